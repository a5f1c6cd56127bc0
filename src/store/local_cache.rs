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
//! Memory is bounded: [`LocalCache::new`] takes a byte budget. A full shard first drops expired entries,
//! then stops caching new ones until entries expire.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use hashbrown::{DefaultHashBuilder, HashTable};

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
    cost: u64,
    until_us: u64,
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

    fn hash(&self, key: &str, limit: &Limit) -> u64 {
        self.hasher.hash_one((key, limit))
    }

    fn shard(&self, hash: u64) -> MutexGuard<'_, HashTable<Blocked>> {
        // A poisoned shard holds plain data; keep serving rather than failing every request.
        self.shards[(hash >> 60) as usize % SHARDS]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The cached denial for `item`, if it still holds.
    fn lookup(&self, item: &BatchItem, now_us: u64) -> Option<Decision> {
        if item.cost == 0 || self.per_shard == 0 {
            return None;
        }
        let hash = self.hash(&item.key, &item.limit);
        let shard = self.shard(hash);
        let blocked = shard.find(hash, |b| b.limit == item.limit && b.key == item.key)?;
        (blocked.until_us > now_us && item.cost >= blocked.cost).then(|| {
            let wait = blocked.until_us - now_us;
            Decision {
                allowed: false,
                remaining: 0,
                reset_after_us: wait,
                retry_after_us: wait,
            }
        })
    }

    fn remember(&self, item: &BatchItem, decision: &Decision, now_us: u64) {
        if decision.allowed || item.cost == 0 || decision.retry_after_us == 0 || self.per_shard == 0 {
            return;
        }
        let until_us = now_us.saturating_add(decision.retry_after_us);
        let hash = self.hash(&item.key, &item.limit);
        let mut shard = self.shard(hash);
        if let Some(blocked) = shard.find_mut(hash, |b| b.limit == item.limit && b.key == item.key) {
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
            cost: item.cost,
            until_us,
        };
        shard.insert_unique(hash, entry, |b| self.hasher.hash_one((&b.key, &b.limit)));
    }
}

impl<S: Store> Store for LocalCache<S> {
    async fn apply(&self, batch: &Batch) -> Result<Vec<Decision>, StoreError> {
        if self.per_shard == 0 {
            return self.inner.apply(batch).await;
        }
        let now = self.clock.now_us();
        let cached: Vec<Option<Decision>> = batch.items.iter().map(|item| self.lookup(item, now)).collect();
        let hits = cached.iter().flatten().count();
        if hits == 0 {
            let decisions = self.inner.apply(batch).await?;
            for (item, decision) in batch.items.iter().zip(&decisions) {
                self.remember(item, decision, now);
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
            };
            let answers = self.inner.apply(&sent).await?;
            for ((at, item), decision) in positions.into_iter().zip(&sent.items).zip(answers) {
                self.remember(item, &decision, now);
                decisions[at] = decision;
            }
        }
        Ok(decisions)
    }
}
