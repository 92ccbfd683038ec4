#!/usr/bin/env node
// The CLI lives in dist/apps/ (compiled from apps/cli); `npm install` builds it through `prepare`.
import { main } from '../dist/apps/cli/main.js';

main(process.argv).catch((error) => {
  console.error(error instanceof Error ? error.message : String(error));
  process.exitCode = 1;
});
