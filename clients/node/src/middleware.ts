/**
 * Asking Tollgate before a request runs: `rateLimitGuard` for any framework (a function of the request
 * that says what to answer), and on it `expressRateLimit` (Express, Connect, plain `node:http`) and
 * `fastifyRateLimit` (a Fastify `onRequest` hook). Neither framework is a dependency: the adapters use
 * only what both have had for years.
 */
import type { IncomingHttpHeaders, IncomingMessage, ServerResponse } from 'node:http';

import type { Client } from './client.js';
import type { Decision, ResponseHeaders } from './decision.js';
import type { Descriptors } from './descriptors.js';
import { Unavailable } from './errors.js';

/** What to guard and how. */
export interface RateLimitOptions<Request> {
  /** The client to ask; its failure policy decides what happens when Tollgate cannot be asked. */
  readonly client: Client;
  /**
   * The descriptors of a request (or a promise of them); null or undefined lets the request through
   * unchecked. What it throws goes to the framework's error handling.
   */
  readonly describe: (request: Request) => Descriptors | null | undefined | PromiseLike<Descriptors | null | undefined>;
  /** Units each request consumes; default 1. */
  readonly cost?: number;
}

/** What to do with a request: let it through (with headers to add), or answer it now. */
export type GuardOutcome =
  | {
      readonly allowed: true;
      /** The server's rate-limit headers, for the response. */
      readonly headers: ResponseHeaders;
      /** Null when `describe` let the request through unchecked, or the decision failed open. */
      readonly decision: Decision | null;
    }
  | {
      readonly allowed: false;
      /** 429 when refused; 503 when Tollgate cannot be asked and the client fails closed. */
      readonly status: 429 | 503;
      /** The response's headers, `Retry-After` and `Content-Type` among them. */
      readonly headers: ResponseHeaders;
      /** 429: `{"error":"rate_limited","retry_after":N}`; 503: a line of text. */
      readonly body: string;
      readonly decision: Decision | null;
    };

const UNCHECKED: GuardOutcome = Object.freeze({ allowed: true, headers: Object.freeze({}), decision: null });

const UNAVAILABLE: GuardOutcome = Object.freeze({
  allowed: false,
  status: 503,
  headers: Object.freeze({ 'Content-Type': 'text/plain; charset=utf-8' }),
  body: 'rate limiter unavailable\n',
  decision: null,
});

/**
 * A function that checks a request (one `cost` unit of its descriptors) and says what to do with it:
 * - allowed: let it through, adding `headers` (the server's rate-limit headers) to its response;
 * - refused: answer `429` with `Retry-After` (whole seconds, rounded up), those headers and a JSON body;
 * - Tollgate cannot be asked: through when the client fails open, `503` when it fails closed.
 *
 * It rejects only with what `describe` throws and with errors Tollgate answers (an unknown domain, a
 * malformed descriptor): configuration to fix, for the framework's error handling (a 500).
 */
export function rateLimitGuard<Request>(options: RateLimitOptions<Request>): (request: Request) => Promise<GuardOutcome> {
  const { client, describe } = options;
  const checkOptions = { cost: options.cost ?? 1 };
  return async (request) => {
    const descriptors = await describe(request);
    if (descriptors === null || descriptors === undefined) {
      return UNCHECKED;
    }
    let decision: Decision;
    try {
      decision = await client.check(descriptors, checkOptions);
    } catch (error) {
      if (error instanceof Unavailable) {
        return UNAVAILABLE;
      }
      throw error;
    }
    if (decision.allowed) {
      return { allowed: true, headers: decision.headers, decision: decision.failedOpen ? null : decision };
    }
    const retryAfter = decision.retryAfterSeconds();
    return {
      allowed: false,
      status: 429,
      headers: { ...decision.headers, 'Content-Type': 'application/json' },
      body: JSON.stringify({ error: 'rate_limited', retry_after: retryAfter }),
      decision,
    };
  };
}

/**
 * Express (4 and 5) and Connect middleware, also usable with a plain `node:http` server: refused requests
 * get 429 and never reach the next handler; errors go to `next(error)`, never to an unhandled rejection.
 *
 *     app.use(expressRateLimit({ client, describe: (req) => [{ remote_address: req.ip }] }));
 */
export function expressRateLimit<Request = IncomingMessage>(
  options: RateLimitOptions<Request>,
): (request: Request, response: ServerResponse, next: (error?: unknown) => void) => void {
  const guard = rateLimitGuard(options);
  return (request, response, next) => {
    guard(request).then((outcome) => {
      try {
        for (const [name, value] of Object.entries(outcome.headers)) {
          response.setHeader(name, value);
        }
      } catch (error) {
        next(error); // the response was already sent by someone else
        return;
      }
      if (outcome.allowed) {
        next();
      } else {
        response.statusCode = outcome.status;
        response.setHeader('Content-Length', Buffer.byteLength(outcome.body));
        response.end(outcome.body);
      }
    }, next);
  };
}

/**
 * `T`, not inferred from where the hook is used: Fastify's hook types are unions of overloads that TS
 * would narrow to `never`, so the request type comes from `describe`, else FastifyRequestLike. (TS 5.4's
 * NoInfer, written so that older compilers read the declarations too.)
 */
type NotInferred<T> = [T][T extends unknown ? 0 : never];

/** A Fastify request as `describe` sees it when no type is given: what Fastify's (v4 and v5) have. */
export interface FastifyRequestLike {
  readonly method: string;
  readonly url: string;
  readonly ip: string;
  readonly headers: IncomingHttpHeaders;
}

/** What `fastifyRateLimit` uses of Fastify's reply (v4 and v5). */
export interface FastifyReplyLike {
  code(statusCode: number): unknown;
  headers(values: Record<string, string>): unknown;
  send(payload?: unknown): unknown;
}

/**
 * A Fastify `onRequest` hook: for every route with `app.addHook('onRequest', fastifyRateLimit({...}))`,
 * or for one with its route option `onRequest`. Refused requests get 429 and never reach the handler;
 * errors go to Fastify's error handler.
 */
export function fastifyRateLimit<Request = FastifyRequestLike>(
  options: RateLimitOptions<Request>,
): (request: NotInferred<Request>, reply: FastifyReplyLike) => Promise<unknown> {
  const guard = rateLimitGuard(options);
  return async (request, reply) => {
    const outcome = await guard(request);
    reply.headers(outcome.headers as Record<string, string>);
    if (!outcome.allowed) {
      reply.code(outcome.status);
      reply.send(outcome.body);
      // An async hook that answered returns the reply, so Fastify stops there.
      return reply;
    }
    return undefined;
  };
}
