//! The store contract, written once: what every [`Store`] and its [`LeaseStore`] promise, as async
//! bodies over a [`Backend`], each run on the embedded store, the local over-limit cache in front of
//! it, a single Redis and a Redis Cluster ([`contract_tests!`] at the end makes one test per body and
//! backend: `store_contract::<backend>::<body>`). Behaviour that only one backend has (Redis key
//! names and TTLs, cached denials, the embedded store's sweep) stays in that backend's own tests.
//!
//! Time: the embedded store reads a [`ManualClock`], moved exactly; Redis reads its own clock, so
//! there letting time pass means sleeping. Bodies that need no time use day-long windows and minute-long
//! leases, so that the real clock changes nothing while they run; the three that wait use 1 s windows
//! or sub-second leases ([`Backend::tick_us`], [`Backend::short_ttl_us`]), about 3 s of sleep on Redis. Verdicts and counts are compared exactly;
//! durations read by different calls may differ by the time the test has run on a real clock
//! ([`Backend::drift_us`], 0 on the manual one, so there they are compared exactly too).
//!
//! Keys: every key starts with the backend's scope ([`Backend::scope`], `CACHE_KEY_PREFIX + domain`),
//! which [`apply`], [`acquire`] and [`release`] put in front of the names the bodies use.
//!
//! Redis Cluster: a batch is one script call per hash slot, so a policy that settles across
//! descriptors is atomic only when the domain keeps its keys together ([`Batch::keep_together`]);
//! the bodies for `AllOrNothing` and `StopIncrementWhenOverLimit` set it, and every other batch
//! needs no more than the limits of one descriptor in one slot, which their shared hash tag gives.
//! Lease calls place their keys in the scope's slot. Starting a cluster takes seconds, so the
//! cluster tests running at the same time share one ([`shared_cluster`]), each in a scope of its own.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use tollgate_core::algorithm::{Algorithm, Decision, Limit};
use tollgate_core::clock::{Clock, ManualClock};
use tollgate_core::store::lease::{
    AcquireRequest, LeaseItem, LeaseSlot, LeaseStore, ReleaseRequest, Released,
};
use tollgate_core::store::local_cache::LocalCache;
use tollgate_core::store::memory::MemoryStore;
use tollgate_core::store::redis::RedisStore;
use tollgate_core::store::{Batch, BatchItem, CommitPolicy, RefundOnce, Store};

use crate::common::T0_US;
use crate::common::redis::{RedisCluster, RedisServer, cli, connected_store};

/// A store under contract, with the means to let its time pass and to count what it holds.
pub trait Backend {
    type Store: Store;

    fn store(&self) -> &Self::Store;

    /// What every key starts with (`CACHE_KEY_PREFIX + domain`).
    fn scope(&self) -> &str;

    /// Lets `us` µs of the store's time pass (exactly on a manual clock, at least that on a real one).
    async fn advance(&self, us: u64);

    /// How far the store's clock may have moved by itself since the backend was made: 0 on a manual
    /// clock. Durations read by different calls are compared within it.
    fn drift_us(&self) -> u64;

    /// The shortest wait that surely orders two events on this clock, a call's latency included.
    fn tick_us(&self) -> u64;

    /// A lease TTL short enough to wait out, more than two ticks.
    fn short_ttl_us(&self) -> u64;

    /// Drops what has expired, as the store's own housekeeping does (Redis needs none: an expired
    /// key is gone for every command).
    async fn sweep(&self);

    /// Counter entries the store holds (bodies that count entries take no leases). Redis holds no
    /// expired key; the embedded store holds its expired entries until a sweep.
    async fn entries(&self) -> usize;

    /// Whether batches are split per Redis Cluster slot: then a batch that settles across
    /// descriptors must keep its keys together (the limiter sees to it), or it is refused.
    fn splits_by_slot(&self) -> bool {
        false
    }
}

/// The embedded store, alone or behind the local cache, on a manual clock.
pub struct Embedded<S> {
    store: S,
    memory: fn(&S) -> &MemoryStore,
    clock: ManualClock,
}

impl Embedded<MemoryStore> {
    pub fn memory() -> Self {
        let clock = start_clock();
        Self {
            store: MemoryStore::new(Arc::new(clock.clone())),
            memory: |store| store,
            clock,
        }
    }
}

impl Embedded<LocalCache<MemoryStore>> {
    pub fn local_cache() -> Self {
        let clock = start_clock();
        let shared: Arc<dyn Clock> = Arc::new(clock.clone());
        Self {
            store: LocalCache::new(MemoryStore::new(Arc::clone(&shared)), 1 << 20, shared),
            memory: LocalCache::inner,
            clock,
        }
    }
}

/// A quarter second into an exact hour: fixed windows do not start at the first call.
fn start_clock() -> ManualClock {
    ManualClock::new(T0_US + 250_000)
}

impl<S: Store> Backend for Embedded<S> {
    type Store = S;

    fn store(&self) -> &S {
        &self.store
    }

    fn scope(&self) -> &str {
        "pre:dom"
    }

    async fn advance(&self, us: u64) {
        self.clock.advance_us(us);
    }

    fn drift_us(&self) -> u64 {
        0
    }

    fn tick_us(&self) -> u64 {
        1
    }

    fn short_ttl_us(&self) -> u64 {
        10
    }

    async fn sweep(&self) {
        (self.memory)(&self.store).sweep();
    }

    async fn entries(&self) -> usize {
        (self.memory)(&self.store).len()
    }
}

/// A [`RedisStore`] on a `redis-server` of its own, or on a cluster of three masters shared with the
/// other cluster tests running at the same time; on the Redis clock.
pub struct Redis {
    store: Arc<RedisStore>,
    stop: CancellationToken,
    scope: String,
    ports: Vec<u16>,
    started: Instant,
    _single: Option<RedisServer>,
    _cluster: Option<Arc<RedisCluster>>,
}

impl Redis {
    pub async fn single() -> Self {
        let server = RedisServer::start();
        let (store, stop) = connected_store(&server.url(), "single").await;
        Self {
            store,
            stop,
            scope: "pre:dom".to_owned(),
            ports: vec![server.port],
            started: Instant::now(),
            _single: Some(server),
            _cluster: None,
        }
    }

    pub async fn cluster() -> Self {
        static SCOPES: AtomicUsize = AtomicUsize::new(0);
        let cluster = shared_cluster();
        let (store, stop) = connected_store(&cluster.addrs(), "cluster").await;
        Self {
            store,
            stop,
            scope: format!("c{}:dom", SCOPES.fetch_add(1, Ordering::Relaxed)),
            ports: cluster.nodes.iter().map(|node| node.port).collect(),
            started: Instant::now(),
            _single: None,
            _cluster: Some(cluster),
        }
    }
}

/// The cluster the running cluster tests share: started by the first, stopped when the last one
/// using it ends (a later test then starts another), so no `redis-server` outlives the tests.
fn shared_cluster() -> Arc<RedisCluster> {
    static SHARED: Mutex<Weak<RedisCluster>> = Mutex::new(Weak::new());
    let mut shared = SHARED.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(cluster) = shared.upgrade() {
        return cluster;
    }
    let cluster = Arc::new(RedisCluster::start());
    *shared = Arc::downgrade(&cluster);
    cluster
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Backend for Redis {
    type Store = Arc<RedisStore>;

    fn splits_by_slot(&self) -> bool {
        self.store.is_cluster()
    }

    fn store(&self) -> &Arc<RedisStore> {
        &self.store
    }

    fn scope(&self) -> &str {
        &self.scope
    }

    async fn advance(&self, us: u64) {
        tokio::time::sleep(Duration::from_micros(us)).await;
    }

    fn drift_us(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    fn tick_us(&self) -> u64 {
        150_000
    }

    fn short_ttl_us(&self) -> u64 {
        400_000
    }

    async fn sweep(&self) {}

    /// The keys of this scope on every node. `KEYS` skips keys whose TTL has passed even before
    /// Redis deletes them.
    async fn entries(&self) -> usize {
        let pattern = format!("*{}_*", self.scope);
        self.ports
            .iter()
            .map(|port| {
                let keys = cli(*port, &["KEYS", &pattern]);
                keys.lines().filter(|k| !k.is_empty()).count()
            })
            .sum()
    }
}

// ---------------------------------------------------------------------------------------------
// Building batches and reading answers.

const SECOND_US: u64 = 1_000_000;
const DAY_US: u64 = 86_400 * SECOND_US;

const INDEPENDENT: CommitPolicy = CommitPolicy::Independent;
const PEEK: CommitPolicy = CommitPolicy::Peek;
const REFUND: CommitPolicy = CommitPolicy::Refund;

/// `requests` per `window_us` (and as much burst).
fn limit(algorithm: Algorithm, requests: u64, window_us: u64) -> Limit {
    Limit {
        algorithm,
        requests,
        window_us,
        burst: requests,
    }
}

/// 5 a day: nothing refills while a test runs, even on a real clock.
fn daily(algorithm: Algorithm) -> Limit {
    limit(algorithm, 5, DAY_US)
}

/// An item on descriptor `name` (keys differ per algorithm, so one store serves every algorithm). The
/// key is the descriptor's without the scope, which [`apply`] puts in front.
fn item(name: &str, limit: Limit, cost: u64, group: u32) -> BatchItem {
    BatchItem {
        key: format!("_{name}_{}_", limit.algorithm.as_str()),
        limit,
        cost,
        group,
        go_format: false,
    }
}

/// Items placed per descriptor.
fn batch(items: Vec<BatchItem>, policy: CommitPolicy) -> Batch {
    Batch {
        items,
        policy,
        scope_len: 0,
        keep_together: false,
        once: None,
    }
}

/// Items placed together, as an `all_or_nothing` domain places them (one slot in a cluster).
fn together(items: Vec<BatchItem>, policy: CommitPolicy) -> Batch {
    Batch {
        keep_together: true,
        ..batch(items, policy)
    }
}

/// Items each in a group of its own: `(name, cost)` of one limit.
fn lone(specs: &[(&str, u64)], limit: Limit, policy: CommitPolicy) -> Batch {
    let items = specs
        .iter()
        .zip(0..)
        .map(|((name, cost), group)| item(name, limit, *cost, group))
        .collect();
    batch(items, policy)
}

/// Applies `batch` in the backend's scope: every key gets the scope in front.
async fn apply(backend: &impl Backend, batch: &Batch) -> Vec<Decision> {
    let scope = backend.scope();
    let mut scoped = batch.clone();
    scoped.scope_len = scope.len();
    for item in &mut scoped.items {
        item.key.insert_str(0, scope);
    }
    let decisions = backend.store().apply(&scoped).await.expect("the store answers");
    assert_eq!(decisions.len(), batch.items.len(), "one decision per item");
    decisions
}

/// What a zero-cost check of every item of `batch` sees now: same descriptors, same placement,
/// nothing consumed.
async fn check(backend: &impl Backend, batch: &Batch) -> Vec<Decision> {
    let mut zero = batch.clone();
    zero.policy = INDEPENDENT;
    for item in &mut zero.items {
        item.cost = 0;
    }
    apply(backend, &zero).await
}

/// Allowed and remaining of each decision.
fn verdicts(decisions: &[Decision]) -> Vec<(bool, u64)> {
    decisions.iter().map(|d| (d.allowed, d.remaining)).collect()
}

/// `got` equals `want`: verdicts and counts exactly, durations within the clock's drift.
fn assert_same(backend: &impl Backend, got: &[Decision], want: &[Decision], context: &str) {
    let drift = backend.drift_us();
    let close = |a: u64, b: u64| a.abs_diff(b) <= drift;
    let same = got.len() == want.len()
        && got.iter().zip(want).all(|(g, w)| {
            g.allowed == w.allowed
                && g.remaining == w.remaining
                && close(g.reset_after_us, w.reset_after_us)
                && close(g.retry_after_us, w.retry_after_us)
        });
    assert!(
        same,
        "{context}:\n  got  {got:?}\n  want {want:?}\n(durations within {drift} µs)"
    );
}

// ---------------------------------------------------------------------------------------------
// Consuming.

/// Exactly the limit passes, one unit at a time, for every algorithm; then the key is refused with a
/// retry hint, a refused descriptor does not stop another one of the same batch, and the refused
/// item itself is applied: a fixed window counts it (envoyproxy/ratelimit's counter), the other
/// algorithms have nothing to change.
async fn independent_counts_to_the_limit<B: Backend>(backend: &B) {
    for algorithm in Algorithm::ALL {
        let lim = daily(algorithm);
        let context = format!("{algorithm:?}");
        for remaining in (0..5).rev() {
            let decisions = apply(backend, &lone(&[("k", 1)], lim, INDEPENDENT)).await;
            assert_eq!(verdicts(&decisions), [(true, remaining)], "{context}");
            assert_eq!(decisions[0].retry_after_us, 0, "{context}");
        }
        let denied = apply(backend, &lone(&[("k", 1)], lim, INDEPENDENT)).await[0];
        assert_eq!(verdicts(&[denied]), [(false, 0)], "{context}");
        assert!(denied.retry_after_us > 0, "{context}: {denied:?}");
        let both = apply(backend, &lone(&[("k", 1), ("other", 2)], lim, INDEPENDENT)).await;
        assert_eq!(verdicts(&both), [(false, 0), (true, 3)], "{context}");
        // Giving one unit back shows what the refusals did: a fixed window counted past its limit
        // and is still over it; the others are at their limit and have one unit again.
        let refunded = apply(backend, &lone(&[("k", 1)], lim, REFUND)).await;
        let fixed = algorithm == Algorithm::FixedWindow;
        assert_eq!(
            verdicts(&refunded),
            [(true, if fixed { 0 } else { 1 })],
            "{context}"
        );
    }
}

/// A request of several units that crosses the limit: a fixed window counts it though it refuses it
/// and reports the part it had room for (the Go service's `near_limit` share of such a request),
/// alone (Redis' `INCRBY` path) or beside another limit of its descriptor (the script); the other
/// algorithms consume nothing and report nothing.
async fn a_refusal_that_crosses_the_limit_reports_the_room_it_had<B: Backend>(backend: &B) {
    for algorithm in Algorithm::ALL {
        let context = format!("{algorithm:?}");
        let fixed = algorithm == Algorithm::FixedWindow;
        let lim = limit(algorithm, 20, DAY_US);
        let lone_item = |cost| lone(&[("crossing", cost)], lim, INDEPENDENT);
        assert_eq!(
            verdicts(&apply(backend, &lone_item(19)).await),
            [(true, 1)],
            "{context}"
        );
        let crossing = apply(backend, &lone_item(3)).await;
        assert_eq!(verdicts(&crossing), [(false, u64::from(fixed))], "{context}");
        let after = if fixed { (false, 0) } else { (true, 1) };
        assert_eq!(
            verdicts(&check(backend, &lone_item(0)).await),
            [after],
            "{context}"
        );

        let pair = |cost| {
            batch(
                vec![
                    item("pair", limit(algorithm, 100, DAY_US), cost, 0),
                    item("pair", limit(algorithm, 10, 2 * DAY_US), cost, 0),
                ],
                INDEPENDENT,
            )
        };
        assert_eq!(
            verdicts(&apply(backend, &pair(7)).await),
            [(true, 93), (true, 3)],
            "{context}"
        );
        let held = if fixed { 3 } else { 0 };
        assert_eq!(
            verdicts(&apply(backend, &pair(7)).await),
            [(true, 93), (false, held)],
            "{context}"
        );
    }
}

/// The limits of one descriptor (one group) pass or fail together: when one refuses, the others
/// consume nothing, while another descriptor of the same batch consumes as usual.
async fn a_descriptor_passes_or_fails_with_all_its_limits<B: Backend>(backend: &B) {
    for algorithm in Algorithm::ALL {
        let context = format!("{algorithm:?}");
        let request = |cost: u64| {
            batch(
                vec![
                    item("pair", limit(algorithm, 5, DAY_US), cost, 0),
                    item("pair", limit(algorithm, 3, 2 * DAY_US), cost, 0),
                    item("solo", daily(algorithm), cost, 1),
                ],
                INDEPENDENT,
            )
        };
        let first = apply(backend, &request(2)).await;
        assert_eq!(verdicts(&first), [(true, 3), (true, 1), (true, 3)], "{context}");
        // The second limit of "pair" refuses: its first consumes nothing (its verdict stands, its
        // remaining is what it had), "solo" consumes.
        let second = apply(backend, &request(2)).await;
        let fixed = algorithm == Algorithm::FixedWindow;
        // A fixed window counts the refused item, and reports the unit it had room for.
        let refused = (false, u64::from(fixed));
        assert_eq!(verdicts(&second), [(true, 3), refused, (true, 1)], "{context}");
        let refused_limit = if fixed { (false, 0) } else { (true, 1) };
        assert_eq!(
            verdicts(&check(backend, &request(0)).await),
            [(true, 3), refused_limit, (true, 1)],
            "{context}: a fixed window counted the refused item, past its limit"
        );
    }
}

/// `AllOrNothing`: when one item is refused, nothing is consumed at all, not even by the refused item
/// (a fixed window does not count it); every item keeps its verdict and reports what it has, as
/// items that were evaluated but not consumed do.
async fn all_or_nothing_consumes_nothing_when_one_item_is_refused<B: Backend>(backend: &B) {
    for algorithm in Algorithm::ALL {
        let context = format!("{algorithm:?}");
        let lim = daily(algorithm);
        let pair = |a: u64, b: u64| {
            together(
                vec![item("a", lim, a, 0), item("b", lim, b, 1)],
                CommitPolicy::AllOrNothing,
            )
        };
        assert_eq!(
            verdicts(&apply(backend, &pair(2, 2)).await),
            [(true, 3), (true, 3)],
            "{context}"
        );
        assert_eq!(
            verdicts(&apply(backend, &pair(2, 4)).await),
            [(true, 3), (false, 3)],
            "{context}"
        );
        assert_eq!(
            verdicts(&check(backend, &pair(0, 0)).await),
            [(true, 3), (true, 3)],
            "{context}: something was consumed"
        );
        assert_eq!(
            verdicts(&apply(backend, &pair(1, 1)).await),
            [(true, 2), (true, 2)],
            "{context}: a batch that passes consumes"
        );
    }
}

/// `StopIncrementWhenOverLimit`: when an item is refused, the items allowed consume nothing, across
/// descriptors, and the refused items are applied (a fixed window counts them).
async fn stop_increment_applies_only_the_refused_items<B: Backend>(backend: &B) {
    let policy = CommitPolicy::StopIncrementWhenOverLimit;
    for algorithm in Algorithm::ALL {
        let context = format!("{algorithm:?}");
        let lim = daily(algorithm);
        let pair = |a: u64, b: u64| together(vec![item("a", lim, a, 0), item("b", lim, b, 1)], policy);
        assert_eq!(
            verdicts(&apply(backend, &pair(2, 2)).await),
            [(true, 3), (true, 3)],
            "{context}"
        );
        let fixed = algorithm == Algorithm::FixedWindow;
        assert_eq!(
            verdicts(&apply(backend, &pair(2, 4)).await),
            [(true, 3), (false, if fixed { 3 } else { 0 })],
            "{context}: a fixed window reports the room it counted"
        );
        let refused = if fixed { (false, 0) } else { (true, 3) };
        assert_eq!(
            verdicts(&check(backend, &pair(0, 0)).await),
            [(true, 3), refused],
            "{context}: only the refused item was applied"
        );
        let alone = together(vec![item("a", lim, 1, 0)], policy);
        assert_eq!(
            verdicts(&apply(backend, &alone).await),
            [(true, 2)],
            "{context}: a batch that passes consumes"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Peeks and refunds.

/// A peek decides every item exactly as the first pass of a consuming batch (in order, a repeated
/// key seeing the first item's effect, a new key evaluated too, with the real costs), for every
/// algorithm, and writes nothing: no state changes, no entry appears.
async fn peek_decides_like_a_consuming_first_pass_and_writes_nothing<B: Backend>(backend: &B) {
    for algorithm in Algorithm::ALL {
        let context = format!("{algorithm:?}");
        let lim = daily(algorithm);
        // Two copies of one history: one is peeked at, the other consumed.
        let on = |copy: &str, specs: &[(&str, u64)], policy| {
            let specs: Vec<(String, u64)> = specs
                .iter()
                .map(|(name, cost)| (format!("{copy}_{name}"), *cost))
                .collect();
            let specs: Vec<(&str, u64)> = specs.iter().map(|(n, c)| (n.as_str(), *c)).collect();
            lone(&specs, lim, policy)
        };
        for copy in ["peeked", "consumed"] {
            apply(backend, &on(copy, &[("k", 2)], INDEPENDENT)).await;
        }
        // The 3 does not fit in what the 1 leaves. One group per item, so the consuming batch does not
        // settle and its decisions are its first pass.
        let specs = [("k", 1), ("k", 3), ("new", 4), ("k", 9)];
        let before = check(backend, &on("peeked", &specs, INDEPENDENT)).await;
        let entries = backend.entries().await;
        let peek = apply(backend, &on("peeked", &specs, PEEK)).await;
        assert_eq!(
            backend.entries().await,
            entries,
            "{context}: a peek created an entry"
        );
        let consumed = apply(backend, &on("consumed", &specs, INDEPENDENT)).await;
        assert_same(backend, &peek, &consumed, &context);
        // A fixed window counts the refused 3 and reports the 2 it had room for.
        let crossing = u64::from(algorithm == Algorithm::FixedWindow) * 2;
        assert_eq!(
            verdicts(&peek),
            [(true, 2), (false, crossing), (true, 1), (false, 0)],
            "{context}"
        );
        let after = check(backend, &on("peeked", &specs, INDEPENDENT)).await;
        assert_same(
            backend,
            &after,
            &before,
            &format!("{context}: a peek changed a state"),
        );
    }
}

/// A peek reports the first pass: no settling, whatever a consuming batch of the same items would do
/// with a refused item in the group.
async fn peek_ignores_the_settling_rules<B: Backend>(backend: &B) {
    for algorithm in Algorithm::ALL {
        let lim = daily(algorithm);
        let items = vec![item("a", lim, 2, 0), item("b", lim, 6, 0)];
        let peek = apply(backend, &batch(items, PEEK)).await;
        assert_eq!(
            (peek[0].allowed, peek[0].remaining, peek[1].allowed),
            (true, 3, false),
            "{algorithm:?}: the first pass, not a settled answer"
        );
    }
    assert_eq!(backend.entries().await, 0, "a peek created an entry");
}

/// Peeks and refunds find what consuming batches wrote, whatever the consuming policy and placement
/// (per descriptor, or together for an `all_or_nothing` domain) and whether the descriptor has one
/// limit or several, as long as they are placed and grouped as the consumption was.
async fn peeks_and_refunds_find_what_consumptions_wrote<B: Backend>(backend: &B) {
    let policies = [
        (INDEPENDENT, false),
        (CommitPolicy::StopIncrementWhenOverLimit, backend.splits_by_slot()),
        (CommitPolicy::AllOrNothing, true),
    ];
    for algorithm in Algorithm::ALL {
        for (consume, keep_together) in policies {
            let context = format!("{algorithm:?} {consume:?}");
            let lone = format!("lone_{consume:?}");
            let pair = format!("pair_{consume:?}");
            // A descriptor with one limit and one with two.
            let request = |policy: CommitPolicy, cost: u64| Batch {
                keep_together,
                ..batch(
                    vec![
                        item(&lone, daily(algorithm), cost, 0),
                        item(&pair, daily(algorithm), cost, 1),
                        item(&pair, limit(algorithm, 5, 2 * DAY_US), cost, 1),
                    ],
                    policy,
                )
            };
            let remaining =
                |decisions: Vec<Decision>| -> Vec<u64> { decisions.iter().map(|d| d.remaining).collect() };
            let consumed = apply(backend, &request(consume, 2)).await;
            assert_eq!(remaining(consumed), [3, 3, 3], "{context}");
            let peeked = apply(backend, &request(PEEK, 1)).await;
            assert_eq!(remaining(peeked), [2, 2, 2], "{context}");
            let unchanged = apply(backend, &request(PEEK, 0)).await;
            assert_eq!(remaining(unchanged), [3, 3, 3], "{context}: the peek wrote");
            let refunded = apply(backend, &request(REFUND, 2)).await;
            assert_eq!(remaining(refunded), [5, 5, 5], "{context}");
            let all_back = apply(backend, &request(consume, 5)).await;
            assert_eq!(
                verdicts(&all_back),
                [(true, 0), (true, 0), (true, 0)],
                "{context}: all back"
            );
        }
    }
}

/// A refund of what was consumed leaves the key as a fresh one: the refund's decision is a fresh
/// key's, and the whole limit passes again.
async fn refund_gives_back_what_was_consumed<B: Backend>(backend: &B) {
    for algorithm in Algorithm::ALL {
        let context = format!("{algorithm:?}");
        let lim = daily(algorithm);
        let fresh = check(backend, &lone(&[("k", 0)], lim, INDEPENDENT)).await;
        apply(backend, &lone(&[("k", 3)], lim, INDEPENDENT)).await;
        let refunded = apply(backend, &lone(&[("k", 3)], lim, REFUND)).await;
        assert_same(backend, &refunded, &fresh, &context);
        let full = apply(backend, &lone(&[("k", 5)], lim, INDEPENDENT)).await;
        assert_eq!(
            verdicts(&full),
            [(true, 0)],
            "{context}: the whole limit is available again"
        );
    }
}

/// A refund carrying a token's id gives each descriptor its cost back once: the same id again, in a
/// later call, gives nothing back and reports not allowed (what it reports as remaining is not
/// specified: a cluster does not even ask the other slots), while another id still refunds. A descriptor
/// with several limits is claimed once for all of them.
async fn a_refund_token_gives_each_descriptor_back_once<B: Backend>(backend: &B) {
    for algorithm in Algorithm::ALL {
        let context = format!("{algorithm:?}");
        let (day, week) = (daily(algorithm), limit(algorithm, 5, 7 * DAY_US));
        let items = |cost: u64| {
            vec![
                item("a", day, cost, 0),
                item("a", week, cost, 0),
                item("b", day, cost, 1),
            ]
        };
        apply(backend, &batch(items(3), INDEPENDENT)).await;
        let refund = |id: &str| Batch {
            once: Some(RefundOnce {
                id: id.to_owned(),
                ttl_us: DAY_US,
            }),
            ..batch(items(2), REFUND)
        };
        let first = apply(backend, &refund("t1")).await;
        assert_eq!(verdicts(&first), [(true, 4); 3], "{context}");
        let replay = apply(backend, &refund("t1")).await;
        assert!(replay.iter().all(|d| !d.allowed), "{context}: {replay:?}");
        let after = check(backend, &batch(items(0), INDEPENDENT)).await;
        assert_eq!(
            verdicts(&after),
            [(true, 4); 3],
            "{context}: nothing given back twice"
        );
        let other = apply(backend, &refund("t2")).await;
        assert_eq!(
            verdicts(&other),
            [(true, 5); 3],
            "{context}: another token refunds"
        );
    }
}

/// Refunds of one key in one batch apply in order (the second sees the first), each allowed with
/// no retry.
async fn refunds_of_one_key_apply_in_order<B: Backend>(backend: &B) {
    for algorithm in Algorithm::ALL {
        let lim = daily(algorithm);
        apply(backend, &lone(&[("k", 4)], lim, INDEPENDENT)).await;
        let refunded = apply(backend, &lone(&[("k", 1), ("k", 1)], lim, REFUND)).await;
        assert_eq!(verdicts(&refunded), [(true, 2), (true, 3)], "{algorithm:?}");
        assert!(
            refunded.iter().all(|d| d.retry_after_us == 0),
            "{algorithm:?}: {refunded:?}"
        );
    }
}

/// A key without state has nothing to give back: a refund of an absent key, or of one whose state
/// has expired, answers as a fresh key and writes nothing (no entry is created or revived).
async fn refund_never_creates_or_revives_an_entry<B: Backend>(backend: &B) {
    // One item per algorithm, 5 a second, so one wait expires them all.
    let every = |name: &str, cost: u64, policy: CommitPolicy| {
        let items = Algorithm::ALL
            .into_iter()
            .zip(0..)
            .map(|(algorithm, group)| item(name, limit(algorithm, 5, SECOND_US), cost, group))
            .collect();
        batch(items, policy)
    };
    let fresh = check(backend, &every("absent", 0, INDEPENDENT)).await;
    let refunded = apply(backend, &every("absent", 2, REFUND)).await;
    assert_same(backend, &refunded, &fresh, "absent keys");
    assert_eq!(backend.entries().await, 0, "a refund created an entry");

    let consumed = apply(backend, &every("old", 5, INDEPENDENT)).await;
    assert!(consumed.iter().all(|d| d.allowed), "{consumed:?}");
    assert_eq!(backend.entries().await, Algorithm::ALL.len());
    // The longest-lived state, a full sliding window, lasts until the end of the next window.
    backend.advance(2 * SECOND_US + backend.tick_us()).await;
    let refunded = apply(backend, &every("old", 5, REFUND)).await;
    let fresh = check(backend, &every("old", 0, INDEPENDENT)).await;
    assert_same(backend, &refunded, &fresh, "expired keys");
    // Left expired: the sweep drops them.
    backend.sweep().await;
    assert_eq!(backend.entries().await, 0, "a refund revived an expired entry");
}

// ---------------------------------------------------------------------------------------------
// Leases.

/// Long enough that no lease of it expires while a test runs.
const LONG_TTL_US: u64 = 60 * SECOND_US;

fn lease_key(backend: &impl Backend, name: &str) -> String {
    format!("{}_job_{name}_", backend.scope())
}

/// Takes a new lease under `id` on `keys` (name, max_in_flight).
async fn acquire(backend: &impl Backend, keys: &[(&str, u64)], id: &str, ttl_us: u64) -> Vec<LeaseSlot> {
    lease_call(backend, keys, id, ttl_us, false).await
}

/// Renews the lease `id` on `keys`.
async fn renew(backend: &impl Backend, keys: &[(&str, u64)], id: &str, ttl_us: u64) -> Vec<LeaseSlot> {
    lease_call(backend, keys, id, ttl_us, true).await
}

async fn lease_call(
    backend: &impl Backend,
    keys: &[(&str, u64)],
    id: &str,
    ttl_us: u64,
    renew: bool,
) -> Vec<LeaseSlot> {
    let request = AcquireRequest {
        items: keys
            .iter()
            .map(|(name, max_in_flight)| LeaseItem {
                key: lease_key(backend, name),
                max_in_flight: *max_in_flight,
            })
            .collect(),
        lease_id: id.to_owned(),
        renew,
        ttl_us,
        scope_len: backend.scope().len(),
    };
    let slots = backend
        .store()
        .acquire(&request)
        .await
        .expect("the store answers");
    assert_eq!(slots.len(), keys.len(), "one slot per key");
    slots
}

async fn release(backend: &impl Backend, keys: &[&str], id: &str) -> Vec<Released> {
    let request = ReleaseRequest {
        keys: keys.iter().map(|name| lease_key(backend, name)).collect(),
        lease_id: id.to_owned(),
        scope_len: backend.scope().len(),
    };
    let released = backend
        .store()
        .release(&request)
        .await
        .expect("the store answers");
    assert_eq!(released.len(), keys.len(), "one answer per key");
    released
}

fn taken(in_flight: u64) -> LeaseSlot {
    LeaseSlot {
        available: true,
        in_flight,
        retry_after_us: 0,
    }
}

/// A full key's slot: `in_flight` held, and a retry hint of the oldest lease's expiry, which is
/// `ttl_us` after it was taken (the clock's drift ago at most).
fn assert_full(backend: &impl Backend, slot: LeaseSlot, in_flight: u64, ttl_us: u64) {
    assert_eq!((slot.available, slot.in_flight), (false, in_flight), "{slot:?}");
    let drift = backend.drift_us();
    assert!(
        slot.retry_after_us <= ttl_us && slot.retry_after_us + drift >= ttl_us,
        "{slot:?}: the oldest lease expires {ttl_us} µs after it was taken ({drift} µs ago at most)"
    );
}

/// At most `max_in_flight` leases hold a key; releasing one frees its slot, once.
async fn leases_hold_at_most_max_in_flight_and_release_frees_a_slot<B: Backend>(backend: &B) {
    assert_eq!(acquire(backend, &[("k", 2)], "a", LONG_TTL_US).await, [taken(1)]);
    assert_eq!(acquire(backend, &[("k", 2)], "b", LONG_TTL_US).await, [taken(2)]);
    let full = acquire(backend, &[("k", 2)], "c", LONG_TTL_US).await;
    assert_full(backend, full[0], 2, LONG_TTL_US);
    let freed = Released {
        released: true,
        in_flight: 1,
    };
    assert_eq!(release(backend, &["k"], "a").await, [freed]);
    let again = Released {
        released: false,
        in_flight: 1,
    };
    assert_eq!(release(backend, &["k"], "a").await, [again], "released already");
    assert_eq!(acquire(backend, &[("k", 2)], "c", LONG_TTL_US).await, [taken(2)]);
}

/// An acquire takes a slot of every key or of none: one full key and nothing is taken anywhere.
async fn leases_are_all_or_none_across_keys<B: Backend>(backend: &B) {
    let keys = [("a", 2), ("b", 1)];
    assert_eq!(
        acquire(backend, &keys, "one", LONG_TTL_US).await,
        [taken(1), taken(1)]
    );
    let refused = acquire(backend, &keys, "two", LONG_TTL_US).await;
    assert_eq!(refused[0], taken(1), "room on a, but nothing taken");
    assert_full(backend, refused[1], 1, LONG_TTL_US);
    // "two" holds nothing on "a": a third lease still fits there.
    assert_eq!(
        acquire(backend, &[("a", 2)], "three", LONG_TTL_US).await,
        [taken(2)]
    );
}

/// Renewing extends a live lease's slot and takes nothing new; a new lease is never granted under an
/// id that already holds the slot (no two callers share one), and an id holding nothing renews nothing.
async fn renewing_extends_a_live_lease_and_nothing_else<B: Backend>(backend: &B) {
    let (ttl, tick) = (backend.short_ttl_us(), backend.tick_us());
    assert!(ttl > 2 * tick);
    assert_eq!(acquire(backend, &[("k", 2)], "a", ttl).await, [taken(1)]);
    backend.advance(ttl - tick).await;
    assert_eq!(renew(backend, &[("k", 2)], "a", ttl).await, [taken(1)], "renewed");
    let refused = LeaseSlot {
        available: false,
        in_flight: 1,
        retry_after_us: 0,
    };
    assert_eq!(
        renew(backend, &[("k", 2)], "ghost", ttl).await,
        [refused],
        "nothing to renew"
    );
    let shared = acquire(backend, &[("k", 2)], "a", ttl).await[0];
    assert_eq!(
        (shared.available, shared.in_flight),
        (false, 1),
        "a held id is not a new lease"
    );
    backend.advance(ttl - tick).await;
    // Past the first expiry, still held thanks to the renewal, and nothing else was taken.
    let blocked = acquire(backend, &[("k", 1)], "b", ttl).await[0];
    assert_eq!((blocked.available, blocked.in_flight), (false, 1), "{blocked:?}");
    backend.advance(2 * tick).await;
    let expired = LeaseSlot {
        available: false,
        in_flight: 0,
        retry_after_us: 0,
    };
    assert_eq!(
        renew(backend, &[("k", 2)], "a", ttl).await,
        [expired],
        "an expired lease is gone"
    );
    assert_eq!(acquire(backend, &[("k", 1)], "b", ttl).await, [taken(1)]);
}

/// A lease nobody releases expires on its own after its TTL (a lease expiring exactly now is gone),
/// and then there is nothing left to release.
async fn expired_leases_free_their_slots<B: Backend>(backend: &B) {
    let (ttl, tick) = (backend.short_ttl_us(), backend.tick_us());
    assert_eq!(acquire(backend, &[("k", 1)], "a", ttl).await, [taken(1)]);
    backend.advance(ttl - tick).await;
    let blocked = acquire(backend, &[("k", 1)], "b", ttl).await[0];
    assert_eq!((blocked.available, blocked.in_flight), (false, 1), "{blocked:?}");
    assert!(
        blocked.retry_after_us > 0 && blocked.retry_after_us <= tick,
        "{blocked:?}"
    );
    backend.advance(tick).await;
    assert_eq!(acquire(backend, &[("k", 1)], "b", ttl).await, [taken(1)]);
    let nothing = Released {
        released: false,
        in_flight: 1,
    };
    assert_eq!(release(backend, &["k"], "a").await, [nothing], "expired");
}

/// `max_in_flight` 0 refuses every lease, with no retry hint (nothing will free a slot), and takes
/// nothing; releasing what was never held releases nothing.
async fn zero_max_in_flight_refuses_every_lease<B: Backend>(backend: &B) {
    let refused = LeaseSlot {
        available: false,
        in_flight: 0,
        retry_after_us: 0,
    };
    assert_eq!(acquire(backend, &[("k", 0)], "a", LONG_TTL_US).await, [refused]);
    assert_eq!(acquire(backend, &[("k", 5)], "b", LONG_TTL_US).await, [taken(1)]);
    let held_by_b = Released {
        released: false,
        in_flight: 1,
    };
    assert_eq!(
        release(backend, &["k", "never"], "a").await,
        [held_by_b, Released::default()]
    );
}

// ---------------------------------------------------------------------------------------------
// One test per body and backend.

macro_rules! contract_tests {
    ($($body:ident),* $(,)?) => {
        /// The embedded store on a manual clock.
        mod memory {
            $(
                #[tokio::test]
                async fn $body() {
                    super::$body(&super::Embedded::memory()).await;
                }
            )*
        }

        /// The local over-limit cache in front of the embedded store.
        mod local_cache {
            $(
                #[tokio::test]
                async fn $body() {
                    super::$body(&super::Embedded::local_cache()).await;
                }
            )*
        }

        /// A single `redis-server`.
        mod redis_single {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $body() {
                    crate::require_redis!();
                    super::$body(&super::Redis::single().await).await;
                }
            )*
        }

        /// A Redis Cluster of three masters.
        mod redis_cluster {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $body() {
                    crate::require_redis!();
                    super::$body(&super::Redis::cluster().await).await;
                }
            )*
        }
    };
}

contract_tests!(
    independent_counts_to_the_limit,
    a_refusal_that_crosses_the_limit_reports_the_room_it_had,
    a_descriptor_passes_or_fails_with_all_its_limits,
    all_or_nothing_consumes_nothing_when_one_item_is_refused,
    stop_increment_applies_only_the_refused_items,
    peek_decides_like_a_consuming_first_pass_and_writes_nothing,
    peek_ignores_the_settling_rules,
    peeks_and_refunds_find_what_consumptions_wrote,
    a_refund_token_gives_each_descriptor_back_once,
    refund_gives_back_what_was_consumed,
    refunds_of_one_key_apply_in_order,
    refund_never_creates_or_revives_an_entry,
    leases_hold_at_most_max_in_flight_and_release_frees_a_slot,
    leases_are_all_or_none_across_keys,
    renewing_extends_a_live_lease_and_nothing_else,
    expired_leases_free_their_slots,
    zero_max_in_flight_refuses_every_lease,
);
