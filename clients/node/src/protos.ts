/**
 * The RPCs the client makes: each one's path and its (de)serializers, from the package's own copy of
 * the proto files (generated/protos.ts, written by scripts/build.mjs) loaded by @grpc/proto-loader.
 * @internal
 * @packageDocumentation
 */
import * as loader from '@grpc/proto-loader';

import { PROTOS_JSON } from './generated/protos.js';
import type * as wire from './wire.js';

/** One unary RPC, as grpc-js's `Client.makeUnaryRequest` takes it. */
export interface Method<Request, Response> {
  readonly path: string;
  readonly serialize: (request: Request) => Buffer;
  readonly deserialize: (bytes: Buffer) => Response;
}

// The shapes wire.ts declares: camelCase fields, 64-bit counts as numbers (exact below 2^53, far above
// any limit a rules file can set), enums by name, unset scalars as their defaults and unset messages
// as null.
const definitions = loader.fromJSON(JSON.parse(PROTOS_JSON) as Parameters<typeof loader.fromJSON>[0], {
  keepCase: false,
  longs: Number,
  enums: String,
  defaults: true,
});

function method<Request, Response>(service: string, name: string): Method<Request, Response> {
  const definition = (definitions[service] as loader.ServiceDefinition)[name];
  if (definition === undefined) {
    throw new Error(`the package's protos have no ${service}.${name}: the build is broken`);
  }
  return {
    path: definition.path,
    serialize: definition.requestSerialize as (request: Request) => Buffer,
    deserialize: definition.responseDeserialize as (bytes: Buffer) => Response,
  };
}

const NATIVE = 'tollgate.v1.RateLimiter';

export const CHECK = method<wire.CheckRequest, wire.CheckResponse>(NATIVE, 'Check');
export const REFUND = method<wire.RefundRequest, wire.RefundResponse>(NATIVE, 'Refund');
export const ACQUIRE = method<wire.AcquireRequest, wire.AcquireResponse>(NATIVE, 'Acquire');
export const RELEASE = method<wire.ReleaseRequest, wire.ReleaseResponse>(NATIVE, 'Release');
export const SHOULD_RATE_LIMIT = method<wire.RateLimitRequest, wire.RateLimitResponse>(
  'envoy.service.ratelimit.v3.RateLimitService',
  'ShouldRateLimit',
);
