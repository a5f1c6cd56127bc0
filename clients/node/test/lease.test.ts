/** Concurrency leases against a real Tollgate on each store (one export at a time per user). */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import { LeaseNotFound, LeaseRefused, type Lease } from '@tollgate/client';

import { serve } from './support/fixtures.js';
import { newKey, sleep, stores } from './support/processes.js';

for (const store of stores()) {
  describe(`leases on the ${store} store`, () => {
    const tollgate = serve({ store });

    it('refuses a second lease until the first is released', async () => {
      const { client } = tollgate;
      const export_ = [{ export_user: newKey() }];
      const first = await client.acquire(export_);

      const second = await client.acquire(export_);

      assert.ok(first.allowed && first.held && first.id && !first.failedOpen);
      assert.equal(first.ttlMs, 300_000); // the rule's lease_ttl
      assert.ok(!second.allowed && !second.held && second.id === null);
      assert.ok(second.retryAfterMs! > 299_000 && second.retryAfterMs! <= 300_000); // until the first expires
      assert.equal(second.retryAfterSeconds(), 300);
      assert.equal(await first.release(), true);
      assert.ok((await client.acquire(export_)).held);
    });

    it('withLease releases when the work resolves', async () => {
      const { client } = tollgate;
      const export_ = [{ export_user: newKey() }];

      const result = await client.withLease(export_, async (lease) => {
        assert.ok(lease.held);
        assert.equal((await client.acquire(export_)).allowed, false);
        return 'exported';
      });

      assert.equal(result, 'exported');
      assert.ok((await client.acquire(export_)).held);
    });

    it('withLease releases when the work throws, and the error propagates', async () => {
      const { client } = tollgate;
      const export_ = [{ export_user: newKey() }];
      let held: Lease | undefined;

      await assert.rejects(
        client.withLease(export_, (lease) => {
          held = lease;
          throw new RangeError('the export failed');
        }),
        RangeError,
      );

      assert.equal(held?.held, false);
      assert.ok((await client.acquire(export_)).held);
    });

    it('withLease does not run the work when every slot is taken', async () => {
      const { client } = tollgate;
      const export_ = [{ export_user: newKey() }];
      await client.acquire(export_);
      let ran = false;

      const refused = await client
        .withLease(export_, () => {
          ran = true;
        })
        .catch((error: unknown) => error);

      assert.ok(refused instanceof LeaseRefused, String(refused));
      assert.equal(refused.retryAfterSeconds(), 300);
      assert.equal(ran, false);
    });

    it('a refused lease releases nothing and cannot be renewed', async () => {
      const { client } = tollgate;
      const export_ = [{ export_user: newKey() }];
      await client.acquire(export_);
      const refused = await client.acquire(export_);

      assert.equal(await refused.release(), false);
      await assert.rejects(refused.renew(), LeaseNotFound);
    });

    it('releasing twice does nothing the second time', async () => {
      const lease = await tollgate.client.acquire([{ export_user: newKey() }]);

      assert.equal(await lease.release(), true);
      assert.equal(await lease.release(), false);
    });

    it('renews with a new TTL, by default the rule`s', async () => {
      const lease = await tollgate.client.acquire([{ export_user: newKey() }], { ttlMs: 30_000 });
      assert.equal(lease.ttlMs, 30_000);

      await lease.renew({ ttlMs: 60_500 });

      assert.equal(lease.ttlMs, 60_500);
      await lease.renew();
      assert.equal(lease.ttlMs, 300_000);
      assert.equal(await lease.release(), true);
    });

    it('renewing an expired lease throws LeaseNotFound and frees the slot', async () => {
      const { client } = tollgate;
      const export_ = [{ export_user: newKey() }];
      const lease = await client.acquire(export_, { ttlMs: 50 });
      // The one real wait in these tests: the server's clock decides expiry.
      await sleep(300);

      await assert.rejects(lease.renew(), LeaseNotFound);

      assert.equal(lease.held, false);
      assert.ok((await client.acquire(export_)).allowed);
    });
  });
}
