/**
 * What the tests run against: real `tollgate serve` processes (embedded store, or a real
 * `redis-server` of their own), a listener that never answers, and a port with nothing behind it.
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { createInterface } from 'node:readline';

/** Generous: a debug build on a busy two-core machine can take a while to bind and load its rules. */
const STARTUP_TIMEOUT_MS = 30_000;

/**
 * Real-server tests must not fail open because a busy machine was slow: they get a long deadline and
 * check that nothing failed open. The failure tests set their own short one.
 */
export const PATIENT_DEADLINE_MS = 10_000;

/** The tests' rules: domain `test`. */
export const RULES = `domain: test
descriptors:
  # Two an hour per phone: the third check is refused, with a retry hint of about an hour.
  - key: phone
    rate_limit: {name: otp-per-phone, unit: hour, requests_per_unit: 2, algorithm: sliding_log}
  # Three exports a day per user (a token bucket, so refunds give units back), one running at a time.
  - key: export_user
    rate_limit: {name: exports-per-day, unit: day, requests_per_unit: 3, algorithm: token_bucket}
    concurrency: {max_in_flight: 1, lease_ttl: 5m}
  # Fifty an hour, for admission under concurrency.
  - key: burst
    rate_limit: {name: burst, unit: hour, requests_per_unit: 50, algorithm: token_bucket}
  # Fifty an hour on Envoy's fixed window.
  - key: envoy_burst
    rate_limit: {unit: hour, requests_per_unit: 50}
  # Three in flight at a time.
  - key: slots
    concurrency: {max_in_flight: 3, lease_ttl: 1m}
`;

// Every process a test starts is killed when the test process exits, or is told to stop (a signal
// ends a process without its 'exit' handlers).
const children = new Set<ChildProcess>();
function killAll(): void {
  for (const child of children) {
    child.kill('SIGKILL');
  }
}
process.on('exit', killAll);
for (const signal of ['SIGINT', 'SIGTERM', 'SIGHUP'] as const) {
  process.once(signal, () => {
    killAll();
    process.exit(128 + (signal === 'SIGINT' ? 2 : signal === 'SIGTERM' ? 15 : 1));
  });
}

/** A directory of this run's own, removed at exit. */
export function tempDir(prefix: string): string {
  const dir = mkdtempSync(path.join(tmpdir(), `tollgate-node-${prefix}-`));
  process.on('exit', () => rmSync(dir, { recursive: true, force: true }));
  return dir;
}

/** A directory holding RULES (or `rules`) as test.yaml. */
export function rulesDir(rules: string = RULES): string {
  const dir = tempDir('rules');
  writeFileSync(path.join(dir, 'test.yaml'), rules);
  return dir;
}

/** A descriptor value no other test uses, so tests share a server without sharing budgets. */
export function newKey(): string {
  return randomBytes(8).toString('hex');
}

/** The server binary: $TOLLGATE_BIN, which run-tests.sh sets to the debug build cargo made. */
function tollgateBin(): string {
  const binary = process.env['TOLLGATE_BIN'];
  if (binary === undefined || binary === '') {
    throw new Error('TOLLGATE_BIN is not set: run clients/node/run-tests.sh, or set it to a tollgate binary');
  }
  return binary;
}

/** Where the stores come from: the embedded one, or a real redis-server of the server's own. */
export type Store = 'embedded' | 'redis';

/**
 * The stores to test on: both, unless redis-server is not installed and TOLLGATE_REQUIRE_REDIS is not
 * 1 (scripts/test.sh sets it, so a broken install cannot turn the run silently green).
 */
export function stores(): Store[] {
  if (spawnSync('redis-server', ['--version']).error === undefined) {
    return ['embedded', 'redis'];
  }
  if (process.env['TOLLGATE_REQUIRE_REDIS'] === '1') {
    throw new Error('TOLLGATE_REQUIRE_REDIS=1 but redis-server is not installed (scripts/test.sh installs it)');
  }
  console.warn('skipping the Redis store: redis-server is not installed');
  return ['embedded'];
}

/** A `redis-server` on a free loopback port, with no persistence. */
export class Redis {
  readonly address: string;
  readonly #child: ChildProcess;

  private constructor(address: string, child: ChildProcess) {
    this.address = address;
    this.#child = child;
  }

  static async start(): Promise<Redis> {
    for (let attempt = 0; attempt < 5; attempt++) {
      const port = Number((await unusedAddress()).split(':')[1]);
      const args = ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--dir', tempDir('redis')];
      const child = spawn('redis-server', args, { stdio: 'ignore' });
      children.add(child);
      const redis = new Redis(`127.0.0.1:${port}`, child);
      if (await redis.#answers(5000)) {
        return redis;
      }
      await redis.stop(); // lost the race for the port: try another
    }
    throw new Error('could not start redis-server after 5 attempts');
  }

  async #answers(timeoutMs: number): Promise<boolean> {
    const giveUp = Date.now() + timeoutMs;
    while (Date.now() < giveUp && this.#child.exitCode === null) {
      if ((await ask(this.address, 'PING\r\n')).startsWith('+PONG')) {
        return true;
      }
      await sleep(20);
    }
    return false;
  }

  async stop(): Promise<void> {
    await kill(this.#child);
  }
}

/** How to start a Tollgate. */
export interface TollgateOptions {
  readonly store?: Store;
  /** The gRPC address to bind (default a free loopback port). */
  readonly grpcAddr?: string;
  /** Settings, over the clean environment the server gets. */
  readonly env?: Readonly<Record<string, string>>;
  readonly rulesDir?: string;
}

/**
 * A `tollgate serve` process, on free loopback ports, ready (its rules loaded) when `start` resolves.
 * With the Redis store it has a redis-server of its own, stopped with it.
 */
export class Tollgate {
  /** The gRPC address, as the serving line gives it (host:port, or unix:/path). */
  grpc = '';
  /** The HTTP (admin) address. */
  http = '';
  /** The server's log so far, for failure messages. */
  readonly log: string[] = [];
  readonly #child: ChildProcess;
  readonly #redis: Redis | null;

  private constructor(child: ChildProcess, redis: Redis | null) {
    this.#child = child;
    this.#redis = redis;
  }

  static async start(options: TollgateOptions = {}): Promise<Tollgate> {
    const redis = options.store === 'redis' ? await Redis.start() : null;
    // A clean environment, so nothing of the caller's (a REDIS_URL, a LOG_LEVEL) changes the server.
    const env: Record<string, string> = {
      PATH: process.env['PATH'] ?? '',
      LOG_LEVEL: 'warn',
      LOG_FORMAT: 'text',
      NO_COLOR: '1',
      TOLLGATE_RESPONSE_HEADERS: 'ietf,retry-after',
      // A debug build on a busy machine can miss Redis' default 20 ms deadline, and answer by the
      // failure mode: the server's own tests give it two seconds too.
      ...(redis === null ? {} : { REDIS_URL: redis.address, TOLLGATE_REDIS_DEADLINE: '2s' }),
      ...options.env,
    };
    const args = ['serve', '--config-dir', options.rulesDir ?? rulesDir(), '--http-addr', '127.0.0.1:0', '--debug-addr', '127.0.0.1:0'];
    if (env['GRPC_UDS'] === undefined) {
      args.push('--grpc-addr', options.grpcAddr ?? '127.0.0.1:0');
    }
    const child = spawn(tollgateBin(), args, { env, stdio: ['ignore', 'ignore', 'pipe'] });
    children.add(child);
    const server = new Tollgate(child, redis);
    try {
      await server.#ready();
    } catch (error) {
      await server.stop();
      throw error;
    }
    return server;
  }

  async #ready(): Promise<void> {
    const giveUp = Date.now() + STARTUP_TIMEOUT_MS;
    const serving = new Promise<void>((resolve, reject) => {
      createInterface({ input: this.#child.stderr! }).on('line', (raw) => {
        const line = raw.replace(/\x1b\[[0-9;]*m/g, '');
        this.log.push(line);
        const found = /tollgate serving grpc=(\S+) http=(\S+)/.exec(line);
        if (found) {
          this.grpc = found[1]!;
          this.http = found[2]!;
          resolve();
        }
      });
      this.#child.once('exit', (code) => reject(new Error(`tollgate exited (${code}):\n${this.log.join('\n')}`)));
      setTimeout(() => reject(new Error(`tollgate did not start:\n${this.log.join('\n')}`)), STARTUP_TIMEOUT_MS).unref();
    });
    await serving;
    while (!(await this.#healthy())) {
      if (Date.now() > giveUp || this.#child.exitCode !== null) {
        throw new Error(`tollgate did not become ready:\n${this.log.join('\n')}`);
      }
      await sleep(20);
    }
  }

  async #healthy(): Promise<boolean> {
    try {
      return (await fetch(`http://${this.http}/healthcheck`)).status === 200;
    } catch {
      return false;
    }
  }

  /** Kills the server (and its Redis) and waits for them. */
  async stop(): Promise<void> {
    await kill(this.#child);
    await this.#redis?.stop();
  }
}

/** A TCP listener that accepts connections and never says a word: a Tollgate that hangs. */
export class Blackhole {
  readonly address: string;
  readonly #server: net.Server;
  readonly #sockets = new Set<net.Socket>();

  private constructor(server: net.Server) {
    this.#server = server;
    this.address = `127.0.0.1:${(server.address() as net.AddressInfo).port}`;
    server.on('connection', (socket) => {
      this.#sockets.add(socket);
      socket.on('close', () => this.#sockets.delete(socket));
    });
  }

  static async start(): Promise<Blackhole> {
    const server = net.createServer();
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    return new Blackhole(server);
  }

  /** Stops listening and drops the connections. */
  async close(): Promise<void> {
    for (const socket of this.#sockets) {
      socket.destroy();
    }
    await new Promise((resolve) => this.#server.close(resolve));
  }
}

/** A loopback address with nothing listening: a port the kernel just handed out, then released. */
export async function unusedAddress(): Promise<string> {
  const probe = net.createServer();
  await new Promise<void>((resolve) => probe.listen(0, '127.0.0.1', resolve));
  const { port } = probe.address() as net.AddressInfo;
  await new Promise((resolve) => probe.close(resolve));
  return `127.0.0.1:${port}`;
}

export function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/** Sends `line` to `address` and resolves to the first answer ('' when the connection fails). */
function ask(address: string, line: string): Promise<string> {
  const [host, port] = address.split(':');
  return new Promise((resolve) => {
    const socket = net.connect(Number(port), host!, () => socket.write(line));
    socket.setTimeout(1000, () => socket.destroy());
    socket.once('data', (data) => {
      socket.destroy();
      resolve(data.toString());
    });
    socket.once('error', () => resolve(''));
    socket.once('close', () => resolve(''));
  });
}

async function kill(child: ChildProcess): Promise<void> {
  children.delete(child);
  if (child.exitCode !== null || child.signalCode !== null) {
    return;
  }
  const exited = new Promise((resolve) => child.once('exit', resolve));
  child.kill('SIGKILL');
  await exited;
}
