/** The errors the client throws, and which gRPC status becomes which. */
import { status as Status, type ServiceError } from '@grpc/grpc-js';

import { wholeSeconds } from './decision.js';

/**
 * A call to Tollgate failed, or was refused before it was sent. Thrown as is for errors that are the
 * caller's to fix (a malformed request, such as one without descriptors: `INVALID_ARGUMENT`), whatever
 * the failure policy; the subclasses name the failures a caller can act on.
 */
export class TollgateError extends Error {
  override name = 'TollgateError';
  /** The gRPC status code of the failed call (`grpc.status`), or null when nothing was sent. */
  readonly code: Status | null;
  /** The server's (or gRPC's) own message. */
  readonly details: string;

  /** @internal */
  constructor(message: string, details: string, code: Status | null) {
    super(message);
    this.code = code;
    this.details = details;
  }
}

/**
 * Tollgate could not be asked in time: no answer within the deadline, a connection that failed, or
 * `UNAVAILABLE` from the server (its store is down and no rule's `failure_mode` answered).
 *
 * Checks and acquires throw it only when the client fails closed; refunds, renewals and releases always
 * do, as they have nothing to fail open to. Retry them once Tollgate is back.
 */
export class Unavailable extends TollgateError {
  override name = 'Unavailable';
}

/**
 * Tollgate refused a refund token (`PERMISSION_DENIED`): forged, altered, expired, already used, or sent
 * with another domain or other descriptors than its check's. Nothing was refunded.
 */
export class RefundDenied extends TollgateError {
  override name = 'RefundDenied';
}

/** The lease holds no live slot (`NOT_FOUND` on renewal): it expired, was released, or was refused. */
export class LeaseNotFound extends TollgateError {
  override name = 'LeaseNotFound';
}

/**
 * No rules define the client's domain (`NOT_FOUND`, "unknown domain"): a typo in the domain, or rules
 * not deployed. Thrown whatever the failure policy: failing open would silently disable every limit of
 * the domain.
 */
export class UnknownDomain extends TollgateError {
  override name = 'UnknownDomain';
}

/**
 * `Client.withLease` found every slot taken: the work did not run. Answer `429` with
 * `Retry-After: retryAfterSeconds()`, or try again after `retryAfterMs`.
 */
export class LeaseRefused extends TollgateError {
  override name = 'LeaseRefused';
  /** Milliseconds until the oldest lease in the way expires (a release may free a slot sooner). */
  readonly retryAfterMs: number | null;

  /** @internal */
  constructor(retryAfterMs: number | null) {
    super(
      'every slot of a concurrency rule is taken: the work did not run; retry after the lease in the way ' +
        'is released or expires',
      '',
      null,
    );
    this.retryAfterMs = retryAfterMs;
  }

  /** `retryAfterMs` for a `Retry-After` header: whole seconds, rounded up, at least 1. */
  retryAfterSeconds(): number {
    return wholeSeconds(this.retryAfterMs);
  }
}

/**
 * The error that stands for a failed gRPC call. Deadline exceeded, `UNAVAILABLE` and `CANCELLED` (a
 * stream reset by the transport) are the failures of reaching Tollgate, so they alone become
 * Unavailable, the one error the failure policy may turn into a pass. Every other status means the
 * server answered and the request was wrong, which failing open would only hide.
 * @internal
 */
export function errorFor(error: ServiceError, target: string): TollgateError {
  const details = error.details || error.message;
  const what = `${Status[error.code] ?? error.code}: ${details}`;
  switch (error.code) {
    case Status.DEADLINE_EXCEEDED:
    case Status.UNAVAILABLE:
    case Status.CANCELLED:
      return new Unavailable(
        `Tollgate at ${target} could not be asked (${what}): is it running, and reachable from here?`,
        details,
        error.code,
      );
    case Status.PERMISSION_DENIED:
      return new RefundDenied(
        `Tollgate refused the refund token (${what}): a token works once, with its check's domain and ` +
          'descriptors in the same order, until it expires; nothing was refunded',
        details,
        error.code,
      );
    case Status.NOT_FOUND:
      if (details.startsWith('unknown domain')) {
        return new UnknownDomain(
          `Tollgate has no rules for the client's domain (${what}): fix the domain, or deploy its rules`,
          details,
          error.code,
        );
      }
      return new LeaseNotFound(
        `the lease holds no slot (${what}): it expired, was released or was refused; acquire a new one`,
        details,
        error.code,
      );
    default:
      return new TollgateError(`Tollgate rejected the call (${what})`, details, error.code);
  }
}
