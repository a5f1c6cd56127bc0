/**
 * How applications write the middleware in TypeScript: compiled with the tests (never run), so the
 * package's declarations must accept each form, and type `req` in `describe` without an annotation.
 */
import express from 'express';
import Fastify, { type FastifyRequest } from 'fastify';

import { Client, expressRateLimit, fastifyRateLimit } from '@tollgate/client';

const client = new Client({ domain: 'api' });

// Express infers `req` from app.use.
express().use(expressRateLimit({ client, describe: (req) => [{ remote_address: req.ip ?? '' }] }));

const app = Fastify();
// Fastify: FastifyRequestLike when unannotated, or the app's own FastifyRequest.
app.addHook('onRequest', fastifyRateLimit({ client, describe: (req) => [{ remote_address: req.ip }] }));
app.addHook('onRequest', fastifyRateLimit({ client, describe: (req: FastifyRequest) => [{ request: req.id }] }));
// As a route's own hook, alone or among others.
app.get('/search', { onRequest: fastifyRateLimit({ client, describe: (req) => [{ path: req.url }] }) }, async () => 'ok');
app.get(
  '/export',
  { onRequest: [fastifyRateLimit({ client, describe: (req: FastifyRequest) => [{ path: req.url }] })] },
  async () => 'ok',
);
