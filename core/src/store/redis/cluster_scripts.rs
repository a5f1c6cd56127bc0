//! Redis Cluster: the script calls of coalesced requests, one pipeline per master.
//!
//! A script call must stay in one hash slot, and concurrent requests' keys rarely share one, so in a
//! cluster coalescing cannot merge requests into one call as it does on one node. What it can share is
//! the trip: the calls of a drained group, one `FCALL` per slot, go to each master as one pipeline over
//! Tollgate's own connection to it ([`super::link`]'s slot map), so Redis reads, wakes up and answers once per
//! master and group instead of once per request and slot.
//!
//! An `FCALL` that a master answers with an error (`MOVED`, `ASK` or `TRYAGAIN` while a slot moves, or
//! `Function not found` on a master that has not loaded the library yet) has run nowhere: that slot's
//! call is made again through redis-rs' cluster connection, which follows redirects and loads the
//! library ([`Caller::invoke`](super::call::Caller::invoke)). Without the slot map, without a link to a slot's master, or on a
//! server without functions, every slot's call goes that way. A master whose pipeline fails or times
//! out fails only the items it serves, and its slots go through the cluster connection until a newer
//! map is read; the other masters keep their links.

use std::sync::atomic::Ordering;
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use redis::aio::ConnectionManager;
use redis::cluster_async::ClusterConnection;

use super::call::Caller;
use super::group::{Answers, place};
use super::keys::by_slot;
use super::link::{CallError, ReplyError, Routes, within};
use super::script::{BatchScript, ScriptItem, Tail};
use crate::algorithm::Decision;
use crate::store::{CommitPolicy, StoreError};

/// Decides each of `items` (the concatenated items of independent requests, groups distinct, in
/// request order as `answers` holds them): one `FCALL` per slot, pipelined per master, each request
/// answered once its own items are decided. `timeout` bounds each pipeline and call.
pub(super) async fn decide_per_master(
    call: &Caller,
    conn: &ClusterConnection,
    items: &[ScriptItem<'_>],
    timeout: Duration,
    answers: &mut Answers,
) {
    let slots = by_slot(items.iter().map(|item| item.key));
    // Without functions (Redis 6.2, EVALSHA) every call goes through the cluster connection.
    let routes = if call.script.has_functions() {
        call.link.route(slots.keys().copied())
    } else {
        Routes {
            linked: Vec::new(),
            unlinked: slots.keys().copied().collect(),
        }
    };
    let part = |slot: u16| -> Vec<ScriptItem<'_>> { slots[&slot].iter().map(|&at| items[at]).collect() };
    let pipelines: FuturesUnordered<_> = routes
        .linked
        .into_iter()
        .map(|(master, mut link, of_master)| {
            let parts: Vec<(u16, Vec<ScriptItem<'_>>)> =
                of_master.into_iter().map(|slot| (slot, part(slot))).collect();
            async move {
                let answers = pipeline_calls(call, master, &mut link, conn, &parts, timeout).await;
                parts
                    .into_iter()
                    .map(|(slot, _)| slot)
                    .zip(answers)
                    .collect::<Vec<_>>()
            }
        })
        .collect();
    let singles: FuturesUnordered<_> = routes
        .unlinked
        .into_iter()
        .map(|slot| {
            let part = part(slot);
            let mut conn = conn.clone();
            async move {
                let answer = call
                    .invoke(
                        &mut conn,
                        Some(slot),
                        &part,
                        CommitPolicy::Independent,
                        None,
                        timeout,
                    )
                    .await
                    .map_err(|error| call.store_error(error));
                vec![(slot, answer)]
            }
        })
        .collect();
    // Each request is answered as soon as its own items are decided.
    let mut done = futures_util::stream::select(pipelines, singles);
    while let Some(decided) = done.next().await {
        for (slot, answer) in decided {
            let positions = &slots[&slot];
            place(answers.decisions(), positions, answer);
            answers.record(positions.iter().copied());
        }
    }
}

/// The `FCALL`s of `parts` (slot, items), all served by `master`, over its `link`, as one pipeline;
/// each slot's decisions or error. A call the master refused is made again through `conn`.
async fn pipeline_calls(
    call: &Caller,
    master: u16,
    link: &mut ConnectionManager,
    conn: &ClusterConnection,
    parts: &[(u16, Vec<ScriptItem<'_>>)],
    timeout: Duration,
) -> Vec<Result<Vec<Decision>, StoreError>> {
    let mut pipe = redis::pipe();
    // A refused call comes back in its place; the others ran.
    pipe.ignore_errors();
    for (_, items) in parts {
        pipe.add_command(call.script.fcall(items, CommitPolicy::Independent, Tail::None));
    }
    call.counters.pipelines.fetch_add(1, Ordering::Relaxed);
    call.counters
        .script_calls
        .fetch_add(parts.len() as u64, Ordering::Relaxed);
    let sent_at = call.clock.now_us();
    let replies = within(timeout, pipe.query_async::<Vec<redis::Value>>(link)).await;
    call.link.observe(parts.first().map(|(slot, _)| *slot), &replies);
    let replies = match replies {
        Ok(replies) if replies.len() == parts.len() => replies,
        Ok(replies) => {
            let error = call.store_error(CallError::Reply(ReplyError::WrongLength {
                expected: parts.len(),
                got: replies.len(),
            }));
            return parts.iter().map(|_| Err(error.clone())).collect();
        }
        Err(error) => {
            // The master may have gone (a failover): its calls go through the cluster connection
            // until the map is read again.
            call.link.link_failed(master);
            let error = call.store_error(error);
            return parts.iter().map(|_| Err(error.clone())).collect();
        }
    };
    let received_at = call.clock.now_us();
    let mut answers = Vec::with_capacity(parts.len());
    for ((slot, items), reply) in parts.iter().zip(replies) {
        let answer = match reply {
            redis::Value::ServerError(_) => {
                // Run nowhere: made again where redis-rs routes it, loading the library if needed.
                call.invoke(
                    &mut conn.clone(),
                    Some(*slot),
                    items,
                    CommitPolicy::Independent,
                    None,
                    timeout,
                )
                .await
                .map_err(|error| call.store_error(error))
            }
            reply => BatchScript::decode(reply, items.len())
                .map(|reply| call.settle(Some(*slot), items, sent_at, received_at, reply))
                .map_err(|error| call.store_error(CallError::Reply(error))),
        };
        answers.push(answer);
    }
    answers
}
