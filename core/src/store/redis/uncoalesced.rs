//! A batch on a call of its own, not coalesced: a traced request (its `FCALL` span stays the child of
//! its RPC span) or a batch settled as a whole (all-or-nothing, stop-incrementing-when-over-limit, a
//! peek, a refund). A refund token's single use rides along as one marker key per descriptor, in its
//! key's slot; in a Redis Cluster the batch goes as one script call per hash slot.

use super::call::Caller;
use super::keys::refund_marker;
use super::script::{Markers, ScriptItem};
use crate::algorithm::Decision;
use crate::store::{Batch, CommitPolicy, StoreError};

/// A batch sent on its own call, not coalesced: traced, or settled as a whole (see
/// `RedisStore::coalesces`).
pub(super) async fn apply(
    call: &Caller,
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
        return call.whole(&items, batch.policy, None, call.deadline()).await;
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
    call.whole(&items, batch.policy, Some(markers), call.deadline())
        .await
}
