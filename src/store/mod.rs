//! Where algorithm state lives.
//!
//! A [`Store`] takes the whole batch of one request (every limit of every descriptor) in one call and
//! applies it atomically: no other request's update interleaves with it. That is what lets the Redis store
//! answer in one round trip (one script call) and what makes `all_or_nothing` and
//! `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT` exact instead of racy.
//!
//! Backends: [`memory::MemoryStore`] (embedded, the default when no Redis is configured).

pub mod local_cache;
pub mod memory;
pub mod redis;

use std::future::Future;

use crate::algorithm::{Decision, Limit};

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
}

/// What a batch may change.
///
/// The three consuming policies differ only when some items are denied. Except under `AllOrNothing`, a
/// denied item itself is still applied, so a fixed-window counter keeps counting past its limit as
/// envoyproxy/ratelimit's does (for the other algorithms applying a denied item changes nothing).
///
/// `Peek` changes nothing at all, and `Refund` only gives units back. Both carry the domain's
/// `all_or_nothing` setting, because a store that shards keys places them by it: Redis keeps the keys of
/// an `all_or_nothing` domain together in the slot of the batch's scope (so that the whole batch is
/// decided in one script call), and everyone else's per descriptor. A peek or refund must read the keys
/// the domain's consuming batches wrote, so it must say which placement they used; with the wrong
/// setting it reads other, normally absent, keys (a peek sees fresh state, a refund gives nothing back).
/// The memory store keeps every key in one place and ignores the setting.
///
/// A peek or refund must also hold the same items per descriptor as the consuming batch (every limit of
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
    Peek {
        /// The domain's `all_or_nothing` setting (where its keys are; see the enum docs).
        all_or_nothing: bool,
    },
    /// Every item gives its cost back to its key ([`crate::algorithm::refund`]), in order (a key
    /// appearing twice sees the first refund). Each decision is allowed with no retry, its `remaining`
    /// and `reset_after_us` what the key admits right after the refund. A key without state (absent or
    /// expired) is never written: there is nothing to give back, and the decision is a fresh key's.
    Refund {
        /// The domain's `all_or_nothing` setting (where its keys are; see the enum docs).
        all_or_nothing: bool,
    },
}

/// A store failure. Every variant is transient: the request may succeed later, so the caller applies
/// the rule's failure mode (or answers UNAVAILABLE and lets Envoy's `failure_mode_deny` decide).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The store could not be reached or refused the command.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The store did not answer within the per-call deadline.
    #[error("store did not answer within {0:?}")]
    Timeout(std::time::Duration),
}

/// Every limit of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    /// The items, grouped by descriptor (see [`BatchItem::group`]).
    pub items: Vec<BatchItem>,
    /// What may change when some items are denied.
    pub policy: CommitPolicy,
    /// Every item key starts with the same scope, `CACHE_KEY_PREFIX + domain`, this many bytes long.
    /// A store that must keep a whole batch together (Redis Cluster under `AllOrNothing`) places keys
    /// by it.
    pub scope_len: usize,
}

impl Batch {
    /// A batch of items that share no scope (tests and benchmarks).
    pub fn new(items: Vec<BatchItem>, policy: CommitPolicy) -> Self {
        Self {
            items,
            policy,
            scope_len: 0,
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

/// A place to keep counters.
pub trait Store: Send + Sync + 'static {
    /// Applies a batch atomically and returns one decision per item, in order. The batch is borrowed:
    /// a store copies a key only when it must keep it (a new entry), not on every request.
    fn apply(&self, batch: &Batch) -> impl Future<Output = Result<Vec<Decision>, StoreError>> + Send;
}

/// The store chosen at startup: the embedded one, or Redis behind the local over-limit cache.
#[derive(Debug)]
pub enum AnyStore {
    /// No Redis configured.
    Memory(memory::MemoryStore),
    /// `REDIS_URL` set.
    Redis(local_cache::LocalCache<std::sync::Arc<redis::RedisStore>>),
}

impl AnyStore {
    /// Limits answered by the local over-limit cache (Redis only).
    pub fn local_cache_hits(&self) -> Option<u64> {
        match self {
            AnyStore::Memory(_) => None,
            AnyStore::Redis(cache) => Some(cache.hits()),
        }
    }
}

impl Store for AnyStore {
    async fn apply(&self, batch: &Batch) -> Result<Vec<Decision>, StoreError> {
        match self {
            AnyStore::Memory(store) => store.apply(batch).await,
            AnyStore::Redis(store) => store.apply(batch).await,
        }
    }
}
