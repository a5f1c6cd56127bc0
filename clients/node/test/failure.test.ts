/**
 * Deadlines and the failure policy: a Tollgate that hangs (accepts connections, never answers), one
 * that is down, and one stopped mid-way. Asserted: the policy's answer, and that it came by the deadline
 * (with a generous margin for a busy machine), never a late answer or a hang.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';

import { Client, Unavailable, type ClientOptions, type Logger } from '@tollgate/client';

import { Blackhole, Tollgate, newKey, sleep, unusedAddress } from './support/processes.js';

const DEADLINE_MS = 50;
/** How long a call may take past its deadline: timers and a busy machine, never a hang. */
const SLACK_MS = 1000;
const OTP = [{ phone: '5550100' }];

// An unhandled rejection from the client would end the process anyway; counting them says which test.
let unhandled = 0;
process.on('unhandledRejection', () => {
  unhandled += 1;
});

/** A logger that keeps what it is told. */
function recorder(): Logger & { lines: string[] } {
  const lines: string[] = [];
  return { lines, warn: (line) => lines.push(`warn: ${line}`), info: (line) => lines.push(`info: ${line}`) };
}

const clients: Client[] = [];
function client(target: string, options: Partial<ClientOptions> = {}): Client {
  const made = new Client({ target, domain: 'test', deadlineMs: DEADLINE_MS, logger: null, ...options });
  clients.push(made);
  return made;
}

/** What `call` resolves to; asserts that it resolved by the deadline. */
async function answered<T>(call: () => Promise<T>, deadlineMs = DEADLINE_MS): Promise<T> {
  const started = performance.now();
  const value = await call();
  inTime(started, deadlineMs);
  return value;
}

/** What `call` rejects with; asserts that it rejected by the deadline. */
async function failed(call: () => Promise<unknown>, deadlineMs = DEADLINE_MS): Promise<unknown> {
  const started = performance.now();
  const error = await call().then(
    (value) => assert.fail(`resolved to ${String(value)}`),
    (rejection: unknown) => rejection,
  );
  inTime(started, deadlineMs);
  return error;
}

function inTime(started: number, deadlineMs: number): void {
  const took = performance.now() - started;
  assert.ok(took < deadlineMs + SLACK_MS, `settled after ${took.toFixed(0)} ms, deadline ${deadlineMs} ms`);
}

after(() => {
  for (const made of clients) {
    made.close();
  }
  assert.equal(unhandled, 0, 'unhandled rejections');
});

describe('a Tollgate that hangs', () => {
  let blackhole: Blackhole;
  before(async () => {
    blackhole = await Blackhole.start();
  });
  after(() => blackhole.close());

  it('fails open within the deadline, and counts it', async () => {
    const failingOpen = client(blackhole.address);

    const decision = await answered(() => failingOpen.check(OTP));

    assert.ok(decision.allowed && decision.failedOpen);
    assert.equal(decision.refundToken, null);
    assert.equal(decision.remaining, null);
    assert.ok((await answered(() => failingOpen.peek(OTP))).failedOpen);
    assert.ok((await answered(() => failingOpen.shouldRateLimit(OTP))).failedOpen);
    const lease = await answered(() => failingOpen.acquire([{ export_user: 'ada' }]));
    assert.ok(lease.allowed && lease.failedOpen && !lease.held);
    assert.equal(failingOpen.failedOpenCount, 4);
  });

  it('throws Unavailable within the deadline when failing closed', async () => {
    const failingClosed = client(blackhole.address, { failure: 'closed' });

    assert.ok((await failed(() => failingClosed.check(OTP))) instanceof Unavailable);
    assert.ok((await failed(() => failingClosed.acquire(OTP))) instanceof Unavailable);
    assert.ok((await failed(() => failingClosed.shouldRateLimit(OTP))) instanceof Unavailable);
    assert.equal(failingClosed.failedOpenCount, 0);
  });

  it('keeps to a longer deadline too', async () => {
    const patient = client(blackhole.address, { deadlineMs: 400, failure: 'closed' });

    const started = performance.now();
    const error = await failed(() => patient.check(OTP), 400);

    assert.ok(error instanceof Unavailable);
    assert.match(error.message, /could not be asked \(DEADLINE_EXCEEDED/);
    // Not early either: the answer waited for the deadline.
    assert.ok(performance.now() - started >= 390);
  });
});

describe('a Tollgate that is down', () => {
  let unused: string;
  before(async () => {
    unused = await unusedAddress();
  });

  it('applies the policy to clients made while it is down', async () => {
    // Channels connect on the first call, so making the clients succeeds.
    const failingOpen = client(unused);
    const failingClosed = client(unused, { failure: 'closed' });

    assert.ok((await failingOpen.check(OTP)).failedOpen);
    assert.ok((await failed(() => failingClosed.check(OTP))) instanceof Unavailable);
  });

  it('refunds, renewals and releases throw Unavailable whatever the policy', async () => {
    const failingOpen = client(unused);

    assert.ok((await failed(() => failingOpen.refund('a-token', OTP))) instanceof Unavailable);
    const lease = await failingOpen.acquire([{ export_user: 'ada' }]);
    assert.equal(await lease.release(), false); // failed open: holds nothing, releases nothing
    await lease.renew(); // nothing to renew, no error
    assert.equal(failingOpen.failedOpenCount, 1);
  });

  it('tells of an outage once when it starts and once when it ends', async () => {
    const logger = recorder();
    const watched = client(unused, { logger });

    await watched.check(OTP);
    await watched.check(OTP);
    await watched.check(OTP);

    assert.equal(logger.lines.length, 1, logger.lines.join('\n'));
    assert.match(logger.lines[0]!, /^warn: Tollgate at 127\.0\.0\.1:\d+ could not be asked .*let the work go ahead/);
  });
});

describe('a Tollgate that stops and comes back', () => {
  it('fails open, then closed, by the deadline once stopped; is used again once back', async () => {
    const server = await Tollgate.start();
    const logger = recorder();
    const failingOpen = client(server.grpc, { deadlineMs: 2000, logger });
    const failingClosed = client(server.grpc, { deadlineMs: 2000, failure: 'closed' });
    assert.equal((await failingOpen.check([{ phone: newKey() }])).failedOpen, false);

    await server.stop();

    assert.ok((await answered(() => failingOpen.check(OTP), 2000)).failedOpen);
    assert.ok((await failed(() => failingClosed.check(OTP), 2000)) instanceof Unavailable);

    const back = await Tollgate.start({ grpcAddr: server.grpc });
    try {
      // gRPC retries the connection after a backoff the client caps at two seconds.
      const giveUp = Date.now() + 10_000;
      while ((await failingOpen.check([{ phone: newKey() }])).failedOpen) {
        assert.ok(Date.now() < giveUp, 'the client never reconnected');
        await sleep(50);
      }
      assert.deepEqual(
        logger.lines.map((line) => line.split(':')[0]),
        ['warn', 'info'],
      );
      assert.match(logger.lines[1]!, /answers again \(\d+ decisions failed open so far\)/);
    } finally {
      await back.stop();
    }
  });

  it('withLease logs a release it cannot make, and does not throw it', async () => {
    const server = await Tollgate.start();
    const logger = recorder();
    const failingClosed = client(server.grpc, { deadlineMs: 2000, failure: 'closed', logger });

    const result = await failingClosed.withLease([{ export_user: newKey() }], async (lease) => {
      assert.ok(lease.held);
      await server.stop();
      return 'done';
    });

    assert.equal(result, 'done');
    assert.ok(logger.lines.some((line) => /^warn: cannot release Tollgate lease [0-9a-f]+ .*expires after its TTL/.test(line)));
  });

  it('an explicit release throws Unavailable when Tollgate is gone, and the lease stays held', async () => {
    const server = await Tollgate.start();
    const lease = await client(server.grpc, { deadlineMs: 2000 }).acquire([{ export_user: newKey() }]);
    await server.stop();

    assert.ok((await failed(() => lease.release(), 2000)) instanceof Unavailable);
    assert.equal(lease.held, true); // so the release can be retried
  });
});
