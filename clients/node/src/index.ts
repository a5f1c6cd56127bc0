/**
 * A client for Tollgate, the rate-limit decision service: checks with a cost, peeks, refunds and
 * concurrency leases over its native API (`tollgate.v1.RateLimiter`), Envoy's `ShouldRateLimit`, with a
 * deadline on every call and one failure policy; and middleware for Express and Fastify.
 *
 *     import { Client } from '@tollgate/client';
 *
 *     const limiter = new Client({ target: '127.0.0.1:8081', domain: 'api' });
 *     const decision = await limiter.check([{ path: '/auth/otp', phone }]);
 *     if (!decision.allowed) {
 *       // 429 with decision.headers (Retry-After among them), or wait decision.retryAfterMs
 *     }
 *
 * @packageDocumentation
 */
export { DEFAULT_TARGET, type TlsOptions } from './channel.js';
export { Client, type CheckOptions, type ClientOptions, type LeaseOptions } from './client.js';
export {
  Decision,
  EnvoyDecision,
  Verdict,
  type CheckResult,
  type DescriptorStatus,
  type Limit,
  type Refunded,
  type ResponseHeaders,
} from './decision.js';
export type { Descriptors, Entries, Value } from './descriptors.js';
export { LeaseNotFound, LeaseRefused, RefundDenied, TollgateError, Unavailable, UnknownDomain } from './errors.js';
export { Lease } from './lease.js';
export {
  expressRateLimit,
  fastifyRateLimit,
  rateLimitGuard,
  type FastifyReplyLike,
  type FastifyRequestLike,
  type GuardOutcome,
  type RateLimitOptions,
} from './middleware.js';
export { DEFAULT_DEADLINE_MS, type Failure, type Logger } from './policy.js';
