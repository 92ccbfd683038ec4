import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

/** @internal The version in package.json (lib/ and dist/ both sit one level below it). */
export function packageVersion(): string {
  const path = fileURLToPath(new URL('../package.json', import.meta.url));
  return (JSON.parse(readFileSync(path, 'utf8')) as { version: string }).version;
}
