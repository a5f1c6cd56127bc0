/** The deadline every call gets, and the one failure policy for when Tollgate cannot be asked in it. */
import type { ServiceError } from '@grpc/grpc-js';

import { Unavailable, errorFor, type TollgateError } from './errors.js';

/**
 * What checks, peeks and acquires do when Tollgate cannot be asked: `'open'` lets the work go ahead
 * (and counts it), `'closed'` throws `Unavailable`.
 */
export type Failure = 'open' | 'closed';

/**
 * Milliseconds each call may take by default. Tollgate answers in about a millisecond; 25 ms leaves
 * room for a slow answer while keeping a stalled Tollgate from stalling every request that asks it.
 */
export const DEFAULT_DEADLINE_MS = 25;

/** Where the client says that Tollgate became unreachable, and reachable again. */
export interface Logger {
  warn(message: string): void;
  info?(message: string): void;
}

/** A client's deadline and failure policy, its count of decisions that failed open, and its outages. @internal */
export class Policy {
  readonly deadlineMs: number;
  readonly failure: Failure;
  failedOpenCount = 0;
  /** Where outages are told; null for nowhere. */
  readonly logger: Logger | null;
  readonly #target: string;
  /** The last call found Tollgate unreachable: an outage is logged once when it starts and once when it ends. */
  #down = false;

  constructor(target: string, deadlineMs: number, failure: Failure, logger: Logger | null) {
    if (typeof deadlineMs !== 'number' || !(deadlineMs > 0) || !Number.isFinite(deadlineMs)) {
      throw new RangeError(`deadlineMs is a positive number of milliseconds, got ${String(deadlineMs)}`);
    }
    if (failure !== 'open' && failure !== 'closed') {
      throw new RangeError(`failure is 'open' or 'closed', got ${String(failure)}`);
    }
    this.deadlineMs = deadlineMs;
    this.failure = failure;
    this.#target = target;
    this.logger = logger;
  }

  /** The error a failed call stands for, noting an outage when it is one. */
  failed(error: ServiceError): TollgateError {
    const failure = errorFor(error, this.#target);
    if (failure instanceof Unavailable && !this.#down) {
      this.#down = true;
      this.logger?.warn(
        `${failure.message} Checks and acquires ${this.failure === 'open' ? 'let the work go ahead' : 'throw Unavailable'} ` +
          'until it answers again.',
      );
    }
    return failure;
  }

  /** Notes an answer: the end of an outage, if there was one. */
  answered(): void {
    if (this.#down) {
      this.#down = false;
      this.logger?.info?.(
        `Tollgate at ${this.#target} answers again (${this.failedOpenCount} decisions failed open so far)`,
      );
    }
  }

  /**
   * `failedOpen` when the policy lets the work go ahead after `error` (and counts it), else throws
   * `error`: every error but Unavailable, and Unavailable when failing closed.
   */
  recover<T>(error: unknown, failedOpen: T): T {
    if (error instanceof Unavailable && this.failure === 'open') {
      this.failedOpenCount += 1;
      return failedOpen;
    }
    throw error;
  }
}
