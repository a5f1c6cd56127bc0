//! The store the settings ask for: the embedded one, or Redis (with the per-second Redis of
//! `REDIS_PERSECOND`) behind the local over-limit cache, and which of them health pings.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::options::read_setting_file;
use crate::observe::health::Pinged;
use crate::settings::{Origins, SettingsError, StoreSettings};
use tollgate_core::clock::Clock;
use tollgate_core::store::AnyStore;

/// The embedded store, or Redis (connecting in the background) behind the local over-limit cache, as
/// the store settings say; the `REDIS_TLS_*` files are read now, so a missing one stops startup.
pub(super) fn build_store(
    settings: &StoreSettings,
    origins: &Origins,
    clock: Arc<dyn Clock>,
    stop: CancellationToken,
) -> anyhow::Result<AnyStore> {
    let tls = redis_tls_certificates(settings)?;
    let options = settings.store_options(origins, tls, crate::observe::telemetry::traces_enabled())?;
    match (&options.redis, &options.per_second) {
        (None, _) => tracing::info!("no REDIS_URL: counting in the embedded store (one instance only)"),
        (Some(_), Some(per_second)) => tracing::info!(
            redis = %per_second.target,
            "per-second limits are counted in their own Redis (REDIS_PERSECOND)"
        ),
        (Some(_), None) => {}
    }
    Ok(AnyStore::open(options, clock, stop))
}

/// The Redis stores of `store` for the health watcher, named as `tollgate_store_up` labels them.
pub(super) fn pinged(store: &AnyStore) -> Pinged {
    match store {
        AnyStore::Memory(_) => Vec::new(),
        AnyStore::Redis(stores) => {
            let mut pinged = vec![("redis", Arc::clone(stores.main.redis()))];
            pinged.extend(
                stores
                    .per_second
                    .as_ref()
                    .map(|cache| ("redis_persecond", Arc::clone(cache.redis()))),
            );
            pinged
        }
    }
}

/// The certificates for TLS to Redis, read from the configured files (none configured: `None`, and the
/// system's roots verify the server).
fn redis_tls_certificates(settings: &StoreSettings) -> Result<Option<redis::TlsCertificates>, SettingsError> {
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
                name: "redis_tls_client_cert".into(),
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
