//! The link to Redis: everything about reaching it, nothing about what is asked of it. One
//! [`RedisLink`] holds the connections of a deployment (a pool to a single node or to the master
//! Sentinel names, or a Redis Cluster connection), makes them in the background with backoff, finds
//! stalled connections and replaces them (`node_pool.rs`), follows Sentinel failovers (`sentinel.rs`),
//! rebuilds a cluster connection whose calls keep failing (`cluster_rebuild.rs`), reads the cluster's
//! slot map with a connection to each master (`slot_map.rs`), answers pings and counts its pool.
//!
//! It knows no algorithm, script or decision: what its user loads onto new connections (the batch
//! library) comes in through a `Prepare` of the user's. `RedisLink::start(...).ping()` is a whole conversation with
//! Redis.

mod address;
mod cluster_rebuild;
mod connections;
mod error;
mod node_pool;
mod sentinel;
mod slot_map;

use std::future::Future;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Weak};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use futures_util::future::BoxFuture;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use tokio_util::sync::CancellationToken;

pub use self::address::{RedisMode, RedisTarget, TargetError, without_userinfo};
use self::cluster_rebuild::ClusterRebuild;
pub(crate) use self::connections::{Connections, WholeConnection};
pub use self::error::ReplyError;
pub(crate) use self::error::{CallError, within};
use self::node_pool::NodePool;
use self::sentinel::SentinelLink;
pub(crate) use self::slot_map::{Routes, SLOTS};
use crate::clock::Clock;
use crate::store::PoolCounters;

/// First and longest pause between connection attempts.
const RECONNECT_BACKOFF: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(5));

/// How to reach Redis.
#[derive(Debug, Clone)]
pub struct LinkOptions {
    /// Where Redis is.
    pub target: RedisTarget,
    /// Multiplexed connections to a single node, used round-robin.
    pub connections: usize,
    /// Longest a call may wait for Redis; bounds [`RedisLink::ping`] and the sockets' response timeout.
    pub deadline: Duration,
    /// Longest a connection attempt may take.
    pub connect_timeout: Duration,
    /// Certificates for TLS; `None` trusts the system's roots (whether TLS is used is in the target).
    pub tls: Option<redis::TlsCertificates>,
}

/// What the link's user does with new connections before they serve calls (the store loads its batch
/// library). Each returns when done; a failure is the user's to log, never the link's to act on.
pub(crate) trait Prepare: Send + Sync + 'static {
    /// The deployment's first connection (a node of the pool, or the cluster connection), before the
    /// link reports itself connected.
    fn connected(&self, conn: WholeConnection) -> BoxFuture<'static, ()>;
    /// A connection of the link's own to one cluster master, before the slot map naming it is used.
    fn master_linked(&self, conn: ConnectionManager) -> BoxFuture<'static, ()>;
}

/// Nothing to prepare.
impl Prepare for () {
    fn connected(&self, _: WholeConnection) -> BoxFuture<'static, ()> {
        Box::pin(async {})
    }

    fn master_linked(&self, _: ConnectionManager) -> BoxFuture<'static, ()> {
        Box::pin(async {})
    }
}

/// The connections to one Redis deployment, and what keeps them serving.
pub struct RedisLink {
    options: LinkOptions,
    connections: ArcSwapOption<Connections>,
    prepare: Box<dyn Prepare>,
    clock: Arc<dyn Clock>,
    /// Redis Cluster only: rebuilds a connection whose calls keep failing.
    rebuild: Option<ClusterRebuild>,
    /// Redis Cluster only: the master serving each slot, once read, and a connection to each, for
    /// grouping pipelines by master.
    slot_map: ArcSwapOption<slot_map::Masters>,
    /// When the slot map was last asked for (local µs), so it is asked for at most once a second.
    slot_map_tried_us: AtomicU64,
    /// This link, for the background tasks it starts.
    me: Weak<RedisLink>,
}

impl std::fmt::Debug for RedisLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisLink")
            .field("target", &self.options.target)
            .field("connected", &self.connections.load().is_some())
            .finish_non_exhaustive()
    }
}

impl RedisLink {
    /// Starts connecting in the background until connected or `stop` is cancelled. Returns at once: a
    /// Redis that is down at startup is not an error, only a link that is not connected yet.
    pub fn start(options: LinkOptions, clock: Arc<dyn Clock>, stop: CancellationToken) -> Arc<Self> {
        Self::start_preparing(options, clock, stop, ())
    }

    /// [`RedisLink::start`], with `prepare` run on each new connection before it serves.
    pub(crate) fn start_preparing(
        options: LinkOptions,
        clock: Arc<dyn Clock>,
        stop: CancellationToken,
        prepare: impl Prepare,
    ) -> Arc<Self> {
        // redis-rs builds its TLS configs on rustls' process-wide provider; another install (a second
        // link in tests) is a no-op.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let cluster = matches!(options.target.mode, RedisMode::Cluster(_));
        let link = Arc::new_cyclic(|me| Self {
            options,
            connections: ArcSwapOption::empty(),
            prepare: Box::new(prepare),
            clock,
            rebuild: cluster.then(ClusterRebuild::new),
            slot_map: ArcSwapOption::empty(),
            slot_map_tried_us: AtomicU64::new(0),
            me: me.clone(),
        });
        tokio::spawn(Arc::clone(&link).connect_until_connected(stop));
        link
    }

    async fn connect_until_connected(self: Arc<Self>, stop: CancellationToken) {
        let mut backoff = RECONNECT_BACKOFF.0;
        loop {
            match self.connect().await {
                Ok(connections) => {
                    self.prepare.connected(connections.first()).await;
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

    /// Notes whether a call to cluster slot `slot` reached Redis; when calls to a slot keep failing,
    /// starts a rebuild of the cluster connection in the background.
    pub(crate) fn observe<T>(&self, slot: Option<u16>, result: &Result<T, CallError>) {
        let (Some(rebuild), Some(slot)) = (&self.rebuild, slot) else {
            return;
        };
        let failed = matches!(result, Err(CallError::Timeout | CallError::Redis(_)));
        if !rebuild.record(slot, failed) {
            return;
        }
        let Some(link) = self.me.upgrade() else {
            rebuild.done();
            return;
        };
        tokio::spawn(async move {
            tracing::warn!(
                failing_for = ?ClusterRebuild::AFTER,
                "Redis Cluster calls keep failing: reconnecting from the seed nodes"
            );
            match link.connect().await {
                Ok(connections) => {
                    link.connections.store(Some(Arc::new(connections)));
                    tracing::info!("reconnected to Redis Cluster");
                }
                Err(error) => tracing::warn!(%error, "cannot reconnect to Redis Cluster yet"),
            }
            if let Some(rebuild) = &link.rebuild {
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
                    .tcp_settings(address::tcp_settings())
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

    /// Where Redis is (its address without userinfo).
    pub fn target(&self) -> &RedisTarget {
        &self.options.target
    }

    /// Whether the target is a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        matches!(self.options.target.mode, RedisMode::Cluster(_))
    }

    /// The per-call deadline.
    pub fn deadline(&self) -> Duration {
        self.options.deadline
    }

    /// The live connections; `None` until the first connection is made.
    pub(crate) fn connections(&self) -> Option<Arc<Connections>> {
        self.connections.load_full()
    }

    /// Connections found stalled so far: a call on them outlived its timeout (see `node_pool.rs`).
    pub fn stalled_connections(&self) -> u64 {
        match self.connections.load().as_deref() {
            Some(Connections::Node(pool)) => pool.stalls(),
            _ => 0,
        }
    }

    /// The connections as envoyproxy/ratelimit's pool stats count them (`None` on a Redis Cluster).
    pub fn pool_counters(&self) -> Option<PoolCounters> {
        match self.connections.load().as_deref() {
            Some(Connections::Node(pool)) => Some(pool.counters()),
            Some(_) => None,
            None => (!self.is_cluster()).then(PoolCounters::default),
        }
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
    pub(crate) async fn call_whole<T, F, Fut>(&self, call: F) -> Result<T, CallError>
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
}
