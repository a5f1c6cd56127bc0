//! A batch on a call of its own, not coalesced: a traced request (its `FCALL` span stays the child of
//! its RPC span) or a batch settled as a whole (all-or-nothing, stop-incrementing-when-over-limit, a
//! peek, a refund). A refund token's single use rides along as one marker key per descriptor, in its
//! key's slot; in a Redis Cluster the batch goes as one script call per hash slot.

use std::time::Duration;

use redis::cluster_async::ClusterConnection;

use super::keys::refund_marker;
use super::link::CallError;
use super::script::{Markers, ScriptItem};
use super::{RedisStore, by_slot};
use crate::algorithm::Decision;
use crate::store::{Batch, CommitPolicy, StoreError};

impl RedisStore {
    /// A batch sent on its own call, not coalesced: traced, or settled as a whole (see
    /// `RedisStore::coalesces`).
    pub(super) async fn apply_alone(
        &self,
        batch: &Batch,
        named: Vec<(String, ScriptItem<'static>)>,
    ) -> Result<Vec<Decision>, StoreError> {
        let items: Vec<ScriptItem<'_>> = named
            .iter()
            .map(|(key, item)| ScriptItem { key, ..*item })
            .collect();
        let Some(once) = batch
            .once
            .as_ref()
            .filter(|_| batch.policy == CommitPolicy::Refund)
        else {
            return self
                .invoke_whole(&items, batch.policy, None, self.options.deadline)
                .await;
        };
        // Single use: one marker per descriptor (its items share it), in the slot of its key.
        let mut names: Vec<String> = Vec::with_capacity(named.len());
        for (at, ((key, _), item)) in named.iter().zip(&batch.items).enumerate() {
            let shared = at > 0 && batch.items[at - 1].group == item.group;
            let name = match names.last() {
                Some(previous) if shared => previous.clone(),
                _ => refund_marker(key, &item.key, item.group, &once.id),
            };
            names.push(name);
        }
        let keys: Vec<&str> = names.iter().map(String::as_str).collect();
        let markers = Markers {
            keys: &keys,
            ttl_ms: once.ttl_us.div_ceil(1_000),
        };
        self.invoke_whole(&items, batch.policy, Some(markers), self.options.deadline)
            .await
    }

    /// Redis Cluster: one script call per hash slot, all in parallel, answers put back in request order.
    pub(super) async fn apply_per_slot(
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
