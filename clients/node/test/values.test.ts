/**
 * What the client decides without a server: descriptor shapes, argument checks, rounding, what stays
 * out of logs, and that the CommonJS build is the same package as the ESM one.
 */
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { describe, it } from 'node:test';
import util from 'node:util';

import * as esm from '@tollgate/client';
import { Client, DEFAULT_DEADLINE_MS, Decision, type Descriptors } from '@tollgate/client';

function offline(): Client {
  // Nothing listens at a port this low on loopback; no call below is sent anyway.
  return new Client({ target: '127.0.0.1:1', domain: 'test', logger: null });
}

describe('arguments', () => {
  it('refuses descriptors of the wrong shape with a hint, before sending anything', async () => {
    const client = offline();
    const wrong: unknown[] = [
      { phone: '5550100' }, // one descriptor where an array of them is expected
      [['phone', '5550100']],
      ['phone'],
      [{ phone: undefined }],
      [{ phone: null }],
      [{ phone: { nested: 'value' } }],
      [{ phone: Number.NaN }],
      [new Map([[1, 'one']])],
      'phone=5550100',
    ];
    for (const descriptors of wrong) {
      await assert.rejects(client.check(descriptors as Descriptors), TypeError, JSON.stringify(descriptors));
    }
    await assert.rejects(client.check({ phone: '1' } as unknown as Descriptors), /wrap a single descriptor in an array/);
    // The value stays out of the message: it may be a caller's data.
    await assert.rejects(client.check([{ phone: { secret: 'hunter2' } } as never]), (error: Error) => !error.message.includes('hunter2'));
    assert.equal(client.failedOpenCount, 0);
    client.close();
  });

  it('refuses bad costs, TTLs and hits', async () => {
    const client = offline();
    for (const cost of [-1, 1.5, Number.NaN, 2 ** 53]) {
      await assert.rejects(client.check([{ phone: '1' }], { cost }), RangeError);
    }
    for (const ttlMs of [0, -5, Number.POSITIVE_INFINITY]) {
      await assert.rejects(client.acquire([{ slots: '1' }], { ttlMs }), RangeError);
    }
    await assert.rejects(client.shouldRateLimit([{ phone: '1' }], { hitsAddend: 2 ** 32 }), RangeError);
    client.close();
  });

  it('refuses bad options when the client is made', () => {
    assert.throws(() => new Client({ domain: '' }), /domain is required/);
    assert.throws(() => new Client({ domain: 'test', deadlineMs: 0 }), RangeError);
    assert.throws(() => new Client({ domain: 'test', failure: 'sometimes' as 'open' }), RangeError);
    assert.throws(() => new Client({ domain: 'test', target: 'http://127.0.0.1:8081' }), /not a URL/);
    assert.throws(() => new Client({ domain: 'test', tls: {}, credentials: {} as never }), /pass one of them/);
  });

  it('has the siblings’ defaults', () => {
    const client = new Client({ domain: 'test' });

    assert.equal(DEFAULT_DEADLINE_MS, 25);
    assert.equal(client.deadlineMs, 25);
    assert.equal(client.failure, 'open');
    assert.equal(client.target, '127.0.0.1:8081');
    client.close();
  });
});

describe('decisions', () => {
  it('round a retry hint up to whole seconds, at least 1', () => {
    const cases: [number | null, number][] = [
      [null, 1],
      [0, 1],
      [200, 1],
      [1000, 1],
      [1001, 2],
      [3_599_990, 3600],
    ];
    for (const [retryAfterMs, seconds] of cases) {
      assert.equal(new Decision({ allowed: false, retryAfterMs }).retryAfterSeconds(), seconds, String(retryAfterMs));
    }
  });

  it('keep the refund token out of logs and JSON', () => {
    const decision = new Decision({ allowed: true, refundToken: 'AAAA-secret-token' });

    assert.ok(!util.inspect(decision).includes('secret'));
    assert.ok(!JSON.stringify(decision).includes('secret'));
    assert.match(JSON.stringify(decision), /"refundToken":"\[redacted\]"/);
    assert.equal(decision.refundToken, 'AAAA-secret-token');
  });
});

describe('the package', () => {
  it('is the same from require() and import', () => {
    const cjs = createRequire(import.meta.url)('@tollgate/client') as typeof esm;

    assert.deepEqual(Object.keys(cjs).sort(), Object.keys(esm).sort());
    assert.equal(typeof cjs.Client, 'function');
    assert.notEqual(cjs.Client, esm.Client); // two builds, as a dual package has
    assert.equal(new cjs.Client({ domain: 'test', logger: null }).deadlineMs, 25);
  });
});
