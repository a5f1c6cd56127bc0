//! Redis Cluster: when calls to a slot have failed without a success there in between for
//! [`ClusterRebuild::AFTER`], the cluster connection is made again from the seed nodes. Successes on
//! other slots do not end the run: with one master down, calls to the others still work.
//!
//! redis-rs refreshes its slot map on `MOVED` and on some errors, but after a master dies and its
//! replica is promoted, calls to the cluster were seen failing indefinitely (the faults suite's
//! `cluster_master_killed_and_replaced_by_its_replica`). A new connection reads the topology afresh.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// When a run of failed calls calls for a new cluster connection.
#[derive(Debug)]
pub(super) struct ClusterRebuild {
    /// The current run of failures, in one word so it changes atomically: the slot it started on
    /// (high 16 bits) and when, in µs since `epoch` plus one (low 48 bits, 8 years); 0: no run.
    failing: AtomicU64,
    rebuilding: AtomicBool,
    epoch: Instant,
}

impl ClusterRebuild {
    /// How long calls must keep failing before the connection is rebuilt (and between rebuilds).
    pub(super) const AFTER: Duration = Duration::from_millis(500);

    pub(super) fn new() -> Self {
        Self {
            failing: AtomicU64::new(0),
            rebuilding: AtomicBool::new(false),
            epoch: Instant::now(),
        }
    }

    /// Records the outcome of a call to `slot`; returns whether a rebuild should start now (then it
    /// is marked as running until [`ClusterRebuild::done`]).
    pub(super) fn record(&self, slot: u16, failed: bool) -> bool {
        self.record_at(slot, failed, self.epoch.elapsed())
    }

    /// [`ClusterRebuild::record`] at `elapsed` since the epoch.
    fn record_at(&self, slot: u16, failed: bool, elapsed: Duration) -> bool {
        // Read first: a healthy cluster's calls then never write the shared word.
        let run = self.failing.load(Ordering::Relaxed);
        if !failed {
            if run != 0 && run >> TIME_BITS == u64::from(slot) {
                // Ends the run, unless another one replaced it meanwhile.
                let _ = self
                    .failing
                    .compare_exchange(run, 0, Ordering::Relaxed, Ordering::Relaxed);
            }
            return false;
        }
        let now = u64::try_from(elapsed.as_micros())
            .unwrap_or(TIME_MASK)
            .min(TIME_MASK - 1)
            + 1;
        let since = if run != 0 {
            run & TIME_MASK
        } else {
            let started = (u64::from(slot) << TIME_BITS) | now;
            match self
                .failing
                .compare_exchange(0, started, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => now,
                Err(other) => other & TIME_MASK,
            }
        };
        let long = Duration::from_micros(now.saturating_sub(since)) >= Self::AFTER;
        long && !self.rebuilding.swap(true, Ordering::AcqRel)
    }

    /// A rebuild ended: the next needs another [`ClusterRebuild::AFTER`] of failures.
    pub(super) fn done(&self) {
        self.failing.store(0, Ordering::Relaxed);
        self.rebuilding.store(false, Ordering::Release);
    }
}

/// Bits of [`ClusterRebuild::failing`] that hold the time.
const TIME_BITS: u32 = 48;
const TIME_MASK: u64 = (1 << TIME_BITS) - 1;

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_rebuild_starts_once_calls_have_failed_long_enough() {
        let rebuild = ClusterRebuild::new();
        assert!(!rebuild.record_at(7, true, Duration::ZERO), "one failure");
        assert!(!rebuild.record_at(7, true, 499 * MS));
        assert!(rebuild.record_at(7, true, 500 * MS), "500 ms of failures");
        assert!(!rebuild.record_at(7, true, 900 * MS), "one rebuild at a time");
        rebuild.done();
        assert!(
            !rebuild.record_at(7, true, 1_000 * MS),
            "the clock starts again after a rebuild"
        );
        assert!(rebuild.record_at(7, true, 1_500 * MS));
    }

    #[test]
    fn a_success_on_the_failing_slot_ends_the_run() {
        let rebuild = ClusterRebuild::new();
        assert!(!rebuild.record_at(7, true, Duration::ZERO));
        assert!(!rebuild.record_at(7, false, 300 * MS));
        assert!(
            !rebuild.record_at(7, true, 600 * MS),
            "a new run starts at 600 ms"
        );
        assert!(rebuild.record_at(7, true, 1_100 * MS));
    }

    /// One master down, the others fine: their successes do not hide its failures.
    #[test]
    fn successes_on_other_slots_do_not_end_the_run() {
        let rebuild = ClusterRebuild::new();
        assert!(!rebuild.record_at(7, true, Duration::ZERO));
        for at in (10..500).step_by(10) {
            assert!(!rebuild.record_at(9_000, false, at * MS));
            assert!(!rebuild.record_at(7, true, at * MS + MS));
        }
        assert!(rebuild.record_at(7, true, 510 * MS));
    }
}
