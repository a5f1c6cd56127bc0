//! How many connections each listener holds, and which one gives way at the cap ([`ConnectionCap`]).
//!
//! A connection is on probation from its accept until it has shown it is a client: a gRPC connection
//! until its HTTP/2 preface has arrived, an HTTP connection until a request's headers have. At the cap,
//! a new connection takes the place of the oldest one still on probation, which is closed
//! (`tollgate_connections_evicted_total`); only when every connection has sent a request is a new one
//! refused (closed at once, `tollgate_connections_refused_total`). So connections that send nothing, or
//! trickle their headers, cannot keep clients out: each new client pushes one of them out, where before
//! it waited for the read timeout. An evicted connection closes at its next poll, so for a moment the
//! listener may hold a few more than its cap (at most twice, as only probation slots are taken over).
//!
//! A gRPC connection that has sent no request for `TOLLGATE_IDLE_CONNECTION_PROBATION` is back on
//! probation ([`Slot::idle`]), in its original place by age, until its next request: one that
//! completed its handshake and then stayed silent cannot hold its slot against new clients, while an
//! idle Envoy connection is only ever closed when the listener is full.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tollgate_core::observe::metrics::Metrics;

/// Pause after an accept error (out of file descriptors, say), so an accept loop does not spin on it.
pub const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(50);

/// Accept errors and refusals are logged at most this often (a flood must not flood the log).
const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(60);

/// One listener's bound on its open connections; see the module's comment.
#[derive(Debug)]
pub struct ConnectionCap {
    open: Arc<Mutex<Open>>,
    max: usize,
    next_id: u64,
    /// Names the listener and its setting in the log line.
    what: &'static str,
    refusals: RateLimitedLog,
    metrics: Arc<Metrics>,
}

/// The connections a listener holds: how many, and those on probation by age (ids rise with time).
#[derive(Debug, Default)]
struct Open {
    count: usize,
    probation: BTreeMap<u64, CancellationToken>,
}

/// A connection's place in its listener's cap, given back when dropped.
#[derive(Debug)]
pub struct Slot {
    open: Arc<Mutex<Open>>,
    id: u64,
    proven: AtomicBool,
    /// Requests the connection has sent (counted on gRPC, to tell an idle connection).
    requests: AtomicU64,
    evicted: CancellationToken,
}

impl ConnectionCap {
    /// At most `max` connections (at least one); `what` names the listener and its setting.
    pub fn new(max: usize, what: &'static str, metrics: Arc<Metrics>) -> Self {
        Self {
            open: Arc::default(),
            max: max.max(1),
            next_id: 0,
            what,
            refusals: RateLimitedLog::default(),
            metrics,
        }
    }

    /// A slot for a new connection, taking over the oldest one on probation at the cap; `None`
    /// (counted, logged at most once a minute) when every connection held has proven itself.
    pub fn admit(&mut self) -> Option<Slot> {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        if open.count >= self.max {
            let Some((_, oldest)) = open.probation.pop_first() else {
                drop(open);
                self.metrics.connections_refused.add(1);
                self.refusals.warn(
                    "listener at its connection cap, every connection busy: new connections are closed",
                    &self.what,
                    self.max,
                );
                return None;
            };
            oldest.cancel();
            self.metrics.connections_evicted.add(1);
        }
        self.next_id += 1;
        let evicted = CancellationToken::new();
        open.count += 1;
        open.probation.insert(self.next_id, evicted.clone());
        Some(Slot {
            open: Arc::clone(&self.open),
            id: self.next_id,
            proven: AtomicBool::new(false),
            requests: AtomicU64::new(0),
            evicted,
        })
    }
}

impl Slot {
    /// The connection has sent a request: it is no longer the one to give way at the cap.
    pub fn prove(&self) {
        // Flipped under the lock, as `idle` does, so that the flag and the map agree.
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        if !self.proven.swap(true, Ordering::Relaxed) {
            open.probation.remove(&self.id);
        }
    }

    /// A request arrived on the connection: it has proven itself (again, if it had been idle).
    pub fn request(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        if !self.proven.load(Ordering::Relaxed) {
            self.prove();
        }
    }

    /// Requests so far ([`Slot::request`]).
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// The connection has been idle: back on probation in its original place by age, so that at the
    /// cap it gives way before younger connections on probation, until its next request.
    pub fn idle(&self) {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        if self.proven.swap(false, Ordering::Relaxed) && !self.evicted.is_cancelled() {
            open.probation.insert(self.id, self.evicted.clone());
        }
    }

    /// Whether the connection is on probation (it may be evicted at the cap).
    pub fn on_probation(&self) -> bool {
        !self.proven.load(Ordering::Relaxed)
    }

    /// Cancelled when a newer connection took this one's place; the connection should then close.
    pub fn evicted(&self) -> &CancellationToken {
        &self.evicted
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        open.count -= 1;
        open.probation.remove(&self.id);
    }
}

/// A warning logged at most once a minute, with how many times it happened since.
#[derive(Debug, Default)]
pub struct RateLimitedLog {
    last: Option<tokio::time::Instant>,
    since: u64,
}

impl RateLimitedLog {
    /// Counts one occurrence of `message` about `what`, and logs it if none was logged recently.
    pub fn warn(&mut self, message: &str, what: &dyn std::fmt::Display, detail: impl std::fmt::Display) {
        self.since += 1;
        if self.last.is_none_or(|at| at.elapsed() >= REFUSAL_LOG_INTERVAL) {
            tracing::warn!(times = self.since, %what, %detail, "{message}");
            self.last = Some(tokio::time::Instant::now());
            self.since = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_the_cap_the_oldest_connection_on_probation_gives_way() {
        let metrics = Metrics::new();
        let mut cap = ConnectionCap::new(2, "test", Arc::clone(&metrics));
        let (first, second) = (cap.admit().expect("room"), cap.admit().expect("room"));
        first.prove();
        let third = cap.admit().expect("takes the place of the second");
        assert!(second.evicted().is_cancelled() && !first.evicted().is_cancelled());
        third.prove();
        assert!(cap.admit().is_none(), "every connection held has proven itself");
        assert_eq!(
            (
                metrics.connections_evicted.get(),
                metrics.connections_refused.get()
            ),
            (1, 1)
        );
        drop((second, third));
        let fourth = cap.admit().expect("slots given back");
        assert!(!fourth.evicted().is_cancelled());
        drop((first, fourth));
        assert_eq!(cap.open.lock().expect("lock").count, 0);
    }
}
