//! One script call on the link: the batch script sent on a connection, bounded by its deadline, its
//! reply decoded, the offset to the Redis clock it shows recorded, and any value no Tollgate could have
//! written that it found counted. Every way a decision reaches Redis by script (the uncoalesced path,
//! coalesced batches, a cluster's calls per slot) goes through [`Caller`].

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::cluster_async::ClusterConnection;
use tracing::Instrument as _;

use super::clock_offset::ClockOffsets;
use super::impossible_state::ImpossibleStates;
use super::keys::by_slot;
use super::link::{CallError, Connections, RedisLink, within};
use super::script::{BatchScript, Markers, ScriptItem, ScriptReply};
use super::timed_counters::TimedCounters;
use crate::algorithm::Decision;
use crate::clock::Clock;
use crate::store::{CommitPolicy, StoreError};

/// What every way to Redis shares (the coalescer owns one too): the link, the script, the clock and its
/// offsets to Redis's, and the counters. A script call is [`Caller::invoke`].
pub(super) struct Caller {
    /// The connections, and what keeps them serving.
    pub(super) link: Arc<RedisLink>,
    pub(super) script: BatchScript,
    pub(super) clock: Arc<dyn Clock>,
    /// Redis clock minus local clock (per node in a cluster), from the replies.
    pub(super) offsets: ClockOffsets,
    /// What the ways to Redis counted.
    pub(super) counters: Counters,
    /// Whether traced requests' calls get spans of their own.
    traces: bool,
}

/// What the ways to Redis counted, read by the store's getters.
#[derive(Default)]
pub(super) struct Counters {
    /// Batches applied (one per request that reached Redis).
    pub(super) batches: AtomicU64,
    /// Script calls made (per hash slot in a cluster; shared by coalesced batches).
    pub(super) script_calls: AtomicU64,
    /// Pipelines sent: of fixed-window counters instead of script calls ([`super::pipeline`]), and in
    /// a cluster of script calls to one master ([`super::cluster_scripts`]).
    pub(super) pipelines: AtomicU64,
    /// The pipelines' counters known to carry a TTL already, and their `EXPIRE`s counted.
    pub(super) timed: TimedCounters,
    /// Keys found holding values no Tollgate could have written.
    pub(super) impossible: ImpossibleStates,
}

impl Caller {
    /// A caller on `link`, with no call made yet. `traces`: traced requests' calls get spans.
    pub(super) fn new(
        link: Arc<RedisLink>,
        script: BatchScript,
        clock: Arc<dyn Clock>,
        traces: bool,
    ) -> Self {
        Self {
            offsets: ClockOffsets::new(link.is_cluster()),
            link,
            script,
            clock,
            counters: Counters::default(),
            traces,
        }
    }

    /// The store's error for a failed call (a timeout names the link's deadline).
    pub(super) fn store_error(&self, error: CallError) -> StoreError {
        error.into_store_error(self.link.deadline())
    }

    /// The store's deadline for one call.
    pub(super) fn deadline(&self) -> Duration {
        self.link.deadline()
    }

    /// Whether the current request is traced (its Redis calls get spans of their own).
    pub(super) fn traced(&self) -> bool {
        self.traces && !tracing::Span::current().is_disabled()
    }

    /// One batch on the deployment's connection: one script call (per slot in a cluster).
    pub(super) async fn whole(
        &self,
        items: &[ScriptItem<'_>],
        policy: CommitPolicy,
        markers: Option<Markers<'_>>,
        timeout: Duration,
    ) -> Result<Vec<Decision>, StoreError> {
        let Some(connections) = self.link.connections() else {
            return Err(self.store_error(CallError::NotConnected));
        };
        let result = match &*connections {
            Connections::Cluster(conn) => self.per_slot(conn, items, policy, markers, timeout).await,
            whole => {
                whole
                    .on_whole(async |mut conn| {
                        self.invoke(&mut conn, None, items, policy, markers, timeout)
                            .await
                    })
                    .await
            }
        };
        result.map_err(|e| self.store_error(e))
    }

    /// One script call. `slot`: the cluster slot every item lies in (`None` off a cluster).
    pub(super) async fn invoke<C: ConnectionLike + Send>(
        &self,
        conn: &mut C,
        slot: Option<u16>,
        items: &[ScriptItem<'_>],
        policy: CommitPolicy,
        markers: Option<Markers<'_>>,
        timeout: Duration,
    ) -> Result<Vec<Decision>, CallError> {
        let sent_at = self.clock.now_us();
        self.counters.script_calls.fetch_add(1, Ordering::Relaxed);
        let call = within(timeout, self.script.call(conn, items, policy, markers.into()));
        let reply = if self.traced() {
            // A child of the RPC span (the current span), named as the database semantic conventions
            // name client calls: the operation. Coalesced calls serve several requests and have no
            // span of their own (traced requests are never coalesced).
            let span = tracing::info_span!(
                "FCALL",
                otel.kind = "client",
                db.system.name = "redis",
                db.operation.name = "FCALL",
                db.operation.batch.size = items.len(),
            );
            call.instrument(span).await
        } else {
            call.await
        };
        self.link.observe(slot, &reply);
        let reply = BatchScript::decode(reply?, items.len()).map_err(CallError::Reply)?;
        Ok(self.settle(slot, items, sent_at, self.clock.now_us(), reply))
    }

    /// What every script reply leaves behind, however it came (one call, a pipeline of calls, a
    /// reservation): the values no Tollgate could have written that it found, counted, and the offset
    /// to the Redis clock of `slot` it shows (sent at `sent_at`, received at `received_at`). Returns
    /// its decisions, one per item of `items`.
    pub(super) fn settle(
        &self,
        slot: Option<u16>,
        items: &[ScriptItem<'_>],
        sent_at: u64,
        received_at: u64,
        reply: ScriptReply,
    ) -> Vec<Decision> {
        let ScriptReply {
            now_us,
            decisions,
            impossible,
        } = reply;
        if let Some(&first) = impossible.first() {
            self.counters
                .impossible
                .found(impossible.len(), items[first].key, now_us);
        }
        self.offsets.record(slot, sent_at, received_at, now_us);
        decisions
    }

    /// Redis Cluster: one script call per hash slot, all in parallel, answers put back in request order.
    async fn per_slot(
        &self,
        conn: &ClusterConnection,
        items: &[ScriptItem<'_>],
        policy: CommitPolicy,
        markers: Option<Markers<'_>>,
        timeout: Duration,
    ) -> Result<Vec<Decision>, CallError> {
        let by_slot = by_slot(items.iter().map(|item| item.key));
        let settles_across = matches!(
            policy,
            CommitPolicy::AllOrNothing | CommitPolicy::StopIncrementWhenOverLimit
        );
        if settles_across && by_slot.len() > 1 {
            // One script per slot cannot settle together; only a domain whose keys are kept together
            // (all_or_nothing, or every domain under STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT) has
            // them in one slot (see keys.rs).
            return Err(CallError::CrossSlot);
        }
        let mut decisions = vec![Decision::default(); items.len()];
        let mut slots: Vec<(u16, &Vec<usize>)> = by_slot.iter().map(|(&slot, at)| (slot, at)).collect();
        if let Some(markers) = markers.filter(|_| slots.len() > 1) {
            // A refund token over several slots: one script per slot cannot claim it for all of them
            // at once, so the slot of the first descriptor goes first, every item there claiming the
            // first descriptor's marker. Of two callers racing on one token exactly one wins that
            // claim; the loser is told the token is spent before it touches any other slot. (The
            // other slots' own markers still keep each descriptor refunded once.)
            let first_at = slots.iter().position(|(_, p)| p.contains(&0)).unwrap_or(0);
            let (first_slot, first) = slots.remove(first_at);
            let shared: Vec<&str> = first.iter().map(|_| markers.keys[0]).collect();
            let marked = Markers {
                keys: &shared,
                ttl_ms: markers.ttl_ms,
            };
            let part: Vec<ScriptItem<'_>> = first.iter().map(|&at| items[at]).collect();
            let answer = self
                .invoke(
                    &mut conn.clone(),
                    Some(first_slot),
                    &part,
                    policy,
                    Some(marked),
                    timeout,
                )
                .await?;
            let claimed = answer.iter().any(|d| d.allowed);
            for (&at, decision) in first.iter().zip(answer) {
                decisions[at] = decision;
            }
            if !claimed {
                // Spent: the other slots are not asked; their items report "not refunded".
                return Ok(decisions);
            }
        }
        let calls = slots.iter().map(|&(slot, positions)| {
            let part: Vec<ScriptItem<'_>> = positions.iter().map(|&at| items[at]).collect();
            // Each marker lies in its item's slot, so it travels with it.
            let part_markers: Option<Vec<&str>> =
                markers.map(|m| positions.iter().map(|&at| m.keys[at]).collect());
            let mut conn = conn.clone();
            async move {
                let markers = markers.zip(part_markers.as_deref()).map(|(m, keys)| Markers {
                    keys,
                    ttl_ms: m.ttl_ms,
                });
                self.invoke(&mut conn, Some(slot), &part, policy, markers, timeout)
                    .await
            }
        });
        let answers = futures_util::future::try_join_all(calls).await?;
        for ((_, positions), answer) in slots.iter().zip(answers) {
            for (&at, decision) in positions.iter().zip(answer) {
                decisions[at] = decision;
            }
        }
        Ok(decisions)
    }
}
