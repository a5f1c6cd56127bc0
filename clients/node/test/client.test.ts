/** Checks, peeks, refunds and Envoy's call against a real Tollgate, on each store. */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import { RefundDenied, TollgateError, Unavailable, UnknownDomain } from '@tollgate/client';

import { header, serve } from './support/fixtures.js';
import { grpc } from './support/grpc.js';
import { newKey, stores } from './support/processes.js';

for (const store of stores()) {
  describe(`checks on the ${store} store`, () => {
    const tollgate = serve({ store });

    it('allows until the limit, then refuses with a retry hint', async () => {
      const { client } = tollgate;
      const otp = [{ phone: newKey() }];

      const [first, second, third] = [await client.check(otp), await client.check(otp), await client.check(otp)];

      assert.deepEqual([first.allowed, second.allowed, third.allowed], [true, true, false]);
      assert.deepEqual([first.remaining, second.remaining, third.remaining], [1, 0, 0]);
      assert.ok(first.refundToken && third.refundToken === null);
      // The sliding log's oldest entry leaves in about an hour; exact, in whole milliseconds.
      assert.ok(third.retryAfterMs! > 3_590_000 && third.retryAfterMs! <= 3_600_000, `${third.retryAfterMs}`);
      assert.ok(Number.isInteger(third.retryAfterMs));
      assert.equal(third.retryAfterSeconds(), Math.ceil(third.retryAfterMs! / 1000));
      assert.equal(third.results[0]!.limit!.name, 'otp-per-phone');
      assert.equal(third.results[0]!.limit!.windowMs, 3_600_000);
      assert.ok([first, second, third].every((decision) => !decision.failedOpen));
    });

    it('hands out the ready headers: RateLimit, RateLimit-Policy, and Retry-After on a refusal', async () => {
      const { client } = tollgate;
      const otp = [{ phone: newKey() }];
      const allowed = await client.check(otp);
      await client.check(otp);
      const refused = await client.check(otp);

      assert.equal(header(allowed.headers, 'RateLimit-Policy'), '"otp-per-phone";q=2;w=3600');
      assert.match(header(allowed.headers, 'RateLimit'), /^"otp-per-phone";r=1;t=\d+$/);
      assert.throws(() => header(allowed.headers, 'Retry-After'));
      assert.equal(header(refused.headers, 'Retry-After'), String(refused.retryAfterSeconds()));
    });

    it('adds Retry-After to a refusal when the server hands out none', async () => {
      // A cost above the limit: refused with no hint at all, and the server adds no Retry-After.
      const refused = await tollgate.client.check([{ export_user: newKey() }], { cost: 4 });

      assert.equal(refused.allowed, false);
      assert.equal(refused.retryAfterMs, null);
      assert.equal(refused.retryAfterSeconds(), 1);
      assert.equal(header(refused.headers, 'Retry-After'), '1');
    });

    it('takes descriptors as objects, Maps or [key, value] pairs, and numbers as values', async () => {
      const { client } = tollgate;
      const user = newKey();
      await client.check([{ export_user: user }]);

      assert.equal((await client.peek([[['export_user', user]]])).remaining, 2);
      assert.equal((await client.peek([new Map([['export_user', user]])])).remaining, 2);
      const numbered = 1_000_000 + Math.floor(Math.random() * 1e9);
      await client.check([{ export_user: numbered }]);
      assert.equal((await client.peek([{ export_user: String(numbered) }])).remaining, 2);
    });

    it('peeks without consuming', async () => {
      const { client } = tollgate;
      const export_ = [{ export_user: newKey() }];
      await client.check(export_);

      const [first, second] = [await client.peek(export_), await client.peek(export_)];

      assert.deepEqual([first.remaining, second.remaining], [2, 2]);
      assert.equal(first.refundToken, null);
      assert.equal((await client.peek(export_, { cost: 3 })).allowed, false); // only 2 left
    });

    it('refunds with the decision, once', async () => {
      const { client } = tollgate;
      const export_ = [{ export_user: newKey() }];
      const decision = await client.check(export_);
      assert.equal((await client.peek(export_)).remaining, 2);

      const refunded = await client.refund(decision, export_);

      assert.equal(refunded?.remaining, 3);
      assert.equal((await client.peek(export_)).remaining, 3);
      // The token alone works too, but only once.
      const again = await client.refund(decision.refundToken!, export_).catch((error: unknown) => error);
      assert.ok(again instanceof RefundDenied, String(again));
      assert.equal(again.code, grpc.status.PERMISSION_DENIED);
    });

    it('denies a forged token, or a real one for other descriptors, and changes nothing', async () => {
      const { client } = tollgate;
      const user = newKey();
      const decision = await client.check([{ export_user: user }]);
      const token = decision.refundToken!;
      const forged = token.slice(0, 20) + (token[20] === 'A' ? 'B' : 'A') + token.slice(21);

      await assert.rejects(client.refund(forged, [{ export_user: user }]), RefundDenied);
      await assert.rejects(client.refund(decision, [{ export_user: `${user}-other` }]), RefundDenied);

      assert.equal((await client.peek([{ export_user: user }])).remaining, 2);
    });

    it('refunds nothing, without a call, for a decision that consumed nothing', async () => {
      const export_ = [{ export_user: newKey() }];

      assert.equal(await tollgate.client.refund(await tollgate.client.peek(export_), export_), null);
    });

    it('consumes nothing anywhere when an all-or-nothing check is refused', async () => {
      const { client } = tollgate;
      const key = newKey();
      await client.check([{ phone: key }], { cost: 2 }); // the phone's hour is used up

      const decision = await client.checkAllOrNothing([{ export_user: key }, { phone: key }]);

      assert.equal(decision.allowed, false);
      assert.equal((await client.peek([{ export_user: key }])).remaining, 3);
    });

    it('throws what the caller must fix, even when failing open', async () => {
      const client = tollgate.clientWith({ failure: 'open' });
      const malformed = await client.check([]).catch((error: unknown) => error);

      assert.ok(malformed instanceof TollgateError && !(malformed instanceof Unavailable), String(malformed));
      assert.equal(malformed.code, grpc.status.INVALID_ARGUMENT);

      const typo = tollgate.clientWith({ domain: 'tset', failure: 'open' });
      const unknown = await typo.check([{ phone: '5550100' }]).catch((error: unknown) => error);
      assert.ok(unknown instanceof UnknownDomain, String(unknown));
      assert.match(unknown.message, /tset.*fix the domain/);
      assert.equal(client.failedOpenCount + typo.failedOpenCount, 0);
    });

    it("asks Envoy's question with Envoy's answers", async () => {
      const { client } = tollgate;
      const otp = [{ phone: newKey() }];

      const answers = [
        await client.shouldRateLimit(otp),
        await client.shouldRateLimit(otp),
        await client.shouldRateLimit(otp),
      ];

      assert.deepEqual(
        answers.map((answer) => answer.overallCode),
        ['OK', 'OK', 'OVER_LIMIT'],
      );
      const refused = answers[2]!;
      assert.equal(refused.allowed, false);
      assert.equal(refused.remaining, 0);
      assert.equal(refused.statuses[0]!.currentLimit!.requestsPerUnit, 2);
      // Envoy's protocol has whole seconds.
      assert.equal(refused.retryAfterMs! % 1000, 0);
      assert.equal(header(refused.headers, 'Retry-After'), String(refused.retryAfterSeconds()));
      // The native API sees the same counter.
      assert.equal((await client.peek(otp)).remaining, 0);
      // An unknown domain is allowed, as Envoy's calls are.
      assert.equal((await tollgate.clientWith({ domain: 'tset' }).shouldRateLimit(otp)).overallCode, 'OK');
    });
  });
}
