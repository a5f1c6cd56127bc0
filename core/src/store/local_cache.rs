//! The local over-limit cache (envoyproxy/ratelimit's `LOCAL_CACHE_SIZE_IN_BYTES`), in front of a
//! remote store.
//!
//! When the store denies a request, its `retry_after` says until when the same request cannot pass.
//! Until then the same limit is answered locally: OVER_LIMIT, without a Redis round trip. So a client
//! hammering a key that is already over its limit costs Redis nothing. The answer is exact for every
//! algorithm, because `retry_after` is the earliest time the same request could pass. A cached denial
//! covers requests of the same or higher cost only, since a cheaper request may pass sooner. The cache
//! key includes the whole limit (requests, window, burst, algorithm), so a reload that raises a limit
//! is never blocked by an old entry (envoyproxy/ratelimit issue #1077).
//!
//! Items the cache answers are not sent. The others are sent, with costs adjusted so the batch keeps
//! its meaning:
//! - `AllOrNothing` and `StopIncrementWhenOverLimit`: nothing else may consume, so every remaining
//!   item becomes a zero-cost check;
//! - `Independent`: only the other limits of the same descriptor become checks.
//!
//! Peeks ([`CommitPolicy::Peek`]) are answered from cached denials like consuming batches (a denial is
//! exact whatever the batch would have written) and keep their costs when sent, since they write
//! nothing; their own denials are not cached, because a peek's answer for a key that appears twice
//! reflects a first consumption that was never written.
//!
//! Refunds ([`CommitPolicy::Refund`]) are never answered from the cache: every item is sent, and the
//! cached denials of the refunded (key, limit) pairs are dropped once the store has answered, since the
//! refund may let the same request pass sooner. That is this replica only: other replicas keep their
//! cached denial until it expires, i.e. for at most the `retry_after` of the denial they cached, and
//! answer OVER_LIMIT for that key until then (as they would have without the refund). Units another
//! replica gives back from a hot-key slice ([`super::hot_keys`]) are the same case.
//!
//! Memory is bounded: [`LocalCache::new`] takes a byte budget. A full shard first drops expired entries,
//! then stops caching new ones until entries expire.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use hashbrown::{DefaultHashBuilder, HashTable};

use super::lease::{AcquireRequest, LeaseSlot, LeaseStore, ReleaseRequest, Released};
use super::{Batch, BatchItem, CommitPolicy, Store, StoreError};
use crate::algorithm::{Decision, Limit};
use crate::clock::Clock;

/// Independently locked parts of the cache.
const SHARDS: usize = 16;

/// Rough memory cost of one entry (key text, limit, bookkeeping), to turn a byte budget into a count.
const ENTRY_BYTES: usize = 160;

#[derive(Debug)]
struct Blocked {
    key: String,
    limit: Limit,
    /// Told apart from a key of Tollgate's own with the same text ([`BatchItem::go_format`]).
    go_format: bool,
    cost: u64,
    until_us: u64,
}

impl Blocked {
    fn is(&self, item: &BatchItem) -> bool {
        self.limit == item.limit && self.go_format == item.go_format && self.key == item.key
    }
}

/// A store wrapped with the over-limit cache.
#[derive(Debug)]
pub struct LocalCache<S> {
    inner: S,
    shards: Box<[Mutex<HashTable<Blocked>>]>,
    per_shard: usize,
    hasher: DefaultHashBuilder,
    clock: Arc<dyn Clock>,
    hits: AtomicU64,
}

/// Default budget of the over-limit cache (envoyproxy/ratelimit's `LOCAL_CACHE_SIZE_IN_BYTES` is 0,
/// off): about 25,000 blocked keys.
pub const DEFAULT_BYTES: usize = 4 << 20;

impl<S: Store> LocalCache<S> {
    /// Wraps `inner` with a cache of at most about `bytes` bytes (0 disables caching).
    pub fn new(inner: S, bytes: usize, clock: Arc<dyn Clock>) -> Self {
        let shards = (0..SHARDS).map(|_| Mutex::new(HashTable::new())).collect();
        Self {
            inner,
            shards,
            per_shard: bytes / ENTRY_BYTES / SHARDS,
            hasher: DefaultHashBuilder::default(),
            clock,
            hits: AtomicU64::new(0),
        }
    }

    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// Items answered from the cache so far.
    pub fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }

    fn hash(&self, key: &str, limit: &Limit, go_format: bool) -> u64 {
        self.hasher.hash_one((key, limit, go_format))
    }

    fn shard(&self, hash: u64) -> MutexGuard<'_, HashTable<Blocked>> {
        // A poisoned shard holds plain data; keep serving rather than failing every request.
        self.shards[super::shard_of(hash, SHARDS)]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The cached denial for `item`, if it still holds.
    fn lookup(&self, item: &BatchItem, now_us: u64) -> Option<Decision> {
        if item.cost == 0 || self.per_shard == 0 {
            return None;
        }
        let hash = self.hash(&item.key, &item.limit, item.go_format);
        let shard = self.shard(hash);
        let blocked = shard.find(hash, |b| b.is(item))?;
        (blocked.until_us > now_us && item.cost >= blocked.cost).then(|| {
            let wait = blocked.until_us - now_us;
            Decision {
                from_local_cache: true,
                ..Decision::deny(wait, wait)
            }
        })
    }

    /// Drops the cached denial of `item`'s key and limit, if any.
    fn forget(&self, item: &BatchItem) {
        let hash = self.hash(&item.key, &item.limit, item.go_format);
        let mut shard = self.shard(hash);
        if let Ok(blocked) = shard.find_entry(hash, |b| b.is(item)) {
            blocked.remove();
        }
    }

    /// Sends a refund on and drops the cached denials it may have lifted, even when the store failed:
    /// the refund may have landed all the same, and a dropped entry only costs one round trip.
    async fn refund(&self, batch: &Batch) -> Result<Vec<Decision>, StoreError> {
        let result = self.inner.apply(batch).await;
        for item in &batch.items {
            self.forget(item);
        }
        result
    }

    fn remember(&self, item: &BatchItem, decision: &Decision, now_us: u64) {
        if decision.allowed || item.cost == 0 || decision.retry_after_us == 0 || self.per_shard == 0 {
            return;
        }
        let until_us = now_us.saturating_add(decision.retry_after_us);
        let hash = self.hash(&item.key, &item.limit, item.go_format);
        let mut shard = self.shard(hash);
        if let Some(blocked) = shard.find_mut(hash, |b| b.is(item)) {
            blocked.until_us = until_us;
            blocked.cost = item.cost;
            return;
        }
        if shard.len() >= self.per_shard {
            shard.retain(|b| b.until_us > now_us);
            if shard.len() >= self.per_shard {
                return;
            }
        }
        let entry = Blocked {
            key: item.key.clone(),
            limit: item.limit,
            go_format: item.go_format,
            cost: item.cost,
            until_us,
        };
        shard.insert_unique(hash, entry, |b| self.hash(&b.key, &b.limit, b.go_format));
    }
}

impl<S: Store> Store for LocalCache<S> {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    async fn apply(&self, batch: &Batch) -> Result<Vec<Decision>, StoreError> {
        if self.per_shard == 0 {
            return self.inner.apply(batch).await;
        }
        if let CommitPolicy::Refund = batch.policy {
            return self.refund(batch).await;
        }
        let remembers = !matches!(batch.policy, CommitPolicy::Peek);
        // A denial is cached for a duration: timed on the monotonic clock, so that a step of the wall
        // clock neither stretches it (a step back) nor cuts it short.
        let now = self.clock.monotonic_us();
        let cached: Vec<Option<Decision>> = batch.items.iter().map(|item| self.lookup(item, now)).collect();
        let hits = cached.iter().flatten().count();
        if hits == 0 {
            let decisions = self.inner.apply(batch).await?;
            if remembers {
                for (item, decision) in batch.items.iter().zip(&decisions) {
                    self.remember(item, decision, now);
                }
            }
            return Ok(decisions);
        }
        self.hits.fetch_add(hits as u64, Ordering::Relaxed);
        let blocked_groups: Vec<u32> = batch
            .items
            .iter()
            .zip(&cached)
            .filter(|(_, c)| c.is_some())
            .map(|(i, _)| i.group)
            .collect();
        let mut sent = Vec::new();
        let mut positions = Vec::new();
        for (at, (item, cached)) in batch.items.iter().zip(&cached).enumerate() {
            if cached.is_some() {
                continue;
            }
            let check_only = match batch.policy {
                CommitPolicy::Independent => blocked_groups.contains(&item.group),
                CommitPolicy::AllOrNothing | CommitPolicy::StopIncrementWhenOverLimit => true,
                // A peek writes nothing, so its items keep their costs (and refunds never get here).
                CommitPolicy::Peek | CommitPolicy::Refund => false,
            };
            sent.push(BatchItem {
                cost: if check_only { 0 } else { item.cost },
                ..item.clone()
            });
            positions.push(at);
        }
        let mut decisions: Vec<Decision> = cached.into_iter().map(Option::unwrap_or_default).collect();
        if !sent.is_empty() {
            let sent = Batch {
                items: sent,
                policy: batch.policy,
                scope_len: batch.scope_len,
                keep_together: batch.keep_together,
                once: batch.once.clone(),
            };
            let answers = self.inner.apply(&sent).await?;
            for ((at, item), decision) in positions.into_iter().zip(&sent.items).zip(answers) {
                if remembers {
                    self.remember(item, &decision, now);
                }
                decisions[at] = decision;
            }
        }
        Ok(decisions)
    }

    fn shares_with_go(&self) -> bool {
        self.inner.shares_with_go()
    }
}

/// The over-limit cache only concerns rate limits: leases go straight to the store behind it.
impl<S: Store> LeaseStore for LocalCache<S> {
    async fn acquire(&self, request: &AcquireRequest) -> Result<Vec<LeaseSlot>, StoreError> {
        self.inner().acquire(request).await
    }

    async fn release(&self, request: &ReleaseRequest) -> Result<Vec<Released>, StoreError> {
        self.inner().release(request).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::Algorithm;
    use crate::clock::ManualClock;
    use crate::store::memory::MemoryStore;

    const PEEK: CommitPolicy = CommitPolicy::Peek;

    fn cache() -> LocalCache<MemoryStore> {
        let clock: Arc<dyn Clock> = Arc::new(ManualClock::new(5_000_000));
        LocalCache::new(MemoryStore::new(Arc::clone(&clock)), 1 << 20, clock)
    }

    fn item(key: &str, cost: u64) -> BatchItem {
        BatchItem {
            key: key.to_owned(),
            limit: Limit {
                algorithm: Algorithm::Gcra,
                requests: 5,
                window_us: 1_000_000,
                burst: 5,
            },
            cost,
            group: 0,
            go_format: false,
        }
    }

    async fn one(cache: &LocalCache<MemoryStore>, item: BatchItem, policy: CommitPolicy) -> Decision {
        let decisions = cache.apply(&Batch::new(vec![item], policy)).await;
        decisions.expect("the memory store never fails")[0]
    }

    /// Exhausts `key` and gets its denial cached.
    async fn block(cache: &LocalCache<MemoryStore>, key: &str) {
        assert!(one(cache, item(key, 5), CommitPolicy::Independent).await.allowed);
        assert!(!one(cache, item(key, 1), CommitPolicy::Independent).await.allowed);
        let hits = cache.hits();
        assert!(!one(cache, item(key, 1), CommitPolicy::Independent).await.allowed);
        assert_eq!(cache.hits(), hits + 1, "the denial is cached");
    }

    #[tokio::test]
    async fn a_refund_is_always_sent_and_lifts_the_cached_denial() {
        let cache = cache();
        block(&cache, "k").await;
        let hits = cache.hits();
        let refund = CommitPolicy::Refund;
        let refunded = one(&cache, item("k", 2), refund).await;
        assert_eq!((refunded.allowed, refunded.remaining), (true, 2));
        assert_eq!(cache.hits(), hits, "a refund is never answered from the cache");
        let after = one(&cache, item("k", 1), CommitPolicy::Independent).await;
        assert_eq!((after.allowed, after.remaining), (true, 1), "the store answered");
        assert_eq!(cache.hits(), hits);
    }

    #[tokio::test]
    async fn a_peek_is_answered_from_cached_denials_but_never_cached() {
        let cache = cache();
        block(&cache, "k").await;
        let hits = cache.hits();
        assert!(!one(&cache, item("k", 1), PEEK).await.allowed);
        assert_eq!(cache.hits(), hits + 1);
        // A peek's own denial is not cached: the same peek again is answered by the store.
        assert!(
            one(&cache, item("other", 4), CommitPolicy::Independent)
                .await
                .allowed
        );
        for _ in 0..2 {
            let denied = one(&cache, item("other", 3), PEEK).await;
            assert!(!denied.allowed && denied.retry_after_us > 0);
        }
        assert_eq!(cache.hits(), hits + 1);
    }

    #[tokio::test]
    async fn a_peek_sends_the_uncached_items_with_their_costs() {
        let cache = cache();
        block(&cache, "k").await;
        let batch = Batch::new(vec![item("k", 1), item("other", 2)], PEEK);
        let decisions = cache.apply(&batch).await.expect("memory store");
        assert!(!decisions[0].allowed);
        assert_eq!(
            (decisions[1].allowed, decisions[1].remaining),
            (true, 3),
            "decided as if consumed"
        );
        let check = one(&cache, item("other", 0), CommitPolicy::Independent).await;
        assert_eq!(check.remaining, 5, "and nothing written");
    }
}
