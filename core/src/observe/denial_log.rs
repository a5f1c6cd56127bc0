//! Sampled logging of refusals: the first few per second are logged with the rule and the caller's
//! storage key (hashed where the rule hashes), the rest are counted and reported in the next second's
//! first line. A flood of 429s shows up in the logs at once without the logs becoming the flood.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Refusals logged per second before the rest are only counted.
pub const PER_SECOND: u64 = 5;

/// The sampler.
#[derive(Debug, Default)]
pub struct DenialLog {
    second: AtomicU64,
    logged: AtomicU64,
    suppressed: AtomicU64,
}

impl DenialLog {
    /// Logs one refusal if this second's budget allows, else counts it.
    pub fn refused(&self, domain: &str, rule: &str, key: &str, retry_after_ms: u128) {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        if self.second.swap(now, Ordering::Relaxed) != now {
            self.logged.store(0, Ordering::Relaxed);
        }
        if self.logged.fetch_add(1, Ordering::Relaxed) >= PER_SECOND {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let suppressed = self.suppressed.swap(0, Ordering::Relaxed);
        tracing::info!(%domain, %rule, %key, retry_after_ms, suppressed_since_last = suppressed, "over limit");
    }
}
