//! Coalescing: concurrent requests share one script call.
//!
//! On this kind of host most of a script call's cost, in Redis and here, is per call rather than per
//! item: reading the command off the socket, dispatching it, writing the reply (measured: a trivial
//! `EVALSHA` costs Redis as much CPU as Tollgate's whole batch function). So while a few calls are in
//! flight, requests that arrive meanwhile wait in a queue, and the next call carries all of them.
//! Under light load a request finds a free slot and is sent at once, alone; under heavy load calls
//! grow to carry many requests, and Redis spends its time on the decisions, not on the calls.
//!
//! Only [`CommitPolicy::Independent`] batches are coalesced: for them, one call over the concatenated
//! items is exactly the requests applied one after another (the script settles each group on its
//! own, and a later item sees an earlier item's effect), so nothing about their meaning changes. Every
//! other policy acts on a whole batch and is sent alone. Each request keeps its own deadline, counted
//! from when it was queued.
//!
//! [`CommitPolicy::Independent`]: crate::store::CommitPolicy::Independent

use std::sync::{Arc, Weak};

use tokio::sync::{Semaphore, mpsc, oneshot};

use super::RedisStore;
use super::script::ScriptItem;
use crate::algorithm::Decision;
use crate::store::StoreError;

/// Script calls carrying coalesced requests that may be in flight at once. Few enough that requests
/// pile up behind them under load, enough that one slow reply does not stall everything.
const CALLS_IN_FLIGHT: usize = 4;

/// Most items one coalesced call carries, bounding the time one call holds Redis.
const MAX_ITEMS_PER_CALL: usize = 512;

/// One queued request: its items with their Redis keys, and where its decisions go.
pub(super) struct Pending {
    /// Each item's key and the item (whose `key` field points at it when the call is made).
    pub(super) named: Vec<(String, ScriptItem<'static>)>,
    /// The request's answer.
    pub(super) reply: oneshot::Sender<Result<Vec<Decision>, StoreError>>,
}

/// The queue in front of the script calls.
#[derive(Debug)]
pub(super) struct Coalescer {
    queue: mpsc::UnboundedSender<Pending>,
}

impl Coalescer {
    /// Starts the task that drains the queue into calls; it ends when the store is dropped.
    pub(super) fn start(store: Weak<RedisStore>) -> Self {
        let (queue, pending) = mpsc::unbounded_channel();
        tokio::spawn(drain(store, pending));
        Self { queue }
    }

    /// Queues a request; the answer arrives on the returned receiver.
    pub(super) fn submit(
        &self,
        named: Vec<(String, ScriptItem<'static>)>,
    ) -> oneshot::Receiver<Result<Vec<Decision>, StoreError>> {
        let (reply, answer) = oneshot::channel();
        // The drain task lives as long as the store, so the queue is open; if it ever were not, the
        // dropped `reply` tells the caller.
        let _ = self.queue.send(Pending { named, reply });
        answer
    }
}

/// Takes a free call slot, then everything queued (up to [`MAX_ITEMS_PER_CALL`]), and sends it as one
/// call.
async fn drain(store: Weak<RedisStore>, mut pending: mpsc::UnboundedReceiver<Pending>) {
    let slots = Arc::new(Semaphore::new(CALLS_IN_FLIGHT));
    loop {
        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
            return;
        };
        let Some(first) = pending.recv().await else {
            return;
        };
        let mut items = first.named.len();
        let mut group = vec![first];
        while items < MAX_ITEMS_PER_CALL {
            match pending.try_recv() {
                Ok(next) => {
                    items += next.named.len();
                    group.push(next);
                }
                Err(_) => break,
            }
        }
        let Some(store) = store.upgrade() else {
            return;
        };
        tokio::spawn(async move {
            store.send_coalesced(group).await;
            drop(slot);
        });
    }
}

impl RedisStore {
    /// One script call for several queued requests; each gets its own decisions back.
    async fn send_coalesced(&self, group: Vec<Pending>) {
        let mut items = Vec::with_capacity(group.iter().map(|p| p.named.len()).sum());
        // Group ids must stay distinct across requests so no two requests' groups merge.
        let mut offset = 0u32;
        for request in &group {
            let mut next_offset = offset;
            for (key, item) in &request.named {
                let group = item.group.saturating_add(offset);
                next_offset = next_offset.max(group.saturating_add(1));
                items.push(ScriptItem { key, group, ..*item });
            }
            offset = next_offset;
        }
        let result = self
            .invoke_whole(&items, crate::store::CommitPolicy::Independent, None)
            .await;
        match result {
            Ok(decisions) => {
                let mut decisions = decisions.into_iter();
                for request in group {
                    let own = decisions.by_ref().take(request.named.len()).collect();
                    let _ = request.reply.send(Ok(own));
                }
            }
            Err(error) => {
                for request in group {
                    let _ = request.reply.send(Err(error.clone()));
                }
            }
        }
    }
}
