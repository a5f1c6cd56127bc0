/**
 * The middleware in real Express and Fastify apps, and the plain guard in a bare node:http server, each
 * listening on a real socket and asked over HTTP, in front of a real Tollgate.
 */
import assert from 'node:assert/strict';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { after, before, describe, it } from 'node:test';

import express from 'express';
import Fastify, { type FastifyRequest } from 'fastify';

import { expressRateLimit, fastifyRateLimit, rateLimitGuard, type Client, type RateLimitOptions } from '@tollgate/client';

import { serve } from './support/fixtures.js';
import { newKey, unusedAddress } from './support/processes.js';

/** What the apps see of a request: its path and its `x-phone` header. */
interface Seen {
  readonly path: string;
  readonly phone: string | undefined;
}

/** Limits /send-otp by the x-phone header (two an hour); /boom's describe throws; nothing else is limited. */
function describeRequest(request: Seen): ReturnType<RateLimitOptions<unknown>['describe']> {
  if (request.path === '/boom') {
    throw new Error('describe failed');
  }
  // A missing header passes undefined on purpose: the client refuses it at run time too.
  return request.path === '/send-otp' ? [{ phone: request.phone as string }] : null;
}

/** An app under test: where it listens, how many requests its handlers ran, and how to stop it. */
interface App {
  readonly url: string;
  readonly handled: () => number;
  close(): Promise<void>;
}

type AppMaker = (client: Client) => Promise<App>;

const expressApp: AppMaker = async (client) => {
  let handled = 0;
  const app = express();
  app.use(expressRateLimit({ client, describe: (req: express.Request) => describeRequest({ path: req.path, phone: req.get('x-phone') }) }));
  app.all('/{*path}', (_req, res) => {
    handled += 1;
    res.set('x-app', 'yes').send('ok');
  });
  // Errors from describe and from Tollgate reach Express's error handling.
  app.use((error: Error, _req: express.Request, res: express.Response, _next: express.NextFunction) => {
    res.status(500).send(`error: ${error.name}`);
  });
  const server = http.createServer(app);
  return listening(server, () => handled);
};

const fastifyApp: AppMaker = async (client) => {
  let handled = 0;
  const app = Fastify();
  app.addHook(
    'onRequest',
    fastifyRateLimit({
      client,
      describe: (request: FastifyRequest) =>
        describeRequest({ path: request.url.split('?')[0]!, phone: request.headers['x-phone'] as string | undefined }),
    }),
  );
  app.all('/*', async (_request, reply) => {
    handled += 1;
    reply.header('x-app', 'yes');
    return 'ok';
  });
  app.setErrorHandler(async (error: Error, _request, reply) => reply.code(500).send(`error: ${error.name}`));
  await app.listen({ port: 0, host: '127.0.0.1' });
  const { port } = app.server.address() as AddressInfo;
  return { url: `http://127.0.0.1:${port}`, handled: () => handled, close: () => app.close() };
};

/** The guard alone, in a bare node:http server: what any framework would do with it. */
const plainApp: AppMaker = async (client) => {
  let handled = 0;
  const guard = rateLimitGuard({
    client,
    describe: (req: http.IncomingMessage) => describeRequest({ path: req.url!.split('?')[0]!, phone: req.headers['x-phone'] as string | undefined }),
  });
  const server = http.createServer((req, res) => {
    guard(req).then(
      (outcome) => {
        if (!outcome.allowed) {
          res.writeHead(outcome.status, outcome.headers).end(outcome.body);
          return;
        }
        handled += 1;
        res.writeHead(200, { ...outcome.headers, 'x-app': 'yes' }).end('ok');
      },
      (error: Error) => res.writeHead(500).end(`error: ${error.name}`),
    );
  });
  return listening(server, () => handled);
};

async function listening(server: http.Server, handled: () => number): Promise<App> {
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    handled,
    close: () => new Promise((resolve) => server.close(() => resolve())),
  };
}

async function post(app: App, path: string, phone?: string): Promise<Response> {
  return fetch(`${app.url}${path}`, { method: 'POST', headers: phone === undefined ? {} : { 'x-phone': phone } });
}

for (const [framework, make] of [
  ['Express', expressApp],
  ['Fastify', fastifyApp],
  ['a plain node:http server', plainApp],
] as const) {
  describe(`the middleware in ${framework}`, () => {
    const tollgate = serve();
    let app: App;
    let closedApp: App;
    let openApp: App;
    before(async () => {
      app = await make(tollgate.client);
      const down = await unusedAddress();
      closedApp = await make(tollgate.clientWith({ target: down, deadlineMs: 50, failure: 'closed', logger: null }));
      openApp = await make(tollgate.clientWith({ target: down, deadlineMs: 50, failure: 'open', logger: null }));
    });
    after(async () => {
      await Promise.all([app, closedApp, openApp].map((made) => made.close()));
    });

    it('lets allowed requests through with the rate-limit headers', async () => {
      const response = await post(app, '/send-otp', newKey());

      assert.equal(response.status, 200);
      assert.equal(await response.text(), 'ok');
      assert.equal(response.headers.get('x-app'), 'yes');
      assert.equal(response.headers.get('ratelimit-policy'), '"otp-per-phone";q=2;w=3600');
      assert.match(response.headers.get('ratelimit') ?? '', /^"otp-per-phone";r=1;/);
    });

    it('answers refused requests with 429 and Retry-After, without running the handler', async () => {
      const phone = newKey();
      const before = app.handled();
      const statuses = [];
      for (let i = 0; i < 4; i++) {
        statuses.push((await post(app, '/send-otp', phone)).status);
      }
      const refused = await post(app, '/send-otp', phone);

      assert.deepEqual([...statuses, refused.status], [200, 200, 429, 429, 429]);
      assert.equal(app.handled() - before, 2);
      const retryAfter = Number(refused.headers.get('retry-after'));
      assert.ok(retryAfter > 3590 && retryAfter <= 3600, String(retryAfter));
      assert.match(refused.headers.get('ratelimit') ?? '', /^"otp-per-phone";r=0;/);
      assert.match(refused.headers.get('content-type') ?? '', /^application\/json/);
      assert.deepEqual(await refused.json(), { error: 'rate_limited', retry_after: retryAfter });
    });

    it('lets through unchecked what describe returns null for', async () => {
      const response = await post(app, '/search');

      assert.equal(response.status, 200);
      assert.equal(response.headers.get('ratelimit'), null);
    });

    it('hands errors to the framework: a describe that throws, a descriptor Tollgate rejects', async () => {
      const thrown = await post(app, '/boom');
      const rejected = await post(app, '/send-otp'); // no x-phone: the descriptor's value is undefined

      assert.equal(thrown.status, 500);
      assert.equal(await thrown.text(), 'error: Error');
      assert.equal(rejected.status, 500);
      assert.equal(await rejected.text(), 'error: TypeError');
    });

    it('answers 503 when Tollgate is down and the client fails closed', async () => {
      const response = await post(closedApp, '/send-otp', newKey());

      assert.equal(response.status, 503);
      assert.equal(closedApp.handled(), 0);
    });

    it('lets requests through when Tollgate is down and the client fails open', async () => {
      const response = await post(openApp, '/send-otp', newKey());

      assert.equal(response.status, 200);
      assert.equal(openApp.handled(), 1);
    });
  });
}
