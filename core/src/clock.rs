//! Where the embedded store gets its time from.
//!
//! Algorithms never read the clock themselves: time is an argument (see [`crate::algorithm`]), so the
//! same code is exact in tests (a [`ManualClock`]) and in production (the [`SystemClock`]). The Redis store
//! does not use this module at all: it reads the Redis server's clock inside its scripts, so replicas
//! with skewed clocks still agree.

use std::fmt::Debug;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// A source of the current time in microseconds since the Unix epoch.
pub trait Clock: Send + Sync + Debug {
    /// Microseconds since the Unix epoch.
    fn now_us(&self) -> u64;
}

/// The machine's wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_us(&self) -> u64 {
        // A clock set before 1970 is a broken host; answering 0 keeps decisions defined instead of
        // panicking on the hot path.
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
    }
}

/// A clock that only moves when told to; clones share the same time.
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    now_us: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock reading `now_us` microseconds since the epoch.
    pub fn new(now_us: u64) -> Self {
        Self {
            now_us: Arc::new(AtomicU64::new(now_us)),
        }
    }

    /// Moves the clock forward by `us` microseconds.
    pub fn advance_us(&self, us: u64) {
        self.now_us.fetch_add(us, Ordering::SeqCst);
    }

    /// Sets the clock to an absolute time.
    pub fn set_us(&self, now_us: u64) {
        self.now_us.store(now_us, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_us(&self) -> u64 {
        self.now_us.load(Ordering::SeqCst)
    }
}
