//! Hot keys admitted from quota reserved in Redis (`TOLLGATE_HOT_KEY_RATE`), exact at the edge.
//!
//! A limit with no per-client part puts the whole fleet's requests on one Redis key: one Redis thread
//! does all its work and every decision waits for a round trip. [`HotKeys`] sits in front of the Redis
//! store; when one key's decisions on this replica pass the configured rate, the next decision on it
//! is a *reservation* ([`Reserve`]): the same atomic script call also takes a slice of the key's
//! remaining budget, which this replica then admits from locally, without a round trip, until the
//! slice is spent, its lease ends or (window algorithms) its window ends. Then it reserves again.
//! Below the rate nothing changes: one store call per decision.
//!
//! **Slices.** A replica asks for what it will use in a tenth of the lease at its current rate. Redis
//! grants at most what the key admits divided by twice the replicas reserving it (the script counts
//! them in a hash beside the key), so as the budget runs out the slices shrink to nothing and the last
//! decisions of a window are made in Redis one by one, as without reservations. Requests on the key
//! that arrive while its reservation is in flight wait for it instead of calling Redis themselves.
//!
//! **The guarantee.** A replica admits only units Redis granted it, and a grant is consumed from the
//! key in the same atomic step that decides it, so the key never admits more than its limit counts:
//! - fixed window and sliding window: a slice is spent only within the window that granted it (its end
//!   measured from before the call was sent, on the monotonic clock, which no step of the wall clock
//!   moves), so every unit is counted in the window it is admitted in;
//! - token bucket and GCRA: units are taken from the bucket when granted and admitted within the
//!   lease, so over any interval of length T the key admits at most what it admits in T plus the lease;
//! - unspent units go back when a slice's lease ends (the same script call, capped at the replica's
//!   last grant and, for windows, only in the window that granted them); a replica that dies or is cut
//!   off takes its unspent units with it: they lapse with their window, or the bucket refills them.
//!
//! Only independent batches of domains without `all_or_nothing` reserve, and only descriptors with a
//! single limit (a descriptor's limits pass or fail together, which one slice cannot express); a
//! sliding log never does, since it logs each admission's own instant. Everything else is decided in
//! Redis as before. While Redis is away, a slice still valid is admitted from until it ends; then the
//! rules' failure modes answer, as for any other key.
//!
//! **Answers.** A decision admitted from a slice reports as `remaining` the units the slice still holds
//! (a lower bound of what the key admits), and its reset as of the reservation. So `limit_remaining` is
//! not envoyproxy/ratelimit's while a key is hot, which is why this is off unless configured.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use hashbrown::{DefaultHashBuilder, HashTable};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::lease::{AcquireRequest, LeaseSlot, LeaseStore, ReleaseRequest, Released};
use super::{Batch, BatchItem, CommitPolicy, Store, StoreError};
use crate::algorithm::{Algorithm, Decision, Limit};
use crate::clock::Clock;

/// When hot keys reserve, and for how long a slice holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HotKeyOptions {
    /// Decisions per second on one key, on this replica, from which it reserves (0: never).
    pub rate: u64,
    /// How long a slice may be admitted from before its unspent units go back.
    pub lease: Duration,
}

impl Default for HotKeyOptions {
    fn default() -> Self {
        Self {
            rate: 0,
            lease: DEFAULT_LEASE,
        }
    }
}

/// The default lease (`TOLLGATE_HOT_KEY_LEASE`).
pub const DEFAULT_LEASE: Duration = Duration::from_secs(1);

/// Most keys holding a slice at once; past it, new hot keys are decided in Redis (counted).
pub const MAX_KEYS: usize = 4096;

/// Independently locked parts of the slice table.
const SHARDS: usize = 16;

/// Rate-counting cells; keys share a cell when their hashes do (a shared cell only overstates a rate,
/// which costs a reservation, never exactness).
const RATE_CELLS: usize = 4096;

/// The rate is counted per tick of this many µs (the busier of the last two ticks).
const TICK_US: u64 = 100_000;

/// The most decisions a cell counts per tick (20 bits).
const TICK_MAX: u64 = (1 << 20) - 1;

/// A store that can decide an item while granting a slice of its key (Redis).
pub trait Reserve: Store + Clone + 'static {
    /// Decides `request.item` (its cost is the request in hand) after giving back `give_back` units,
    /// and grants up to `want` more for this replica to admit from locally.
    fn reserve(
        &self,
        request: ReserveRequest<'_>,
    ) -> impl Future<Output = Result<Reserved, StoreError>> + Send;
}

/// One reservation call.
#[derive(Debug, Clone, Copy)]
pub struct ReserveRequest<'a> {
    /// The item: a single-limit descriptor; cost 0 only gives back.
    pub item: &'a BatchItem,
    /// Extra units wanted beyond the item's cost.
    pub want: u64,
    /// Units of this replica's last grant it did not admit, given back first.
    pub give_back: u64,
    /// This replica's id.
    pub replica: &'a str,
    /// How long the grant may be admitted from, in µs.
    pub lease_us: u64,
}

/// What a reservation call answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reserved {
    /// The decision for the item's own cost.
    pub decision: Decision,
    /// Extra units granted (0 when denied).
    pub extra: u64,
    /// How long from before the call the grant may be admitted from, as far as the algorithm goes
    /// (the end of the window that granted it; `u64::MAX` for the buckets).
    pub valid_for_us: u64,
}

/// The units this replica holds for one (key, limit).
#[derive(Debug)]
struct Slice {
    key: String,
    limit: Limit,
    /// Told apart from a key of Tollgate's own with the same text ([`BatchItem::go_format`]).
    go_format: bool,
    units: u64,
    /// Until when `units` may be admitted, on this replica's monotonic clock ([`Clock::monotonic_us`]):
    /// a slice is timed there, so that a step of the wall clock (an NTP step back) cannot stretch it
    /// past the window or the lease that granted it.
    valid_until_us: u64,
    /// When the key's usage drains, as of the reservation (reported as the reset), on the same clock.
    reset_at_us: u64,
    /// A reservation for this key is in flight: a request on the key alone waits for it (told here when
    /// it lands), others decide in Redis meanwhile.
    busy: Option<Arc<Notify>>,
}

/// What hot-key reservation has done so far, for `/metrics`.
#[derive(Debug, Default)]
pub struct HotKeyCounts {
    /// Reservation calls made (including give-backs).
    pub reservations: AtomicU64,
    /// Units granted beyond the requests that asked.
    pub units_granted: AtomicU64,
    /// Unspent units offered back (Redis takes at most what the replica holds in the window).
    pub units_returned: AtomicU64,
    /// Decisions answered from a slice, without a store call.
    pub local_decisions: AtomicU64,
    /// Hot keys decided in Redis because [`MAX_KEYS`] keys held slices.
    pub table_full: AtomicU64,
}

/// A store whose hot keys are admitted from reserved slices.
#[derive(Debug)]
pub struct HotKeys<S> {
    inner: S,
    options: HotKeyOptions,
    replica: String,
    clock: Arc<dyn Clock>,
    hasher: DefaultHashBuilder,
    rates: Box<[AtomicU64]>,
    slices: Box<[Mutex<HashTable<Slice>>]>,
    counts: HotKeyCounts,
}

/// What happens to one item of a batch.
enum Plan<'a, S: Reserve> {
    /// Decided by the inner store with the rest of the batch.
    Send,
    /// Admitted from the slice.
    Local(Decision),
    /// Decided by a reservation call that gives back `give_back` and asks for `want` more.
    Reserve {
        want: u64,
        give_back: u64,
        pending: Pending<'a, S>,
    },
    /// Its reservation call has been started.
    Reserved,
    /// A reservation for the key is in flight; this tells when it lands.
    Wait(Arc<Notify>),
}

/// A reservation in flight for one key: until it lands, requests on the key wait for it or go to
/// Redis. Dropped before it landed (its request was cancelled), it clears the way and drops the slice:
/// what the call gave back and what it may yet be granted are unknown, so neither is admitted (units
/// lost to this replica, never admitted twice).
struct Pending<'a, S: Reserve> {
    hot: &'a HotKeys<S>,
    item: &'a BatchItem,
    /// The item's hash in the slice table.
    hash: u64,
    landed: bool,
}

impl<S: Reserve> Drop for Pending<'_, S> {
    fn drop(&mut self) {
        if !self.landed {
            self.hot.land(self.item, self.hash, None, 0);
        }
    }
}

impl<S: Reserve> HotKeys<S> {
    /// Wraps `inner`. With a rate, starts the task that gives back slices whose lease ended (until
    /// `stop`), so a replica that goes quiet does not keep units from the others.
    pub fn start(
        inner: S,
        options: HotKeyOptions,
        clock: Arc<dyn Clock>,
        stop: CancellationToken,
    ) -> Arc<Self> {
        let hot = Arc::new(Self {
            inner,
            options,
            replica: replica_id(),
            clock,
            hasher: DefaultHashBuilder::default(),
            rates: (0..RATE_CELLS).map(|_| AtomicU64::new(0)).collect(),
            slices: (0..SHARDS).map(|_| Mutex::new(HashTable::new())).collect(),
            counts: HotKeyCounts::default(),
        });
        if options.rate > 0 {
            let every = (options.lease / 4).max(Duration::from_millis(10));
            tokio::spawn(sweep(Arc::downgrade(&hot), every, stop));
        }
        hot
    }

    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// What reservation has done so far.
    pub fn counts(&self) -> &HotKeyCounts {
        &self.counts
    }

    /// Keys holding a slice now.
    pub fn keys(&self) -> u64 {
        self.slices.iter().map(|shard| lock(shard).len() as u64).sum()
    }

    /// Units held in slices now, not yet admitted.
    pub fn held_units(&self) -> u64 {
        self.slices
            .iter()
            .map(|shard| lock(shard).iter().map(|slice| slice.units).sum::<u64>())
            .sum()
    }

    /// This replica's decisions per second on the cell of `hash`, counting this one.
    fn rate(&self, hash: u64, now_us: u64) -> u64 {
        let cell = &self.rates[hash as usize % RATE_CELLS];
        let tick = (now_us / TICK_US) & 0xFF_FFFF;
        let old = cell.load(Ordering::Relaxed);
        let (at, previous, current) = (old >> 40, (old >> 20) & TICK_MAX, old & TICK_MAX);
        let (previous, current) = if at == tick {
            (previous, (current + 1).min(TICK_MAX))
        } else if at == (tick.wrapping_sub(1) & 0xFF_FFFF) {
            (current, 1)
        } else {
            (0, 1)
        };
        // A lost race loses one count: rates are estimates.
        let _ = cell.compare_exchange(
            old,
            tick << 40 | previous << 20 | current,
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
        previous.max(current) * (1_000_000 / TICK_US)
    }

    /// The hash of a (key, limit) in the slice table and among the rate cells.
    fn hash(&self, key: &str, limit: &Limit, go_format: bool) -> u64 {
        self.hasher.hash_one((key, limit, go_format))
    }

    fn shard(&self, hash: u64) -> MutexGuard<'_, HashTable<Slice>> {
        lock(&self.slices[super::shard_of(hash, SHARDS)])
    }

    /// The item's hash in the slice table and its rate on this replica, counting this decision; `None`
    /// for an item that never reserves (a peek, a sliding log).
    fn measure(&self, item: &BatchItem, now_us: u64) -> Option<(u64, u64)> {
        if item.cost == 0 || item.limit.algorithm == Algorithm::SlidingLog {
            return None;
        }
        let hash = self.hash(&item.key, &item.limit, item.go_format);
        Some((hash, self.rate(hash, now_us)))
    }

    /// What to do with `item`, a descriptor's only limit, at `now_us`.
    fn plan<'a>(&'a self, item: &'a BatchItem, now_us: u64) -> Plan<'a, S> {
        match self.measure(item, now_us) {
            Some((hash, rate)) => self.plan_measured(item, hash, rate, now_us),
            None => Plan::Send,
        }
    }

    /// [`HotKeys::plan`] for an item measured already.
    fn plan_measured<'a>(&'a self, item: &'a BatchItem, hash: u64, rate: u64, now_us: u64) -> Plan<'a, S> {
        // A key cooling down still spends the slice it holds.
        if rate.saturating_mul(2) < self.options.rate {
            return Plan::Send;
        }
        let mut shard = self.shard(hash);
        let found = shard.find_mut(hash, same_key(item));
        let slice = match found {
            Some(Slice {
                busy: Some(landed), ..
            }) => return Plan::Wait(Arc::clone(landed)),
            Some(slice) if slice.valid_until_us > now_us && slice.units >= item.cost => {
                slice.units -= item.cost;
                self.counts.local_decisions.fetch_add(1, Ordering::Relaxed);
                let reset = slice.reset_at_us.saturating_sub(now_us);
                return Plan::Local(Decision {
                    from_slice: true,
                    ..Decision::allow(slice.units, reset)
                });
            }
            Some(slice) => slice,
            None if rate < self.options.rate => return Plan::Send,
            None => {
                if shard.len() >= MAX_KEYS / SHARDS {
                    self.counts.table_full.fetch_add(1, Ordering::Relaxed);
                    return Plan::Send;
                }
                let slice = Slice {
                    key: item.key.clone(),
                    limit: item.limit,
                    go_format: item.go_format,
                    units: 0,
                    valid_until_us: 0,
                    reset_at_us: 0,
                    busy: None,
                };
                shard
                    .insert_unique(hash, slice, |s| self.hash(&s.key, &s.limit, s.go_format))
                    .into_mut()
            }
        };
        slice.busy = Some(Arc::new(Notify::new()));
        // What a tenth of the lease brings at this rate.
        let lease_tenths = u128::from(self.lease_us() / 10);
        let want = u64::try_from(u128::from(rate) * lease_tenths / 1_000_000).unwrap_or(u64::MAX);
        Plan::Reserve {
            want,
            give_back: std::mem::take(&mut slice.units),
            pending: Pending {
                hot: self,
                item,
                hash,
                landed: false,
            },
        }
    }

    fn lease_us(&self) -> u64 {
        u64::try_from(self.options.lease.as_micros()).unwrap_or(u64::MAX)
    }

    /// Runs one reservation and files its grant; `sent_us` is the monotonic time before the call (a
    /// window's end is measured from there, so the slice never outlives it).
    async fn reserve(
        &self,
        mut pending: Pending<'_, S>,
        want: u64,
        give_back: u64,
        sent_us: u64,
    ) -> Result<Decision, StoreError> {
        let result = self.call(pending.item, want, give_back).await;
        pending.landed = true;
        self.land(pending.item, pending.hash, result.as_ref().ok(), sent_us);
        let reserved = result?;
        Ok(Decision {
            // What the key admits now is at least what Redis left plus this replica's slice.
            remaining: reserved.decision.remaining.saturating_add(reserved.extra),
            ..reserved.decision
        })
    }

    /// One reservation call (a give-back alone when `item` costs nothing and `want` is 0), counted.
    async fn call(&self, item: &BatchItem, want: u64, give_back: u64) -> Result<Reserved, StoreError> {
        self.counts.reservations.fetch_add(1, Ordering::Relaxed);
        self.counts.units_returned.fetch_add(give_back, Ordering::Relaxed);
        let request = ReserveRequest {
            item,
            want,
            give_back,
            replica: &self.replica,
            lease_us: self.lease_us(),
        };
        self.inner.reserve(request).await
    }

    /// Files what a reservation for `item` (at `hash`) brought (`None`: failed or cancelled) and wakes
    /// the requests waiting for it. A slice granted nothing is dropped.
    fn land(&self, item: &BatchItem, hash: u64, reserved: Option<&Reserved>, sent_us: u64) {
        let mut shard = self.shard(hash);
        let Ok(mut slice) = shard.find_entry(hash, same_key(item)) else {
            return;
        };
        if let Some(waiting) = slice.get_mut().busy.take() {
            waiting.notify_waiters();
        }
        let Some(reserved) = reserved.filter(|r| r.extra > 0) else {
            slice.remove();
            return;
        };
        self.counts
            .units_granted
            .fetch_add(reserved.extra, Ordering::Relaxed);
        let slice = slice.get_mut();
        slice.units = reserved.extra;
        slice.valid_until_us = sent_us.saturating_add(reserved.valid_for_us.min(self.lease_us()));
        slice.reset_at_us = sent_us.saturating_add(reserved.decision.reset_after_us);
    }

    /// The plan for a request on one key alone. While a reservation for the key is in flight, waits
    /// for it (at most a lease) rather than adding a Redis call: on a hot key that is one round trip
    /// anyway, and the new slice usually answers. Waits once; a second in-flight reservation sends.
    async fn plan_alone<'a>(&'a self, item: &'a BatchItem, now_us: u64) -> Plan<'a, S> {
        let Some((hash, rate)) = self.measure(item, now_us) else {
            return Plan::Send;
        };
        let notify = match self.plan_measured(item, hash, rate, now_us) {
            Plan::Wait(notify) => notify,
            other => return other,
        };
        let landed = notify.notified();
        tokio::pin!(landed);
        // Registered before looking again, so a reservation landing in between is not missed.
        landed.as_mut().enable();
        let busy = self
            .shard(hash)
            .find(hash, same_key(item))
            .is_some_and(|slice| slice.busy.is_some());
        if busy {
            let _ = tokio::time::timeout(self.options.lease, landed).await;
        }
        // The same decision, counted once in the rate.
        match self.plan_measured(item, hash, rate, self.clock.monotonic_us()) {
            Plan::Wait(_) => Plan::Send,
            other => other,
        }
    }

    /// Gives back the unspent units of every slice whose lease has ended and drops it. A slice being
    /// given back stays in the table, busy, until its call lands, as for any reservation: a request on
    /// its key meanwhile waits for it or is decided in Redis. Had it reserved beside the give-back, its
    /// call could reach Redis first and clear the grant record the give-back is capped by, and the
    /// units would be lost to the key.
    async fn give_back_ended(&self) {
        let now = self.clock.monotonic_us();
        // Each ended slice's key, as a costless item, its hash and its unspent units.
        let mut ended = Vec::new();
        for shard in &self.slices {
            let mut shard = lock(shard);
            shard.retain(|slice| {
                if slice.busy.is_some() || slice.valid_until_us > now {
                    return true;
                }
                if slice.units == 0 {
                    return false;
                }
                slice.busy = Some(Arc::new(Notify::new()));
                let item = BatchItem {
                    key: slice.key.clone(),
                    limit: slice.limit,
                    cost: 0,
                    group: 0,
                    go_format: slice.go_format,
                };
                let hash = self.hash(&slice.key, &slice.limit, slice.go_format);
                ended.push((item, hash, std::mem::take(&mut slice.units)));
                true
            });
        }
        for (item, hash, give_back) in &ended {
            let pending = Pending {
                hot: self,
                item,
                hash: *hash,
                landed: false,
            };
            // Granted nothing (it asks for nothing), the slice is dropped as it lands.
            if let Err(error) = self.reserve(pending, 0, *give_back, now).await {
                tracing::debug!(%error, "unspent hot-key units could not be given back; they lapse");
            }
        }
    }
}

/// Gives back ended slices every `every` until `stop`, or until the store is dropped.
async fn sweep<S: Reserve>(hot: Weak<HotKeys<S>>, every: Duration, stop: CancellationToken) {
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = ticks.tick() => {}
        }
        let Some(hot) = hot.upgrade() else { return };
        hot.give_back_ended().await;
    }
}

/// Finds `item`'s slice in the table.
fn same_key(item: &BatchItem) -> impl Fn(&Slice) -> bool + '_ {
    move |slice| slice.limit == item.limit && slice.go_format == item.go_format && slice.key == item.key
}

fn lock(shard: &Mutex<HashTable<Slice>>) -> MutexGuard<'_, HashTable<Slice>> {
    // A poisoned shard holds plain data; keep serving rather than failing every request.
    shard.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A random id for this replica's fields in the reservers hashes. Two replicas must never share one
/// (each could give back the other's units), so without an OS random source the process id and the
/// start time stand in.
fn replica_id() -> String {
    let mut bytes = [0u8; 12];
    if getrandom::fill(&mut bytes).is_err() {
        let started = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let seed = format!("{}:{}", std::process::id(), started.as_nanos());
        bytes.copy_from_slice(&blake3::hash(seed.as_bytes()).as_bytes()[..12]);
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Whether the item at `at` is its descriptor's only limit (groups are contiguous).
fn alone(items: &[BatchItem], at: usize) -> bool {
    let group = items[at].group;
    !(at > 0 && items[at - 1].group == group) && items.get(at + 1).is_none_or(|next| next.group != group)
}

impl<S: Reserve> Store for Arc<HotKeys<S>> {
    // Hot keys are held only in front of Redis.
    fn name(&self) -> &'static str {
        "redis"
    }

    async fn apply(&self, batch: &Batch) -> Result<Vec<Decision>, StoreError> {
        if self.options.rate == 0 || batch.policy != CommitPolicy::Independent || batch.keep_together {
            return self.inner.apply(batch).await;
        }
        let now = self.clock.monotonic_us();
        let items = &batch.items;
        let mut plans: Vec<Plan<'_, S>> = if items.len() == 1 {
            // The common request, one descriptor: a cold key goes on with nothing allocated here.
            match self.plan_alone(&items[0], now).await {
                Plan::Send | Plan::Wait(_) => return self.inner.apply(batch).await,
                Plan::Local(decision) => return Ok(vec![decision]),
                plan => vec![plan],
            }
        } else {
            (0..items.len())
                .map(|at| match alone(items, at).then(|| self.plan(&items[at], now)) {
                    Some(Plan::Wait(_)) | None => Plan::Send,
                    Some(plan) => plan,
                })
                .collect()
        };
        let sends = |plan: &Plan<'_, S>| matches!(plan, Plan::Send | Plan::Wait(_));
        if plans.iter().all(sends) {
            return self.inner.apply(batch).await;
        }
        let sent: Vec<BatchItem> = items
            .iter()
            .zip(&plans)
            .filter(|(_, plan)| sends(plan))
            .map(|(item, _)| item.clone())
            .collect();
        let rest = async {
            if sent.is_empty() {
                return Ok(Vec::new());
            }
            let part = Batch {
                items: sent,
                policy: batch.policy,
                scope_len: batch.scope_len,
                keep_together: false,
                once: None,
            };
            self.inner.apply(&part).await
        };
        let mut calls = Vec::new();
        for plan in &mut plans {
            match std::mem::replace(plan, Plan::Reserved) {
                Plan::Reserve {
                    want,
                    give_back,
                    pending,
                } => calls.push(self.reserve(pending, want, give_back, now)),
                other => *plan = other,
            }
        }
        let reservations = futures_util::future::join_all(calls);
        let (rest, reservations) = futures_util::future::join(rest, reservations).await;
        let failed = rest
            .as_ref()
            .err()
            .or_else(|| reservations.iter().find_map(|r| r.as_ref().err()));
        if let Some(error) = failed.cloned() {
            // Units taken from slices for this request stay spent: putting them back could hand a
            // window's units to the next window's slice.
            return Err(error);
        }
        let mut rest = rest.unwrap_or_default().into_iter();
        let mut reservations = reservations.into_iter().flatten();
        Ok(plans
            .iter()
            .map(|plan| match plan {
                Plan::Send | Plan::Wait(_) => rest.next().unwrap_or_default(),
                Plan::Local(decision) => *decision,
                Plan::Reserve { .. } | Plan::Reserved => reservations.next().unwrap_or_default(),
            })
            .collect())
    }

    fn shares_with_go(&self) -> bool {
        self.inner.shares_with_go()
    }
}

impl<S: Reserve + LeaseStore> LeaseStore for Arc<HotKeys<S>> {
    async fn acquire(&self, request: &AcquireRequest) -> Result<Vec<LeaseSlot>, StoreError> {
        self.inner.acquire(request).await
    }

    async fn release(&self, request: &ReleaseRequest) -> Result<Vec<Released>, StoreError> {
        self.inner.release(request).await
    }
}
