/**
 * @deprecated The ucx backend's probe moved beside it, to lib/comm/ucx-native.ts. This re-export is
 * kept only for the modules being moved out of lib (lib/bench imports it); import
 * '../comm/ucx-native.js' instead, and delete it once nothing does.
 */
export { probeUcx, ucxStatus } from '../comm/ucx-native.js';
