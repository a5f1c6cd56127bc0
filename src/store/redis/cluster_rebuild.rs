//! Redis Cluster: when calls have failed without a success in between for [`ClusterRebuild::AFTER`],
//! the cluster connection is made again from the seed nodes.
//!
//! redis-rs refreshes its slot map on `MOVED` and on some errors, but after a master dies and its
//! replica is promoted, calls to the cluster were seen failing indefinitely (the faults suite's
//! `cluster_master_killed_and_replaced_by_its_replica`). A new connection reads the topology afresh.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// When a run of failed calls calls for a new cluster connection.
#[derive(Debug)]
pub(super) struct ClusterRebuild {
    /// When the current run of failures started, in µs since `epoch` plus one; 0: the last call worked.
    failing_since: AtomicU64,
    rebuilding: AtomicBool,
    epoch: Instant,
}

impl ClusterRebuild {
    /// How long calls must keep failing before the connection is rebuilt (and between rebuilds).
    pub(super) const AFTER: Duration = Duration::from_millis(500);

    pub(super) fn new() -> Self {
        Self {
            failing_since: AtomicU64::new(0),
            rebuilding: AtomicBool::new(false),
            epoch: Instant::now(),
        }
    }

    /// Records a call's outcome; returns whether a rebuild should start now (then it is marked as
    /// running until [`ClusterRebuild::done`]).
    pub(super) fn record(&self, failed: bool) -> bool {
        self.record_at(failed, self.epoch.elapsed())
    }

    /// [`ClusterRebuild::record`] at `elapsed` since the epoch.
    fn record_at(&self, failed: bool, elapsed: Duration) -> bool {
        if !failed {
            // Read first: a healthy cluster's calls then never write the shared line.
            if self.failing_since.load(Ordering::Relaxed) != 0 {
                self.failing_since.store(0, Ordering::Relaxed);
            }
            return false;
        }
        let now = u64::try_from(elapsed.as_micros())
            .unwrap_or(u64::MAX - 1)
            .saturating_add(1);
        let since = match self
            .failing_since
            .compare_exchange(0, now, Ordering::Relaxed, Ordering::Relaxed)
        {
            Ok(_) => now,
            Err(since) => since,
        };
        let long = Duration::from_micros(now.saturating_sub(since)) >= Self::AFTER;
        long && !self.rebuilding.swap(true, Ordering::AcqRel)
    }

    /// A rebuild ended: the next needs another [`ClusterRebuild::AFTER`] of failures.
    pub(super) fn done(&self) {
        self.failing_since.store(0, Ordering::Relaxed);
        self.rebuilding.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_rebuild_starts_once_calls_have_failed_long_enough() {
        let rebuild = ClusterRebuild::new();
        assert!(!rebuild.record_at(true, Duration::ZERO), "one failure");
        assert!(!rebuild.record_at(true, 499 * MS));
        assert!(rebuild.record_at(true, 500 * MS), "500 ms of failures");
        assert!(!rebuild.record_at(true, 900 * MS), "one rebuild at a time");
        rebuild.done();
        assert!(
            !rebuild.record_at(true, 1_000 * MS),
            "the clock starts again after a rebuild"
        );
        assert!(rebuild.record_at(true, 1_500 * MS));
    }

    #[test]
    fn a_success_ends_the_run_of_failures() {
        let rebuild = ClusterRebuild::new();
        assert!(!rebuild.record_at(true, Duration::ZERO));
        assert!(!rebuild.record_at(false, 300 * MS));
        assert!(!rebuild.record_at(true, 600 * MS), "a new run starts at 600 ms");
        assert!(rebuild.record_at(true, 1_100 * MS));
    }
}
