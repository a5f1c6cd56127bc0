/**
 * The messages on the wire, as @grpc/proto-loader hands them over with the options of protos.ts
 * (camelCase names, 64-bit integers as numbers, enums as their names, defaults filled in, absent
 * messages as null). Only what the client sends and reads is declared; proto/ has the whole of them.
 * @internal
 * @packageDocumentation
 */

/** google.protobuf.Duration. */
export interface Duration {
  seconds: number;
  nanos: number;
}

/** One `key: value` entry, in both APIs. */
export interface Entry {
  key: string;
  value: string;
}

/** A descriptor, in both APIs (Envoy's has more fields, which the client leaves unset). */
export interface Descriptor {
  entries: Entry[];
}

/** tollgate.v1.Mode. */
export type Mode = 'MODE_CONSUME' | 'MODE_PEEK' | 'MODE_ALL_OR_NOTHING';

export interface CheckRequest {
  domain: string;
  descriptors: Descriptor[];
  cost: number;
  mode: Mode;
}

export interface Limit {
  rule: string;
  name: string;
  algorithm: string;
  requestsPerUnit: number;
  unit: string;
  window: Duration | null;
  burst: number;
}

export interface CheckResult {
  allowed: boolean;
  limit: Limit | null;
  remaining: number;
  resetAfter: Duration | null;
  retryAfter: Duration | null;
  shadow: boolean;
  unlimited: boolean;
  failureModeApplied: boolean;
}

export interface Header {
  name: string;
  value: string;
}

export interface CheckResponse {
  allowed: boolean;
  results: CheckResult[];
  retryAfter: Duration | null;
  headers: Header[];
  refundToken: string;
}

export interface RefundRequest {
  domain: string;
  descriptors: Descriptor[];
  cost: number;
  refundToken: string;
}

export interface RefundResult {
  limit: Limit | null;
  remaining: number;
  resetAfter: Duration | null;
}

export interface RefundResponse {
  results: RefundResult[];
}

export interface AcquireRequest {
  domain: string;
  descriptors: Descriptor[];
  leaseId: string;
  ttl: Duration | null;
}

export interface AcquireResponse {
  acquired: boolean;
  leaseId: string;
  ttl: Duration | null;
  retryAfter: Duration | null;
}

export interface ReleaseRequest {
  domain: string;
  descriptors: Descriptor[];
  leaseId: string;
}

export interface ReleaseResponse {
  results: { released: boolean; inFlight: number }[];
}

/** envoy.service.ratelimit.v3.RateLimitResponse.Code. */
export type EnvoyCode = 'UNKNOWN' | 'OK' | 'OVER_LIMIT';

export interface RateLimitRequest {
  domain: string;
  descriptors: Descriptor[];
  hitsAddend: number;
}

export interface DescriptorStatus {
  code: EnvoyCode;
  currentLimit: { name: string; requestsPerUnit: number; unit: string } | null;
  limitRemaining: number;
  durationUntilReset: Duration | null;
}

export interface RateLimitResponse {
  overallCode: EnvoyCode;
  statuses: DescriptorStatus[];
  responseHeadersToAdd: { key: string; value: string }[];
}
