// A closed-loop load of one kind of call against a Tollgate (or `tollgate noop-serve`): CONCURRENCY
// calls in flight on one channel, each followed at once by the next, for DURATION seconds after a
// one-second warm-up. Prints one JSON line: decisions/s, p50 and p99 in milliseconds, the process's CPU
// per call in microseconds, errors.
//
//   node bench/closed-loop.mjs --target 127.0.0.1:8081 --call client-check [--concurrency 64] [--duration 10]
//
// Calls (one descriptor, `user=u-N` over 10,000 keys, domain `bench`):
//   client-check   Client.check, this package (build it first: npm run build)
//   bare-check     tollgate.v1.RateLimiter/Check through @grpc/grpc-js and @grpc/proto-loader alone, as
//                  an application without the package would make it: the same RPC, with a deadline
//   client-envoy   Client.shouldRateLimit (Envoy's RateLimitService, which noop-serve answers)
//   bare-envoy     envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit through grpc-js alone
// scripts/bench/bench-clients.sh runs them in turns, beside the Python client.
import path from 'node:path';
import { parseArgs } from 'node:util';
import { fileURLToPath } from 'node:url';

import * as grpc from '@grpc/grpc-js';
import * as loader from '@grpc/proto-loader';

import { Client } from '../dist/esm/index.js';

const { values } = parseArgs({
  options: {
    target: { type: 'string', default: '127.0.0.1:8081' },
    call: { type: 'string', default: 'client-check' },
    concurrency: { type: 'string', default: '64' },
    duration: { type: 'string', default: '10' },
  },
});
const concurrency = Number(values.concurrency);
const durationMs = Number(values.duration) * 1000;
const KEYS = 10_000;
// Generous: a deadline that a busy machine never meets would measure the failure policy instead.
const DEADLINE_MS = 5000;

function bareStub(file, service) {
  const protoDir = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../../proto');
  const definition = loader.loadSync(file, { includeDirs: [protoDir], keepCase: false, longs: Number, enums: String, defaults: true });
  const Stub = service.split('.').reduce((at, name) => at[name], grpc.loadPackageDefinition(definition));
  return new Stub(values.target, grpc.credentials.createInsecure());
}

/** One call of the chosen kind for key `i`; resolves when answered. */
function caller(kind) {
  const descriptors = (i) => [{ user: `u-${i % KEYS}` }];
  const wire = (i) => [{ entries: [{ key: 'user', value: `u-${i % KEYS}` }] }];
  const promised = (stub, method, request) =>
    new Promise((resolve, reject) =>
      stub[method](request, { deadline: Date.now() + DEADLINE_MS }, (error, answer) => (error ? reject(error) : resolve(answer))),
    );
  switch (kind) {
    case 'client-check': {
      const client = new Client({ target: values.target, domain: 'bench', deadlineMs: DEADLINE_MS, failure: 'closed' });
      return (i) => client.check(descriptors(i));
    }
    case 'client-envoy': {
      const client = new Client({ target: values.target, domain: 'bench', deadlineMs: DEADLINE_MS, failure: 'closed' });
      return (i) => client.shouldRateLimit(descriptors(i));
    }
    case 'bare-check': {
      const stub = bareStub('tollgate/v1/ratelimiter.proto', 'tollgate.v1.RateLimiter');
      return (i) => promised(stub, 'Check', { domain: 'bench', descriptors: wire(i), cost: 1 });
    }
    case 'bare-envoy': {
      const stub = bareStub('envoy/service/ratelimit/v3/rls.proto', 'envoy.service.ratelimit.v3.RateLimitService');
      return (i) => promised(stub, 'ShouldRateLimit', { domain: 'bench', descriptors: wire(i) });
    }
    default:
      throw new Error(`unknown --call ${kind}`);
  }
}

/** Runs the load until `untilMs`; returns the latencies (ms) of the calls that completed in the window. */
async function load(call, untilMs) {
  const latencies = [];
  let errors = 0;
  let next = 0;
  const worker = async () => {
    while (performance.now() < untilMs) {
      const started = performance.now();
      try {
        await call(next++);
        latencies.push(performance.now() - started);
      } catch {
        errors += 1;
      }
    }
  };
  await Promise.all(Array.from({ length: concurrency }, worker));
  return { latencies, errors };
}

const call = caller(values.call);
await load(call, performance.now() + 1000); // warm-up: the connection, the JIT
const started = performance.now();
const cpuBefore = process.cpuUsage();
const { latencies, errors } = await load(call, started + durationMs);
const cpu = process.cpuUsage(cpuBefore);
const elapsedS = (performance.now() - started) / 1000;
const sorted = Float64Array.from(latencies).sort();
const at = (q) => sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))];
console.log(
  JSON.stringify({
    call: values.call,
    decisions_per_s: Math.round(latencies.length / elapsedS),
    p50_ms: Number(at(0.5).toFixed(3)),
    p99_ms: Number(at(0.99).toFixed(3)),
    // The load generator's own CPU per call (user + system): what the client costs the application,
    // whatever share of a busy machine's cores the process got.
    client_cpu_us: Number(((cpu.user + cpu.system) / Math.max(latencies.length, 1)).toFixed(1)),
    errors,
  }),
);
process.exit(0);
