//! Fixed windows without a script: the envoyproxy/ratelimit way, `INCRBY` then `EXPIRE`, pipelined.
//!
//! A fixed-window decision needs no atomicity beyond one counter: `INCRBY key cost` returns the
//! count with this request in it, and the verdict follows from that count alone
//! ([`fixed_window::decide_counted`]), exactly as the batch script decides it. Where nothing needs
//! items settled together, this costs Redis a fraction of a script call (measured in
//! docs/performance.md): no Lua, no argument decoding, no state to read back. So a queued request
//! whose items are all such counters ([`pipelinable`]) goes into one pipeline with the other
//! pipelinable requests queued with it: `TIME`, then per item `INCRBY key cost` and
//! `EXPIRE key ttl NX`, one write and one round trip for all of them. A counter this replica has
//! already seen given its TTL gets `INCRBY` alone ([`super::timed_counters`]): the `EXPIRE NX` would
//! change nothing, and left out it saves Redis a command on every hit but a counter's first.
//!
//! The keys and values are the script's and the Go service's: the window-named key holding a plain
//! integer. `EXPIRE … NX` (Redis 7.0) sets the TTL once, when the counter is created, so the key
//! expires a window plus jitter after its first hit (the script's `SET … EX` measures from the last
//! one; both outlive the window). On Redis older than 7.0 plain `EXPIRE`, as Go sends it. A Go
//! replica, an older Tollgate and this path can share counters in any mix: each command is atomic
//! and each writes what the others read.
//!
//! `TIME` gives the Redis clock the decisions' reset times are counted from, and keeps the clock
//! offset fresh for naming windows, as every script reply does.
//!
//! A counter holding something that is not an integer (`INCRBY` refuses it) is decided again by the
//! script, which reads such a value as 0 and overwrites it, as Go's `INCRBY` never could.
//!
//! In a Redis Cluster the queued requests' counters go out as one pipeline per master, over a
//! connection to each master, grouped by the slot map Tollgate reads (`CLUSTER SLOTS`,
//! [`super::link`]'s slot map); a counter whose slot moved since gets `MOVED` or `ASK`, is not counted there,
//! and is decided by the script instead. Until the map is read, and after a master fails, the script
//! decides the counters, one call per slot (never a pipeline through redis-rs' cluster connection,
//! which resends a whole pipeline on one redirect).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::future::Either;
use futures_util::stream::FuturesUnordered;
use redis::ServerErrorKind;
use redis::aio::{ConnectionLike, ConnectionManager};

use super::call::Caller;
use super::group::{Answers, Pending, fail, place};
use super::keys::{by_slot, shares_group};
use super::link::{CallError, Connections, ReplyError, within};
use super::script::ScriptItem;
use crate::algorithm::{Algorithm, Decision, fixed_window};
use crate::store::{BatchItem, CommitPolicy, StoreError};

/// Whether every item of an independent batch is a fixed-window counter that `INCRBY` alone decides:
/// a cost to count (a cost of 0 is a peek, which never writes), and no other limit on its descriptor
/// (a descriptor's limits are settled together: an allowed one must not count when another refuses).
pub(super) fn pipelinable(items: &[BatchItem]) -> bool {
    items.iter().enumerate().all(|(at, item)| {
        item.limit.algorithm == Algorithm::FixedWindow && item.cost > 0 && !shares_group(items, at)
    })
}

/// One pipeline for several queued requests whose items are all [`pipelinable`] (in a cluster,
/// one per master); each request gets its own decisions back as soon as they are made, or the error
/// of a pipeline that carried one of its counters: a master that fails fails only the requests it
/// serves, and one that is slow holds up only those. `timeout` bounds each pipeline (the coalescer sets
/// it for the group).
pub(super) async fn send_pipelined(call: &Caller, group: Vec<Pending>, timeout: Duration) {
    let (named, mut answers) = Answers::new(group);
    let named: Vec<&(String, ScriptItem<'static>)> = named.iter().flatten().collect();
    count(call, &named, timeout, &mut answers).await;
}

/// Decides each of `named`'s items (in request order, as `answers` holds them), counted with
/// pipelines: one on a single node or Sentinel's master; in a Redis Cluster one per master (a script
/// call per slot without a link to its master), all sent at once, each request answered once its own
/// items are decided. `timeout` bounds each pipeline. An item carried by a pipeline that failed gets
/// that pipeline's error; an item whose `INCRBY` was refused is decided by the script.
async fn count(
    call: &Caller,
    named: &[&(String, ScriptItem<'static>)],
    timeout: Duration,
    answers: &mut Answers,
) {
    let all = || (0..named.len()).collect::<Vec<_>>();
    // The script's decision of the items at `positions`, each independent of the others.
    let script = |positions: Vec<usize>| async move {
        let decided = decide_by_script(call, named, &positions, timeout).await;
        Done::Scripted(positions, decided)
    };
    let Some(connections) = call.link.connections() else {
        let error = call.store_error(CallError::NotConnected);
        apply(named, answers, Done::Counted(all(), Err(error)));
        return;
    };
    match &*connections {
        Connections::Cluster(_) => {
            let slots = by_slot(named.iter().map(|(key, _)| key.as_str()));
            // A master with a link is sent its counters as one pipeline over it. Any other slot (the
            // map not read yet; a master whose link failed; a slot no master serves) is decided by
            // the script, one call per slot through the cluster connection: that connection would
            // send a whole pipeline again on a single ASK or MOVED reply, counting twice what the
            // first node had counted, where a script call that is redirected has run nowhere.
            let routes = call.link.route(slots.keys().copied());
            let pipeline = |(master, mut link, of_master): (u16, ConnectionManager, Vec<u16>)| {
                let positions: Vec<usize> = of_master
                    .iter()
                    .flat_map(|slot| slots[slot].iter().copied())
                    .collect();
                let counters: Vec<_> = positions.iter().map(|&at| named[at]).collect();
                async move {
                    let counted = increment(call, &mut link, Some(&of_master), &counters, timeout).await;
                    if counted.is_err() {
                        // The master may have gone (a failover): its counters go to the script,
                        // which follows the cluster, until the map is read again.
                        call.link.link_failed(master);
                    }
                    call.link.observe(Some(of_master[0]), &counted);
                    Done::Counted(positions, counted.map_err(|e| call.store_error(e)))
                }
            };
            let mut work: FuturesUnordered<_> = routes
                .linked
                .into_iter()
                .map(|route| Either::Left(pipeline(route)))
                .collect();
            for slot in &routes.unlinked {
                work.push(Either::Right(script(slots[slot].clone())));
            }
            // Each request is answered as soon as its own items are decided; a counter refused on
            // its master is decided by the script as soon as that is known.
            while let Some(done) = work.next().await {
                let refused = apply(named, answers, done);
                if !refused.is_empty() {
                    work.push(Either::Right(script(refused)));
                }
            }
        }
        whole => {
            let counted = whole
                .on_whole(async |mut conn| increment(call, &mut conn, None, named, timeout).await)
                .await;
            let refused = apply(
                named,
                answers,
                Done::Counted(all(), counted.map_err(|e| call.store_error(e))),
            );
            if !refused.is_empty() {
                apply(named, answers, script(refused).await);
            }
        }
    }
}

/// The decisions of `named`'s items at `positions` by the batch script, each item independent of the
/// others (a group of its own), as separate requests would be decided.
async fn decide_by_script(
    call: &Caller,
    named: &[&(String, ScriptItem<'static>)],
    positions: &[usize],
    timeout: Duration,
) -> Result<Vec<Decision>, StoreError> {
    let items: Vec<ScriptItem<'_>> = (0u32..)
        .zip(positions)
        .map(|(group, &at)| ScriptItem {
            key: &named[at].0,
            group,
            ..named[at].1
        })
        .collect();
    call.whole(&items, CommitPolicy::Independent, None, timeout).await
}

/// `TIME`, then per item `INCRBY`, with `EXPIRE` unless the counter is known to carry a TTL
/// ([`super::timed_counters`]), as one pipeline. Returns Redis' clock and each counter with its item
/// counted (`None`: `INCRBY` refused the value there, or the node does not serve its slot, and
/// nothing was counted). Every counter it counted has a TTL when it returns, or one on its way (a
/// counter it found created without one). `slots`: in a cluster, the slots of the counters, all
/// served by the node `conn` reaches.
async fn increment<C: ConnectionLike + Clone + Send + 'static>(
    call: &Caller,
    conn: &mut C,
    slots: Option<&[u16]>,
    named: &[&(String, ScriptItem<'static>)],
    timeout: Duration,
) -> Result<(u64, Vec<Option<u64>>), CallError> {
    let mut pipe = redis::pipe();
    // A refused INCRBY comes back in its place instead of failing the whole pipeline, whose other
    // commands Redis has run.
    pipe.ignore_errors();
    pipe.cmd("TIME");
    let expire_nx = call.script.has_functions();
    // Each item's counter fingerprint, and whether its INCRBY goes with an EXPIRE.
    let mut plan = Vec::with_capacity(named.len());
    let mut expires = 0;
    for (key, item) in named.iter().map(|n| (&n.0, &n.1)) {
        pipe.cmd("INCRBY").arg(key).arg(item.cost);
        let fingerprint = call.counters.timed.fingerprint(key);
        let expire = !call.counters.timed.has_ttl(fingerprint);
        if expire {
            push_expire(&mut pipe, key, item.ttl_secs, expire_nx);
            expires += 1;
        }
        plan.push((fingerprint, expire));
    }
    call.counters
        .timed
        .sent
        .fetch_add(expires as u64, Ordering::Relaxed);
    let skipped = named.len() - expires;
    call.counters
        .timed
        .skipped
        .fetch_add(skipped as u64, Ordering::Relaxed);
    call.counters.pipelines.fetch_add(1, Ordering::Relaxed);
    let sent_at = call.clock.now_us();
    let values = within(timeout, pipe.query_async::<Vec<redis::Value>>(conn)).await?;
    let bad = |index: usize| {
        CallError::Reply(ReplyError::BadValue {
            index,
            value: format!("{:?}", values.get(index)),
        })
    };
    let expected = 1 + named.len() + expires;
    if values.len() != expected {
        return Err(CallError::Reply(ReplyError::WrongLength {
            expected,
            got: values.len(),
        }));
    }
    let now_us = redis_time_us(&values[0]).ok_or_else(|| bad(0))?;
    let received_at = call.clock.now_us();
    match slots {
        None => call.offsets.record(None, sent_at, received_at, now_us),
        Some(slots) => {
            for &slot in slots {
                call.offsets.record(Some(slot), sent_at, received_at, now_us);
            }
        }
    }
    let mut counts = Vec::with_capacity(named.len());
    // Counters left without a TTL: where EXPIRE NX was refused, and where an INCRBY sent alone
    // turned out to create its counter.
    let (mut refused_nx, mut created) = (Vec::new(), Vec::new());
    // Counters that held a negative count (no INCRBY leaves one: see `super::impossible_state`), and
    // what brings each back to this request's cost, as if it had held nothing.
    let mut negative = Vec::new();
    let mut index = 1;
    for (at, &(fingerprint, expires)) in plan.iter().enumerate() {
        let count = match &values[index] {
            redis::Value::Int(after) => {
                let cost = named[at].1.cost;
                match u64::try_from(*after) {
                    Ok(after) if after >= cost => Some(after),
                    // Decided as the counter's first hit; the correction is an increment, so
                    // that other replicas' concurrent hits are kept.
                    _ => {
                        negative.push((at, i64::try_from(cost).unwrap_or(i64::MAX).saturating_sub(*after)));
                        Some(cost)
                    }
                }
            }
            redis::Value::ServerError(error) => {
                if matches!(error.kind(), Some(ServerErrorKind::Moved | ServerErrorKind::Ask)) {
                    // A slot moved since the map was read: read it again.
                    call.link.read_slot_map();
                }
                None
            }
            _ => return Err(bad(index)),
        };
        index += 1;
        if expires {
            match &values[index] {
                redis::Value::Int(_) => call.counters.timed.remember(fingerprint),
                // Where INCRBY was refused too, the script writes the counter, TTL and all.
                redis::Value::ServerError(_) if count.is_some() => refused_nx.push(at),
                redis::Value::ServerError(_) => {}
                _ => return Err(bad(index)),
            }
            index += 1;
        } else if count.is_some_and(|after| after <= named[at].1.cost) {
            // Nothing was counted in it before this INCRBY: it created the counter (the hint was
            // wrong: the key was deleted since), which has no TTL yet.
            created.push(at);
        }
        counts.push(count);
    }
    if !refused_nx.is_empty() {
        // A server that turned out not to know EXPIRE's NX (older than 7.0, found before the
        // script could tell): the counters must not live forever, so plain EXPIRE, as Go sends it,
        // before answering.
        tracing::warn!(
            keys = refused_nx.len(),
            "EXPIRE NX refused: setting the counters' TTL with EXPIRE"
        );
        let again = expire_pipe(named, &refused_nx, false);
        within(timeout, again.query_async::<()>(conn)).await?;
    }
    if let Some(&(first, _)) = negative.first() {
        call.counters
            .impossible
            .found(negative.len(), &named[first].0, now_us);
        let mut again = redis::pipe();
        for &(at, correction) in &negative {
            again.cmd("INCRBY").arg(&named[at].0).arg(correction).ignore();
        }
        within(timeout, again.query_async::<()>(conn)).await?;
    }
    if !created.is_empty() {
        repair_ttls(call, conn, named, &created, expire_nx, timeout).await?;
    }
    Ok((now_us, counts))
}

/// Gives the counters of `named` at `created` (found created by an `INCRBY` sent without
/// `EXPIRE`) their TTL: in the background while few repairs are in flight, else before returning.
async fn repair_ttls<C: ConnectionLike + Clone + Send + 'static>(
    call: &Caller,
    conn: &C,
    named: &[&(String, ScriptItem<'static>)],
    created: &[usize],
    expire_nx: bool,
    timeout: Duration,
) -> Result<(), CallError> {
    call.counters
        .timed
        .repaired
        .fetch_add(created.len() as u64, Ordering::Relaxed);
    let again = expire_pipe(named, created, expire_nx);
    let mut conn = conn.clone();
    let repair = async move { within(timeout, again.query_async::<()>(&mut conn)).await };
    // A count a refund brought back to zero looks the same as a new counter, and may come often:
    // its repair is an EXPIRE NX that changes nothing, so it need not hold the answer up.
    match Arc::clone(&call.counters.timed.repairs).try_acquire_owned() {
        Ok(permit) => {
            let deadline = call.deadline();
            tokio::spawn(async move {
                if let Err(error) = repair.await {
                    let error = error.into_store_error(deadline);
                    tracing::warn!(%error, "cannot set a new counter's TTL");
                }
                drop(permit);
            });
            Ok(())
        }
        Err(_) => repair.await,
    }
}

/// Adds `EXPIRE key ttl_secs` (at least 1 s; with `NX` if `nx`) to `pipe`.
fn push_expire<'p>(
    pipe: &'p mut redis::Pipeline,
    key: &str,
    ttl_secs: u64,
    nx: bool,
) -> &'p mut redis::Pipeline {
    let expire = pipe.cmd("EXPIRE").arg(key).arg(ttl_secs.max(1));
    if nx {
        expire.arg("NX");
    }
    expire
}

/// A pipeline of `EXPIRE` (with `NX` if `nx`) for the counters of `named` at `positions`, each
/// reply ignored.
fn expire_pipe(named: &[&(String, ScriptItem<'static>)], positions: &[usize], nx: bool) -> redis::Pipeline {
    let mut pipe = redis::pipe();
    for &at in positions {
        push_expire(&mut pipe, &named[at].0, named[at].1.ttl_secs, nx).ignore();
    }
    pipe
}

/// A finished part of [`count`]'s work.
enum Done {
    /// A pipeline: the positions of its counters and what it counted (Redis' clock and each counter).
    Counted(Vec<usize>, Result<(u64, Vec<Option<u64>>), StoreError>),
    /// A script call: the positions of its items and their decisions.
    Scripted(Vec<usize>, Result<Vec<Decision>, StoreError>),
}

/// Writes the decisions of a finished part into `answers` and records them, answering the requests
/// they complete. Returns the positions whose `INCRBY` was refused, which the script must decide yet.
fn apply(named: &[&(String, ScriptItem<'static>)], answers: &mut Answers, done: Done) -> Vec<usize> {
    match done {
        Done::Counted(positions, Ok((now_us, counts))) => {
            let mut refused = Vec::new();
            let decisions = answers.decisions();
            for (&at, count) in positions.iter().zip(counts) {
                let item = &named[at].1;
                match count {
                    Some(after) => {
                        decisions[at] = Ok(fixed_window::decide_counted(
                            &item.limit,
                            item.window_start_us,
                            now_us,
                            after,
                            item.cost,
                        ));
                    }
                    None => refused.push(at),
                }
            }
            answers.record(positions.into_iter().filter(|at| !refused.contains(at)));
            refused
        }
        Done::Counted(positions, Err(error)) => {
            fail(answers.decisions(), positions.iter().copied(), &error);
            answers.record(positions);
            Vec::new()
        }
        Done::Scripted(positions, decided) => {
            place(answers.decisions(), &positions, decided);
            answers.record(positions);
            Vec::new()
        }
    }
}

/// `TIME`'s reply (seconds and microseconds, as bulk strings) in µs since the epoch.
fn redis_time_us(value: &redis::Value) -> Option<u64> {
    let redis::Value::Array(parts) = value else {
        return None;
    };
    let number = |part: &redis::Value| -> Option<u64> {
        match part {
            redis::Value::BulkString(bytes) => std::str::from_utf8(bytes).ok()?.parse().ok(),
            redis::Value::Int(n) => u64::try_from(*n).ok(),
            _ => None,
        }
    };
    match parts.as_slice() {
        [seconds, micros] => number(seconds)?
            .checked_mul(1_000_000)?
            .checked_add(number(micros)?),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::Limit;

    fn item(algorithm: Algorithm, cost: u64, group: u32) -> BatchItem {
        BatchItem {
            key: "k".into(),
            limit: Limit {
                algorithm,
                requests: 10,
                window_us: 60_000_000,
                burst: 10,
            },
            cost,
            group,
            go_format: false,
        }
    }

    #[test]
    fn only_lone_costed_fixed_windows_are_pipelinable() {
        let fixed = |cost, group| item(Algorithm::FixedWindow, cost, group);
        assert!(pipelinable(&[fixed(1, 0), fixed(3, 1)]));
        assert!(
            !pipelinable(&[fixed(1, 0), fixed(1, 0)]),
            "two limits of one descriptor settle together"
        );
        assert!(!pipelinable(&[fixed(0, 0)]), "a peek never writes");
        assert!(!pipelinable(&[fixed(1, 0), item(Algorithm::TokenBucket, 1, 1)]));
    }

    #[test]
    fn time_replies_are_read_as_microseconds() {
        let bulk = |s: &str| redis::Value::BulkString(s.as_bytes().to_vec());
        let time = redis::Value::Array(vec![bulk("1700000000"), bulk("123456")]);
        assert_eq!(redis_time_us(&time), Some(1_700_000_000_123_456));
        assert_eq!(
            redis_time_us(&redis::Value::Array(vec![bulk("x"), bulk("1")])),
            None
        );
        assert_eq!(redis_time_us(&redis::Value::Nil), None);
    }
}
