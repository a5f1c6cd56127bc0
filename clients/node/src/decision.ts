/** Tollgate's answers to checks, in application terms: a Decision (native API) or an EnvoyDecision. */
import type * as wire from './wire.js';

/** HTTP response headers: names as the server writes them, one value each. */
export type ResponseHeaders = Readonly<Record<string, string>>;

const NO_HEADERS: ResponseHeaders = Object.freeze({});

/**
 * What every answer to a check says, whichever API asked: whether the work may go ahead and what to
 * tell its caller. The middleware needs only this.
 */
export abstract class Verdict {
  /** The work may go ahead. */
  readonly allowed: boolean;
  /**
   * When refused: milliseconds until the same request could pass, rounded up to a whole millisecond (so
   * never early); null when allowed, or when no wait would help (a cost above the limit itself).
   */
  readonly retryAfterMs: number | null;
  /**
   * The fewest units left among the limits that applied, after this call; null when no limit applied
   * (no rule matched, or the rule is unlimited) or the decision failed open.
   */
  readonly remaining: number | null;
  /**
   * The headers for the application's response, ready to set: the rate-limit headers the server hands
   * out for this verdict (`RateLimit` and `RateLimit-Policy`, `X-RateLimit-*`, ... as its
   * `TOLLGATE_RESPONSE_HEADERS` says), and on a refusal always a `Retry-After` (the server's, else
   * `retryAfterSeconds()`).
   */
  readonly headers: ResponseHeaders;
  /** Tollgate could not be asked and the client's policy (`failure: 'open'`) let the work go ahead. */
  readonly failedOpen: boolean;

  /** @internal */
  protected constructor(
    allowed: boolean,
    retryAfterMs: number | null,
    remaining: number | null,
    headers: ResponseHeaders,
    failedOpen: boolean,
  ) {
    this.allowed = allowed;
    this.retryAfterMs = retryAfterMs;
    this.remaining = remaining;
    this.headers = headers;
    this.failedOpen = failedOpen;
  }

  /**
   * `retryAfterMs` for a `Retry-After` header: whole seconds, rounded up so a client told to come back
   * never comes back early, and at least 1 (also when the server gave no hint).
   */
  retryAfterSeconds(): number {
    return wholeSeconds(this.retryAfterMs);
  }
}

/** A limit that decided a descriptor (tollgate.v1.Limit). */
export interface Limit {
  /** The rule's path, as in stats and logs: "domain.key_value.subkey". */
  readonly rule: string;
  /** The limit's `name` in the rules file; empty when it has none. */
  readonly name: string;
  /** fixed_window, sliding_window, sliding_log, token_bucket or gcra. */
  readonly algorithm: string;
  readonly requestsPerUnit: number;
  /** SECOND, MINUTE, HOUR, DAY, WEEK, MONTH or YEAR. */
  readonly unit: string;
  /** unit × unit_multiplier, in milliseconds. */
  readonly windowMs: number | null;
  /** Bucket capacity (token_bucket, gcra); requests_per_unit for the window algorithms. */
  readonly burst: number;
}

/** What one descriptor of a check got (tollgate.v1.CheckResult). */
export interface CheckResult {
  /** Whether this descriptor allows the request (always true for shadow rules). */
  readonly allowed: boolean;
  /** Null when no limit applies: no rule matched, the rule is `unlimited`, or it was replaced. */
  readonly limit: Limit | null;
  /** Units still admissible after this call. */
  readonly remaining: number;
  /** Milliseconds until the limit is fully replenished (fixed window: until the window ends). */
  readonly resetAfterMs: number | null;
  /** Set when the limit refused the cost (shadow rules too): milliseconds until the same cost would pass. */
  readonly retryAfterMs: number | null;
  /** The rule is in shadow mode: counted and reported, never enforced. */
  readonly shadow: boolean;
  /** The rule is `unlimited: true`. */
  readonly unlimited: boolean;
  /** The store could not be reached and the rule's `failure_mode` decided. */
  readonly failureModeApplied: boolean;
}

/** The answer to `check`, `peek` or `checkAllOrNothing` (tollgate.v1.CheckResponse). */
export class Decision extends Verdict {
  /**
   * Set when the check consumed: pass the decision (or this token) to `Client.refund` to give the units
   * back, once. It grants budget back, so it is left out of `util.inspect` and `JSON.stringify`.
   */
  readonly refundToken: string | null;
  /** One result per descriptor, in order; empty when the decision failed open. */
  readonly results: readonly CheckResult[];

  /** @internal */
  constructor(fields: {
    allowed: boolean;
    retryAfterMs?: number | null;
    remaining?: number | null;
    headers?: ResponseHeaders;
    refundToken?: string | null;
    failedOpen?: boolean;
    results?: readonly CheckResult[];
  }) {
    super(
      fields.allowed,
      fields.retryAfterMs ?? null,
      fields.remaining ?? null,
      fields.headers ?? NO_HEADERS,
      fields.failedOpen ?? false,
    );
    this.refundToken = fields.refundToken ?? null;
    this.results = fields.results ?? [];
  }

  /** `JSON.stringify` without the refund token. */
  toJSON(): object {
    return { ...this, refundToken: this.refundToken === null ? null : '[redacted]' };
  }

  /** `util.inspect` (and so `console.log`) without the refund token. */
  [Symbol.for('nodejs.util.inspect.custom')](): object {
    return this.toJSON();
  }
}

/** What one descriptor of an Envoy check got (envoy.service.ratelimit.v3 DescriptorStatus). */
export interface DescriptorStatus {
  /** OK or OVER_LIMIT. */
  readonly code: wire.EnvoyCode;
  /** The limit that applied; null when none did. */
  readonly currentLimit: { readonly name: string; readonly requestsPerUnit: number; readonly unit: string } | null;
  /** Units left, clamped to 2^32 − 1 as Envoy's protocol does. */
  readonly limitRemaining: number;
  /** Milliseconds until the limit resets, in whole seconds as Envoy's protocol has them. */
  readonly durationUntilResetMs: number | null;
}

/** The answer to `shouldRateLimit`, Envoy's `ShouldRateLimit` call (a RateLimitResponse). */
export class EnvoyDecision extends Verdict {
  /** The response's `overall_code`: OK, OVER_LIMIT, or UNKNOWN when the decision failed open. */
  readonly overallCode: wire.EnvoyCode;
  /** One status per descriptor, in order; empty when the decision failed open. */
  readonly statuses: readonly DescriptorStatus[];

  /** @internal */
  constructor(
    allowed: boolean,
    retryAfterMs: number | null,
    remaining: number | null,
    headers: ResponseHeaders,
    failedOpen: boolean,
    overallCode: wire.EnvoyCode,
    statuses: readonly DescriptorStatus[],
  ) {
    super(allowed, retryAfterMs, remaining, headers, failedOpen);
    this.overallCode = overallCode;
    this.statuses = statuses;
  }
}

/** A Decision that failed open: allowed, nothing consumed, nothing known. @internal */
export const FAILED_OPEN = Object.freeze(new Decision({ allowed: true, failedOpen: true }));

/** An EnvoyDecision that failed open. @internal */
export const ENVOY_FAILED_OPEN = Object.freeze(new EnvoyDecision(true, null, null, NO_HEADERS, true, 'UNKNOWN', []));

/** A CheckResponse as a Decision. @internal */
export function decisionOf(response: wire.CheckResponse): Decision {
  const results = response.results.map(resultOf);
  const retryAfterMs = millis(response.retryAfter);
  return new Decision({
    allowed: response.allowed,
    retryAfterMs,
    remaining: fewestRemaining(response.results),
    headers: headersOf(response.headers, 'name', response.allowed, retryAfterMs),
    refundToken: response.refundToken === '' ? null : response.refundToken,
    results,
  });
}

/** A RateLimitResponse as an EnvoyDecision. @internal */
export function envoyDecisionOf(response: wire.RateLimitResponse): EnvoyDecision {
  const allowed = response.overallCode !== 'OVER_LIMIT';
  const statuses = response.statuses.map(statusOf);
  let retryAfterMs: number | null = null;
  let remaining: number | null = null;
  for (const status of statuses) {
    if (status.code === 'OVER_LIMIT' && status.durationUntilResetMs !== null) {
      retryAfterMs = Math.max(retryAfterMs ?? 0, status.durationUntilResetMs);
    }
    if (status.currentLimit !== null) {
      remaining = Math.min(remaining ?? Infinity, status.limitRemaining);
    }
  }
  const headers = headersOf(response.responseHeadersToAdd, 'key', allowed, retryAfterMs);
  return new EnvoyDecision(allowed, retryAfterMs, remaining, headers, false, response.overallCode, statuses);
}

/** The fewest units left among the results a limit applied to; null when none did. */
function fewestRemaining(results: readonly { limit: unknown; remaining: number }[]): number | null {
  let fewest: number | null = null;
  for (const result of results) {
    if (result.limit !== null && (fewest === null || result.remaining < fewest)) {
      fewest = result.remaining;
    }
  }
  return fewest;
}

/** Milliseconds, rounded up to a whole one; null for an absent (or negative) duration. @internal */
export function millis(duration: wire.Duration | null): number | null {
  if (duration === null) {
    return null;
  }
  const ms = Math.ceil(duration.seconds * 1000 + duration.nanos / 1e6);
  return ms >= 0 ? ms : null;
}

/** `ms` as whole seconds for a `Retry-After` header: rounded up, at least 1; 1 for null. @internal */
export function wholeSeconds(ms: number | null): number {
  return ms === null ? 1 : Math.max(1, Math.ceil(ms / 1000));
}

function resultOf(result: wire.CheckResult): CheckResult {
  return {
    allowed: result.allowed,
    limit: result.limit === null ? null : limitOf(result.limit),
    remaining: result.remaining,
    resetAfterMs: millis(result.resetAfter),
    retryAfterMs: millis(result.retryAfter),
    shadow: result.shadow,
    unlimited: result.unlimited,
    failureModeApplied: result.failureModeApplied,
  };
}

/** A tollgate.v1.Limit with its window in milliseconds. */
function limitOf(limit: wire.Limit): Limit {
  return {
    rule: limit.rule,
    name: limit.name,
    algorithm: limit.algorithm,
    requestsPerUnit: limit.requestsPerUnit,
    unit: limit.unit,
    windowMs: millis(limit.window),
    burst: limit.burst,
  };
}

function statusOf(status: wire.DescriptorStatus): DescriptorStatus {
  return {
    code: status.code,
    currentLimit: status.currentLimit,
    limitRemaining: status.limitRemaining,
    durationUntilResetMs: millis(status.durationUntilReset),
  };
}

/**
 * The server's headers as an object, with a `Retry-After` on a refusal when the server sent none (it
 * does only when configured to), so a 429 built from them always says when to come back.
 */
function headersOf<K extends 'name' | 'key'>(
  list: readonly ({ [name in K]: string } & { value: string })[],
  nameField: K,
  allowed: boolean,
  retryAfterMs: number | null,
): ResponseHeaders {
  if (list.length === 0 && allowed) {
    return NO_HEADERS;
  }
  const headers: Record<string, string> = {};
  let retryAfter = false;
  for (const header of list) {
    const name = header[nameField];
    headers[name] = header.value;
    retryAfter ||= name.toLowerCase() === 'retry-after';
  }
  if (!allowed && !retryAfter) {
    headers['Retry-After'] = String(wholeSeconds(retryAfterMs));
  }
  return headers;
}

/** The answer to `Client.refund` (tollgate.v1.RefundResponse). */
export interface Refunded {
  /** The fewest units left among the descriptors' limits after the refund; null when no limit applies. */
  readonly remaining: number | null;
  /** One result per descriptor, in order. */
  readonly results: readonly {
    readonly limit: Limit | null;
    readonly remaining: number;
    readonly resetAfterMs: number | null;
  }[];
}

/** A RefundResponse as Refunded. @internal */
export function refundedOf(response: wire.RefundResponse): Refunded {
  return {
    remaining: fewestRemaining(response.results),
    results: response.results.map((result) => ({
      limit: result.limit === null ? null : limitOf(result.limit),
      remaining: result.remaining,
      resetAfterMs: millis(result.resetAfter),
    })),
  };
}
