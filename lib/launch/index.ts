/** Starting the ranks of a job: `sapipe launch` as a function. */
export { launch, type LaunchOptions, type LaunchResult, type RankExit } from './launch.js';
export { findFreePort } from './free-port.js';
