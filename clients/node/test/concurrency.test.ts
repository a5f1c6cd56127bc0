/**
 * Many calls in flight at once on one client, against a real Tollgate on each store: exactly the limit
 * is admitted, a refund token restores exactly once, exactly `max_in_flight` leases are held.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import { RefundDenied } from '@tollgate/client';

import { serve } from './support/fixtures.js';
import { newKey, stores } from './support/processes.js';

const CALLS = 120;

for (const store of stores()) {
  describe(`many calls in flight on the ${store} store`, () => {
    const tollgate = serve({ store });

    it('admits exactly the limit', async () => {
      const burst = [{ burst: newKey() }];

      const decisions = await Promise.all(Array.from({ length: CALLS }, () => tollgate.client.check(burst)));

      assert.equal(decisions.filter((decision) => decision.allowed).length, 50);
      assert.ok(decisions.every((decision) => !decision.failedOpen));
      assert.equal((await tollgate.client.peek(burst)).remaining, 0);
    });

    it("admits exactly the limit through Envoy's call", async () => {
      const burst = [{ envoy_burst: newKey() }];

      const decisions = await Promise.all(Array.from({ length: CALLS }, () => tollgate.client.shouldRateLimit(burst)));

      assert.equal(decisions.filter((decision) => decision.allowed).length, 50);
    });

    it('refunds a token exactly once when it is sent many times at once', async () => {
      const burst = [{ burst: newKey() }];
      const decision = await tollgate.client.check(burst, { cost: 10 });
      assert.equal(decision.remaining, 40);

      const refunds = await Promise.allSettled(Array.from({ length: 20 }, () => tollgate.client.refund(decision, burst)));

      const done = refunds.filter((refund) => refund.status === 'fulfilled');
      const denied = refunds.filter((refund) => refund.status === 'rejected' && refund.reason instanceof RefundDenied);
      assert.deepEqual([done.length, denied.length], [1, 19]);
      assert.equal((await tollgate.client.peek(burst)).remaining, 50);
    });

    it('holds exactly max_in_flight leases, and frees them on release', async () => {
      const slots = [{ slots: newKey() }];

      const leases = await Promise.all(Array.from({ length: 20 }, () => tollgate.client.acquire(slots)));

      const held = leases.filter((lease) => lease.held);
      assert.equal(held.length, 3);
      assert.ok(leases.filter((lease) => !lease.allowed).every((lease) => lease.retryAfterMs! > 0));
      assert.deepEqual(await Promise.all(held.map((lease) => lease.release())), [true, true, true]);
      const again = await Promise.all(Array.from({ length: 5 }, () => tollgate.client.acquire(slots)));
      assert.equal(again.filter((lease) => lease.held).length, 3);
      await Promise.all(again.map((lease) => lease.release()));
    });
  });
}
