//! Redis Sentinel: the master is found through the sentinels, and found again after a failover.
//!
//! The connection to the master is a redis-rs `ConnectionManager`, which reconnects to the same
//! address by itself. After a failover that address is a demoted replica (writes answer `READONLY`) or
//! gone, so when a call fails that way the master is re-resolved through the sentinels in the
//! background and the new connection swapped in. The failing call itself gets the rules' failure
//! mode; the calls after the swap reach the new master.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{ConnectionInfo, RedisConnectionInfo, TlsCertificates, TlsMode};
use tokio::sync::Mutex;

/// Shortest pause between two re-resolutions, so a burst of failing calls asks the sentinels once.
const RESOLVE_COOLDOWN: Duration = Duration::from_millis(500);

/// A master connection that follows failovers.
pub(crate) struct SentinelLink {
    sentinels: Mutex<SentinelClient>,
    config: ConnectionManagerConfig,
    current: ArcSwap<ConnectionManager>,
    resolving: AtomicBool,
}

impl SentinelLink {
    /// Asks the sentinels for `master` and connects to it. With `tls`, both the sentinels and the master
    /// are reached over TLS, verified with `certificates` when given (else the system's roots).
    pub(crate) async fn connect(
        master: &str,
        sentinels: &[ConnectionInfo],
        node: &RedisConnectionInfo,
        tls: Option<(TlsMode, Option<TlsCertificates>)>,
        config: ConnectionManagerConfig,
    ) -> redis::RedisResult<Self> {
        let mut builder = SentinelClientBuilder::new(
            sentinels.iter().map(|s| s.addr().clone()),
            master,
            SentinelServerType::Master,
        )?
        .set_client_to_sentinel_tcp_settings(super::target::tcp_settings())
        .set_client_to_redis_tcp_settings(super::target::tcp_settings())
        .set_client_to_redis_db(node.db());
        // The sentinels' own credentials (`REDIS_SENTINEL_AUTH`) ride on their addresses; the master's
        // (`REDIS_AUTH`) on `node`.
        if let Some(sentinel) = sentinels.first().map(ConnectionInfo::redis_settings) {
            if let Some(user) = sentinel.username() {
                builder = builder.set_client_to_sentinel_username(user);
            }
            if let Some(password) = sentinel.password() {
                builder = builder.set_client_to_sentinel_password(password);
            }
        }
        if let Some(user) = node.username() {
            builder = builder.set_client_to_redis_username(user);
        }
        if let Some(password) = node.password() {
            builder = builder.set_client_to_redis_password(password);
        }
        if let Some((mode, certificates)) = tls {
            builder = builder
                .set_client_to_sentinel_tls_mode(mode)
                .set_client_to_redis_tls_mode(mode);
            if let Some(certificates) = certificates {
                builder = builder
                    .set_client_to_sentinel_certificates(certificates.clone())
                    .set_client_to_redis_certificates(certificates);
            }
        }
        let mut client = builder.build()?;
        let manager =
            ConnectionManager::new_with_config(client.async_get_client().await?, config.clone()).await?;
        Ok(Self {
            sentinels: Mutex::new(client),
            config,
            current: ArcSwap::from_pointee(manager),
            resolving: AtomicBool::new(false),
        })
    }

    /// The current master connection (cheap: a clone of a multiplexed handle).
    pub(crate) fn connection(&self) -> ConnectionManager {
        ConnectionManager::clone(&self.current.load())
    }

    /// Starts re-resolving the master in the background unless that is already under way.
    pub(crate) fn refresh(self: &Arc<Self>) {
        if self.resolving.swap(true, Ordering::AcqRel) {
            return;
        }
        let link = Arc::clone(self);
        tokio::spawn(async move {
            match link.resolve().await {
                Ok(()) => tracing::info!("Redis master re-resolved through the sentinels"),
                Err(error) => {
                    tracing::warn!(%error, "cannot re-resolve the Redis master through the sentinels")
                }
            }
            tokio::time::sleep(RESOLVE_COOLDOWN).await;
            link.resolving.store(false, Ordering::Release);
        });
    }

    async fn resolve(&self) -> redis::RedisResult<()> {
        // The sentinel client is only touched here and at connect; the lock is never held on the
        // request path.
        let client = self.sentinels.lock().await.async_get_client().await?;
        let manager = ConnectionManager::new_with_config(client, self.config.clone()).await?;
        self.current.store(Arc::new(manager));
        Ok(())
    }
}

/// Whether a failed call means the master may have moved: the connection broke or the server
/// refuses writes as a replica.
pub(crate) fn suggests_failover(error: &redis::RedisError) -> bool {
    error.is_io_error()
        || error.is_connection_dropped()
        || error.is_connection_refusal()
        || error.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly)
}
