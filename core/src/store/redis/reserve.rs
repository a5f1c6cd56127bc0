//! Hot-key reservations on Redis: one script call that decides a request's item and grants the replica
//! a slice of the key to admit from locally ([`crate::store::hot_keys`] decides when, and states the
//! guarantee; `lua/batch.lua`, policy 5, does it). Never coalesced: a reservation is rare (about one
//! per slice) and its reply is shaped differently.

use std::sync::atomic::Ordering;

use super::call::Caller;
use super::keys::reservers_key;
use super::link::CallError;
use super::script::{BatchScript, Reservation, ReservedReply, ScriptItem, Tail};
use crate::algorithm::Algorithm;
use crate::store::hot_keys::{ReserveRequest, Reserved};
use crate::store::{CommitPolicy, StoreError};

/// Decides `item` (its Redis key `key`) and reserves a slice of that key for this replica, as
/// `request` asks: one script call.
pub(super) async fn reserve(
    call: &Caller,
    key: &str,
    item: ScriptItem<'_>,
    request: ReserveRequest<'_>,
) -> Result<Reserved, StoreError> {
    let item = ScriptItem { key, ..item };
    let reservers = reservers_key(key);
    let tail = Tail::Reserve(Reservation {
        reservers: &reservers,
        request,
    });
    let slot = call.link.is_cluster().then(|| super::keys::slot(key));
    let sent_at = call.clock.now_us();
    call.counters.script_calls.fetch_add(1, Ordering::Relaxed);
    let reply = call
        .link
        .call_whole(|mut conn| async move {
            let items = [item];
            call.script
                .call(&mut conn, &items, CommitPolicy::Independent, tail)
                .await
        })
        .await
        .and_then(|value| BatchScript::decode_reserved(value).map_err(CallError::Reply));
    call.link.observe(slot, &reply);
    let ReservedReply {
        reply,
        extra,
        reservers_repaired,
    } = reply.map_err(|e| call.store_error(e))?;
    let now_us = reply.now_us;
    if reservers_repaired {
        call.counters.impossible.found(1, &reservers, now_us);
    }
    let decision = call.settle(slot, &[item], sent_at, call.clock.now_us(), reply)[0];
    let valid_for_us = match item.limit.algorithm {
        // The window that lent the units ends then (the fixed window's reset is its end).
        Algorithm::FixedWindow => decision.reset_after_us,
        Algorithm::SlidingWindow => {
            let window = item.limit.window_us.max(1);
            window - now_us % window
        }
        _ => u64::MAX,
    };
    Ok(Reserved {
        decision,
        extra,
        valid_for_us,
    })
}
