/** Concurrency leases: slots of `concurrency` rules held while work runs. */
import { wholeSeconds } from './decision.js';
import { LeaseNotFound } from './errors.js';
import type * as wire from './wire.js';

/** What a lease needs of its client: the renewing and releasing calls. @internal */
export interface LeaseCalls {
  /** Renews lease `id` on `descriptors`; resolves to the new TTL in milliseconds. */
  renew(descriptors: wire.Descriptor[], id: string, ttlMs: number | undefined): Promise<number | null>;
  /** Releases lease `id`; resolves to whether it still held every slot. */
  release(descriptors: wire.Descriptor[], id: string): Promise<boolean>;
}

/** How a lease came about. @internal */
export type Grant =
  | { readonly kind: 'held'; readonly id: string; readonly ttlMs: number | null }
  | { readonly kind: 'refused'; readonly retryAfterMs: number | null }
  | { readonly kind: 'failed-open' };

/**
 * One in-flight slot of every descriptor's `concurrency` rule, from `Client.acquire`.
 *
 * Check `allowed` before doing the work: a refused lease (every slot taken) holds nothing and says how
 * long to wait in `retryAfterMs`. Release it when the work is done, on every path; `Client.withLease`
 * does that for you. A lease never released (the process died) expires after its TTL.
 */
export class Lease {
  /** The work may go ahead: the slots are held, or the acquire failed open. */
  readonly allowed: boolean;
  /**
   * Tollgate could not be asked and the client's policy let the work go ahead; the lease holds nothing,
   * and renewing or releasing it does nothing.
   */
  readonly failedOpen: boolean;
  /** The server's id for the lease; null when it was refused or failed open. */
  readonly id: string | null;
  /** When refused: milliseconds until the oldest lease in the way expires (a release may free a slot sooner). */
  readonly retryAfterMs: number | null;
  readonly #calls: LeaseCalls;
  readonly #descriptors: wire.Descriptor[];
  #held: boolean;
  #ttlMs: number | null;

  /** @internal */
  constructor(calls: LeaseCalls, descriptors: wire.Descriptor[], grant: Grant) {
    this.#calls = calls;
    this.#descriptors = descriptors;
    this.allowed = grant.kind !== 'refused';
    this.failedOpen = grant.kind === 'failed-open';
    this.id = grant.kind === 'held' ? grant.id : null;
    this.retryAfterMs = grant.kind === 'refused' ? grant.retryAfterMs : null;
    this.#held = grant.kind === 'held';
    this.#ttlMs = grant.kind === 'held' ? grant.ttlMs : null;
  }

  /** The lease holds slots on the server: acquired, and not yet released or found expired. */
  get held(): boolean {
    return this.#held;
  }

  /** Milliseconds the lease lives from its last acquire or renewal; null when it holds nothing. */
  get ttlMs(): number | null {
    return this.#ttlMs;
  }

  /** `retryAfterMs` for a `Retry-After` header: whole seconds, rounded up, at least 1. */
  retryAfterSeconds(): number {
    return wholeSeconds(this.retryAfterMs);
  }

  /**
   * Extends the lease by `ttlMs` from now (by default, and at most, the rules' `lease_ttl`), taking
   * nothing new. Does nothing on a lease that failed open. Throws LeaseNotFound when the lease holds no
   * slot any more (refused, released, or expired: its slots may have gone to someone else), and
   * Unavailable when Tollgate cannot be asked.
   */
  async renew(options: { readonly ttlMs?: number } = {}): Promise<void> {
    if (this.failedOpen) {
      return;
    }
    if (!this.#held || this.id === null) {
      throw new LeaseNotFound('the lease holds no slot: it was refused or released', '', null);
    }
    try {
      this.#ttlMs = await this.#calls.renew(this.#descriptors, this.id, options.ttlMs);
    } catch (error) {
      if (error instanceof LeaseNotFound) {
        this.#held = false;
      }
      throw error;
    }
  }

  /**
   * Frees the lease's slots; resolves to whether it still held all of them (false: some had expired,
   * or it held nothing). Releasing twice does nothing the second time. Throws Unavailable when Tollgate
   * cannot be asked: the lease is then still held, and the release can be retried.
   */
  async release(): Promise<boolean> {
    if (!this.#held || this.id === null) {
      return false;
    }
    const released = await this.#calls.release(this.#descriptors, this.id);
    this.#held = false;
    return released;
  }
}
