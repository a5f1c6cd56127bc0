//! Where algorithm state lives.
//!
//! A [`Store`] takes the whole batch of one request (every limit of every descriptor) in one call and
//! applies it atomically: no other request's update interleaves with it. That is what lets the Redis store
//! answer in one round trip (one script call) and what makes `all_or_nothing` and
//! `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT` exact instead of racy.
//!
//! Backends: [`memory::MemoryStore`] (embedded, the default when no Redis is configured).

pub mod memory;

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
    /// Units to consume; 0 checks without consuming.
    pub cost: u64,
}

/// What a batch may change when some of its items are denied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CommitPolicy {
    /// Every item is applied on its own (envoyproxy/ratelimit's default): a denied descriptor does not
    /// stop the others from consuming. Fixed window still counts denied hits, as Go does.
    #[default]
    Independent,
    /// Tollgate's `all_or_nothing`: if any item is denied, nothing is consumed at all.
    AllOrNothing,
    /// envoyproxy/ratelimit's `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`: if any item is denied, only the
    /// denied items are applied (so fixed-window counters over the limit keep counting) and the others
    /// consume nothing.
    StopIncrementWhenOverLimit,
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

/// A place to keep counters.
pub trait Store: Send + Sync + 'static {
    /// Applies `items` atomically under `policy` and returns one decision per item, in order.
    fn apply(
        &self,
        items: Vec<BatchItem>,
        policy: CommitPolicy,
    ) -> impl Future<Output = Result<Vec<Decision>, StoreError>> + Send;
}
