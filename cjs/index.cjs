// sapipe is an ES module package: Node 20 cannot require() it. This entry is what require('sapipe')
// resolves to, so that the error says what to write instead of ERR_PACKAGE_PATH_NOT_EXPORTED.
'use strict';
const error = new Error(
  "sapipe is an ES module: load it with `import { ParamSet, SGD } from 'sapipe'` (in an .mjs file, or with \"type\": \"module\" in package.json), " +
    "or from CommonJS with `const sapipe = await import('sapipe')`.",
);
error.code = 'ERR_REQUIRE_ESM';
throw error;
