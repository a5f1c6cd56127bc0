//! The Redis store: every replica of Tollgate shares the same counters, and every request costs at most
//! one Redis round trip (one `FCALL` of the batch function, or `EVALSHA` of the same script on Redis
//! older than 7.0; in Redis Cluster, one per hash slot the request touches, sent in parallel). Fixed
//! windows alone are counted with `INCRBY` pipelines instead, shared by concurrent requests (in a
//! cluster, one per master; `pipeline.rs`).
//!
//! - **Atomic.** The whole batch is decided inside one Lua script ([`script`]), so no other request
//!   interleaves between reading and writing a counter, and `all_or_nothing` is exact.
//! - **Redis clock.** Scripts read `TIME`. Fixed-window keys carry their window start in the name (as
//!   envoyproxy/ratelimit's do); Tollgate names them from its clock corrected by the offset to the
//!   Redis clock that every reply reports, so replicas with skewed clocks still agree.
//! - **Bounded.** Every call has a deadline ([`RedisOptions::deadline`]); a slow or dead Redis yields
//!   [`StoreError::Timeout`] or [`StoreError::Unavailable`], and the limiter applies each rule's
//!   `failure_mode`.
//! - **No startup dependency.** Connections are made in the background with backoff; until Redis
//!   answers, calls fail fast and readiness reports NOT_SERVING. Reconnection after a Redis restart is
//!   automatic; a `Function not found` after a restart or `FUNCTION FLUSH` (`NOSCRIPT` after `SCRIPT
//!   FLUSH` on the EVAL fallback) costs one reload, not a failed request.
//!
//! Connections are redis-rs multiplexed (a checkout pool only adds waiting: docs/performance.md).

mod call;
mod clock_offset;
mod cluster_scripts;
mod coalesce;
mod group;
mod impossible_state;
mod keys;
mod lease;
pub mod link;
mod options;
mod pipeline;
mod reserve;
pub mod script;
mod timed_counters;
mod uncoalesced;
mod window_timer;

use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures_util::future::BoxFuture;
use redis::aio::ConnectionManager;
use tokio_util::sync::CancellationToken;

pub use keys::slot;
pub use link::{RedisLink, RedisMode, RedisTarget, TargetError, without_userinfo};
pub use options::{
    DEFAULT_CONNECT_TIMEOUT, DEFAULT_CONNECTIONS, DEFAULT_DEADLINE, DEFAULT_EXPIRATION_JITTER_SECS,
    RedisOptions,
};

use self::call::Caller;
use self::keys::{Placement, redis_key, shares_group};
use self::link::{CallError, Prepare, WholeConnection, within};
use self::script::{BatchScript, ScriptItem};
use super::hot_keys::{Reserve, ReserveRequest, Reserved};
use super::{Batch, CommitPolicy, Store, StoreError};
use crate::algorithm::{Algorithm, Decision};
use crate::clock::Clock;

/// The Redis store.
pub struct RedisStore {
    options: RedisOptions,
    coalescer: coalesce::Coalescer,
    /// The link, the script and the counters that every way to Redis shares ([`call`]); the
    /// coalescer holds it too.
    call: Arc<Caller>,
    jitter_hasher: hashbrown::DefaultHashBuilder,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("target", self.call.link.target())
            .field("connected", &self.call.link.connections().is_some())
            .finish_non_exhaustive()
    }
}

/// What the store prepares on the link's new connections: the batch library, loaded before the first
/// request.
struct LoadLibrary {
    script: BatchScript,
    connect_timeout: Duration,
    deadline: Duration,
}

impl Prepare for LoadLibrary {
    /// Loads the batch library before the first request (in a cluster, redis-rs sends `FUNCTION LOAD`
    /// to every master).
    fn connected(&self, mut conn: WholeConnection) -> BoxFuture<'static, ()> {
        let script = self.script.clone();
        Box::pin(async move {
            if let Err(error) = script.preload(&mut conn).await {
                // Not fatal: calls load the library on demand when they find it missing.
                tracing::warn!(%error, "cannot load the Tollgate library into Redis yet");
            }
        })
    }

    /// Loads the batch function on a master, so that no call needs to load it on the way. A script call
    /// that finds it missing loads it through the cluster connection, on every master at once; with one
    /// master down that load waits for it, and the calls to the others with it (fixed-window counters
    /// fall back to the script when their master's pipeline fails). Already there (another replica, or an
    /// earlier map) is fine; anything else is left to that fallback, and logged.
    fn master_linked(&self, mut link: ConnectionManager) -> BoxFuture<'static, ()> {
        let (script, connect_timeout, deadline) = (self.script.clone(), self.connect_timeout, self.deadline);
        Box::pin(async move {
            if !script.has_functions() {
                return;
            }
            let mut load = redis::cmd("FUNCTION");
            load.arg("LOAD").arg(script.library());
            match within(connect_timeout, load.query_async::<redis::Value>(&mut link)).await {
                Ok(_) => {}
                Err(CallError::Redis(error)) if error.to_string().contains("already exists") => {}
                Err(error) => {
                    let error = error.into_store_error(deadline);
                    tracing::warn!(%error, "cannot load the batch function on a cluster master");
                }
            }
        })
    }
}

impl RedisStore {
    /// Creates the store and starts connecting in the background until `stop` is cancelled. Returns at
    /// once: a Redis that is down at startup is not an error, only a store that is not ready yet.
    pub fn start(options: RedisOptions, clock: Arc<dyn Clock>, stop: CancellationToken) -> Arc<Self> {
        let script = BatchScript::new();
        let prepare = LoadLibrary {
            script: script.clone(),
            connect_timeout: options.connect_timeout,
            deadline: options.deadline,
        };
        let link = RedisLink::start_preparing(options.link(), Arc::clone(&clock), stop, prepare);
        let call = Arc::new(Caller::new(link, script, clock, options.traces));
        Arc::new(Self {
            coalescer: coalesce::Coalescer::start(
                Arc::clone(&call),
                options.pipeline_window,
                options.pipeline_limit,
                options.deadline,
            ),
            call,
            options,
            jitter_hasher: hashbrown::DefaultHashBuilder::default(),
        })
    }

    /// Where this store's Redis is (its address without userinfo).
    pub fn target(&self) -> &RedisTarget {
        self.call.link.target()
    }

    /// Whether the target is a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        self.call.link.is_cluster()
    }

    /// Batches applied so far (one per request that reached Redis).
    pub fn batches(&self) -> u64 {
        self.call.counters.batches.load(Ordering::Relaxed)
    }

    /// Keys found so far holding a value no Tollgate could have written, decided as none and repaired
    /// (see `impossible_state.rs`).
    pub fn impossible_states(&self) -> u64 {
        self.call.counters.impossible.count()
    }

    /// Connections found stalled so far: a call on them outlived its timeout (see `link/node_pool.rs`).
    pub fn stalled_connections(&self) -> u64 {
        self.call.link.stalled_connections()
    }

    /// The connections as envoyproxy/ratelimit's pool stats count them (`None` on a Redis Cluster).
    pub fn pool_counters(&self) -> Option<crate::store::PoolCounters> {
        self.call.link.pool_counters()
    }

    /// Requests refused because the queue of requests waiting for a coalesced call was full.
    pub fn queue_full(&self) -> u64 {
        self.coalescer.counts().queue_full.load(Ordering::Relaxed)
    }

    /// Queued requests never sent because their caller had given up waiting.
    pub fn abandoned(&self) -> u64 {
        self.coalescer.counts().abandoned.load(Ordering::Relaxed)
    }

    /// Script calls made so far; with coalescing, fewer than [`RedisStore::batches`].
    pub fn script_calls(&self) -> u64 {
        self.call.counters.script_calls.load(Ordering::Relaxed)
    }

    /// Pipelines of fixed-window counters sent so far instead of script calls.
    pub fn pipelines(&self) -> u64 {
        self.call.counters.pipelines.load(Ordering::Relaxed)
    }

    /// The pipelines' `EXPIRE`s so far: sent, left out (the counter known to carry a TTL), and sent
    /// after the fact (a counter found created without one).
    pub fn expires(&self) -> (u64, u64, u64) {
        let timed = &self.call.counters.timed;
        (
            timed.sent.load(Ordering::Relaxed),
            timed.skipped.load(Ordering::Relaxed),
            timed.repaired.load(Ordering::Relaxed),
        )
    }

    /// Whether Redis answers a `PING` within the deadline (readiness).
    pub async fn ping(&self) -> bool {
        self.call.link.ping().await
    }

    /// Each item's Redis key, and the item as the script sees it (its `key` left empty: the caller
    /// points it at the name when the call is made).
    fn script_items(&self, batch: &Batch) -> Vec<(String, ScriptItem<'static>)> {
        let local_us = self.call.clock.now_us();
        let items = &batch.items;
        items
            .iter()
            .enumerate()
            .map(|(at, item)| {
                let placement = if batch.keep_together {
                    Placement::Scope(batch.scope())
                } else {
                    Placement::PerDescriptor {
                        go_named: item.go_format && !shares_group(items, at),
                    }
                };
                let fixed = item.limit.algorithm == Algorithm::FixedWindow;
                let window = item.limit.window_us.max(1);
                let (key, window_start_us) = if fixed {
                    self.call.offsets.name_window(local_us, window, |start| {
                        redis_key(&item.key, &item.limit, start, placement)
                    })
                } else {
                    (redis_key(&item.key, &item.limit, 0, placement), 0)
                };
                let ttl_secs = if fixed {
                    window.div_ceil(1_000_000) + self.jitter(&key)
                } else {
                    0
                };
                (
                    key,
                    ScriptItem {
                        key: "",
                        limit: item.limit,
                        cost: item.cost,
                        group: item.group,
                        window_start_us,
                        ttl_secs,
                    },
                )
            })
            .collect()
    }

    /// A per-key expiry jitter in `0..max`, derived from the key so no random source is needed.
    fn jitter(&self, key: &str) -> u64 {
        let max = self.options.expiration_jitter_max_secs;
        if max == 0 {
            0
        } else {
            self.jitter_hasher.hash_one(key) % max
        }
    }
}

impl Store for Arc<RedisStore> {
    fn name(&self) -> &'static str {
        "redis"
    }

    async fn apply(&self, batch: &Batch) -> Result<Vec<Decision>, StoreError> {
        self.call.counters.batches.fetch_add(1, Ordering::Relaxed);
        let named = self.script_items(batch);
        // Any independent batch goes through the coalesce queue, except a traced request's, so that
        // its FCALL span stays the child of its own RPC span. Fixed-window batches share a pipeline
        // (`pipeline`); the others a script call, or in a cluster, where a script call must stay in
        // one slot, a pipeline of script calls per master (`cluster_scripts`).
        let coalesces = batch.policy == CommitPolicy::Independent && !self.call.traced();
        let pipelined =
            coalesces && self.options.pipeline_fixed_windows && pipeline::pipelinable(&batch.items);
        if coalesces {
            let deadline = tokio::time::Instant::now() + self.options.deadline;
            let answer = self.coalescer.submit(named, deadline, pipelined)?;
            return match tokio::time::timeout_at(deadline, answer).await {
                Ok(Ok(result)) => result,
                Ok(Err(_)) => Err(StoreError::Unavailable("the coalesced call was dropped".into())),
                Err(_) => Err(StoreError::Timeout(self.options.deadline)),
            };
        }
        // Boxed: this call's state is some 2.4 KB (a cluster's per-slot calls among it), and the
        // common request (coalesced, above) should not carry it inline through every future that
        // awaits this one.
        Box::pin(uncoalesced::apply(&self.call, batch, named)).await
    }

    fn shares_with_go(&self) -> bool {
        true
    }
}

impl Reserve for Arc<RedisStore> {
    async fn reserve(&self, request: ReserveRequest<'_>) -> Result<Reserved, StoreError> {
        let batch = Batch::new(vec![request.item.clone()], CommitPolicy::Independent);
        let named = self.script_items(&batch);
        let (key, item) = &named[0];
        reserve::reserve(&self.call, key, *item, request).await
    }
}
