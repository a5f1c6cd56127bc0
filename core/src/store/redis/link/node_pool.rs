//! Connections to one Redis node: a single Redis, or the master Sentinel names.
//!
//! A pool of redis-rs `ConnectionManager`s, taken in turn. redis-rs reconnects a manager whose socket
//! breaks, but keeps one whose calls simply go unanswered: a Redis that stalls without closing its
//! connections (stopped, blackholed, busy with a long command) would be written every later call, and
//! run them all when it resumes, counting hits whose callers had long been answered by their failure
//! mode ("ghost hits"). So a connection on which a call outlives its timeout is **stalled**: nothing is
//! written to it again until it is known to be drained, and while every connection of the pool is
//! stalled, calls fail at once without writing anything ([`super::CallError::Stalled`]). What Redis
//! runs when it resumes is what was written before the first timeout on each connection.
//!
//! A stalled connection comes back in the background, whichever happens first:
//! - a `PING` sent on it is answered: replies come in order, so every call written before it has
//!   been answered too, and the connection is drained (a Redis that only paused);
//! - a new connection completes its handshake (a connection lost for good): it takes the old one's
//!   place.
//!
//! On Sentinel the pool holds the one connection to the master, and a new connection is found through
//! the sentinels. The same replacement follows a failover (a broken connection, a `READONLY` reply),
//! where the old connection keeps serving until the new one is ready.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use arc_swap::ArcSwap;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use super::CallError;
use super::sentinel::SentinelLink;
use crate::store::PoolCounters;

/// First and longest pause between two attempts at a new connection for a stalled one. Short: a
/// stalled Redis that resumes should serve again within a fraction of a second.
const RETRY_BACKOFF: (Duration, Duration) = (Duration::from_millis(50), Duration::from_millis(250));

/// Shortest time between two replacements of one connection, so that a burst of failing calls makes
/// one new connection (on Sentinel: asks the sentinels once).
const REPLACE_COOLDOWN: Duration = Duration::from_millis(500);

/// Where new connections to the node come from.
pub(super) enum Source {
    /// A single Redis: the client for its address.
    Client(redis::Client),
    /// The master the sentinels name now.
    Sentinel(SentinelLink),
}

/// The pool.
pub(crate) struct NodePool {
    entries: Box<[Entry]>,
    next: AtomicUsize,
    source: Source,
    config: ConnectionManagerConfig,
    /// How long one attempt at a new connection may take.
    connect_timeout: Duration,
    /// Connections found stalled so far.
    stalls: AtomicU64,
    /// The Go service's pool stats, as far as calls show them.
    counts: PoolCounts,
}

/// envoyproxy/ratelimit's Redis pool stats (`cx_active`, `cx_total`, `cx_local_close`), counted from
/// what calls show: redis-rs reconnects a connection by itself and tells no one (it would only tell
/// over RESP3), so a connection counts as closed when a call on it fails for its socket (or when the
/// pool replaces it), and as opened again when a later call on it succeeds.
#[derive(Default)]
struct PoolCounts {
    active: AtomicU64,
    opened: AtomicU64,
    closed: AtomicU64,
}

impl PoolCounts {
    fn opened(&self) {
        self.opened.fetch_add(1, Ordering::Relaxed);
        self.active.fetch_add(1, Ordering::Relaxed);
    }

    fn closed(&self) {
        self.closed.fetch_add(1, Ordering::Relaxed);
        self.active.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One connection of the pool.
struct Entry {
    conn: ArcSwap<ConnectionManager>,
    /// Counted open in [`PoolCounts`]: made, and no call on it has failed for its socket since its
    /// last success. Each change is one `swap`, so each open and close is counted once.
    open: AtomicBool,
    /// A call on it outlived its timeout, and it is not known to be drained yet: nothing is written to it.
    stalled: AtomicBool,
    /// A background task is bringing it back or replacing it.
    replacing: AtomicBool,
}

/// A connection taken for one call, and which entry it is (to report how the call went).
pub(super) struct Taken {
    pub(super) conn: ConnectionManager,
    pub(super) entry: usize,
}

impl NodePool {
    /// A pool of `connections` (at least one), which gets new ones from `source` with `config`, each
    /// attempt bounded by `connect_timeout`.
    pub(super) fn new(
        source: Source,
        config: ConnectionManagerConfig,
        connect_timeout: Duration,
        connections: Vec<ConnectionManager>,
    ) -> Arc<Self> {
        debug_assert!(!connections.is_empty(), "a pool holds at least one connection");
        let entries = connections
            .into_iter()
            .map(|conn| Entry {
                conn: ArcSwap::from_pointee(conn),
                open: AtomicBool::new(true),
                stalled: AtomicBool::new(false),
                replacing: AtomicBool::new(false),
            })
            .collect::<Box<[Entry]>>();
        let counts = PoolCounts::default();
        for _ in 0..entries.len() {
            counts.opened();
        }
        Arc::new(Self {
            entries,
            next: AtomicUsize::new(0),
            source,
            config,
            connect_timeout,
            stalls: AtomicU64::new(0),
            counts,
        })
    }

    /// The pool's connections as envoyproxy/ratelimit counts them (see [`PoolCounts`]).
    pub(super) fn counters(&self) -> PoolCounters {
        PoolCounters {
            active: self.counts.active.load(Ordering::Relaxed),
            total: self.counts.opened.load(Ordering::Relaxed),
            closed: self.counts.closed.load(Ordering::Relaxed),
        }
    }

    /// The next connection that is not stalled (cheap: a clone of a multiplexed handle); `None` while
    /// every one is.
    pub(super) fn take(&self) -> Option<Taken> {
        let len = self.entries.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        (0..len)
            .map(|step| start.wrapping_add(step) % len)
            .find(|&at| !self.entries[at].stalled.load(Ordering::Acquire))
            .map(|entry| Taken {
                conn: ConnectionManager::clone(&self.entries[entry].conn.load()),
                entry,
            })
    }

    /// The first connection, stalled or not (to load the library at startup).
    pub(super) fn first(&self) -> ConnectionManager {
        ConnectionManager::clone(&self.entries[0].conn.load())
    }

    /// Connections found stalled so far.
    pub(super) fn stalls(&self) -> u64 {
        self.stalls.load(Ordering::Relaxed)
    }

    /// Learns from a call made on `entry`: one that outlived its timeout stalls the connection; on
    /// Sentinel, one whose failure suggests the master moved has it replaced.
    pub(super) fn after_call<T>(self: &Arc<Self>, entry: usize, result: &Result<T, CallError>) {
        let open = &self.entries[entry].open;
        let Err(error) = result else {
            // redis-rs reconnected it since a call failed for its socket.
            if !open.load(Ordering::Relaxed) && !open.swap(true, Ordering::AcqRel) {
                self.counts.opened();
            }
            return;
        };
        if let CallError::Redis(error) = error
            && (error.is_io_error() || error.is_connection_dropped() || error.is_connection_refusal())
            && open.swap(false, Ordering::AcqRel)
        {
            self.counts.closed();
        }
        if matches!(error, CallError::Timeout) {
            if !self.entries[entry].stalled.swap(true, Ordering::AcqRel) {
                self.stalls.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    connection = entry,
                    "a Redis call went unanswered past its timeout: nothing more is sent on that \
                     connection until it is drained or replaced"
                );
            }
            self.bring_back(entry);
        } else if matches!(self.source, Source::Sentinel(_)) && error.suggests_failover() {
            self.bring_back(entry);
        }
    }

    /// Starts bringing `entry` back (or replacing it) in the background, unless that is under way.
    fn bring_back(self: &Arc<Self>, entry: usize) {
        if self.entries[entry].replacing.swap(true, Ordering::AcqRel) {
            return;
        }
        tokio::spawn(bring_back(Arc::downgrade(self), entry));
    }

    /// A new connection to the node, within the connect timeout.
    async fn connect(&self) -> redis::RedisResult<ConnectionManager> {
        let attempt = async {
            match &self.source {
                Source::Client(client) => {
                    ConnectionManager::new_with_config(client.clone(), self.config.clone()).await
                }
                Source::Sentinel(link) => link.resolve(self.config.clone()).await,
            }
        };
        tokio::time::timeout(self.connect_timeout, attempt)
            .await
            .unwrap_or_else(|_| {
                Err(redis::RedisError::from(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "no answer to the handshake",
                )))
            })
    }
}

/// How a stalled or failing connection came back.
enum Back {
    /// It answered a `PING`: drained, kept.
    Drained,
    /// A new connection replaced it.
    Replaced(ConnectionManager),
}

/// Brings `entry` of `pool` back: drained or replaced, whichever comes first (see the module docs), then
/// again after a cooldown if it stalled meanwhile. Ends when the pool is dropped.
async fn bring_back(pool: Weak<NodePool>, entry: usize) {
    loop {
        let Some(back) = drained_or_replaced(&pool, entry).await else {
            return;
        };
        let Some(this) = pool.upgrade() else {
            return;
        };
        let slot = &this.entries[entry];
        match back {
            Back::Drained => tracing::info!(connection = entry, "a stalled Redis connection is drained"),
            Back::Replaced(conn) => {
                slot.conn.store(Arc::new(conn));
                // The old connection goes (unless a failed call counted it gone already).
                if slot.open.swap(true, Ordering::AcqRel) {
                    this.counts.closed();
                }
                this.counts.opened();
                tracing::info!(connection = entry, "a Redis connection was replaced");
            }
        }
        slot.stalled.store(false, Ordering::Release);
        drop(this);
        tokio::time::sleep(REPLACE_COOLDOWN).await;
        let Some(this) = pool.upgrade() else {
            return;
        };
        let slot = &this.entries[entry];
        slot.replacing.store(false, Ordering::Release);
        // Stalled again during the cooldown: its caller found the task still running.
        if !slot.stalled.load(Ordering::Acquire) || slot.replacing.swap(true, Ordering::AcqRel) {
            return;
        }
    }
}

/// Races a `PING` on the connection at `entry` (only when it is stalled: a failover needs a new one)
/// against new connections, tried with backoff. `None`: the pool was dropped.
async fn drained_or_replaced(pool: &Weak<NodePool>, entry: usize) -> Option<Back> {
    let (old, stalled) = {
        let this = pool.upgrade()?;
        let slot = &this.entries[entry];
        (
            ConnectionManager::clone(&slot.conn.load()),
            slot.stalled.load(Ordering::Acquire),
        )
    };
    let drained = async {
        if !stalled {
            return std::future::pending().await;
        }
        // Each PING waits at most the connection's response timeout; a new one follows at once.
        loop {
            let mut conn = old.clone();
            if redis::cmd("PING").query_async::<String>(&mut conn).await.is_ok() {
                return;
            }
            tokio::time::sleep(RETRY_BACKOFF.0).await;
        }
    };
    let replaced = async {
        let mut backoff = RETRY_BACKOFF.0;
        let mut failures = 0u32;
        loop {
            let this = pool.upgrade()?;
            let attempt = this.connect().await;
            drop(this);
            match attempt {
                Ok(conn) => return Some(conn),
                Err(error) => {
                    failures += 1;
                    if failures == 1 {
                        tracing::warn!(connection = entry, %error, "cannot replace a Redis connection yet");
                    }
                }
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(RETRY_BACKOFF.1);
        }
    };
    tokio::select! {
        () = drained => Some(Back::Drained),
        conn = replaced => conn.map(Back::Replaced),
    }
}
