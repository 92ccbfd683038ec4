#!/usr/bin/env node
// The CLI lives in dist/ (compiled from lib/cli); `npm install` builds it through `prepare`.
import { main } from '../dist/cli/main.js';

main(process.argv).catch((error) => {
  console.error(error instanceof Error ? error.message : String(error));
  process.exitCode = 1;
});
