/** @internal Waits for every promise; the first rejection's reason, or undefined when all resolved. */
export async function firstRejection(promises: readonly Promise<unknown>[]): Promise<unknown> {
  const settled = await Promise.allSettled(promises);
  const failed = settled.find((r) => r.status === 'rejected');
  return failed ? (failed as PromiseRejectedResult).reason : undefined;
}
