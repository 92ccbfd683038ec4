/**
 * Every error sapipe throws is a {@link SapipeError} with a stable `code`. Catch by class or
 * compare `error.code`; messages may change, codes do not.
 *
 * @category Errors
 */
export type SapipeErrorCode =
  | 'ERR_INVALID_ARGUMENT'
  | 'ERR_SIZE_MISMATCH'
  | 'ERR_ALIASING'
  | 'ERR_DISPOSED'
  | 'ERR_BUSY'
  | 'ERR_OUT_OF_MEMORY'
  | 'ERR_RESOURCE_LIMIT'
  | 'ERR_VIEW_TOO_LARGE'
  | 'ERR_BACKEND_UNAVAILABLE'
  | 'ERR_PEER_LOST'
  | 'ERR_TIMEOUT'
  | 'ERR_INVALID_SCHEDULE'
  | 'ERR_RANK_FAILED'
  | 'ERR_CHECKPOINT'
  | 'ERR_RENDEZVOUS'
  | 'ERR_INTERNAL';

/**
 * The base of every error sapipe throws; `code` is stable (see SapipeErrorCode), messages may change.
 *
 * @category Errors
 */
export class SapipeError extends Error {
  readonly code: SapipeErrorCode;
  constructor(code: SapipeErrorCode, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.code = code;
    this.name = new.target.name;
  }
}

/** An argument is missing, of the wrong type, or out of range. @category Errors */
export class InvalidArgumentError extends SapipeError {
  constructor(message: string, options?: { cause?: unknown }) {
    super('ERR_INVALID_ARGUMENT', message, options);
  }
}
/** Buffers or tensors whose lengths must agree do not. @category Errors */
export class SizeMismatchError extends SapipeError {
  constructor(message: string, options?: { cause?: unknown }) {
    super('ERR_SIZE_MISMATCH', message, options);
  }
}
/** Two buffers that must be distinct memory are the same. @category Errors */
export class AliasingError extends SapipeError {
  constructor(message: string, options?: { cause?: unknown }) {
    super('ERR_ALIASING', message, options);
  }
}
/** An object was used after dispose(). @category Errors */
export class DisposedError extends SapipeError {
  constructor(message: string, options?: { cause?: unknown }) {
    super('ERR_DISPOSED', message, options);
  }
}
/** An asynchronous operation still uses the object; await it first. @category Errors */
export class BusyError extends SapipeError {
  constructor(message: string, options?: { cause?: unknown }) {
    super('ERR_BUSY', message, options);
  }
}
/**
 * Memory could not be allocated (host or device); free buffers with dispose() or use less.
 *
 * @category Errors
 */
export class OutOfMemoryError extends SapipeError {
  constructor(message: string, options?: { cause?: unknown }) {
    super('ERR_OUT_OF_MEMORY', message, options);
  }
}
/**
 * The process reached an operating-system limit other than memory: a thread could not be started
 * (`ulimit -u`, a container's pids limit). Destroy (and await) the communicators and queues no
 * longer used, or raise the limit.
 *
 * @category Errors
 */
export class ResourceLimitError extends SapipeError {
  constructor(message: string, options?: { cause?: unknown }) {
    super('ERR_RESOURCE_LIMIT', message, options);
  }
}
/**
 * A JavaScript view of more floats than one can hold (2^30, 4 GiB): a buffer that large is used
 * whole by native kernels and collectives, and from JavaScript through views of ranges.
 *
 * @category Errors
 */
export class ViewTooLargeError extends SapipeError {
  constructor(message: string, options?: { cause?: unknown }) {
    super('ERR_VIEW_TOO_LARGE', message, options);
  }
}
/** The requested backend (native addon, CUDA, UCX, ...) cannot be used here; the message says why. @category Errors */
export class BackendUnavailableError extends SapipeError {
  constructor(message: string, options?: { cause?: unknown }) {
    super('ERR_BACKEND_UNAVAILABLE', message, options);
  }
}
/** A peer of a collective disappeared. @category Errors */
export class PeerLostError extends SapipeError {
  constructor(message: string, options?: { cause?: unknown }) {
    super('ERR_PEER_LOST', message, options);
  }
}
/** A wait ran past its timeout. @category Errors */
export class TimeoutError extends SapipeError {
  constructor(message: string, options?: { cause?: unknown }) {
    super('ERR_TIMEOUT', message, options);
  }
}
/** A pipeline schedule breaks a dependency or would deadlock; the message names the first broken action. @category Errors */
export class InvalidScheduleError extends SapipeError {
  constructor(message: string, options?: { cause?: unknown }) {
    super('ERR_INVALID_SCHEDULE', message, options);
  }
}
/** A rank of a job failed (threw, or exited with a non-zero code); `rank` says which, `cause` holds its error. @category Errors */
export class RankFailedError extends SapipeError {
  readonly rank: number;
  constructor(message: string, options?: { cause?: unknown; rank?: number }) {
    super('ERR_RANK_FAILED', message, options);
    this.rank = options?.rank ?? -1;
  }
}
/** Why a checkpoint cannot be used. @category Errors */
export type CheckpointFault = 'missing' | 'truncated' | 'corrupt' | 'foreign' | 'version' | 'mismatch' | 'unwritable';

/**
 * A checkpoint cannot be saved or used: `reason` says why (`missing`: no complete checkpoint or
 * file; `truncated`; `corrupt`: a checksum, the structure or a counter does not hold; `foreign`:
 * not a sapipe checkpoint, or not of this format; `version`: a format version this sapipe does not
 * read; `mismatch`: it belongs to another model, optimizer, mode or rank layout; `unwritable`: the
 * checkpoint directory cannot be created or written, the OS error in the message and `cause`).
 * The message names the file or directory and the fault.
 *
 * @category Errors
 */
export class CheckpointError extends SapipeError {
  readonly reason: CheckpointFault;
  constructor(message: string, options?: { cause?: unknown; reason?: CheckpointFault }) {
    super('ERR_CHECKPOINT', message, options);
    this.reason = options?.reason ?? 'corrupt';
  }
}
/** Why the rendezvous store, or a value read from it, cannot be used. @category Errors */
export type RendezvousFault = 'malformed' | 'taken' | 'port-in-use';

/**
 * The rendezvous store cannot be used: `reason` says why (`malformed`: a value read from the store
 * is not what the rank its key names would have published: wrong length, format version, kind,
 * sender rank or world size; `taken`: a key a rank publishes about itself was already set by some
 * other client; `port-in-use`: rank 0 could not bind MASTER_PORT). The message names the key or
 * the port.
 *
 * @category Errors
 */
export class RendezvousError extends SapipeError {
  readonly reason: RendezvousFault;
  constructor(message: string, options?: { cause?: unknown; reason?: RendezvousFault }) {
    super('ERR_RENDEZVOUS', message, options);
    this.reason = options?.reason ?? 'malformed';
  }
}
/**
 * An invariant of sapipe itself broke: a bug to report, with the message.
 *
 * @category Errors
 */
export class InternalError extends SapipeError {
  constructor(message: string, options?: { cause?: unknown }) {
    super('ERR_INTERNAL', message, options);
  }
}

const byCode: Record<SapipeErrorCode, new (message: string, options?: { cause?: unknown }) => SapipeError> = {
  ERR_INVALID_ARGUMENT: InvalidArgumentError,
  ERR_SIZE_MISMATCH: SizeMismatchError,
  ERR_ALIASING: AliasingError,
  ERR_DISPOSED: DisposedError,
  ERR_BUSY: BusyError,
  ERR_OUT_OF_MEMORY: OutOfMemoryError,
  ERR_RESOURCE_LIMIT: ResourceLimitError,
  ERR_VIEW_TOO_LARGE: ViewTooLargeError,
  ERR_BACKEND_UNAVAILABLE: BackendUnavailableError,
  ERR_PEER_LOST: PeerLostError,
  ERR_TIMEOUT: TimeoutError,
  ERR_INVALID_SCHEDULE: InvalidScheduleError,
  ERR_RANK_FAILED: RankFailedError,
  ERR_CHECKPOINT: CheckpointError,
  ERR_RENDEZVOUS: RendezvousError,
  ERR_INTERNAL: InternalError,
};

/** Turns an error thrown by the native addon (an Error with a `code`) into its SapipeError subclass. @category Errors */
export function fromNativeError(error: unknown): SapipeError {
  if (error instanceof SapipeError) return error;
  const code = (error as { code?: unknown } | null)?.code;
  const message = error instanceof Error ? error.message : String(error);
  const Ctor = typeof code === 'string' && code in byCode ? byCode[code as SapipeErrorCode] : InternalError;
  return new Ctor(message, { cause: error });
}
