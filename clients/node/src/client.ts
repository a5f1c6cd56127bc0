/** The client: one domain of Tollgate, with a deadline on every call and one failure policy. */
import * as grpc from '@grpc/grpc-js';

import { DEFAULT_TARGET, openChannel, type HeldChannel, type TlsOptions } from './channel.js';
import {
  Decision,
  EnvoyDecision,
  ENVOY_FAILED_OPEN,
  FAILED_OPEN,
  decisionOf,
  envoyDecisionOf,
  millis,
  refundedOf,
  type Refunded,
} from './decision.js';
import { toWire, type Descriptors } from './descriptors.js';
import { LeaseRefused } from './errors.js';
import { Lease, type LeaseCalls } from './lease.js';
import { DEFAULT_DEADLINE_MS, Policy, type Failure, type Logger } from './policy.js';
import { ACQUIRE, CHECK, REFUND, RELEASE, SHOULD_RATE_LIMIT, type Method } from './protos.js';
import type * as wire from './wire.js';

/** How a client reaches Tollgate and what it does when it cannot. */
export interface ClientOptions {
  /** The rules file's `domain` every call is made in. Required. */
  readonly domain: string;
  /** Tollgate's gRPC address: `host:port`, or `unix:/path/to/socket`. Default `127.0.0.1:8081`. */
  readonly target?: string;
  /** Milliseconds each call may take (default 25). The server is told too (`grpc-timeout`). */
  readonly deadlineMs?: number;
  /** When Tollgate cannot be asked in time: `'open'` (the default) or `'closed'`. See the README. */
  readonly failure?: Failure;
  /** TLS (and mTLS) for the channel; plaintext without it. */
  readonly tls?: TlsOptions;
  /** Credentials of your own instead of `tls` (call credentials, a custom verifier). */
  readonly credentials?: grpc.ChannelCredentials;
  /** gRPC channel options, over the client's (a two-second reconnect backoff cap, keepalive pings). */
  readonly channelOptions?: grpc.ChannelOptions;
  /**
   * Share the channel with the process's other clients of the same target and settings (the default):
   * one connection for all of them. `false` gives the client a channel of its own.
   */
  readonly sharedChannel?: boolean;
  /** Where the start and the end of an outage are told (`warn`, `info`); default `console`, null for nowhere. */
  readonly logger?: Logger | null;
}

/** Options of `check`, `peek` and `checkAllOrNothing`. */
export interface CheckOptions {
  /** Units each descriptor consumes (checks: default 1, and 0 counts as 1) or would (peeks: default 0, "what is left?"). */
  readonly cost?: number;
}

/** Options of `acquire` and `withLease`. */
export interface LeaseOptions {
  /** How long the lease lives unless renewed or released; at most, and by default, the rules' `lease_ttl`. */
  readonly ttlMs?: number;
}

/**
 * A client of Tollgate for one domain: the native API (`tollgate.v1.RateLimiter`: checks with a cost,
 * peeks, refunds, concurrency leases) and Envoy's `ShouldRateLimit`.
 *
 * Every call has a deadline. When Tollgate cannot be asked in it (the deadline passes, the connection
 * fails, or the server answers `UNAVAILABLE`), `failure` decides what checks and acquires do: `'open'`
 * (the default) lets the work go ahead, marks the answer `failedOpen` and counts it in
 * `failedOpenCount`; `'closed'` throws `Unavailable`. Refunds, releases and renewals have nothing to
 * fail open to and throw `Unavailable` either way. Any other error (a malformed request, an unknown
 * domain) is the caller's and is thrown as a `TollgateError` whatever the policy.
 *
 * The channel connects on the first call, so creating a client never fails because Tollgate is down;
 * a call made while it is down (or restarting) waits for it, up to the deadline. Make one client per
 * domain and policy, and keep it: clients of one target share one channel.
 */
export class Client {
  /** The domain every call is made in. */
  readonly domain: string;
  /** The target the client asks. */
  readonly target: string;
  readonly #policy: Policy;
  readonly #held: HeldChannel;
  readonly #grpc: grpc.Client;
  readonly #leaseCalls: LeaseCalls;

  constructor(options: ClientOptions) {
    if (typeof options?.domain !== 'string' || options.domain === '') {
      throw new TypeError("domain is required: the `domain` of the rules file to check against, such as 'api'");
    }
    this.domain = options.domain;
    this.target = options.target ?? DEFAULT_TARGET;
    this.#policy = new Policy(
      this.target,
      options.deadlineMs ?? DEFAULT_DEADLINE_MS,
      options.failure ?? 'open',
      options.logger === undefined ? console : options.logger,
    );
    this.#held = openChannel({
      target: this.target,
      tls: options.tls,
      credentials: options.credentials,
      channelOptions: options.channelOptions,
      shared: options.sharedChannel ?? true,
    });
    this.#grpc = new grpc.Client(this.target, grpc.credentials.createInsecure(), {
      channelOverride: this.#held.channel,
    });
    this.#leaseCalls = {
      renew: (descriptors, leaseId, ttlMs) =>
        this.#call(ACQUIRE, { domain: this.domain, descriptors, leaseId, ttl: duration(ttlMs) }).then((answer) =>
          millis(answer.ttl),
        ),
      release: (descriptors, leaseId) =>
        this.#call(RELEASE, { domain: this.domain, descriptors, leaseId }).then((answer) =>
          answer.results.every((result) => result.released),
        ),
    };
  }

  /** Milliseconds each call may take. */
  get deadlineMs(): number {
    return this.#policy.deadlineMs;
  }

  /** What checks, peeks and acquires do when Tollgate cannot be asked. */
  get failure(): Failure {
    return this.#policy.failure;
  }

  /**
   * How many checks, peeks and acquires failed open since the client was made: export it as a metric to
   * learn that requests are going through unchecked.
   */
  get failedOpenCount(): number {
    return this.#policy.failedOpenCount;
  }

  /** The gRPC channel the client calls over (shared with the process's clients of the same settings). */
  get channel(): grpc.Channel {
    return this.#held.channel;
  }

  /**
   * May the work go ahead? Consumes `cost` units (default 1) of every matching limit when it may. Each
   * descriptor is decided on its own unless the domain sets `all_or_nothing: true` (see
   * `checkAllOrNothing`). A refused check consumes nothing, except on a `fixed_window` limit.
   */
  check(descriptors: Descriptors, options?: CheckOptions): Promise<Decision> {
    return this.#decide(descriptors, options?.cost ?? 1, 'MODE_CONSUME');
  }

  /**
   * Would `cost` units (default 0) pass now, and what would be left after them? Consumes nothing. With
   * cost 0, `remaining` is what is left now ("3 exports left today").
   */
  peek(descriptors: Descriptors, options?: CheckOptions): Promise<Decision> {
    return this.#decide(descriptors, options?.cost ?? 0, 'MODE_PEEK');
  }

  /** Like `check`, but consumes only if every descriptor allows it: a refused call consumes nothing anywhere. */
  checkAllOrNothing(descriptors: Descriptors, options?: CheckOptions): Promise<Decision> {
    return this.#decide(descriptors, options?.cost ?? 1, 'MODE_ALL_OR_NOTHING');
  }

  /**
   * Gives back what a check consumed, because the work it paid for did not happen. Pass the check's
   * Decision (or its `refundToken`) and the same descriptors, in the same order; `cost` units go back to
   * each descriptor (0, the default: all it consumed). A token works once. A decision that consumed
   * nothing (refused, a peek, failed open, no limit applied) has no token: refunding it does nothing and
   * resolves to null.
   *
   * Throws RefundDenied when the server refuses the token (forged, expired, already used, other
   * descriptors), and Unavailable when Tollgate cannot be asked, whatever the failure policy.
   */
  async refund(
    decisionOrToken: Decision | string,
    descriptors: Descriptors,
    options: CheckOptions = {},
  ): Promise<Refunded | null> {
    const refundToken = typeof decisionOrToken === 'string' ? decisionOrToken : decisionOrToken.refundToken;
    if (refundToken === null) {
      return null;
    }
    const request = { domain: this.domain, descriptors: toWire(descriptors), cost: units(options.cost ?? 0), refundToken };
    return refundedOf(await this.#call(REFUND, request));
  }

  /**
   * Takes one in-flight slot of every descriptor's `concurrency` rule, all or none. Check
   * `lease.allowed`; release the lease when the work is done (`withLease` does both).
   */
  async acquire(descriptors: Descriptors, options: LeaseOptions = {}): Promise<Lease> {
    const wireDescriptors = toWire(descriptors);
    const request = { domain: this.domain, descriptors: wireDescriptors, leaseId: '', ttl: duration(options.ttlMs) };
    try {
      const answer = await this.#call(ACQUIRE, request);
      const grant = answer.acquired
        ? ({ kind: 'held', id: answer.leaseId, ttlMs: millis(answer.ttl) } as const)
        : ({ kind: 'refused', retryAfterMs: millis(answer.retryAfter) } as const);
      return new Lease(this.#leaseCalls, wireDescriptors, grant);
    } catch (error) {
      return this.#policy.recover(error, new Lease(this.#leaseCalls, wireDescriptors, { kind: 'failed-open' }));
    }
  }

  /**
   * Runs `work` holding a lease of `descriptors`, and releases the lease on every path: when `work`
   * resolves, and when it throws or rejects (whose error then propagates). Resolves to what `work`
   * resolves to. When every slot is taken, `work` does not run and this throws `LeaseRefused` (with
   * `retryAfterMs`). A release that cannot reach Tollgate is logged, not thrown: the lease expires after
   * its TTL anyway.
   */
  async withLease<T>(
    descriptors: Descriptors,
    work: (lease: Lease) => T | PromiseLike<T>,
    options: LeaseOptions = {},
  ): Promise<T> {
    const lease = await this.acquire(descriptors, options);
    if (!lease.allowed) {
      throw new LeaseRefused(lease.retryAfterMs);
    }
    try {
      return await work(lease);
    } finally {
      await lease.release().catch((error: unknown) => {
        this.#policy.logger?.warn(
          `cannot release Tollgate lease ${lease.id ?? ''} (${String(error)}): it expires after its TTL`,
        );
      });
    }
  }

  /**
   * Envoy's question, `ShouldRateLimit`: the same rules and counters as Envoy's calls, with Envoy's
   * semantics (a fixed window counts refused requests too; an unknown domain is allowed). `hitsAddend`
   * is the request's cost (default 0, which counts as 1). The failure policy applies as for `check`.
   */
  async shouldRateLimit(descriptors: Descriptors, options: { readonly hitsAddend?: number } = {}): Promise<EnvoyDecision> {
    const hitsAddend = options.hitsAddend ?? 0;
    if (!Number.isInteger(hitsAddend) || hitsAddend < 0 || hitsAddend > 0xffff_ffff) {
      throw new RangeError(`hitsAddend is a whole number from 0 to 2^32 - 1, got ${String(hitsAddend)}`);
    }
    const request = { domain: this.domain, descriptors: toWire(descriptors), hitsAddend };
    try {
      return envoyDecisionOf(await this.#call(SHOULD_RATE_LIMIT, request));
    } catch (error) {
      return this.#policy.recover(error, ENVOY_FAILED_OPEN);
    }
  }

  /** Gives the channel back; it closes when no client of the process uses it any more. */
  close(): void {
    this.#held.close();
  }

  async #decide(descriptors: Descriptors, cost: number, mode: wire.Mode): Promise<Decision> {
    const request = { domain: this.domain, descriptors: toWire(descriptors), cost: units(cost), mode };
    try {
      return decisionOf(await this.#call(CHECK, request));
    } catch (error) {
      return this.#policy.recover(error, FAILED_OPEN);
    }
  }

  /** One call within the deadline; rejects with the TollgateError the failure stands for. */
  #call<Request, Response>(method: Method<Request, Response>, request: Request): Promise<Response> {
    // waitForReady: a call made while the channel is not connected (Tollgate down or restarting) waits
    // for the connection up to its deadline rather than failing at once, as the Python client's do: no
    // longer than a hanging Tollgate costs anyway, and a Tollgate that is back is used by the next call.
    const metadata = new grpc.Metadata({ waitForReady: true });
    const options: grpc.CallOptions = { deadline: Date.now() + this.#policy.deadlineMs };
    return new Promise((resolve, reject) => {
      this.#grpc.makeUnaryRequest(method.path, method.serialize, method.deserialize, request, metadata, options, (error, answer) => {
        if (error) {
          reject(this.#policy.failed(error));
        } else {
          this.#policy.answered();
          resolve(answer as Response);
        }
      });
    });
  }
}

/** A cost, checked: a whole number of units, exact as a JavaScript number. */
function units(cost: number): number {
  if (!Number.isSafeInteger(cost) || cost < 0) {
    throw new RangeError(`cost is a whole number of units, 0 or more, got ${String(cost)}`);
  }
  return cost;
}

/** A TTL in milliseconds as a protobuf Duration; null for none (the rules' lease_ttl). */
function duration(ttlMs: number | undefined): wire.Duration | null {
  if (ttlMs === undefined) {
    return null;
  }
  if (typeof ttlMs !== 'number' || !(ttlMs > 0) || !Number.isFinite(ttlMs)) {
    throw new RangeError(`a lease's ttlMs is a positive number of milliseconds, got ${String(ttlMs)}`);
  }
  const seconds = Math.floor(ttlMs / 1000);
  return { seconds, nanos: Math.min(999_999_999, Math.round((ttlMs - seconds * 1000) * 1e6)) };
}
