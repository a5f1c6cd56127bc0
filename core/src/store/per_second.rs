//! `REDIS_PERSECOND`: per-second limits counted in a Redis of their own, as envoyproxy/ratelimit does.
//!
//! Per-second counters are the busiest and the shortest-lived; the Go service lets an operator give
//! them their own Redis (`REDIS_PERSECOND_URL`...) so they do not load the one that holds the long
//! windows. [`RedisStores`] is the Redis side of the store with that optional second Redis: a request's
//! descriptors whose every limit has a one-second window go to the per-second Redis, the others to the
//! main one, and a request with both kinds is split into two batches sent at once, its decisions put
//! back in order. The keys are the same as the Go service's in each Redis, so a mixed fleet shares
//! counters.
//!
//! A split request is two atomic steps, not one:
//! - a policy that settles across descriptors cannot hold across the two. A per-call all-or-nothing
//!   check is refused ([`StoreError::AcrossStores`], `FAILED_PRECONDITION`); an `all_or_nothing` domain
//!   mixing per-second and longer limits is refused when the rules load; and
//!   `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT` is settled in each Redis for the descriptors it holds: a
//!   request over a limit in one Redis still increments its counters in the other (the Go service
//!   reads both before incrementing either, which is not atomic either; the server warns at startup);
//! - when one Redis fails and the other answers, the request fails as a whole (the rules' failure
//!   modes answer it) while the half that reached the working Redis stays counted there, as in the
//!   Go service, whose two Redis are just as independent.

use std::sync::Arc;

use super::hot_keys::HotKeys;
use super::local_cache::LocalCache;
use super::redis::RedisStore;
use super::{Batch, BatchItem, CommitPolicy, Store, StoreError, lease};
use crate::algorithm::Decision;

/// A Redis store behind hot-key reservation and its local over-limit cache.
pub type CachedRedis = LocalCache<Arc<HotKeys<Arc<RedisStore>>>>;

impl CachedRedis {
    /// The Redis store underneath.
    pub fn redis(&self) -> &Arc<RedisStore> {
        self.inner().inner()
    }
}

/// The main Redis and, with `REDIS_PERSECOND`, the per-second one.
#[derive(Debug)]
pub struct RedisStores {
    /// `REDIS_URL`: every limit, or every limit but the per-second ones.
    pub main: CachedRedis,
    /// `REDIS_PERSECOND_URL`: the per-second limits, when configured.
    pub per_second: Option<CachedRedis>,
}

impl RedisStores {
    /// Every Redis in use, the main one first.
    pub fn all(&self) -> impl Iterator<Item = &CachedRedis> {
        std::iter::once(&self.main).chain(&self.per_second)
    }
}

/// Each descriptor's items (a group, contiguous) and whether they go to the per-second Redis: a group
/// goes whole, there only when every one of its limits has a one-second window, so the limits of one
/// descriptor still pass or fail together.
fn groups(items: &[BatchItem]) -> impl Iterator<Item = (std::ops::Range<usize>, bool)> + '_ {
    let mut start = 0;
    std::iter::from_fn(move || {
        let group = items.get(start)?.group;
        let end = items[start..]
            .iter()
            .position(|item| item.group != group)
            .map_or(items.len(), |len| start + len);
        let per_second = items[start..end].iter().all(|item| item.limit.is_per_second());
        let range = start..end;
        start = end;
        Some((range, per_second))
    })
}

/// Which Redis each item goes to (`true`: the per-second one).
fn routes(items: &[BatchItem]) -> Vec<bool> {
    let mut routes = vec![false; items.len()];
    for (range, per_second) in groups(items) {
        routes[range].fill(per_second);
    }
    routes
}

/// The items of `batch` routed to one side (`per_second` or not), as a batch of their own.
fn part(batch: &Batch, routes: &[bool], per_second: bool) -> Batch {
    Batch {
        items: batch
            .items
            .iter()
            .zip(routes)
            .filter(|(_, to_second)| **to_second == per_second)
            .map(|(item, _)| item.clone())
            .collect(),
        policy: batch.policy,
        scope_len: batch.scope_len,
        keep_together: batch.keep_together,
        once: batch.once.clone(),
    }
}

impl Store for RedisStores {
    fn name(&self) -> &'static str {
        "redis"
    }

    async fn apply(&self, batch: &Batch) -> Result<Vec<Decision>, StoreError> {
        let Some(per_second) = &self.per_second else {
            return self.main.apply(batch).await;
        };
        // Most requests go whole to one Redis: found without allocating.
        let (mut to_main, mut to_second) = (false, false);
        for (_, per_second) in groups(&batch.items) {
            to_main |= !per_second;
            to_second |= per_second;
        }
        if !to_second {
            return self.main.apply(batch).await;
        }
        if !to_main {
            return per_second.apply(batch).await;
        }
        if batch.policy == CommitPolicy::AllOrNothing {
            return Err(StoreError::AcrossStores);
        }
        // Boxed: both stores' calls at once are twice a call's state, which the common request (one
        // Redis, above) should not carry inline.
        Box::pin(self.apply_split(per_second, batch)).await
    }

    fn shares_with_go(&self) -> bool {
        self.main.shares_with_go()
    }
}

impl RedisStores {
    /// A batch with items for both Redis: each gets its part, at once, and the answers are put back in
    /// the batch's order.
    async fn apply_split(
        &self,
        per_second: &CachedRedis,
        batch: &Batch,
    ) -> Result<Vec<Decision>, StoreError> {
        let routes = routes(&batch.items);
        let (main_part, second_part) = (part(batch, &routes, false), part(batch, &routes, true));
        let (main_decisions, second_decisions) =
            tokio::join!(self.main.apply(&main_part), per_second.apply(&second_part));
        let (mut main_decisions, mut second_decisions) =
            (main_decisions?.into_iter(), second_decisions?.into_iter());
        routes
            .iter()
            .map(|to_second| {
                let next = if *to_second {
                    second_decisions.next()
                } else {
                    main_decisions.next()
                };
                next.ok_or_else(|| {
                    StoreError::Unavailable("a Redis answered fewer decisions than asked".into())
                })
            })
            .collect()
    }
}

/// Concurrency leases stay in the main Redis.
impl lease::LeaseStore for RedisStores {
    async fn acquire(&self, request: &lease::AcquireRequest) -> Result<Vec<lease::LeaseSlot>, StoreError> {
        self.main.acquire(request).await
    }

    async fn release(&self, request: &lease::ReleaseRequest) -> Result<Vec<lease::Released>, StoreError> {
        self.main.release(request).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::{Algorithm, Limit};

    /// One second, in µs.
    const SECOND_US: u64 = 1_000_000;

    fn item(group: u32, window_us: u64) -> BatchItem {
        BatchItem {
            key: format!("k{group}"),
            limit: Limit {
                algorithm: Algorithm::FixedWindow,
                requests: 10,
                window_us,
                burst: 10,
            },
            cost: 1,
            group,
            go_format: false,
        }
    }

    #[test]
    fn a_descriptor_goes_to_the_per_second_redis_only_when_all_its_limits_are_per_second() {
        let items = [
            item(0, SECOND_US),
            item(1, 60 * SECOND_US),
            item(2, SECOND_US),
            item(2, 3600 * SECOND_US),
            item(3, SECOND_US),
            item(3, SECOND_US),
        ];
        assert_eq!(routes(&items), [true, false, false, false, true, true]);
    }

    /// Every request on Redis pays one copy of this future into its box (see `AnyStore::apply`): the
    /// rarer calls (traced or settled as a whole, split between two Redis) are boxed where they start,
    /// so the common one stays small.
    #[tokio::test]
    async fn a_redis_call_is_a_small_future() {
        use crate::clock::SystemClock;
        use crate::store::redis::{RedisOptions, RedisTarget};
        use crate::store::{AnyStore, StoreOptions};

        // Nothing listens there: the future is measured, never polled.
        let target = RedisTarget::parse("127.0.0.1:1", "SINGLE", "tcp", "", "", false, false)
            .expect("a valid address");
        let options = StoreOptions {
            redis: Some(RedisOptions::new(target.clone())),
            per_second: Some(RedisOptions::new(target)),
            ..Default::default()
        };
        let stop = tokio_util::sync::CancellationToken::new();
        let store = AnyStore::open(options, Arc::new(SystemClock), stop.clone());
        let AnyStore::Redis(stores) = &store else {
            panic!("Redis options open a Redis store");
        };
        let batch = Batch {
            items: vec![item(0, SECOND_US)],
            policy: CommitPolicy::Independent,
            scope_len: 0,
            keep_together: false,
            once: None,
        };
        let size = std::mem::size_of_val(&stores.apply(&batch));
        assert!(size < 1024, "a Redis call's future is {size} bytes");
        stop.cancel();
    }
}
