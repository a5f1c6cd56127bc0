//! Where algorithm state lives.
//!
//! A [`Store`] takes the whole batch of one request (every limit of every descriptor) in one call and
//! applies it atomically: no other request's update interleaves with it. That is what lets the Redis store
//! answer in one round trip (one script call) and what makes `all_or_nothing` and
//! `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT` exact instead of racy.
//!
//! Backends: [`memory::MemoryStore`] (embedded, the default when no Redis is configured) and
//! [`redis::RedisStore`], which [`local_cache::LocalCache`] fronts with the over-limit cache.

#[cfg(feature = "redis")]
pub mod hot_keys;
pub mod lease;
pub mod local_cache;
pub mod memory;
#[cfg(feature = "redis")]
pub mod per_second;
#[cfg(feature = "redis")]
pub mod redis;

use std::future::Future;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::algorithm::{Decision, Limit};
use crate::clock::Clock;

/// Which of `shards` locked hashbrown tables holds the entry of `hash` (the embedded store, the
/// over-limit cache and the hot-key slices are each split so). hashbrown places an entry by the hash's
/// low bits and tells the entries of a probed group apart by its top seven: either used for the shard
/// would leave every entry of a shard alike there (with the top bits, a lookup compared the keys of
/// about half of each group it probed). Bits 32 and up are neither in a table under 2^32 buckets.
pub(crate) fn shard_of(hash: u64, shards: usize) -> usize {
    (hash >> 32) as usize % shards
}

/// One limit to apply: which counter, what limit, how much to consume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchItem {
    /// The descriptor's key in envoyproxy/ratelimit's format without the window suffix
    /// (`prefix + domain + "_" + key + "_" + value + "_" …`). The store tells limits of the same
    /// descriptor apart by algorithm and window, so several limits can share this key.
    pub key: String,
    /// The limit to enforce.
    pub limit: Limit,
    /// Units to consume; 0 checks without consuming. Under [`CommitPolicy::Refund`], units to give back.
    pub cost: u64,
    /// Items of one group (the limits of one descriptor) are contiguous in the batch and pass or fail
    /// together: when one is denied, the others consume nothing, so a request refused by a per-second
    /// limit does not eat into the per-day budget of the same caller.
    pub group: u32,
    /// `key` holds request values as envoyproxy/ratelimit writes them
    /// ([`crate::rules::ValueEncoding::Go`]), for a counter a Go fleet may share: Redis names a lone
    /// fixed window's key exactly as Go does. A key of Tollgate's own (values escaped) can have the same
    /// text (`k1` = `v_k2_w` in Go's format is `k1` = `v`, `k2` = `w` escaped), so every store and cache
    /// tells the two apart by this as well as by the key.
    pub go_format: bool,
}

/// What a batch may change.
///
/// The three consuming policies differ only when some items are denied. Except under `AllOrNothing`, a
/// denied item itself is still applied, so a fixed-window counter keeps counting past its limit as
/// envoyproxy/ratelimit's does (for the other algorithms applying a denied item changes nothing).
///
/// `Peek` changes nothing at all, and `Refund` only gives units back. Where keys are placed does not
/// depend on the policy but on the domain ([`Batch::keep_together`]), so a peek or refund reads the keys
/// the domain's consuming batches wrote. A peek or refund must also hold the same items per descriptor as the consuming batch (every limit of
/// the descriptor, in one group): whether a descriptor has one limit or several decides its Redis key
/// (envoyproxy/ratelimit's key for a lone fixed window).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CommitPolicy {
    /// Every group is applied on its own (envoyproxy/ratelimit's default): a denied descriptor does not
    /// stop the others from consuming.
    #[default]
    Independent,
    /// Tollgate's `all_or_nothing`: if any item is denied, nothing is consumed at all.
    AllOrNothing,
    /// envoyproxy/ratelimit's `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`: if any item is denied, only the
    /// denied items are applied and the others consume nothing.
    StopIncrementWhenOverLimit,
    /// "Would a request of this cost pass, and what would remain": every item is decided with its cost
    /// exactly as the first pass of a consuming batch decides it (in order, a key appearing twice seeing
    /// the first item's effect; no settling), and nothing is written, for any algorithm.
    Peek,
    /// Every item gives its cost back to its key ([`crate::algorithm::refund`]), in order (a key
    /// appearing twice sees the first refund). Each decision is allowed with no retry, its `remaining`
    /// and `reset_after_us` what the key admits right after the refund. A key without state (absent or
    /// expired) is never written: there is nothing to give back, and the decision is a fresh key's.
    Refund,
}

/// A store failure. Every variant but [`StoreError::CrossSlot`] and [`StoreError::AcrossStores`] is
/// transient: the request may succeed
/// later, so the caller applies the rule's failure mode (or answers UNAVAILABLE and lets Envoy's
/// `failure_mode_deny` decide).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// A per-call all-or-nothing request (or any batch that settles across descriptors) whose keys live
    /// in several Redis Cluster slots: it cannot be decided atomically. Setting `all_or_nothing: true`
    /// on the domain places its keys in one slot.
    #[error(
        "all-or-nothing across Redis Cluster slots is not atomic; set all_or_nothing: true on the domain"
    )]
    CrossSlot,
    /// A batch that settles across descriptors (`all_or_nothing`) with some descriptors in the
    /// per-second Redis (`REDIS_PERSECOND`) and some in the main one: two Redis cannot decide it
    /// atomically.
    #[error("all-or-nothing across the per-second Redis (REDIS_PERSECOND) and the main Redis is not atomic")]
    AcrossStores,
    /// The store could not be reached or refused the command.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The store did not answer within the per-call deadline.
    #[error("store did not answer within {0:?}")]
    Timeout(std::time::Duration),
    /// Too many requests already wait for the store: this one was not queued.
    #[error("store overloaded: too many requests waiting for it")]
    Overloaded,
}

impl StoreError {
    /// Whether the same call may succeed later (a failure mode may answer for it meanwhile).
    pub fn is_transient(&self) -> bool {
        !matches!(self, StoreError::CrossSlot | StoreError::AcrossStores)
    }
}

/// Every limit of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    /// The items, grouped by descriptor (see [`BatchItem::group`]).
    pub items: Vec<BatchItem>,
    /// What may change when some items are denied.
    pub policy: CommitPolicy,
    /// Every item key starts with the same scope, `CACHE_KEY_PREFIX + domain`, this many bytes long.
    /// A store that must keep a whole batch together places keys by it (see `keep_together`).
    pub scope_len: usize,
    /// The domain is `all_or_nothing`: its keys are placed so that one request's keys can be handled
    /// together (in Redis Cluster, one hash slot per scope). Placement is a property of the domain, not
    /// of one call, so every call on a key (consume, peek, refund, a per-call all-or-nothing) finds the
    /// same counter.
    pub keep_together: bool,
    /// Under [`CommitPolicy::Refund`]: give back only what this refund token has not given back yet.
    pub once: Option<RefundOnce>,
}

/// Single use of a refund token, enforced by the store in the same atomic step as the refund: each
/// group (descriptor) of the batch is refunded only if `id` was never used on that descriptor at that
/// place in the request (its key and its group number, whatever the window; though in Redis Cluster
/// an envoyproxy/ratelimit fixed-window key changes slot with its window, so the marker does too,
/// which is why the limiter's tokens end with the fixed window they consumed from); the store then
/// remembers it for `ttl_us`. A group refused that way gives nothing back and its decisions report
/// `allowed: false`. (In Redis Cluster a batch may be split by slot; each descriptor is still
/// refunded at most once, whichever call reaches its slot first.)
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefundOnce {
    /// The token's id (hex).
    pub id: String,
    /// How long the use must be remembered, in µs: until the token expires.
    pub ttl_us: u64,
}

impl Batch {
    /// A batch of items that share no scope (tests and benchmarks).
    pub fn new(items: Vec<BatchItem>, policy: CommitPolicy) -> Self {
        Self {
            items,
            policy,
            scope_len: 0,
            keep_together: false,
            once: None,
        }
    }

    /// The shared key prefix (`CACHE_KEY_PREFIX + domain`).
    pub fn scope(&self) -> &str {
        self.items
            .first()
            .and_then(|i| i.key.get(..self.scope_len))
            .unwrap_or_default()
    }
}

/// A place to keep counters (and concurrency leases, see [`lease`]).
pub trait Store: lease::LeaseStore + Send + Sync + 'static {
    /// Applies a batch atomically and returns one decision per item, in order. The batch is borrowed:
    /// a store copies a key only when it must keep it (a new entry), not on every request.
    fn apply(&self, batch: &Batch) -> impl Future<Output = Result<Vec<Decision>, StoreError>> + Send;

    /// What the debug line of a decision calls this store: `embedded`, `redis`.
    fn name(&self) -> &'static str;

    /// Whether a fleet of envoyproxy/ratelimit may share this store's counters (Redis), so that the
    /// keys it could share must be written as Go writes them ([`BatchItem::go_format`]). The embedded
    /// store says no: no Go replica reaches it, and every key of its is Tollgate's own, so that no value
    /// spells another descriptor's key.
    fn shares_with_go(&self) -> bool;
}

/// What [`AnyStore::open`] builds: the embedded store, or Redis (with the per-second Redis of
/// envoyproxy/ratelimit's `REDIS_PERSECOND`) behind the local over-limit cache.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// Most entries the embedded store holds (see [`memory::DEFAULT_MAX_KEYS`]).
    pub memory_max_keys: usize,
    /// The over-limit cache's budget in front of each Redis, in bytes (0: none; see
    /// [`local_cache::DEFAULT_BYTES`]).
    pub local_cache_bytes: usize,
    /// Redis; `None`: the embedded store.
    #[cfg(feature = "redis")]
    pub redis: Option<redis::RedisOptions>,
    /// The per-second Redis, for limits whose every window is one second; `None`: they stay in `redis`.
    #[cfg(feature = "redis")]
    pub per_second: Option<redis::RedisOptions>,
    /// When Redis keys are hot enough to admit from reserved slices ([`hot_keys`]; off by default).
    #[cfg(feature = "redis")]
    pub hot_keys: hot_keys::HotKeyOptions,
}

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            memory_max_keys: memory::DEFAULT_MAX_KEYS,
            local_cache_bytes: local_cache::DEFAULT_BYTES,
            #[cfg(feature = "redis")]
            redis: None,
            #[cfg(feature = "redis")]
            per_second: None,
            #[cfg(feature = "redis")]
            hot_keys: hot_keys::HotKeyOptions::default(),
        }
    }
}

/// The store chosen at startup: the embedded one, or Redis behind the local over-limit cache.
#[derive(Debug)]
pub enum AnyStore {
    /// No Redis configured.
    Memory(memory::MemoryStore),
    /// `REDIS_URL` set (and `REDIS_PERSECOND_URL` with `REDIS_PERSECOND`), each Redis behind its local
    /// over-limit cache.
    #[cfg(feature = "redis")]
    Redis(per_second::RedisStores),
}

/// What the store has done so far, for `/metrics` (all zero on the embedded store).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StoreCounters {
    /// Limits answered by the local over-limit cache.
    pub local_cache_hits: u64,
    /// Batches (one per request that reached the store) sent to Redis.
    pub redis_batches: u64,
    /// Script calls made to Redis. Fewer than batches when concurrent requests share calls.
    pub redis_script_calls: u64,
    /// Pipelines of fixed-window counters (`INCRBY` + `EXPIRE`) sent to Redis instead of script calls.
    pub redis_pipelines: u64,
    /// `EXPIRE`s those pipelines sent with an `INCRBY`.
    pub redis_expires_sent: u64,
    /// `EXPIRE`s left out of those pipelines because the counter was known to carry a TTL.
    pub redis_expires_skipped: u64,
    /// Counters found created without a TTL (deleted since this instance saw them with one) and given
    /// one after the fact.
    pub redis_ttl_repairs: u64,
    /// Requests refused because the queue of requests waiting for Redis was full.
    pub redis_queue_full: u64,
    /// Queued requests never sent because their caller had given up waiting.
    pub redis_abandoned: u64,
    /// Redis connections found stalled (a call on them outlived its timeout) and no longer written
    /// until drained or replaced.
    pub redis_stalled_connections: u64,
    /// Items whose Redis key held a value no Tollgate could have written, decided as none and repaired.
    pub redis_impossible_states: u64,
    /// Entries the embedded store evicted to stay within its key cap.
    pub memory_evictions: u64,
    /// Lease acquires and refunds the embedded store refused because its leases or refund markers were
    /// at their cap.
    pub memory_refused: u64,
    /// Entries the embedded store holds now.
    pub memory_keys: u64,
    /// Concurrency slots held by live leases, where this instance can count them: the embedded store
    /// (a Redis store's leases are the fleet's, and counting them would cost Redis a scan).
    pub lease_slots: Option<u64>,
    /// The Redis connections, as envoyproxy/ratelimit's `redis_pool` stats count them: single Redis
    /// and Sentinel (a Redis Cluster's connections are redis-rs's own, and not counted).
    pub redis_pool: Option<PoolCounters>,
    /// The same for `REDIS_PERSECOND`'s Redis (`redis_per_second_pool`).
    pub redis_per_second_pool: Option<PoolCounters>,
    /// Hot-key reservation ([`hot_keys`]), summed over every Redis.
    pub hot_keys: HotKeyCounters,
}

/// What hot-key reservation ([`hot_keys`]) has done: calls, units, and where things stand now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HotKeyCounters {
    /// Reservation calls made (one decides a request and grants a slice, or gives units back).
    pub reservations: u64,
    /// Units granted to slices beyond the requests that asked.
    pub units_granted: u64,
    /// Unspent units offered back when a slice was renewed or its lease ended.
    pub units_returned: u64,
    /// Decisions answered from a slice, without a Redis call.
    pub local_decisions: u64,
    /// Hot keys decided in Redis because the slice table was full.
    pub table_full: u64,
    /// Keys holding a slice now.
    pub keys: u64,
    /// Units held in slices now, not yet admitted.
    pub units_held: u64,
}

/// A Redis connection pool's counters, as envoyproxy/ratelimit names them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolCounters {
    /// `cx_active`: connections open now.
    pub active: u64,
    /// `cx_total`: connections opened so far (a reconnection counts).
    pub total: u64,
    /// `cx_local_close`: connections closed so far (failed, or replaced by the pool).
    pub closed: u64,
}

impl AnyStore {
    /// The store `options` describe, on `clock` (the embedded store's and the local cache's time; Redis
    /// keeps its own). Redis connects in the background until `stop` is cancelled: until it answers,
    /// requests get the rules' failure modes.
    pub fn open(options: StoreOptions, clock: Arc<dyn Clock>, stop: CancellationToken) -> Self {
        #[cfg(feature = "redis")]
        if let Some(main) = options.redis {
            let cached = |redis| {
                let store = redis::RedisStore::start(redis, Arc::clone(&clock), stop.clone());
                let hot = hot_keys::HotKeys::start(store, options.hot_keys, Arc::clone(&clock), stop.clone());
                local_cache::LocalCache::new(hot, options.local_cache_bytes, Arc::clone(&clock))
            };
            let main = cached(main);
            let per_second = options.per_second.map(cached);
            return AnyStore::Redis(per_second::RedisStores { main, per_second });
        }
        let _ = stop;
        AnyStore::Memory(memory::MemoryStore::with_max_keys(clock, options.memory_max_keys))
    }

    /// The store's counters.
    pub fn counters(&self) -> StoreCounters {
        match self {
            AnyStore::Memory(store) => StoreCounters {
                memory_evictions: store.evictions(),
                memory_refused: store.refused_full(),
                memory_keys: store.len() as u64,
                lease_slots: Some(store.leases().held_slots()),
                ..StoreCounters::default()
            },
            #[cfg(feature = "redis")]
            AnyStore::Redis(stores) => StoreCounters {
                redis_pool: stores.main.redis().pool_counters(),
                redis_per_second_pool: stores.per_second.as_ref().and_then(|s| s.redis().pool_counters()),
                hot_keys: stores.all().fold(HotKeyCounters::default(), |sum, cache| {
                    let hot = cache.inner();
                    let counts = hot.counts();
                    let read = |counter: &std::sync::atomic::AtomicU64| {
                        counter.load(std::sync::atomic::Ordering::Relaxed)
                    };
                    HotKeyCounters {
                        reservations: sum.reservations + read(&counts.reservations),
                        units_granted: sum.units_granted + read(&counts.units_granted),
                        units_returned: sum.units_returned + read(&counts.units_returned),
                        local_decisions: sum.local_decisions + read(&counts.local_decisions),
                        table_full: sum.table_full + read(&counts.table_full),
                        keys: sum.keys + hot.keys(),
                        units_held: sum.units_held + hot.held_units(),
                    }
                }),
                ..stores.all().fold(StoreCounters::default(), |sum, cache| {
                    let (sent, skipped, repaired) = cache.redis().expires();
                    StoreCounters {
                        local_cache_hits: sum.local_cache_hits + cache.hits(),
                        redis_batches: sum.redis_batches + cache.redis().batches(),
                        redis_script_calls: sum.redis_script_calls + cache.redis().script_calls(),
                        redis_pipelines: sum.redis_pipelines + cache.redis().pipelines(),
                        redis_expires_sent: sum.redis_expires_sent + sent,
                        redis_expires_skipped: sum.redis_expires_skipped + skipped,
                        redis_ttl_repairs: sum.redis_ttl_repairs + repaired,
                        redis_queue_full: sum.redis_queue_full + cache.redis().queue_full(),
                        redis_abandoned: sum.redis_abandoned + cache.redis().abandoned(),
                        redis_stalled_connections: sum.redis_stalled_connections
                            + cache.redis().stalled_connections(),
                        redis_impossible_states: sum.redis_impossible_states
                            + cache.redis().impossible_states(),
                        memory_evictions: 0,
                        memory_refused: 0,
                        memory_keys: 0,
                        lease_slots: None,
                        redis_pool: None,
                        redis_per_second_pool: None,
                        hot_keys: HotKeyCounters::default(),
                    }
                })
            },
        }
    }
}

impl std::fmt::Display for AnyStore {
    /// What the store is, for the log: `embedded`, or each Redis's address (no userinfo).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AnyStore::Memory(_) => f.write_str("embedded"),
            #[cfg(feature = "redis")]
            AnyStore::Redis(stores) => {
                write!(f, "redis {}", stores.main.redis().target())?;
                if let Some(per_second) = &stores.per_second {
                    write!(f, ", per-second redis {}", per_second.redis().target())?;
                }
                Ok(())
            }
        }
    }
}

impl AnyStore {
    /// Whether counters live in a Redis Cluster (where one script call reaches one hash slot).
    pub fn is_cluster(&self) -> bool {
        match self {
            AnyStore::Memory(_) => false,
            #[cfg(feature = "redis")]
            AnyStore::Redis(stores) => stores.all().any(|cache| cache.redis().is_cluster()),
        }
    }
}

impl lease::LeaseStore for AnyStore {
    async fn acquire(&self, request: &lease::AcquireRequest) -> Result<Vec<lease::LeaseSlot>, StoreError> {
        match self {
            AnyStore::Memory(store) => store.acquire(request).await,
            #[cfg(feature = "redis")]
            AnyStore::Redis(store) => store.acquire(request).await,
        }
    }

    async fn release(&self, request: &lease::ReleaseRequest) -> Result<Vec<lease::Released>, StoreError> {
        match self {
            AnyStore::Memory(store) => store.release(request).await,
            #[cfg(feature = "redis")]
            AnyStore::Redis(store) => store.release(request).await,
        }
    }
}

impl Store for AnyStore {
    async fn apply(&self, batch: &Batch) -> Result<Vec<Decision>, StoreError> {
        match self {
            AnyStore::Memory(store) => store.apply(batch).await,
            // Boxed: a future is as large as its largest arm, and every future that awaits this one
            // holds it. Inline, the Redis call's state (6.6 KB then, under 1 KB now) made each
            // request's future 14.5 KB on either store, copied whole whenever it moved (into
            // tonic's box, between tasks); the embedded store's is a few bytes.
            #[cfg(feature = "redis")]
            AnyStore::Redis(store) => Box::pin(store.apply(batch)).await,
        }
    }

    fn name(&self) -> &'static str {
        match self {
            AnyStore::Memory(store) => store.name(),
            #[cfg(feature = "redis")]
            AnyStore::Redis(store) => store.name(),
        }
    }

    fn shares_with_go(&self) -> bool {
        match self {
            AnyStore::Memory(store) => store.shares_with_go(),
            #[cfg(feature = "redis")]
            AnyStore::Redis(store) => store.shares_with_go(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::hash::BuildHasher as _;

    use super::shard_of;

    #[test]
    fn the_entries_of_one_shard_still_differ_in_the_bits_hashbrown_tells_them_apart_by() {
        let hasher = hashbrown::DefaultHashBuilder::default();
        let mut tags: Vec<HashSet<u64>> = vec![HashSet::new(); 64];
        for n in 0..20_000 {
            let hash = hasher.hash_one(format!("ratelimit_api_user_u-{n}"));
            tags[shard_of(hash, 64)].insert(hash >> 57);
        }
        // About 310 keys a shard over 128 possible tags: all but a few are seen, in every shard.
        for (shard, seen) in tags.iter().enumerate() {
            assert!(seen.len() > 100, "shard {shard}: {} tags of 128", seen.len());
        }
    }
}
