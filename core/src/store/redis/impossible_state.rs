//! Values in Redis that no Tollgate could have written: a state with a NaN, an infinity, a negative or
//! fractional count, or an instant far ahead of Redis's clock (hand-made, or written by something
//! else under Tollgate's key names). Left alone, such a value could deny forever (with a retry hint of
//! centuries), admit without limit until its window rolls, or fail every call; and with no TTL it
//! would never heal. The script reads it as no state, removes or overwrites it (`lua/exact.lua` says
//! what is checked), and flags the item; here each one is counted, and logged at most once a minute.
//! A hot key's reservers hash is held to the same rule (`lua/batch.lua`, reserve): one of another type,
//! with more fields than reservers are admitted, or without a TTL is removed, flagged and counted.

use std::sync::atomic::{AtomicU64, Ordering};

/// How often at most a warning about impossible values is logged.
const LOG_EVERY_US: u64 = 60_000_000;

/// What was found so far.
#[derive(Debug, Default)]
pub(super) struct ImpossibleStates {
    /// Items whose key held an impossible value.
    found: AtomicU64,
    /// When the last warning was logged (Redis clock, µs; 0: never).
    logged_us: AtomicU64,
}

impl ImpossibleStates {
    /// Counts `items` found in one call at Redis time `now_us`; logs `key` (the first of them) unless
    /// a warning was logged within the last minute.
    pub(super) fn found(&self, items: usize, key: &str, now_us: u64) {
        let total = self.found.fetch_add(items as u64, Ordering::Relaxed) + items as u64;
        let last = self.logged_us.load(Ordering::Relaxed);
        let due = last == 0 || now_us.saturating_sub(last) >= LOG_EVERY_US;
        if due
            && self
                .logged_us
                .compare_exchange(last, now_us.max(1), Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            tracing::warn!(
                key,
                total,
                "a Redis key held a value no Tollgate could have written (NaN, an infinity, a \
                 negative count, a time far ahead, a reservers hash of the wrong shape): decided as no \
                 state and repaired"
            );
        }
    }

    /// Items found so far whose key held an impossible value.
    pub(super) fn count(&self) -> u64 {
        self.found.load(Ordering::Relaxed)
    }
}
