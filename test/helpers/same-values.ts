/** Whether two arrays hold the same values, bit for bit (NaN equals NaN, -0 differs from 0). tap's deep comparison is slow on large arrays. */
export function sameValues(a: ArrayLike<number>, b: ArrayLike<number>): boolean {
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (!Object.is(a[i], b[i])) return false;
  return true;
}
