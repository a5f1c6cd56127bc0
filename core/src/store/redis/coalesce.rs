//! Coalescing: concurrent requests share one script call.
//!
//! On this kind of host most of a script call's cost, in Redis and here, is per call rather than per
//! item: reading the command off the socket, dispatching it, writing the reply (measured: a trivial
//! `EVALSHA` costs Redis as much CPU as Tollgate's whole batch function). So while a few calls are in
//! flight, requests that arrive meanwhile wait in a queue, and the next call carries all of them.
//! Under light load a request finds a free slot and is sent at once, alone; under heavy load calls
//! grow to carry many requests, and Redis spends its time on the decisions, not on the calls.
//!
//! Between the two, a call carries few requests, and Redis spends most of its CPU on calls. An operator
//! who would rather spend latency than Redis CPU sets a gathering window (`REDIS_PIPELINE_WINDOW`, the
//! Go service's name for its own implicit pipelining): a call waits that long after its first request
//! arrived for others to join it, unless it already carries `REDIS_PIPELINE_LIMIT` items. A request
//! that already waited that long in the queue (every slot busy) adds no wait.
//!
//! Requests made only of fixed-window counters share a pipeline of `INCRBY` + `EXPIRE` instead
//! ([`super::pipeline`]); a drained group sends both at once, so each request still costs one round
//! trip. In a Redis Cluster both go one pipeline per master: a script call must stay in one hash slot,
//! and concurrent requests' keys rarely share one, so there the group's script calls, one per slot,
//! share each master's trip instead ([`super::cluster_scripts`]).
//!
//! Only [`CommitPolicy::Independent`] batches are coalesced: for them, one call over the concatenated
//! items is exactly the requests applied one after another (the script settles each group on its
//! own, and a later item sees an earlier item's effect), so nothing about their meaning changes. Every
//! other policy acts on a whole batch and is sent alone.
//!
//! Bounds, so that a slow or dead Redis cannot make Tollgate hold unbounded work, nor count what it
//! answered as if Redis were down ("ghost hits"):
//! - the queue holds at most [`QUEUE_CAPACITY`] requests; a request that finds it full is not queued
//!   and gets its rules' failure mode at once ([`StoreError::Overloaded`]);
//! - a request whose caller has given up (its deadline passed, or it went away) before a call could
//!   carry it is never sent; a caller still there is answered [`StoreError::Timeout`] at once;
//! - a call carries at most [`MAX_ITEMS_PER_CALL`] items (a larger request goes alone, and waits for
//!   the next call rather than inflating one already full);
//! - a call holds its slot until Redis answers, or [`CALL_TIMEOUT`] passes: a slow Redis gets no more
//!   concurrent calls than [`CALLS_IN_FLIGHT`]. A call that times out stalls its connection, which is
//!   not written again until it is known to be drained or is replaced (`link/node_pool.rs`), so a
//!   Redis that stalls without closing its connections (stopped, blackholed, a long command) runs,
//!   when it resumes, only the calls that were in flight. (In a cluster a group's per-master
//!   pipelines stop at their requests' deadline instead, so that one stalled master does not hold up
//!   the requests the others serve, and a stalled master is written again: [`super::pipeline`].)
//!
//! [`CommitPolicy::Independent`]: crate::store::CommitPolicy::Independent

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio::time::Instant;

use super::call::Caller;
use super::cluster_scripts::decide_per_master;
use super::group::{Answers, Pending, answer};
use super::pipeline::send_pipelined;
use super::script::ScriptItem;
use super::window_timer::WindowTimer;
use crate::algorithm::Decision;
use crate::store::StoreError;

/// Script calls carrying coalesced requests that may be in flight at once. Few enough that requests
/// pile up behind them under load, enough that one slow reply does not stall everything.
const CALLS_IN_FLIGHT: usize = 4;

/// Most items one coalesced call carries, bounding the time one call holds Redis.
const MAX_ITEMS_PER_CALL: usize = 512;

/// Most requests waiting for a call. At tens of thousands of decisions per second a healthy Redis
/// drains this in well under a deadline; a full queue means Redis is not keeping up, and waiting
/// longer would only answer later what the failure mode answers now.
pub(super) const QUEUE_CAPACITY: usize = 4096;

/// How long a coalesced call may wait for Redis's answer, holding its slot, before its connection is
/// deemed stalled. Far above any healthy call; callers stopped waiting long before (their own deadline).
pub(super) const CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// How a call gathers requests beyond those queued when it opens.
#[derive(Debug, Clone, Copy)]
struct Gathering {
    /// How long after its first request's arrival a call waits for more; zero: no wait.
    window: Duration,
    /// Items at which a call stops gathering (at most [`MAX_ITEMS_PER_CALL`]).
    full_at: usize,
}

/// The queue in front of the script calls.
#[derive(Debug)]
pub(super) struct Coalescer {
    queue: mpsc::Sender<Pending>,
    counts: Arc<Counts>,
}

/// What the bounds turned away.
#[derive(Debug, Default)]
pub(super) struct Counts {
    /// Requests refused because the queue was full.
    pub(super) queue_full: AtomicU64,
    /// Requests dropped unsent because their caller had given up.
    pub(super) abandoned: AtomicU64,
}

impl Coalescer {
    /// Starts the task that drains the queue into calls on `call`; it ends when the coalescer (the
    /// store) is dropped, which closes the queue. A call waits up to `window` after its first
    /// request's arrival for more to join it, and stops gathering at `limit` items (zero: at
    /// [`MAX_ITEMS_PER_CALL`], which also caps a larger limit). A request dropped unsent because
    /// its deadline passed is answered with [`StoreError::Timeout`] of `deadline`, the callers' wait.
    pub(super) fn start(call: Arc<Caller>, window: Duration, limit: usize, deadline: Duration) -> Self {
        let (queue, pending) = mpsc::channel(QUEUE_CAPACITY);
        let counts = Arc::new(Counts::default());
        let full_at = match limit {
            0 => MAX_ITEMS_PER_CALL,
            limit => limit.min(MAX_ITEMS_PER_CALL),
        };
        if limit > MAX_ITEMS_PER_CALL {
            tracing::warn!(
                limit,
                bound = MAX_ITEMS_PER_CALL,
                "REDIS_PIPELINE_LIMIT is above the most items a call carries: calls stop at the bound"
            );
        }
        let gathering = Gathering { window, full_at };
        tokio::spawn(drain(call, pending, Arc::clone(&counts), gathering, deadline));
        Self { queue, counts }
    }

    /// What the bounds turned away so far.
    pub(super) fn counts(&self) -> &Counts {
        &self.counts
    }

    /// Queues a request that the caller waits for until `deadline` (`pipelined`: see [`Pending`]); the
    /// answer arrives on the returned receiver. A full queue refuses it at once.
    pub(super) fn submit(
        &self,
        named: Vec<(String, ScriptItem<'static>)>,
        deadline: Instant,
        pipelined: bool,
    ) -> Result<oneshot::Receiver<Result<Vec<Decision>, StoreError>>, StoreError> {
        let (reply, answer) = oneshot::channel();
        match self.queue.try_send(Pending {
            named,
            reply,
            deadline,
            pipelined,
            queued_at: Instant::now(),
        }) {
            Ok(()) => Ok(answer),
            Err(mpsc::error::TrySendError::Full(_)) => {
                self.counts.queue_full.fetch_add(1, Ordering::Relaxed);
                Err(StoreError::Overloaded)
            }
            // The drain task lives as long as the store; if it ever did not, say so.
            Err(mpsc::error::TrySendError::Closed(_)) => {
                Err(StoreError::Unavailable("the coalescing queue is closed".into()))
            }
        }
    }
}

/// Takes a free call slot, then what is queued (up to [`MAX_ITEMS_PER_CALL`] items, skipping requests
/// nobody waits for) and what arrives within the gathering window, and sends it as one call that keeps
/// the slot until Redis answers.
async fn drain(
    call: Arc<Caller>,
    mut pending: mpsc::Receiver<Pending>,
    counts: Arc<Counts>,
    gathering: Gathering,
    deadline: Duration,
) {
    let slots = Arc::new(Semaphore::new(CALLS_IN_FLIGHT));
    // A request that did not fit the previous call: it opens the next one.
    let mut carried: Option<Pending> = None;
    // Only with a gathering window.
    let mut timer = (!gathering.window.is_zero()).then(WindowTimer::new);
    loop {
        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
            return;
        };
        let mut next = match carried.take() {
            Some(request) => Some(request),
            None => pending.recv().await,
        };
        if next.is_none() {
            return;
        }
        let mut group = Vec::new();
        let mut items = 0;
        // Whether the call still gathers: from its first request's arrival until the window closes.
        let mut gathering_open = false;
        while let Some(request) = next.take() {
            if request.abandoned() {
                counts.abandoned.fetch_add(1, Ordering::Relaxed);
                // A caller still waiting learns why, even before its own timer fires: its deadline
                // passed. (One that went away is not there to read it.)
                let _ = request.reply.send(Err(StoreError::Timeout(deadline)));
            } else if items > 0 && items + request.named.len() > MAX_ITEMS_PER_CALL {
                carried = Some(request);
                break;
            } else {
                if let (true, Some(timer)) = (group.is_empty(), &mut timer) {
                    timer.arm(request.queued_at + gathering.window);
                    gathering_open = true;
                }
                items += request.named.len();
                group.push(request);
            }
            if items >= gathering.full_at {
                break;
            }
            next = match (pending.try_recv(), &timer) {
                (Ok(request), _) => Some(request),
                (Err(mpsc::error::TryRecvError::Empty), Some(timer)) if gathering_open => {
                    tokio::select! {
                        request = pending.recv() => request,
                        () = timer.closed() => {
                            gathering_open = false;
                            None
                        }
                    }
                }
                (Err(_), _) => None,
            };
        }
        if group.is_empty() {
            continue;
        }
        let caller = Arc::clone(&call);
        tokio::spawn(async move {
            send_coalesced(&caller, group).await;
            drop(slot);
        });
    }
}

/// What a drained group costs Redis: one pipeline for the requests made only of fixed-window
/// counters, one script call for the others, sent at once.
async fn send_coalesced(call: &Caller, group: Vec<Pending>) {
    let (pipelined, scripted): (Vec<_>, Vec<_>) = group.into_iter().partition(|p| p.pipelined);
    let pipelined = async {
        if !pipelined.is_empty() {
            let timeout = group_timeout(call, &pipelined);
            send_pipelined(call, pipelined, timeout).await;
        }
    };
    let scripted = async {
        if !scripted.is_empty() {
            send_scripted(call, scripted).await;
        }
    };
    tokio::join!(pipelined, scripted);
}

/// One script call for several queued requests (in a cluster, one per slot, pipelined per master);
/// each gets its own decisions back.
async fn send_scripted(call: &Caller, group: Vec<Pending>) {
    let connections = call.link.connections();
    if let Some(super::link::Connections::Cluster(conn)) = connections.as_deref() {
        let timeout = group_timeout(call, &group);
        let (named, mut answers) = Answers::new(group);
        let items = script_items(&named);
        decide_per_master(call, conn, &items, timeout, &mut answers).await;
        return;
    }
    let named: Vec<_> = group.iter().map(|p| &p.named).collect();
    let items = script_items(&named);
    let result = call
        .whole(
            &items,
            crate::store::CommitPolicy::Independent,
            None,
            CALL_TIMEOUT,
        )
        .await;
    answer(group, result);
}

/// How long a group's calls may take: [`CALL_TIMEOUT`] on one node, so that a slow Redis is not sent
/// more calls than the coalescer allows; in a cluster the latest deadline of its requests, since one
/// slow or dead master must not hold up the requests the others serve, and past it nobody waits.
fn group_timeout(call: &Caller, group: &[Pending]) -> Duration {
    if !call.link.is_cluster() {
        return CALL_TIMEOUT;
    }
    let latest = group.iter().map(|p| p.deadline).max();
    latest.map_or(Duration::ZERO, |at| at.saturating_duration_since(Instant::now()))
}

/// The items of several requests as one call's, in request order. Group ids are shifted so that they stay
/// distinct across requests: no two requests' groups merge.
fn script_items<'n>(requests: &'n [impl AsRef<[(String, ScriptItem<'static>)]>]) -> Vec<ScriptItem<'n>> {
    let mut items = Vec::with_capacity(requests.iter().map(|r| r.as_ref().len()).sum());
    let mut offset = 0u32;
    for request in requests {
        let mut next_offset = offset;
        for (key, item) in request.as_ref() {
            let group = item.group.saturating_add(offset);
            next_offset = next_offset.max(group.saturating_add(1));
            items.push(ScriptItem { key, group, ..*item });
        }
        offset = next_offset;
    }
    items
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::SystemClock;
    use crate::store::redis::{RedisOptions, RedisStore, RedisTarget};
    use tokio_util::sync::CancellationToken;

    /// A request still queued when its deadline passes is never sent, and its caller, still waiting,
    /// is told it timed out: not that the queue lost it, which is what a dropped reply reads as.
    #[tokio::test]
    async fn a_request_past_its_deadline_is_answered_a_timeout() {
        // Nothing listens there: the request must be answered without Redis.
        let target =
            RedisTarget::parse("127.0.0.1:1", "single", "tcp", "", "", false, false).expect("an address");
        let stop = CancellationToken::new();
        let store = RedisStore::start(RedisOptions::new(target), Arc::new(SystemClock), stop.clone());
        let answer = store
            .coalescer
            .submit(Vec::new(), Instant::now(), false)
            .expect("queued");
        let answered = answer.await.expect("answered, not dropped");
        let waited = store.options.deadline;
        assert!(
            matches!(answered, Err(StoreError::Timeout(d)) if d == waited),
            "{answered:?}"
        );
        assert_eq!(store.coalescer.counts().abandoned.load(Ordering::Relaxed), 1);
        stop.cancel();
    }
}
