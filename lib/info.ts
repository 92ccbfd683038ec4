import { nativeAddon, type NativeInfo } from './native.js';

/** What the native addon chose at load time: SIMD level, threads, buffer alignment. @category Backends */
export function nativeInfo(): NativeInfo {
  return nativeAddon().info();
}
