//! The store the settings ask for: the embedded one, or Redis (with the per-second Redis of
//! `REDIS_PERSECOND`) behind the local over-limit cache; where each Redis is; and readiness kept in
//! step with them.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::options::read_setting_file;
use crate::observe::health::Health;
use crate::settings::{Settings, SettingsError};
use tollgate_core::clock::Clock;
use tollgate_core::observe::metrics::Metrics;
use tollgate_core::store::AnyStore;
use tollgate_core::store::local_cache::LocalCache;
use tollgate_core::store::memory::MemoryStore;
use tollgate_core::store::per_second::RedisStores;
use tollgate_core::store::redis::without_userinfo;
use tollgate_core::store::redis::{RedisOptions, RedisStore, RedisTarget, TargetError};

/// The embedded store, or Redis (connecting in the background) behind the local over-limit cache.
pub(super) fn build_store(
    settings: &Settings,
    clock: Arc<dyn Clock>,
    stop: CancellationToken,
) -> anyhow::Result<AnyStore> {
    let Some(target) = redis_target(settings)? else {
        tracing::info!("no REDIS_URL: counting in the embedded store (one instance only)");
        return Ok(AnyStore::Memory(MemoryStore::with_max_keys(
            clock,
            settings.memory_max_keys,
        )));
    };
    let tls = redis_tls_certificates(settings)?;
    let cached = |target, connections, connect_timeout, (pipeline_window, pipeline_limit)| {
        let options = RedisOptions {
            target,
            connections,
            deadline: settings.redis_deadline,
            connect_timeout,
            expiration_jitter_max_secs: settings.expiration_jitter_max_seconds,
            tls: tls.clone(),
            pipeline_fixed_windows: settings.redis_pipeline_fixed_windows,
            pipeline_window,
            pipeline_limit,
            traces: crate::observe::telemetry::traces_enabled(),
        };
        let redis = RedisStore::start(options, Arc::clone(&clock), stop.clone());
        LocalCache::new(redis, settings.local_cache_size_in_bytes, Arc::clone(&clock))
    };
    let main = cached(
        target,
        settings.redis_pool_size,
        settings.redis_connect_timeout,
        (settings.redis_pipeline_window, settings.redis_pipeline_limit),
    );
    let per_second = redis_persecond_target(settings)?.map(|target| {
        tracing::info!(redis = %target, "per-second limits are counted in their own Redis (REDIS_PERSECOND)");
        cached(
            target,
            settings.redis_persecond_pool_size,
            settings.redis_persecond_connect_timeout,
            (
                settings.redis_persecond_pipeline_window,
                settings.redis_persecond_pipeline_limit,
            ),
        )
    });
    Ok(AnyStore::Redis(RedisStores { main, per_second }))
}

/// Keeps readiness and `tollgate_store_up` in step with Redis (every Redis in use: the main one and the
/// per-second one): a PING every [`STORE_PROBE_INTERVAL`]; state changes are logged.
pub(super) async fn watch_redis(
    redis: Vec<Arc<RedisStore>>,
    health: Health,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) {
    let mut ticker = tokio::time::interval(STORE_PROBE_INTERVAL);
    let mut reachable = false;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = ticker.tick() => {}
        }
        let pings = futures_util::future::join_all(redis.iter().map(|r| r.ping())).await;
        let now = pings.into_iter().all(|up| up);
        if now != reachable {
            reachable = now;
            if reachable {
                tracing::info!("Redis answers: ready");
            } else {
                tracing::warn!("Redis does not answer: not ready (rules with failure_mode still answer)");
            }
            health.set_store_reachable(reachable).await;
            metrics.set_store_up(reachable);
        }
    }
}

/// How often readiness checks that Redis answers.
const STORE_PROBE_INTERVAL: Duration = Duration::from_millis(500);

/// Where Redis is, or `None` for the embedded store. The error names the URL without its userinfo.
pub(crate) fn redis_target(settings: &Settings) -> Result<Option<RedisTarget>, SettingsError> {
    if settings.redis_url.trim().is_empty() {
        return Ok(None);
    }
    RedisTarget::parse(
        &settings.redis_url,
        &settings.redis_type,
        &settings.redis_socket_type,
        settings.redis_auth.expose(),
        settings.redis_sentinel_auth.expose(),
        settings.redis_tls,
        settings.redis_tls_skip_hostname_verification,
    )
    .map(Some)
    .map_err(bad_target("redis_url", &settings.redis_url))
}

/// Where the per-second Redis is (`REDIS_PERSECOND`), or `None` when per-second limits stay in the
/// main one.
pub(crate) fn redis_persecond_target(settings: &Settings) -> Result<Option<RedisTarget>, SettingsError> {
    if !settings.redis_persecond {
        return Ok(None);
    }
    RedisTarget::parse(
        &settings.redis_persecond_url,
        &settings.redis_persecond_type,
        &settings.redis_persecond_socket_type,
        settings.redis_persecond_auth.expose(),
        settings.redis_persecond_sentinel_auth.expose(),
        settings.redis_persecond_tls,
        settings.redis_tls_skip_hostname_verification,
    )
    .map(Some)
    .map_err(bad_target("redis_persecond_url", &settings.redis_persecond_url))
}

/// A Redis location that does not parse, as the setting `name` holding `url`: the error names the
/// URL without its userinfo (a password never reaches a log).
fn bad_target<'a>(name: &'static str, url: &'a str) -> impl FnOnce(TargetError) -> SettingsError + 'a {
    move |error| SettingsError::BadValue {
        name,
        value: without_userinfo(url),
        reason: error.to_string(),
    }
}

/// The certificates for TLS to Redis, read from the configured files (none configured: `None`, and the
/// system's roots verify the server).
pub(super) fn redis_tls_certificates(
    settings: &Settings,
) -> Result<Option<redis::TlsCertificates>, SettingsError> {
    let read = read_setting_file;
    let root_cert = match settings.redis_tls_cacert.as_str() {
        "" => None,
        path => Some(read("redis_tls_cacert", path)?),
    };
    let client_tls = match (
        settings.redis_tls_client_cert.as_str(),
        settings.redis_tls_client_key.as_str(),
    ) {
        ("", "") => None,
        (cert, key) if !cert.is_empty() && !key.is_empty() => Some(redis::ClientTlsConfig {
            client_cert: read("redis_tls_client_cert", cert)?,
            client_key: read("redis_tls_client_key", key)?,
        }),
        _ => {
            return Err(SettingsError::BadValue {
                name: "redis_tls_client_cert",
                value: settings.redis_tls_client_cert.clone(),
                reason: "a client certificate and its key go together".into(),
            });
        }
    };
    Ok(
        (root_cert.is_some() || client_tls.is_some()).then_some(redis::TlsCertificates {
            client_tls,
            root_cert,
        }),
    )
}
