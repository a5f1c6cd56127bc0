//! Redis Sentinel: the master is found through the sentinels, and found again after a failover.
//!
//! The connection to the master is a redis-rs `ConnectionManager`, which reconnects to the same
//! address by itself. After a failover that address is a demoted replica (writes answer `READONLY`) or
//! gone, so when a call fails that way the master is re-resolved through the sentinels in the
//! background and the new connection swapped in ([`super::node_pool`]). The failing call itself gets
//! the rules' failure mode; the calls after the swap reach the new master.

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{ConnectionInfo, RedisConnectionInfo, TlsCertificates, TlsMode};
use tokio::sync::Mutex;

/// The sentinels, asked for the master.
pub(crate) struct SentinelLink {
    sentinels: Mutex<SentinelClient>,
}

impl SentinelLink {
    /// Asks the sentinels for `master` and connects to it: the link, and the connection. With `tls`, both
    /// the sentinels and the master are reached over TLS, verified with `certificates` when given (else
    /// the system's roots).
    pub(crate) async fn connect(
        master: &str,
        sentinels: &[ConnectionInfo],
        node: &RedisConnectionInfo,
        tls: Option<(TlsMode, Option<TlsCertificates>)>,
        config: ConnectionManagerConfig,
    ) -> redis::RedisResult<(Self, ConnectionManager)> {
        let mut builder = SentinelClientBuilder::new(
            sentinels.iter().map(|s| s.addr().clone()),
            master,
            SentinelServerType::Master,
        )?
        .set_client_to_sentinel_tcp_settings(super::address::tcp_settings())
        .set_client_to_redis_tcp_settings(super::address::tcp_settings())
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
        let link = Self {
            sentinels: Mutex::new(builder.build()?),
        };
        let manager = link.resolve(config).await?;
        Ok((link, manager))
    }

    /// A connection to the master the sentinels name now.
    pub(crate) async fn resolve(
        &self,
        config: ConnectionManagerConfig,
    ) -> redis::RedisResult<ConnectionManager> {
        // The sentinel client is only touched here; the lock is never held on the request path.
        let client = self.sentinels.lock().await.async_get_client().await?;
        ConnectionManager::new_with_config(client, config).await
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
