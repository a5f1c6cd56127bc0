//! How many connections each listener holds, and which one gives way at the cap ([`ConnectionCap`]).
//!
//! Connections are counted by source: the peer's IP address ([`Source`]; a unix socket's connections
//! are one source). Below the cap every connection is let in, whatever its source, so a sidecar or a
//! proxy behind one address may use the whole listener. At the cap, a new connection from a source that
//! holds `n` connections
//! 1. takes the place of one of the connections of the source holding the most, if that source holds
//!    more than `n + 1`: its oldest on probation, else its oldest;
//! 2. else takes the place of its own source's oldest connection on probation;
//! 3. else is refused: closed at once (`tollgate_connections_refused_total`).
//!
//! The connection that gives way is closed at once (`tollgate_connections_evicted_total`), with any
//! request in progress on it. So the cap is shared by source: a source never loses a connection to one
//! that would then hold more than it, and one address cannot hold the listener against another that
//! holds fewer connections, whatever its own connections do (send nothing, trickle, stop reading their
//! answers, or send a request every second). A source's only connection is never taken by another
//! source: an idle Envoy connection, a health probe. To keep out a client that holds `k` connections an
//! attacker needs every other slot held by sources of at most `k + 1` connections each: about
//! `cap / (k + 1)` addresses, `cap` of them against a health probe. An evicted connection closes at its
//! next poll, so for a moment the listener may hold a few more than its cap.
//!
//! A connection is on probation until it has sent a request that is not a health check: an HTTP/2
//! preface, `/healthcheck`, `/readyz` and `grpc.health.v1` calls do not count, so health checks alone
//! hold no slot against their own source's new connections. A gRPC connection that has sent no request
//! for `TOLLGATE_IDLE_CONNECTION_PROBATION` is back on probation ([`Slot::idle`]), in its original place
//! by age, until its next request.
//!
//! The bookkeeping has one entry per source holding a connection, so it is bounded by the cap itself;
//! every change is a few ordered-map operations at accept and close, and a request takes no lock once
//! its connection is out of probation.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::poll_fn;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::task::AtomicWaker;

use crate::server_counters::ServerCounters;

/// Pause after an accept error (out of file descriptors, say), so an accept loop does not spin on it.
pub const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(50);

/// Accept errors and refusals are logged at most this often (a flood must not flood the log).
const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(60);

/// Where a connection comes from, for its listener's shares: the peer's IP address, or `None` for a
/// unix socket's (all one source).
pub type Source = Option<IpAddr>;

/// The source of a peer's address; an IPv4-mapped IPv6 address (as a dual-stack listener sees IPv4
/// peers) is the IPv4 address.
pub fn source_of(peer: Option<SocketAddr>) -> Source {
    peer.map(|peer| peer.ip().to_canonical())
}

/// One listener's bound on its open connections; see the module's comment.
#[derive(Debug)]
pub struct ConnectionCap {
    open: Arc<Mutex<Open>>,
    max: usize,
    next_id: u64,
    /// Names the listener and its setting in the log line.
    what: &'static str,
    refusals: RateLimitedLog,
    metrics: Arc<ServerCounters>,
}

/// The connections a listener holds.
#[derive(Debug, Default)]
struct Open {
    /// Connections holding a slot, evicted ones included until they close.
    count: usize,
    /// The connections not evicted, by source: an entry per source holding one.
    sources: HashMap<Source, Held>,
    /// The same sources ordered by how many connections they hold.
    by_size: BTreeSet<(usize, Source)>,
}

/// One source's connections.
#[derive(Debug, Default)]
struct Held {
    /// By age (ids rise with time), each with what it shares with its [`Slot`].
    all: BTreeMap<u64, Arc<Shared>>,
    /// Those on probation, by age.
    probation: BTreeSet<u64>,
}

/// What a [`Slot`] shares with its listener's cap: whether the connection must close, and who to wake.
#[derive(Debug, Default)]
struct Shared {
    evicted: AtomicBool,
    waker: AtomicWaker,
}

/// A connection's place in its listener's cap, given back when dropped.
#[derive(Debug)]
pub struct Slot {
    open: Arc<Mutex<Open>>,
    id: u64,
    source: Source,
    shared: Arc<Shared>,
    /// Out of probation: it has sent a request that counts, and not idled since.
    in_use: AtomicBool,
    /// Requests the connection has sent that count ([`Slot::request`]), to tell an idle connection.
    requests: AtomicU64,
}

impl ConnectionCap {
    /// At most `max` connections (at least one); `what` names the listener and its setting.
    pub fn new(max: usize, what: &'static str, metrics: Arc<ServerCounters>) -> Self {
        Self {
            open: Arc::default(),
            max: max.max(1),
            next_id: 0,
            what,
            refusals: RateLimitedLog::default(),
            metrics,
        }
    }

    /// A slot for a new connection from `source`, taking another's place at the cap; `None` (counted,
    /// logged at most once a minute) when no connection gives way to it (see the module's comment).
    pub fn admit(&mut self, source: Source) -> Option<Slot> {
        let mut open = lock(&self.open);
        if open.count >= self.max {
            let Some((from, id)) = open.gives_way_to(source) else {
                drop(open);
                self.metrics.connections_refused.add(1);
                self.refusals.warn(
                    "listener at its connection cap, and no connection gives way to this address: new \
                     connections are closed",
                    &self.what,
                    self.max,
                );
                return None;
            };
            if let Some(evicted) = open.remove(from, id) {
                evicted.evicted.store(true, Ordering::Release);
                evicted.waker.wake();
            }
            self.metrics.connections_evicted.add(1);
        }
        self.next_id += 1;
        let shared = Arc::new(Shared::default());
        open.count += 1;
        open.insert(source, self.next_id, Arc::clone(&shared));
        Some(Slot {
            open: Arc::clone(&self.open),
            id: self.next_id,
            source,
            shared,
            in_use: AtomicBool::new(false),
            requests: AtomicU64::new(0),
        })
    }
}

impl Open {
    /// The connection that gives way to a new one from `source` at the cap, if any.
    fn gives_way_to(&self, source: Source) -> Option<(Source, u64)> {
        let own = self.sources.get(&source);
        let holds = own.map_or(0, |held| held.all.len());
        if let Some(&(most, largest)) = self.by_size.last()
            && most > holds + 1
        {
            let held = self.sources.get(&largest)?;
            let id = held.probation.first().or_else(|| held.all.keys().next())?;
            return Some((largest, *id));
        }
        own?.probation.first().map(|id| (source, *id))
    }

    /// Counts connection `id` of `source`, on probation.
    fn insert(&mut self, source: Source, id: u64, shared: Arc<Shared>) {
        let held = self.sources.entry(source).or_default();
        held.all.insert(id, shared);
        held.probation.insert(id);
        let holds = held.all.len();
        self.resized(source, holds - 1, holds);
    }

    /// Stops counting connection `id` of `source` (when it closes, or is evicted); what it shared with
    /// its slot, if it was still counted.
    fn remove(&mut self, source: Source, id: u64) -> Option<Arc<Shared>> {
        let held = self.sources.get_mut(&source)?;
        let shared = held.all.remove(&id)?;
        held.probation.remove(&id);
        let holds = held.all.len();
        if holds == 0 {
            self.sources.remove(&source);
        }
        self.resized(source, holds + 1, holds);
        Some(shared)
    }

    fn resized(&mut self, source: Source, before: usize, after: usize) {
        if before > 0 {
            self.by_size.remove(&(before, source));
        }
        if after > 0 {
            self.by_size.insert((after, source));
        }
    }
}

fn lock(open: &Mutex<Open>) -> MutexGuard<'_, Open> {
    open.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Slot {
    /// A request that counts arrived (anything but a health check): the connection is in use, out of
    /// probation. Takes no lock once the connection is.
    pub fn request(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        if !self.in_use.load(Ordering::Relaxed) {
            self.set_probation(false);
        }
    }

    /// Whether the connection is in use (out of probation).
    pub fn in_use(&self) -> bool {
        self.in_use.load(Ordering::Relaxed)
    }

    /// Requests so far ([`Slot::request`]).
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// The connection has been idle: back on probation in its original place by age, until its next
    /// request.
    pub fn idle(&self) {
        self.set_probation(true);
    }

    fn set_probation(&self, on: bool) {
        // Flipped under the lock, so that the flag and the map agree.
        let mut open = lock(&self.open);
        let was_in_use = self.in_use.swap(!on, Ordering::Relaxed);
        if was_in_use != on {
            return; // Already so.
        }
        if let Some(held) = open.sources.get_mut(&self.source)
            && held.all.contains_key(&self.id)
        {
            if on {
                held.probation.insert(self.id);
            } else {
                held.probation.remove(&self.id);
            }
        }
    }

    /// Ready once a newer connection has taken this one's place; the connection should then close.
    /// Registers `cx`'s waker otherwise (one task polls a connection's slot).
    pub fn poll_evicted(&self, cx: &mut Context<'_>) -> Poll<()> {
        if self.shared.evicted.load(Ordering::Acquire) {
            return Poll::Ready(());
        }
        self.shared.waker.register(cx.waker());
        if self.shared.evicted.load(Ordering::Acquire) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }

    /// Completes once a newer connection has taken this one's place.
    pub async fn evicted(&self) {
        poll_fn(|cx| self.poll_evicted(cx)).await;
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = lock(&self.open);
        open.count -= 1;
        open.remove(self.source, self.id);
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

    const A: Source = Some(IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 1)));
    const B: Source = Some(IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 2)));
    const C: Source = Some(IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 3)));

    fn evicted(slot: &Slot) -> bool {
        slot.shared.evicted.load(Ordering::Acquire)
    }

    fn counters(metrics: &ServerCounters) -> (u64, u64) {
        (
            metrics.connections_evicted.get(),
            metrics.connections_refused.get(),
        )
    }

    #[test]
    fn within_one_source_the_oldest_on_probation_gives_way_then_newcomers_are_refused() {
        let metrics = ServerCounters::new();
        let mut cap = ConnectionCap::new(2, "test", Arc::clone(&metrics));
        let (first, second) = (cap.admit(A).expect("room"), cap.admit(A).expect("room"));
        first.request();
        let third = cap.admit(A).expect("takes the place of the second");
        assert!(evicted(&second) && !evicted(&first));
        third.request();
        assert!(cap.admit(A).is_none(), "every connection of A is in use");
        assert_eq!(counters(&metrics), (1, 1));
        drop((second, third));
        let fourth = cap.admit(A).expect("slots given back");
        assert!(!evicted(&fourth));
        drop((first, fourth));
        let open = lock(&cap.open);
        assert_eq!(open.count, 0);
        assert!(
            open.sources.is_empty() && open.by_size.is_empty(),
            "nothing left behind"
        );
    }

    #[test]
    fn the_source_holding_the_most_gives_way_on_probation_first_then_its_oldest() {
        let metrics = ServerCounters::new();
        let mut cap = ConnectionCap::new(4, "test", Arc::clone(&metrics));
        let a: Vec<Slot> = (0..4).map(|_| cap.admit(A).expect("room")).collect();
        for slot in [&a[0], &a[2], &a[3]] {
            slot.request();
        }
        // A health probe from B: A holds 4, B none.
        let b = cap.admit(B).expect("A gives way");
        assert!(evicted(&a[1]), "A's connection on probation first");
        let c = cap.admit(C).expect("A still holds more than 1 + 1");
        assert!(evicted(&a[0]), "then A's oldest, in use or not");
        b.request();
        c.request();
        // A holds 2, B and C one each: nobody holds two more than anyone else.
        assert!(cap.admit(A).is_none(), "A holds its share");
        assert!(cap.admit(B).is_none(), "B would take from A only to hold as many");
        assert!(!evicted(&b) && !evicted(&c), "a source's only connection stays");
        assert_eq!(counters(&metrics), (2, 2));
        drop((a, b, c));
    }

    #[test]
    fn an_idle_connection_is_on_probation_for_its_own_source_only() {
        let metrics = ServerCounters::new();
        let mut cap = ConnectionCap::new(3, "test", Arc::clone(&metrics));
        let envoy = cap.admit(B).expect("room");
        envoy.request();
        envoy.idle();
        let attacker = [cap.admit(A).expect("room"), cap.admit(A).expect("room")];
        for slot in &attacker {
            slot.request();
        }
        assert!(cap.admit(A).is_none(), "A holds 2, B only 1: B's idle one stays");
        let c = cap.admit(C).expect("A holds 2, C none: A gives way");
        assert!(evicted(&attacker[0]) && !evicted(&envoy));
        let again = cap.admit(B).expect("B's own idle connection gives way");
        assert!(evicted(&envoy));
        // Out of probation once it sends a request: the next one from B is refused.
        again.request();
        assert!(cap.admit(B).is_none());
        assert_eq!(counters(&metrics), (2, 2));
        drop((attacker, envoy, again, c));
        assert_eq!(lock(&cap.open).count, 0);
    }

    #[tokio::test]
    async fn an_evicted_slot_wakes_its_connection() {
        let mut cap = ConnectionCap::new(1, "test", ServerCounters::new());
        let first = Arc::new(cap.admit(A).expect("room"));
        let waiting = tokio::spawn({
            let first = Arc::clone(&first);
            async move { first.evicted().await }
        });
        tokio::task::yield_now().await;
        let second = cap.admit(A).expect("takes the place of the first");
        tokio::time::timeout(Duration::from_secs(10), waiting)
            .await
            .expect("woken")
            .expect("task");
        drop((first, second));
    }

    #[test]
    fn mapped_ipv6_peers_are_their_ipv4_source() {
        let mapped: SocketAddr = "[::ffff:192.0.2.1]:80".parse().expect("address");
        assert_eq!(source_of(Some(mapped)), A);
        assert_eq!(source_of(None), None);
    }
}
