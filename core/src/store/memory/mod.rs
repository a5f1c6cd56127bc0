//! The embedded store: algorithm state in process memory, for single-instance deployments, development
//! and tests.
//!
//! State lives in [`SHARDS`] independently locked hash tables. A batch locks the shards its keys fall
//! in, in ascending order (so two batches can never deadlock), applies every item, and releases them:
//! that makes a batch as atomic as a Redis script. The locks are plain `std` mutexes held only for
//! the few hundred nanoseconds of arithmetic, never across an `.await`.
//!
//! A peek runs the same first pass as a consuming batch, then restores every state it touched before
//! releasing the locks; a refund updates only entries that hold a live state.
//!
//! Memory stays bounded under key churn: each entry records the instant after which its state can no
//! longer change a decision ([`algorithm::expires_at_us`]); expired entries are ignored on lookup and
//! removed by [`MemoryStore::sweep`], which the server runs periodically, one shard at a time.
//!
//! And it stays bounded under attack: a store holds at most `max_keys` entries (an even share per
//! shard). A consuming batch that must add a key to a full shard first evicts the entry that least
//! affects decisions among a sample of the shard: an expired one if there is one, else the one whose
//! state stops mattering soonest (a bucket nearly refilled, a window nearly over). Each eviction is
//! counted ([`MemoryStore::evictions`]). Peeks and refunds never evict: they must not change the store.

mod lease;

pub use lease::MemoryLeases;

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use hashbrown::{DefaultHashBuilder, HashTable};
use smallvec::SmallVec;

use crate::algorithm::{self, Algorithm, Decision, State};
use crate::clock::Clock;
use crate::store::{Batch, BatchItem, CommitPolicy, RefundOnce, Store, StoreError, shard_of};

/// Number of independently locked tables. Enough that the runtime's worker threads rarely contend on
/// one lock, few enough that a sweep walks them quickly.
pub const SHARDS: usize = 64;

/// The embedded store. Cheap to share: wrap it in an `Arc`.
#[derive(Debug)]
pub struct MemoryStore {
    shards: Box<[Mutex<Shard>]>,
    hasher: DefaultHashBuilder,
    clock: Arc<dyn Clock>,
    leases: MemoryLeases,
    /// Most entries a shard holds (its share of `max_keys`).
    shard_cap: usize,
    /// Entries evicted to make room so far.
    evictions: AtomicU64,
    /// Refund tokens used, per descriptor and place: `key NUL group NUL id` → until when to remember
    /// it (µs). Locked after the shards, only by refunds carrying a token; swept with the entries, and
    /// at most `side_cap` of them (see [`MemoryStore::with_max_keys`]).
    spent: Mutex<HashMap<String, u64>>,
    /// Most refund markers, and most leases: a quarter of the key cap each.
    side_cap: usize,
    /// Refunds and acquires refused because their map was full.
    refused_full: AtomicU64,
}

#[derive(Debug)]
struct Entry {
    key: StoredKey,
    algorithm: Algorithm,
    /// The key is in Go's format ([`BatchItem::go_format`]): never the case for the limiter's own
    /// embedded store, whose keys are all Tollgate's, but `failure_mode: local` counts Redis's keys here.
    go_format: bool,
    /// The number its shard gave the batch that last wrote the entry ([`Shard::batches`]): a batch
    /// never evicts what it wrote itself (it would lose the count it just made). Fits beside
    /// `algorithm`, in what would be padding.
    batch: u32,
    window_us: u64,
    state: State,
    expires_at_us: u64,
}

impl Entry {
    fn is(&self, item: &BatchItem) -> bool {
        self.window_us == item.limit.window_us
            && self.algorithm == item.limit.algorithm
            && self.go_format == item.go_format
            && self.key.as_slice() == item.key.as_bytes()
    }
}

/// Default for the most entries the embedded store holds (`TOLLGATE_MEMORY_MAX_KEYS`): a few hundred
/// bytes a key at most (measured, see docs/performance.md), so the default keeps the embedded store
/// well under 256 MiB.
pub const DEFAULT_MAX_KEYS: usize = 640_000;

/// Entries looked at to pick one to evict: enough that the victim is close to the shard's least
/// useful, few enough to cost far less than the decision that needs the room.
const EVICTION_SAMPLE: usize = 16;

/// What one pass over a batch does with the states it changes.
enum Pass<'u> {
    /// Keeps them.
    Commit,
    /// Keeps them, recording the previous states for a rollback should the batch settle.
    Record(&'u mut Vec<Option<State>>),
    /// A peek: records them for the rollback that always follows, and never evicts.
    Peek(&'u mut Vec<Option<State>>),
}

/// A storage key as an entry holds it: inline up to 46 bytes, which a domain, a key and a grouped IPv6
/// network fit (`api_remote_address_2001:db8:1234:5678::/64`, 42 bytes). On the heap, every key was a
/// second cache miss after its entry's, for the comparison a lookup makes.
type StoredKey = SmallVec<[u8; 46]>;

/// Per-batch values (hashes, costs, shards) kept beside the call rather than allocated: a request
/// has a handful of descriptors, so a batch rarely holds more items than this.
type PerItem<T> = SmallVec<[T; 4]>;

/// One independently locked part of the store.
#[derive(Debug, Default)]
struct Shard {
    table: HashTable<Entry>,
    /// Numbers the batches that lock the shard, so an eviction can tell the entries its own batch
    /// wrote (wraps). Counted under the shard's lock: no atomic operation on the hot path.
    batches: u32,
}

/// Locked shards of one batch, in ascending shard order.
struct Locked<'a> {
    guards: PerItem<(usize, MutexGuard<'a, Shard>)>,
}

impl Locked<'_> {
    /// The locked shard of the entry of `hash`, one of the batch's.
    fn shard(&mut self, hash: u64) -> &mut Shard {
        let shard = shard_of(hash, SHARDS);
        let at = self.guards.partition_point(|(i, _)| *i < shard);
        &mut self.guards[at].1
    }

    /// The locked table of the entry of `hash`.
    fn table(&mut self, hash: u64) -> &mut HashTable<Entry> {
        &mut self.shard(hash).table
    }
}

impl MemoryStore {
    /// An empty store reading time from `clock`, holding at most [`DEFAULT_MAX_KEYS`] entries.
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        Self::with_max_keys(clock, DEFAULT_MAX_KEYS)
    }

    /// An empty store holding at most `max_keys` counters (rounded up to a multiple of [`SHARDS`]),
    /// plus the new entries of batches in progress: a batch never evicts what it wrote itself. Leases
    /// and the markers that make refund tokens single-use are capped at a quarter of `max_keys` each;
    /// they are never evicted (that would free a held slot, or let a token be replayed), so a new one
    /// that finds its map full, once the expired ones are dropped, is refused (and counted in
    /// [`MemoryStore::refused_full`]).
    pub fn with_max_keys(clock: Arc<dyn Clock>, max_keys: usize) -> Self {
        let shards = (0..SHARDS).map(|_| Mutex::default()).collect();
        let side_cap = (max_keys / 4).max(1);
        Self {
            shards,
            hasher: DefaultHashBuilder::default(),
            leases: MemoryLeases::new(Arc::clone(&clock), side_cap),
            clock,
            shard_cap: max_keys.div_ceil(SHARDS).max(1),
            evictions: AtomicU64::new(0),
            spent: Mutex::default(),
            side_cap,
            refused_full: AtomicU64::new(0),
        }
    }

    /// Refunds and lease acquires refused so far because the refund markers or the leases were at
    /// their cap.
    pub fn refused_full(&self) -> u64 {
        self.refused_full.load(Ordering::Relaxed) + self.leases.refused_full()
    }

    /// Entries evicted so far to stay within the key cap.
    pub fn evictions(&self) -> u64 {
        self.evictions.load(Ordering::Relaxed)
    }

    /// The concurrency leases.
    pub fn leases(&self) -> &MemoryLeases {
        &self.leases
    }

    /// Number of entries held, expired or not (for tests and metrics).
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(s).table.len()).sum()
    }

    /// Whether the store holds no entry.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops every entry (and lease) that can no longer change a decision; returns how many were
    /// dropped. Locks one shard at a time, so requests on other shards are never blocked by a sweep.
    pub fn sweep(&self) -> usize {
        let now = self.clock.now_us();
        let mut dropped = self.leases.sweep();
        {
            let mut spent = self.spent.lock().unwrap_or_else(PoisonError::into_inner);
            let before = spent.len();
            spent.retain(|_, until| *until > now);
            dropped += before - spent.len();
        }
        for shard in self.shards.iter() {
            let table = &mut lock(shard).table;
            let before = table.len();
            table.retain(|e| e.expires_at_us > now);
            dropped += before - table.len();
        }
        dropped
    }

    /// An item's hash, which places its entry (shard and bucket).
    fn hash(&self, item: &BatchItem) -> u64 {
        self.hasher.hash_one((
            item.key.as_bytes(),
            item.limit.window_us,
            item.limit.algorithm,
            item.go_format,
        ))
    }

    fn lock_shards(&self, hashes: &[u64]) -> Locked<'_> {
        let mut wanted = PerItem::new();
        wanted.extend(hashes.iter().map(|h| shard_of(*h, SHARDS)));
        wanted.sort_unstable();
        wanted.dedup();
        let mut locked = Locked {
            guards: PerItem::new(),
        };
        locked.guards.extend(wanted.into_iter().map(|i| {
            let mut shard = lock(&self.shards[i]);
            shard.batches = shard.batches.wrapping_add(1);
            (i, shard)
        }));
        locked
    }

    /// [`Store::apply`], answered without a future: the embedded store never waits.
    pub fn apply_now(&self, batch: &Batch) -> Result<Vec<Decision>, StoreError> {
        self.apply_batch(&batch.items, batch.policy, batch.once.as_ref())
    }

    /// The synchronous heart of [`Store::apply`]: locks the batch's shards, then consumes, peeks or
    /// refunds as the policy says. Holding every lock for the whole batch is what makes it atomic.
    fn apply_batch(
        &self,
        items: &[BatchItem],
        policy: CommitPolicy,
        once: Option<&RefundOnce>,
    ) -> Result<Vec<Decision>, StoreError> {
        let now = self.clock.now_us();
        // Per-item lists are filled where they lie, not collected and moved: moving a list just
        // written stalled on every one (loads of one width after stores of another).
        let mut hashes = PerItem::new();
        hashes.extend(items.iter().map(|i| self.hash(i)));
        let mut locked = self.lock_shards(&hashes);
        match policy {
            CommitPolicy::Peek => {
                // The first pass of a consuming batch, then every state back as it was: the tables
                // themselves are the overlay that lets a repeated key see the first item's effect.
                let mut costs = PerItem::new();
                costs.extend(items.iter().map(|i| i.cost));
                let mut undo = Vec::with_capacity(items.len());
                let decisions = self.run(&mut locked, items, &hashes, &costs, now, Pass::Peek(&mut undo));
                rollback(&mut locked, items, &hashes, undo);
                Ok(decisions)
            }
            CommitPolicy::Refund => match once {
                None => Ok(give_back(&mut locked, items, &hashes, None, now)),
                Some(once) => {
                    let mut spent = self.spent.lock().unwrap_or_else(PoisonError::into_inner);
                    let Some(claimed) = claim(&mut spent, items, once, now, self.side_cap) else {
                        self.refused_full.fetch_add(1, Ordering::Relaxed);
                        return Err(StoreError::Unavailable(
                            "the embedded store holds as many refund markers as it may \
                             (TOLLGATE_MEMORY_MAX_KEYS / 4): refund refused, nothing given back"
                                .into(),
                        ));
                    };
                    let mut decisions = give_back(&mut locked, items, &hashes, Some(&claimed), now);
                    for (decision, mine) in decisions.iter_mut().zip(claimed) {
                        decision.allowed &= mine;
                    }
                    Ok(decisions)
                }
            },
            CommitPolicy::Independent
            | CommitPolicy::AllOrNothing
            | CommitPolicy::StopIncrementWhenOverLimit => {
                Ok(self.consume(&mut locked, items, &hashes, policy, now))
            }
        }
    }

    /// Applies every item; if the policy says some of them must not consume after all, restores the
    /// previous states and applies again with those costs at 0.
    fn consume(
        &self,
        locked: &mut Locked<'_>,
        items: &[BatchItem],
        hashes: &[u64],
        policy: CommitPolicy,
        now: u64,
    ) -> Vec<Decision> {
        let mut costs = PerItem::new();
        costs.extend(items.iter().map(|i| i.cost));
        let may_settle = policy != CommitPolicy::Independent || has_shared_group(items);
        let mut undo = Vec::with_capacity(if may_settle { items.len() } else { 0 });
        let pass = if may_settle {
            Pass::Record(&mut undo)
        } else {
            Pass::Commit
        };
        let first = self.run(locked, items, hashes, &costs, now, pass);
        let Some(settled) = settled_costs(items, &first, policy) else {
            return first;
        };
        rollback(locked, items, hashes, undo);
        let second = self.run(locked, items, hashes, &settled, now, Pass::Commit);
        first
            .iter()
            .zip(second)
            .zip(costs.iter().zip(&settled))
            .map(|((first, second), (cost, settled))| {
                if cost == settled {
                    second
                } else {
                    unconsumed(first, &second)
                }
            })
            .collect()
    }

    /// Applies every item in order with the given costs, recording previous states in `undo`.
    fn run(
        &self,
        locked: &mut Locked<'_>,
        items: &[BatchItem],
        hashes: &[u64],
        costs: &[u64],
        now: u64,
        mut pass: Pass<'_>,
    ) -> Vec<Decision> {
        let mut decisions = Vec::with_capacity(items.len());
        for ((item, hash), cost) in items.iter().zip(hashes).zip(costs) {
            let shard = locked.shard(*hash);
            let (table, batch) = (&mut shard.table, shard.batches);
            // One lookup per item: the entry found (live or expired) is decided and updated in place.
            let found = table.find_mut(*hash, |e| e.is(item));
            let previous = found.as_ref().filter(|e| e.expires_at_us > now).map(|e| &e.state);
            let (decision, next) = algorithm::decide(&item.limit, previous, now, *cost);
            if let Pass::Record(undo) | Pass::Peek(undo) = &mut pass {
                undo.push(previous.cloned());
            }
            if *cost > 0 {
                match found {
                    Some(entry) => {
                        entry.expires_at_us = algorithm::expires_at_us(&item.limit, &next);
                        entry.state = next;
                        entry.batch = batch;
                    }
                    None => {
                        // A peek's writes are undone; it must not evict anyone to make them.
                        let may_evict = !matches!(pass, Pass::Peek(_));
                        self.insert(table, *hash, item, batch, next, may_evict, now);
                    }
                }
            }
            decisions.push(decision);
        }
        decisions
    }

    /// Adds the entry of `item`, which `table` does not hold, evicting one first if the shard is full
    /// and `may_evict`.
    #[allow(clippy::too_many_arguments)] // one call site, each argument a different thing
    fn insert(
        &self,
        table: &mut HashTable<Entry>,
        hash: u64,
        item: &BatchItem,
        batch: u32,
        state: State,
        may_evict: bool,
        now: u64,
    ) {
        if may_evict && table.len() >= self.shard_cap {
            self.evict_one(table, batch, now);
        }
        let entry = Entry {
            key: StoredKey::from_slice(item.key.as_bytes()),
            algorithm: item.limit.algorithm,
            go_format: item.go_format,
            batch,
            window_us: item.limit.window_us,
            expires_at_us: algorithm::expires_at_us(&item.limit, &state),
            state,
        };
        table.insert_unique(hash, entry, |e| self.entry_hash(e));
    }

    /// An entry's hash: its item's ([`MemoryStore::hash`]).
    fn entry_hash(&self, entry: &Entry) -> u64 {
        self.hasher.hash_one((
            entry.key.as_slice(),
            entry.window_us,
            entry.algorithm,
            entry.go_format,
        ))
    }

    /// Removes the entry of `table` that least affects decisions among a sample: an expired one, else
    /// the one whose state stops mattering soonest; never one that `batch` wrote.
    fn evict_one(&self, table: &mut HashTable<Entry>, batch: u32, now: u64) {
        // Buckets are ordered by hash, so the first occupied ones are a fair sample of the keys. An
        // expired entry (expiry <= now) ranks as now, before every live one.
        let victim = table
            .iter()
            .filter(|e| e.batch != batch)
            .take(EVICTION_SAMPLE)
            .min_by_key(|e| e.expires_at_us.max(now))
            .map(|e| (self.entry_hash(e), e as *const Entry));
        let Some((hash, victim)) = victim else {
            return;
        };
        if let Ok(entry) = table.find_entry(hash, |e| std::ptr::eq(e, victim)) {
            entry.remove();
            self.evictions.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl Store for MemoryStore {
    async fn apply(&self, batch: &Batch) -> Result<Vec<Decision>, StoreError> {
        self.apply_now(batch)
    }

    fn name(&self) -> &'static str {
        "embedded"
    }

    fn shares_with_go(&self) -> bool {
        false
    }
}

/// Gives every item's cost back to its key, in order ([`algorithm::refund`]); with `claimed`, only
/// the items claimed get their cost back, the others 0. Only a live entry is updated: a key without
/// state has nothing to give back, and a refund never creates an entry.
fn give_back(
    locked: &mut Locked<'_>,
    items: &[BatchItem],
    hashes: &[u64],
    claimed: Option<&[bool]>,
    now: u64,
) -> Vec<Decision> {
    let mut decisions = Vec::with_capacity(items.len());
    for (at, (item, hash)) in items.iter().zip(hashes).enumerate() {
        let cost = if claimed.is_none_or(|claimed| claimed[at]) {
            item.cost
        } else {
            0
        };
        let table = locked.table(*hash);
        let entry = table
            .find_mut(*hash, |e| e.is(item))
            .filter(|e| e.expires_at_us > now);
        let Some(entry) = entry else {
            decisions.push(algorithm::refund(&item.limit, None, now, cost).0);
            continue;
        };
        let (decision, next) = algorithm::refund(&item.limit, Some(&entry.state), now, cost);
        // A state refunded down to nothing expires at once and is swept like any other.
        entry.expires_at_us = algorithm::expires_at_us(&item.limit, &next);
        entry.state = next;
        decisions.push(decision);
    }
    decisions
}

/// Claims `once` for every group (descriptor) of `items`: whether each item may be refunded, true
/// for the groups whose key had not used this token yet (now recorded as used). `None`, claiming
/// nothing, when the markers it needs would pass `cap` even once the expired ones are dropped.
fn claim(
    spent: &mut HashMap<String, u64>,
    items: &[BatchItem],
    once: &RefundOnce,
    now: u64,
    cap: usize,
) -> Option<Vec<bool>> {
    let groups = items.chunk_by(|a, b| a.group == b.group).count();
    if spent.len() + groups > cap {
        spent.retain(|_, until| *until > now);
        if spent.len() + groups > cap {
            return None;
        }
    }
    let until = now.saturating_add(once.ttl_us);
    let mut claimed = Vec::with_capacity(items.len());
    for (at, item) in items.iter().enumerate() {
        if at > 0 && items[at - 1].group == item.group {
            claimed.push(claimed[at - 1]);
            continue;
        }
        // Per descriptor and place in the request: one descriptor asked twice consumed twice.
        let marker = format!("{}\0{}\0{}", item.key, item.group, once.id);
        let fresh = spent.get(&marker).is_none_or(|used_until| *used_until <= now);
        if fresh {
            spent.insert(marker, until);
        }
        claimed.push(fresh);
    }
    Some(claimed)
}

/// Whether some group has more than one item (only then can `Independent` need a second pass).
fn has_shared_group(items: &[BatchItem]) -> bool {
    items.windows(2).any(|pair| pair[0].group == pair[1].group)
}

/// The costs a batch must finally be applied with, or `None` if the first pass stands: when an item is
/// denied, the allowed items of its group (of the whole batch under `StopIncrementWhenOverLimit`) consume
/// nothing, and under `AllOrNothing` nothing at all does.
fn settled_costs(items: &[BatchItem], decisions: &[Decision], policy: CommitPolicy) -> Option<Vec<u64>> {
    if decisions.iter().all(|d| d.allowed) {
        return None;
    }
    let zero_if_allowed = |i: usize, refund: bool| {
        if refund && decisions[i].allowed {
            0
        } else {
            items[i].cost
        }
    };
    let settled: Vec<u64> = match policy {
        CommitPolicy::AllOrNothing => vec![0; items.len()],
        CommitPolicy::StopIncrementWhenOverLimit => {
            (0..items.len()).map(|i| zero_if_allowed(i, true)).collect()
        }
        CommitPolicy::Independent => {
            // Groups are contiguous: mark each run that holds a denied item.
            let mut refund = vec![false; items.len()];
            let mut start = 0;
            while start < items.len() {
                let end = start
                    + items[start..]
                        .iter()
                        .take_while(|i| i.group == items[start].group)
                        .count();
                let denied = decisions[start..end].iter().any(|d| !d.allowed);
                refund[start..end].fill(denied && end - start > 1);
                start = end;
            }
            (0..items.len()).map(|i| zero_if_allowed(i, refund[i])).collect()
        }
        // A total function of the policy: a peek writes nothing and a refund is never denied.
        CommitPolicy::Peek | CommitPolicy::Refund => return None,
    };
    let unchanged = settled.iter().zip(items).all(|(s, i)| *s == i.cost);
    (!unchanged).then_some(settled)
}

/// Restores the states recorded by [`MemoryStore::run`], newest first, so a key that appears twice in
/// one batch ends at its original state.
fn rollback(locked: &mut Locked<'_>, items: &[BatchItem], hashes: &[u64], undo: Vec<Option<State>>) {
    for ((item, hash), previous) in items.iter().zip(hashes).zip(undo).rev() {
        let table = locked.table(*hash);
        match (table.find_entry(*hash, |e| e.is(item)), previous) {
            (Ok(mut entry), Some(state)) => {
                let entry = entry.get_mut();
                entry.expires_at_us = algorithm::expires_at_us(&item.limit, &state);
                entry.state = state;
            }
            (Ok(entry), None) => {
                entry.remove();
            }
            (Err(_), _) => {}
        }
    }
}

/// The decision reported for an item that was evaluated but not consumed: its verdict stands, the
/// counters are what a zero-cost check sees now.
fn unconsumed(evaluated: &Decision, peek: &Decision) -> Decision {
    Decision {
        remaining: peek.remaining,
        reset_after_us: peek.reset_after_us,
        ..*evaluated
    }
}

/// A poisoned shard only means another thread panicked mid-update of plain counters; the data is still
/// usable, and refusing service for the rest of the process's life would be worse.
fn lock(shard: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    shard.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    //! What every store promises (consuming policies, peeks, refunds, leases) is the store contract,
    //! `tests/it/store_contract.rs`, run on this store too; here only what is this store's own.
    use super::*;
    use crate::algorithm::Limit;
    use crate::clock::ManualClock;

    /// The keys of the rules we ship stay in their entry, the grouped IPv6 network included.
    #[test]
    fn a_grouped_ipv6_key_is_held_inline() {
        let key = StoredKey::from_slice(b"api_remote_address_2001:db8:1234:5678::/64");
        assert!(!key.spilled());
    }

    /// A refund of an expired entry neither revives nor removes it: the entry stays, still expired,
    /// and the sweep drops it.
    #[test]
    fn a_refund_leaves_an_expired_entry_to_the_sweep() {
        for algorithm in Algorithm::ALL {
            let clock = ManualClock::new(1_000_250_000);
            let store = MemoryStore::new(Arc::new(clock.clone()));
            let old = [BatchItem {
                key: "old".to_owned(),
                limit: Limit {
                    algorithm,
                    requests: 5,
                    window_us: 1_000_000,
                    burst: 5,
                },
                cost: 5,
                group: 0,
                go_format: false,
            }];
            store
                .apply_batch(&old, CommitPolicy::Independent, None)
                .expect("decides");
            clock.advance_us(10_000_000);
            store
                .apply_batch(&old, CommitPolicy::Refund, None)
                .expect("decides");
            assert_eq!(store.len(), 1, "{algorithm:?}: the refund removed the entry");
            assert_eq!(store.sweep(), 1, "{algorithm:?}: the refund revived the entry");
            assert!(store.is_empty(), "{algorithm:?}");
        }
    }

    /// The markers that make refund tokens single-use stop at a quarter of the key cap: a refund that
    /// would need another is refused whole (nothing given back), never made without its marker.
    #[test]
    fn refund_markers_stop_at_their_cap() {
        let clock = ManualClock::new(1_000_000_000);
        let store = MemoryStore::with_max_keys(Arc::new(clock.clone()), 4); // one marker
        let key = one("k".into(), 60_000_000);
        store
            .apply_batch(&key, CommitPolicy::Independent, None)
            .expect("consumes");
        let once = |id: &str| RefundOnce {
            id: id.to_owned(),
            ttl_us: 1_000_000,
        };
        let refund = |id| store.apply_batch(&key, CommitPolicy::Refund, Some(&once(id)));
        assert!(refund("a").expect("the first marker fits")[0].allowed);
        assert!(
            matches!(refund("b"), Err(StoreError::Unavailable(_))),
            "no room for a second"
        );
        assert_eq!(store.refused_full(), 1);
        clock.advance_us(1_000_001);
        assert!(refund("b").is_ok(), "the first marker expired: room again");
    }

    /// One hit each for `callers` distinct keys of an hour.
    fn fill(store: &MemoryStore, callers: usize) {
        for i in 0..callers {
            store
                .apply_batch(
                    &one(format!("caller-{i}"), 3_600_000_000),
                    CommitPolicy::Independent,
                    None,
                )
                .expect("decides");
        }
    }

    fn one(key: String, window_us: u64) -> [BatchItem; 1] {
        [BatchItem {
            key,
            limit: Limit {
                algorithm: Algorithm::TokenBucket,
                requests: 5,
                window_us,
                burst: 5,
            },
            cost: 1,
            group: 0,
            go_format: false,
        }]
    }

    /// A flood of distinct keys never takes the store past its cap: consuming batches evict, and
    /// every eviction is counted.
    #[test]
    fn a_flood_of_keys_stays_within_the_cap() {
        let clock = ManualClock::new(1_000_000_000);
        let store = MemoryStore::with_max_keys(Arc::new(clock), 640);
        fill(&store, 20_000);
        assert!(store.len() <= 640, "{} entries", store.len());
        assert_eq!(store.evictions(), 20_000 - store.len() as u64);
    }

    /// Expired entries go before live ones: with every shard full of expired state, new keys evict
    /// only expired entries, and a live key inserted meanwhile keeps its count.
    #[test]
    fn expired_state_is_evicted_before_live_state() {
        let clock = ManualClock::new(1_000_000_000);
        let store = MemoryStore::with_max_keys(Arc::new(clock.clone()), 64 * 16);
        for i in 0..5_000 {
            store
                .apply_batch(
                    &one(format!("short-{i}"), 1_000_000),
                    CommitPolicy::Independent,
                    None,
                )
                .expect("decides");
        }
        clock.advance_us(10_000_000); // every short-lived state has expired
        let live = one("live".to_owned(), 3_600_000_000);
        store
            .apply_batch(&live, CommitPolicy::Independent, None)
            .expect("decides");
        // About 3 new keys a shard: each shard still holds expired entries to evict first.
        for i in 0..200 {
            store
                .apply_batch(
                    &one(format!("new-{i}"), 3_600_000_000),
                    CommitPolicy::Independent,
                    None,
                )
                .expect("decides");
        }
        let check = [BatchItem {
            cost: 0,
            ..live[0].clone()
        }];
        let left = store
            .apply_batch(&check, CommitPolicy::Independent, None)
            .expect("decides")[0]
            .remaining;
        assert_eq!(left, 4, "the live key kept its state");
    }

    /// A batch never evicts what it wrote itself: in a full shard, the second key of a batch does not
    /// push out the first, so the first key asked again in the same batch still sees its count.
    #[test]
    fn a_batch_keeps_what_it_wrote() {
        let clock = ManualClock::new(1_000_000_000);
        let store = MemoryStore::with_max_keys(Arc::new(clock), 64); // one entry a shard
        let item = |key: &str, group| BatchItem {
            key: key.to_owned(),
            limit: Limit {
                algorithm: Algorithm::FixedWindow,
                requests: 1,
                window_us: 3_600_000_000,
                burst: 1,
            },
            cost: 1,
            group,
            go_format: false,
        };
        let shard = |key: &str| shard_of(store.hash(&item(key, 0)), SHARDS);
        let other = (0..)
            .map(|i| format!("b{i}"))
            .find(|b| shard(b) == shard("a"))
            .expect("a key in the same shard");
        let batch = [item("a", 0), item(&other, 1), item("a", 2)];
        let allowed: Vec<bool> = store
            .apply_batch(&batch, CommitPolicy::Independent, None)
            .expect("decides")
            .iter()
            .map(|d| d.allowed)
            .collect();
        assert_eq!(
            allowed,
            [true, true, false],
            "the limit of 1 held within the batch"
        );
        assert_eq!(store.evictions(), 0);
    }

    /// A peek never evicts: it must not change the store, even when full.
    #[test]
    fn peeks_never_evict() {
        let clock = ManualClock::new(1_000_000_000);
        let store = MemoryStore::with_max_keys(Arc::new(clock), 64);
        fill(&store, 1_000);
        let (entries, evictions) = (store.len(), store.evictions());
        for i in 0..1_000 {
            store
                .apply_batch(&one(format!("peek-{i}"), 3_600_000_000), CommitPolicy::Peek, None)
                .expect("decides");
        }
        assert_eq!((store.len(), store.evictions()), (entries, evictions));
    }
}
