import { nativeAddon, type NativeInfo } from './native.js';

/** What the native addon chose at load time: SIMD level, threads, buffer alignment. */
export function nativeInfo(): NativeInfo {
  return nativeAddon().info();
}
