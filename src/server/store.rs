//! The store the settings ask for: the embedded one, or Redis (with the per-second Redis of
//! `REDIS_PERSECOND`) behind the local over-limit cache, and which of them health pings.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::options::store_options;
use crate::observe::health::Pinged;
use crate::settings::{Origins, StoreSettings};
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
    let options = store_options(settings, origins, crate::observe::telemetry::traces_enabled())?;
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
