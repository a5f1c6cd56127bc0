//! The open loop's schedule: request `k` is due at `start + k / rate`, whether or not earlier requests
//! were answered.
//!
//! A thread releases the requests that have come due as permits of a semaphore, every [`TICK`]. The
//! semaphore is fair, so the worker that has waited longest takes the next one, and exactly one worker
//! wakes per request (no herd). The worker then takes the next request number and measures latency
//! from its due time: a request that waited for a free worker counts its wait. A tokio timer could
//! not pace this: it fires at 1 ms granularity, and sends would leave in bursts.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;

/// How often the pacing thread releases due requests. A due time is met within about this (the
/// thread's sleep is not more precise), which the latencies include.
const TICK: Duration = Duration::from_micros(50);

/// Hands out due requests to the workers (clones share the schedule).
#[derive(Debug, Clone)]
pub(super) struct Pacer {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    due: Semaphore,
    /// Requests released so far.
    released: AtomicU64,
    /// Requests taken by workers so far.
    taken: AtomicU64,
    start: Instant,
    rate: u64,
}

impl Pacer {
    /// Releases `rate` requests a second from `start` until `deadline`, on a thread of its own.
    pub(super) fn start(rate: u64, start: Instant, deadline: Instant) -> Self {
        let shared = Arc::new(Shared {
            due: Semaphore::new(0),
            released: AtomicU64::new(0),
            taken: AtomicU64::new(0),
            start,
            rate: rate.max(1),
        });
        let pacing = Arc::clone(&shared);
        std::thread::spawn(move || {
            loop {
                let now = Instant::now();
                let due = pacing.due_by(now.min(deadline));
                let before = pacing.released.swap(due, Ordering::Relaxed);
                let newly = usize::try_from(due.saturating_sub(before)).unwrap_or(usize::MAX);
                pacing
                    .due
                    .add_permits(newly.min(Semaphore::MAX_PERMITS - pacing.due.available_permits()));
                if now >= deadline {
                    return;
                }
                std::thread::sleep(TICK);
            }
        });
        Self { shared }
    }

    /// Waits for the next due request; returns when it was due, or `None` at the deadline.
    pub(super) async fn next_due(&self, deadline: Instant) -> Option<Instant> {
        // A permit waiting at the deadline stays unsent: the run is over.
        if Instant::now() >= deadline {
            return None;
        }
        let permit = tokio::time::timeout_at(deadline.into(), self.shared.due.acquire())
            .await
            .ok()?
            .ok()?;
        permit.forget();
        let number = self.shared.taken.fetch_add(1, Ordering::Relaxed);
        Some(self.shared.due_at(number))
    }

    /// Requests that came due but no worker took before the run ended.
    pub(super) fn unsent(&self) -> u64 {
        let released = self.shared.released.load(Ordering::Relaxed);
        released.saturating_sub(self.shared.taken.load(Ordering::Relaxed))
    }
}

impl Shared {
    /// How many requests are due by `at`: request 0 at the start, then one every `1 / rate` s.
    fn due_by(&self, at: Instant) -> u64 {
        let elapsed = at.saturating_duration_since(self.start).as_nanos();
        let due = elapsed * u128::from(self.rate) / 1_000_000_000 + 1;
        u64::try_from(due).unwrap_or(u64::MAX)
    }

    /// When request `number` is due.
    fn due_at(&self, number: u64) -> Instant {
        let nanos = u128::from(number) * 1_000_000_000 / u128::from(self.rate);
        self.start + Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_due_at_the_rate_from_the_start() {
        let start = Instant::now();
        let shared = Shared {
            due: Semaphore::new(0),
            released: AtomicU64::new(0),
            taken: AtomicU64::new(0),
            start,
            rate: 4_000,
        };
        assert_eq!(shared.due_by(start), 1, "the first request is due at once");
        assert_eq!(shared.due_by(start + Duration::from_micros(249)), 1);
        assert_eq!(shared.due_by(start + Duration::from_micros(250)), 2);
        assert_eq!(shared.due_by(start + Duration::from_secs(1)), 4_001);
        assert_eq!(shared.due_at(0), start);
        assert_eq!(shared.due_at(3), start + Duration::from_micros(750));
    }

    #[tokio::test]
    async fn workers_get_requests_at_the_rate_and_the_rest_are_unsent() {
        let start = Instant::now();
        let deadline = start + Duration::from_millis(200);
        let pacer = Pacer::start(1_000, start, deadline);
        // One slow worker taking a request every 2 ms: half the offered 1,000/s.
        let mut taken = 0;
        while let Some(due) = pacer.next_due(deadline).await {
            assert!(due <= Instant::now(), "never handed out before it is due");
            taken += 1;
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        std::thread::sleep(Duration::from_millis(5));
        let unsent = pacer.unsent();
        assert!((40..=110).contains(&taken), "{taken}");
        assert_eq!(
            taken + unsent,
            201,
            "every request due by the deadline is taken or unsent"
        );
    }
}
