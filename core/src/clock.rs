//! Where the limiter and its stores read the time.
//!
//! Algorithms never read the clock themselves: time is an argument (see [`crate::algorithm`]), so the
//! same code is exact in tests (a [`ManualClock`]) and in production (the [`SystemClock`]). The Redis store
//! decides with the Redis server's clock, read inside its scripts, so replicas with skewed clocks still
//! agree; it reads this one only to name fixed windows (corrected by the Redis clock's offset).
//!
//! Two readings: the wall clock, which windows are aligned to, and a monotonic one, which never steps
//! (an NTP step moves the wall clock, backwards too). What this instance times on its own (a hot key's
//! slice, a cached denial) is a duration, and is timed on the monotonic reading: on the wall clock, a
//! step back would let a slice be admitted from past the window that granted it.

use std::fmt::Debug;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// A source of the current time in microseconds since the Unix epoch, and of a monotonic time.
pub trait Clock: Send + Sync + Debug {
    /// Microseconds since the Unix epoch.
    fn now_us(&self) -> u64;

    /// Microseconds since an arbitrary instant, on a clock that never goes back: only differences
    /// between two readings mean anything.
    fn monotonic_us(&self) -> u64;
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

    fn monotonic_us(&self) -> u64 {
        static STARTED: LazyLock<Instant> = LazyLock::new(Instant::now);
        u64::try_from(STARTED.elapsed().as_micros()).unwrap_or(u64::MAX)
    }
}

/// A clock that only moves when told to; clones share the same time. Its monotonic reading starts at the
/// wall clock's and moves with [`ManualClock::advance_us`] only: [`ManualClock::set_us`] is a step of
/// the wall clock, as NTP makes one.
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    now_us: Arc<AtomicU64>,
    monotonic_us: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock reading `now_us` microseconds since the epoch.
    pub fn new(now_us: u64) -> Self {
        Self {
            now_us: Arc::new(AtomicU64::new(now_us)),
            monotonic_us: Arc::new(AtomicU64::new(now_us)),
        }
    }

    /// Moves the clock forward by `us` microseconds: time passes.
    pub fn advance_us(&self, us: u64) {
        self.now_us.fetch_add(us, Ordering::SeqCst);
        self.monotonic_us.fetch_add(us, Ordering::SeqCst);
    }

    /// Sets the wall clock to an absolute time, forward or back, with no time passing: the monotonic
    /// reading stays where it is.
    pub fn set_us(&self, now_us: u64) {
        // Release, not SeqCst: a plain store on x86, where `tollgate what-if` sets it per record.
        self.now_us.store(now_us, Ordering::Release);
    }
}

impl Clock for ManualClock {
    fn now_us(&self) -> u64 {
        self.now_us.load(Ordering::Acquire)
    }

    fn monotonic_us(&self) -> u64 {
        self.monotonic_us.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wall_clock_step_leaves_the_monotonic_reading_alone() {
        let clock = ManualClock::new(5_000_000);
        clock.advance_us(1_000_000);
        assert_eq!((clock.now_us(), clock.monotonic_us()), (6_000_000, 6_000_000));
        clock.set_us(1_000_000);
        assert_eq!((clock.now_us(), clock.monotonic_us()), (1_000_000, 6_000_000));
        clock.advance_us(500_000);
        assert_eq!((clock.now_us(), clock.monotonic_us()), (1_500_000, 6_500_000));
        let system = SystemClock;
        let (a, b) = (system.monotonic_us(), system.monotonic_us());
        assert!(b >= a);
    }
}
