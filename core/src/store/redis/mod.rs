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

mod alone;
mod clock_offset;
mod cluster_rebuild;
mod cluster_scripts;
mod coalesce;
mod impossible;
mod keys;
mod lease;
mod node_pool;
mod options;
mod pipeline;
mod reserve;
pub mod script;
mod sentinel;
mod slot_map;
mod target;
mod timed_counters;
mod window_timer;

use std::collections::BTreeMap;
use std::future::Future;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

pub use keys::slot;
pub use options::{
    DEFAULT_CONNECT_TIMEOUT, DEFAULT_CONNECTIONS, DEFAULT_DEADLINE, DEFAULT_EXPIRATION_JITTER_SECS,
    RedisOptions,
};
pub use target::{RedisMode, RedisTarget, TargetError, without_userinfo};

use self::clock_offset::ClockOffsets;
use self::cluster_rebuild::ClusterRebuild;
use self::keys::{Placement, redis_key};
use self::node_pool::NodePool;
use self::script::{BatchScript, Markers, ScriptItem, ScriptReply};
use self::sentinel::{SentinelLink, suggests_failover};
use super::{Batch, BatchItem, CommitPolicy, Store, StoreError};
use crate::algorithm::{Algorithm, Decision};
use crate::clock::Clock;

/// Live connections, filled in by the background connector.
enum Connections {
    /// A single Redis or Sentinel's master.
    Node(Arc<NodePool>),
    Cluster(ClusterConnection),
}

impl Connections {
    /// Runs `call` on a connection for a call sent whole: on one node the next of the pool that is
    /// not stalled, whose pool then learns how the call went (a timeout stalls the connection); in a
    /// cluster the cluster connection, which routes by the call's keys.
    async fn on_whole<T, Fut>(&self, call: impl FnOnce(WholeConnection) -> Fut) -> Result<T, CallError>
    where
        Fut: Future<Output = Result<T, CallError>>,
    {
        match self {
            Connections::Node(pool) => {
                let taken = pool.take().ok_or(CallError::Stalled)?;
                let result = call(WholeConnection::Node(taken.conn)).await;
                pool.after_call(taken.entry, &result);
                result
            }
            Connections::Cluster(conn) => call(WholeConnection::Cluster(conn.clone())).await,
        }
    }
}

/// A connection for calls sent whole: to the single node or Sentinel's master, or to the cluster
/// (which routes by the call's keys).
#[derive(Clone)]
enum WholeConnection {
    Node(ConnectionManager),
    Cluster(ClusterConnection),
}

impl ConnectionLike for WholeConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> redis::RedisFuture<'a, redis::Value> {
        match self {
            WholeConnection::Node(conn) => conn.req_packed_command(cmd),
            WholeConnection::Cluster(conn) => conn.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        match self {
            WholeConnection::Node(conn) => conn.req_packed_commands(pipeline, offset, count),
            WholeConnection::Cluster(conn) => conn.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            WholeConnection::Node(conn) => conn.get_db(),
            WholeConnection::Cluster(conn) => conn.get_db(),
        }
    }
}

/// Why one script call failed, kept typed until it reaches the store's edge so Sentinel can tell a
/// moved master from other failures.
enum CallError {
    /// No connection has been made yet.
    NotConnected,
    /// Every connection to the node is stalled: a call on each outlived its timeout, and none is known
    /// to be drained or replaced yet ([`node_pool`]).
    Stalled,
    /// An all-or-nothing batch whose keys live in several Redis Cluster slots.
    CrossSlot,
    Timeout,
    Redis(redis::RedisError),
    Reply(script::ReplyError),
}

impl CallError {
    fn into_store_error(self, deadline: Duration) -> StoreError {
        match self {
            CallError::NotConnected => StoreError::Unavailable("not connected to Redis yet".into()),
            CallError::Stalled => StoreError::Unavailable(
                "Redis stopped answering: waiting for it to drain or reconnect".into(),
            ),
            CallError::CrossSlot => StoreError::CrossSlot,
            CallError::Timeout => StoreError::Timeout(deadline),
            CallError::Redis(error) => StoreError::Unavailable(error.to_string()),
            CallError::Reply(error) => StoreError::Unavailable(format!("unexpected script reply: {error}")),
        }
    }

    /// Whether the master may have moved (Sentinel): the call timed out, the connection broke, or the
    /// server now refuses writes as a replica.
    fn suggests_failover(&self) -> bool {
        match self {
            CallError::Timeout => true,
            CallError::NotConnected | CallError::Stalled | CallError::CrossSlot => false,
            CallError::Redis(error) => suggests_failover(error),
            CallError::Reply(_) => false,
        }
    }
}

/// The Redis store.
pub struct RedisStore {
    options: RedisOptions,
    coalescer: coalesce::Coalescer,
    connections: ArcSwapOption<Connections>,
    script: BatchScript,
    clock: Arc<dyn Clock>,
    /// Redis clock minus local clock (per node in a cluster), from the replies.
    offsets: ClockOffsets,
    jitter_hasher: hashbrown::DefaultHashBuilder,
    /// Batches applied (one per request that reached Redis).
    batches: AtomicU64,
    /// Script calls made (per hash slot in a cluster; shared by coalesced batches).
    script_calls: AtomicU64,
    /// Pipelines sent: of fixed-window counters instead of script calls ([`pipeline`]), and in a
    /// cluster of script calls to one master ([`cluster_scripts`]).
    pipelines: AtomicU64,
    /// The pipelines' counters known to carry a TTL already.
    timed: timed_counters::TimedCounters,
    /// Keys found holding values no Tollgate could have written.
    impossible: impossible::Impossible,
    /// Redis Cluster only: rebuilds a connection whose calls keep failing.
    rebuild: Option<ClusterRebuild>,
    /// Redis Cluster only: the master serving each slot, once read, and a connection to each, for
    /// grouping pipelines by master.
    slot_map: ArcSwapOption<slot_map::Masters>,
    /// When the slot map was last asked for (local µs), so it is asked for at most once a second.
    slot_map_tried_us: AtomicU64,
    /// This store, for the background tasks it starts.
    me: std::sync::Weak<RedisStore>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("target", &self.options.target)
            .field("connected", &self.connections.load().is_some())
            .finish_non_exhaustive()
    }
}

/// First and longest pause between connection attempts.
const RECONNECT_BACKOFF: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(5));

impl RedisStore {
    /// Whether the current request is traced (its Redis calls get spans of their own).
    fn traced(&self) -> bool {
        self.options.traces && !tracing::Span::current().is_disabled()
    }

    /// Creates the store and starts connecting in the background until `stop` is cancelled. Returns at
    /// once: a Redis that is down at startup is not an error, only a store that is not ready yet.
    pub fn start(options: RedisOptions, clock: Arc<dyn Clock>, stop: CancellationToken) -> Arc<Self> {
        // redis-rs builds its TLS configs on rustls' process-wide provider; another install (a second
        // store in tests) is a no-op.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let cluster = matches!(options.target.mode, RedisMode::Cluster(_));
        let store = Arc::new_cyclic(|store| Self {
            coalescer: coalesce::Coalescer::start(
                store.clone(),
                options.pipeline_window,
                options.pipeline_limit,
            ),
            options,
            connections: ArcSwapOption::empty(),
            script: BatchScript::new(),
            clock,
            offsets: ClockOffsets::new(cluster),
            jitter_hasher: hashbrown::DefaultHashBuilder::default(),
            batches: AtomicU64::new(0),
            script_calls: AtomicU64::new(0),
            pipelines: AtomicU64::new(0),
            timed: timed_counters::TimedCounters::new(),
            impossible: impossible::Impossible::default(),
            rebuild: cluster.then(ClusterRebuild::new),
            slot_map: ArcSwapOption::empty(),
            slot_map_tried_us: AtomicU64::new(0),
            me: store.clone(),
        });
        tokio::spawn(Arc::clone(&store).connect_until_connected(stop));
        store
    }

    async fn connect_until_connected(self: Arc<Self>, stop: CancellationToken) {
        let mut backoff = RECONNECT_BACKOFF.0;
        loop {
            match self.connect().await {
                Ok(connections) => {
                    if let Err(error) = self.preload(&connections).await {
                        // Not fatal: calls load the library on demand when they find it missing.
                        tracing::warn!(%error, "cannot load the Tollgate library into Redis yet");
                    }
                    self.connections.store(Some(Arc::new(connections)));
                    tracing::info!(target = %self.options.target, "connected to Redis");
                    return;
                }
                Err(error) => {
                    tracing::warn!(target = %self.options.target, %error, retry_in = ?backoff, "cannot connect to Redis");
                }
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(RECONNECT_BACKOFF.1);
        }
    }

    /// Notes whether a script call to cluster slot `slot` reached Redis; when calls to a slot keep
    /// failing, starts a rebuild of the cluster connection in the background.
    fn observe<T>(&self, slot: Option<u16>, result: &Result<T, CallError>) {
        let (Some(rebuild), Some(slot)) = (&self.rebuild, slot) else {
            return;
        };
        let failed = matches!(result, Err(CallError::Timeout | CallError::Redis(_)));
        if !rebuild.record(slot, failed) {
            return;
        }
        let Some(store) = self.me.upgrade() else {
            rebuild.done();
            return;
        };
        tokio::spawn(async move {
            tracing::warn!(
                failing_for = ?ClusterRebuild::AFTER,
                "Redis Cluster calls keep failing: reconnecting from the seed nodes"
            );
            match store.connect().await {
                Ok(connections) => {
                    store.connections.store(Some(Arc::new(connections)));
                    tracing::info!("reconnected to Redis Cluster");
                }
                Err(error) => tracing::warn!(%error, "cannot reconnect to Redis Cluster yet"),
            }
            if let Some(rebuild) = &store.rebuild {
                rebuild.done();
            }
        });
    }

    fn manager_config(&self) -> ConnectionManagerConfig {
        let timeout = self.options.connect_timeout;
        ConnectionManagerConfig::new()
            .set_connection_timeout(Some(timeout))
            // The per-call deadline is enforced above this layer; this only stops a dead socket from
            // holding a multiplexed connection forever.
            .set_response_timeout(Some(self.options.deadline.max(timeout)))
            .set_number_of_retries(1)
    }

    /// A client for one node at `info`, with the configured TLS certificates if any.
    fn node_client(&self, info: redis::ConnectionInfo) -> redis::RedisResult<redis::Client> {
        match &self.options.tls {
            Some(certificates) => redis::Client::build_with_tls(info, certificates.clone()),
            None => redis::Client::open(info),
        }
    }

    async fn connect(&self) -> Result<Connections, redis::RedisError> {
        let timeout = self.options.connect_timeout;
        match &self.options.target.mode {
            RedisMode::Single(info) => {
                let config = self.manager_config();
                let client = self.node_client(info.clone())?;
                let mut pool = Vec::with_capacity(self.options.connections.max(1));
                for _ in 0..self.options.connections.max(1) {
                    pool.push(ConnectionManager::new_with_config(client.clone(), config.clone()).await?);
                }
                Ok(Connections::Node(NodePool::new(
                    node_pool::Source::Client(client),
                    config,
                    timeout,
                    pool,
                )))
            }
            RedisMode::Cluster(nodes) => {
                let mut builder = ClusterClient::builder(nodes.clone())
                    .tcp_settings(target::tcp_settings())
                    .connection_timeout(timeout)
                    .response_timeout(self.options.deadline.max(timeout))
                    .retries(2);
                if let Some(certificates) = &self.options.tls {
                    builder = builder.certs(certificates.clone());
                }
                let client = builder.build()?;
                Ok(Connections::Cluster(client.get_async_connection().await?))
            }
            RedisMode::Sentinel {
                master,
                sentinels,
                node,
                tls,
            } => {
                let tls = tls.map(|mode| (mode, self.options.tls.clone()));
                let config = self.manager_config();
                let (link, master) =
                    SentinelLink::connect(master, sentinels, node, tls, config.clone()).await?;
                Ok(Connections::Node(NodePool::new(
                    node_pool::Source::Sentinel(link),
                    config,
                    timeout,
                    vec![master],
                )))
            }
        }
    }

    /// Loads the batch library before the first request (in a cluster, redis-rs sends `FUNCTION LOAD`
    /// to every master).
    async fn preload(&self, connections: &Connections) -> redis::RedisResult<()> {
        match connections {
            Connections::Node(pool) => self.script.preload(&mut pool.first()).await,
            Connections::Cluster(conn) => self.script.preload(&mut conn.clone()).await,
        }
    }

    /// Where this store's Redis is (its address without userinfo).
    pub fn target(&self) -> &RedisTarget {
        &self.options.target
    }

    /// Whether the target is a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        matches!(self.options.target.mode, RedisMode::Cluster(_))
    }

    /// Batches applied so far (one per request that reached Redis).
    pub fn batches(&self) -> u64 {
        self.batches.load(Ordering::Relaxed)
    }

    /// Keys found so far holding a value no Tollgate could have written, decided as none and repaired
    /// (see `impossible.rs`).
    pub fn impossible_states(&self) -> u64 {
        self.impossible.count()
    }

    /// Connections found stalled so far: a call on them outlived its timeout (see `node_pool.rs`).
    pub fn stalled_connections(&self) -> u64 {
        match self.connections.load().as_deref() {
            Some(Connections::Node(pool)) => pool.stalls(),
            _ => 0,
        }
    }

    /// The connections as envoyproxy/ratelimit's pool stats count them (`None` on a Redis Cluster).
    pub fn pool_counters(&self) -> Option<crate::store::PoolCounters> {
        match self.connections.load().as_deref() {
            Some(Connections::Node(pool)) => Some(pool.counters()),
            Some(_) => None,
            None => (!self.is_cluster()).then(crate::store::PoolCounters::default),
        }
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
        self.script_calls.load(Ordering::Relaxed)
    }

    /// Pipelines of fixed-window counters sent so far instead of script calls.
    pub fn pipelines(&self) -> u64 {
        self.pipelines.load(Ordering::Relaxed)
    }

    /// The pipelines' `EXPIRE`s so far: sent, left out (the counter known to carry a TTL), and sent
    /// after the fact (a counter found created without one).
    pub fn expires(&self) -> (u64, u64, u64) {
        let timed = &self.timed;
        (
            timed.sent.load(Ordering::Relaxed),
            timed.skipped.load(Ordering::Relaxed),
            timed.repaired.load(Ordering::Relaxed),
        )
    }

    /// Whether Redis answers a `PING` within the deadline (readiness).
    pub async fn ping(&self) -> bool {
        let command = redis::cmd("PING");
        let reply = self
            .call_whole(|mut conn| async move { command.query_async::<String>(&mut conn).await })
            .await;
        reply.is_ok()
    }

    /// Runs one call that is sent whole (not split per hash slot) on a connection of the deployment,
    /// within the deadline. A timeout stalls the connection; on Sentinel, a failure that suggests a
    /// failover refreshes the master ([`node_pool`]).
    async fn call_whole<T, F, Fut>(&self, call: F) -> Result<T, CallError>
    where
        F: FnOnce(WholeConnection) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        let Some(connections) = self.connections.load_full() else {
            return Err(CallError::NotConnected);
        };
        connections
            .on_whole(|conn| within(self.options.deadline, call(conn)))
            .await
    }

    /// Each item's Redis key, and the item as the script sees it (its `key` left empty: the caller
    /// points it at the name when the call is made).
    fn script_items(&self, batch: &Batch) -> Vec<(String, ScriptItem<'static>)> {
        let local_us = self.clock.now_us();
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
                    self.offsets.name_window(local_us, window, |start| {
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

    /// One script call. `slot`: the cluster slot every item lies in (`None` off a cluster).
    async fn invoke<C: ConnectionLike + Send>(
        &self,
        conn: &mut C,
        slot: Option<u16>,
        items: &[ScriptItem<'_>],
        policy: CommitPolicy,
        markers: Option<Markers<'_>>,
        timeout: Duration,
    ) -> Result<Vec<Decision>, CallError> {
        let sent_at = self.clock.now_us();
        self.script_calls.fetch_add(1, Ordering::Relaxed);
        let call = within(timeout, self.script.call(conn, items, policy, markers.into()));
        let reply = if self.traced() {
            // A child of the RPC span (the current span), named as the database semantic conventions
            // name client calls: the operation. Coalesced calls serve several requests and have no
            // span of their own (traced requests are never coalesced).
            let span = tracing::info_span!(
                "FCALL",
                otel.kind = "client",
                db.system.name = "redis",
                db.operation.name = "FCALL",
                db.operation.batch.size = items.len(),
            );
            call.instrument(span).await
        } else {
            call.await
        };
        self.observe(slot, &reply);
        let reply = reply?;
        let ScriptReply {
            now_us,
            decisions,
            impossible,
        } = BatchScript::decode(reply, items.len()).map_err(CallError::Reply)?;
        if let Some(&first) = impossible.first() {
            self.impossible.found(impossible.len(), items[first].key, now_us);
        }
        self.offsets.record(slot, sent_at, self.clock.now_us(), now_us);
        Ok(decisions)
    }
}

/// `call`, bounded by `timeout`: its reply, or the Redis error or missed deadline as a [`CallError`].
async fn within<T>(
    timeout: Duration,
    call: impl Future<Output = redis::RedisResult<T>>,
) -> Result<T, CallError> {
    match tokio::time::timeout(timeout, call).await {
        Ok(reply) => reply.map_err(CallError::Redis),
        Err(_) => Err(CallError::Timeout),
    }
}

/// The positions of `keys`, grouped by the Redis Cluster hash slot each lies in (ascending slots).
fn by_slot<'k>(keys: impl Iterator<Item = &'k str>) -> BTreeMap<u16, Vec<usize>> {
    let mut by_slot: BTreeMap<u16, Vec<usize>> = BTreeMap::new();
    for (at, key) in keys.enumerate() {
        by_slot.entry(slot(key)).or_default().push(at);
    }
    by_slot
}

/// Puts a script call's decisions for the items at `positions` in their places, or its error.
pub(super) fn place(
    decisions: &mut [Result<Decision, StoreError>],
    positions: &[usize],
    result: Result<Vec<Decision>, StoreError>,
) {
    match result {
        Ok(decided) => {
            for (&at, decision) in positions.iter().zip(decided) {
                decisions[at] = Ok(decision);
            }
        }
        Err(error) => fail(decisions, positions.iter().copied(), &error),
    }
}

/// Gives the items at `positions` the error of the pipeline or call that should have decided them.
pub(super) fn fail(
    decisions: &mut [Result<Decision, StoreError>],
    positions: impl Iterator<Item = usize>,
    error: &StoreError,
) {
    for at in positions {
        decisions[at] = Err(error.clone());
    }
}

/// Whether the item at `at` belongs to a group of several items (groups are contiguous).
fn shares_group(items: &[BatchItem], at: usize) -> bool {
    let group = items[at].group;
    (at > 0 && items[at - 1].group == group) || items.get(at + 1).is_some_and(|next| next.group == group)
}

impl Store for Arc<RedisStore> {
    fn name(&self) -> &'static str {
        "redis"
    }

    async fn apply(&self, batch: &Batch) -> Result<Vec<Decision>, StoreError> {
        self.batches.fetch_add(1, Ordering::Relaxed);
        let named = self.script_items(batch);
        // Fixed-window counters alone need no script (see `pipeline`); traced requests keep the
        // script, whose call is their Redis span.
        let traced = self.traced();
        let pipelined = self.options.pipeline_fixed_windows
            && batch.policy == CommitPolicy::Independent
            && !traced
            && pipeline::pipelinable(&batch.items);
        if self.coalesces(batch, traced) {
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
        Box::pin(self.apply_alone(batch, named)).await
    }

    fn shares_with_go(&self) -> bool {
        true
    }
}

impl RedisStore {
    /// Whether a batch goes through the [`coalesce`] queue: any independent batch, except when the
    /// request is traced, so its `FCALL` span stays the child of its own RPC span. Fixed-window batches
    /// share a pipeline ([`pipeline`]); the others share a script call, or in a cluster, where a script
    /// call must stay in one slot, a pipeline of script calls per master ([`cluster_scripts`]).
    fn coalesces(&self, batch: &Batch, traced: bool) -> bool {
        batch.policy == CommitPolicy::Independent && !traced
    }

    /// One batch on the deployment's connection: one script call (per slot in a cluster).
    async fn invoke_whole(
        &self,
        items: &[ScriptItem<'_>],
        policy: CommitPolicy,
        markers: Option<Markers<'_>>,
        timeout: Duration,
    ) -> Result<Vec<Decision>, StoreError> {
        let Some(connections) = self.connections.load_full() else {
            return Err(StoreError::Unavailable("not connected to Redis yet".into()));
        };
        let result = match &*connections {
            Connections::Cluster(conn) => self.apply_per_slot(conn, items, policy, markers, timeout).await,
            whole => {
                whole
                    .on_whole(async |mut conn| {
                        self.invoke(&mut conn, None, items, policy, markers, timeout)
                            .await
                    })
                    .await
            }
        };
        result.map_err(|e| e.into_store_error(self.options.deadline))
    }
}
