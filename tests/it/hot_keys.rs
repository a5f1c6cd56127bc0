//! Hot-key reservations (`TOLLGATE_HOT_KEY_RATE`) over real Redis processes: several replicas, each its
//! own Redis store with its own connections and replica id, hammer one key. What is asserted is what
//! the code controls: how many requests were admitted (exactly the limit), that slices were used, and
//! that unspent units go back.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio_util::sync::CancellationToken;
use tollgate::proto::rls::rate_limit_response::Code;
use tollgate::proto::rls::rate_limit_service_client::RateLimitServiceClient;
use tollgate_core::algorithm::{Algorithm, Decision, Limit};
use tollgate_core::clock::{Clock, ManualClock, SystemClock};
use tollgate_core::store::hot_keys::{HotKeyOptions, HotKeys, Reserve, ReserveRequest, Reserved};
use tollgate_core::store::lease::{AcquireRequest, LeaseSlot, LeaseStore, ReleaseRequest, Released};
use tollgate_core::store::redis::RedisStore;
use tollgate_core::store::{Batch, BatchItem, CommitPolicy, Store, StoreError};
use tonic::transport::Channel;

use crate::common::redis::{RedisCluster, RedisSentinel, RedisServer, connected_store};
use crate::common::{TestServer, wire_request};
use crate::require_redis;

type Replica = Arc<HotKeys<Arc<RedisStore>>>;

/// `n` replicas on `url`, each reserving from the first decision on a key.
async fn replicas(url: &str, kind: &str, n: usize, lease: Duration) -> (Vec<Replica>, CancellationToken) {
    let stop = CancellationToken::new();
    let mut out = Vec::new();
    for _ in 0..n {
        let (store, connector) = connected_store(url, kind).await;
        let stop_connector = stop.clone();
        tokio::spawn(async move {
            stop_connector.cancelled().await;
            connector.cancel();
        });
        let options = HotKeyOptions { rate: 1, lease };
        out.push(HotKeys::start(
            store,
            options,
            Arc::new(SystemClock),
            stop.clone(),
        ));
    }
    (out, stop)
}

/// A limit of `requests` per day (the bucket algorithms refill one unit every 86,400 / requests s,
/// none during a test); `requests` per hour for the windows, which a test reruns if the hour turns.
fn limit(algorithm: Algorithm, requests: u64) -> Limit {
    let window_us = match algorithm {
        Algorithm::TokenBucket | Algorithm::Gcra => 86_400_000_000,
        _ => 3_600_000_000,
    };
    Limit {
        algorithm,
        requests,
        window_us,
        burst: requests,
    }
}

fn one(key: &str, limit: Limit) -> Batch {
    let item = BatchItem {
        key: key.to_owned(),
        limit,
        cost: 1,
        group: 0,
        go_format: false,
    };
    Batch::new(vec![item], CommitPolicy::Independent)
}

/// One reservation call by `replica` on `item`'s key, answered.
async fn reserve(
    store: &Arc<RedisStore>,
    item: &BatchItem,
    want: u64,
    give_back: u64,
    replica: &str,
    lease_us: u64,
) -> Reserved {
    let request = ReserveRequest {
        item,
        want,
        give_back,
        replica,
        lease_us,
    };
    store.reserve(request).await.expect("Redis answers")
}

/// What Redis still admits on `item`'s key, read without consuming anything.
async fn remaining(store: &Arc<RedisStore>, item: &BatchItem) -> u64 {
    let item = BatchItem {
        cost: 0,
        ..item.clone()
    };
    let peek = Batch::new(vec![item], CommitPolicy::Peek);
    store.apply(&peek).await.expect("Redis answers")[0].remaining
}

/// Decisions on `key` through `replica`, `lanes` at a time, until `requests` (which other calls may
/// share: a burst the whole fleet receives) have been sent; how many were admitted.
async fn hammer_shared<S: Reserve>(
    replica: &Arc<HotKeys<S>>,
    key: &str,
    limit: Limit,
    requests: Arc<AtomicUsize>,
    lanes: usize,
) -> usize {
    let lanes = (0..lanes).map(|_| {
        let replica = Arc::clone(replica);
        let batch = one(key, limit);
        let requests = Arc::clone(&requests);
        tokio::spawn(async move {
            let mut admitted = 0;
            while requests
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| left.checked_sub(1))
                .is_ok()
            {
                let decision = replica.apply(&batch).await.expect("Redis answers");
                admitted += usize::from(decision[0].allowed);
            }
            admitted
        })
    });
    let mut admitted = 0;
    for lane in lanes.collect::<Vec<_>>() {
        admitted += lane.await.expect("lane runs");
    }
    admitted
}

/// `requests` decisions on `key` through `replica`, `lanes` at a time; how many were admitted.
async fn hammer<S: Reserve>(
    replica: &Arc<HotKeys<S>>,
    key: &str,
    limit: Limit,
    requests: usize,
    lanes: usize,
) -> usize {
    hammer_shared(replica, key, limit, Arc::new(AtomicUsize::new(requests)), lanes).await
}

fn hour() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs()
        / 3600
}

/// The replicas receive three times the limit at once, each as fast as it answers (a fast replica
/// takes more of the burst, as a load balancer's least-request policy would give it); the admitted
/// total must be the limit, and slices must have answered (or the test would prove nothing about
/// them).
async fn burst_admits_exactly_the_limit(url: &str, kind: &str, replicas_n: usize) {
    for algorithm in [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::TokenBucket,
        Algorithm::Gcra,
    ] {
        let (replicas, stop) = replicas(url, kind, replicas_n, Duration::from_secs(1)).await;
        let limit = limit(algorithm, 600);
        for attempt in 0.. {
            let key = format!("hot_{algorithm}_{replicas_n}_{attempt}_");
            let started = hour();
            let burst = Arc::new(AtomicUsize::new(3 * 600));
            let runs = replicas
                .iter()
                .map(|r| hammer_shared(r, &key, limit, Arc::clone(&burst), 4));
            let admitted: usize = futures_util::future::join_all(runs).await.into_iter().sum();
            if hour() != started && attempt < 3 {
                continue; // the window turned during the burst: its count is two windows'
            }
            assert_eq!(admitted, 600, "{algorithm}, {replicas_n} replicas on {kind}");
            break;
        }
        let local: u64 = replicas
            .iter()
            .map(|r| r.counts().local_decisions.load(Ordering::Relaxed))
            .sum();
        assert!(local > 0, "{algorithm}: no decision was answered from a slice");
        stop.cancel();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_over_two_and_four_replicas_admits_exactly_the_limit_on_one_redis() {
    require_redis!();
    let redis = RedisServer::start();
    for n in [2, 4] {
        burst_admits_exactly_the_limit(&redis.url(), "single", n).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_over_two_and_four_replicas_admits_exactly_the_limit_on_a_cluster() {
    require_redis!();
    let cluster = RedisCluster::start();
    for n in [2, 4] {
        burst_admits_exactly_the_limit(&cluster.addrs(), "cluster", n).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_over_two_replicas_admits_exactly_the_limit_through_sentinel() {
    require_redis!();
    let sentinel = RedisSentinel::start();
    burst_admits_exactly_the_limit(&sentinel.url(), "sentinel", 2).await;
}

/// A replica that goes quiet holding a slice gives the unspent units back once its lease ends, so the
/// other replica can admit the whole rest of the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_replica_gives_its_unspent_units_back_after_the_lease() {
    require_redis!();
    let redis = RedisServer::start();
    let lease = Duration::from_millis(300);
    for algorithm in [Algorithm::FixedWindow, Algorithm::TokenBucket, Algorithm::Gcra] {
        let (replicas, stop) = replicas(&redis.url(), "single", 2, lease).await;
        let limit = limit(algorithm, 1_000);
        let key = format!("quiet_{algorithm}_");
        let started = hour();
        let returned = || replicas[0].counts().units_returned.load(Ordering::Relaxed);
        let mut first = hammer(&replicas[0], &key, limit, 300, 4).await;
        // The last slice may have been spent to the last unit (or given back already, on a slow
        // machine): a few more decisions leave some units over.
        while replicas[0].held_units() == 0 && returned() == 0 && first < 400 {
            first += hammer(&replicas[0], &key, limit, 10, 1).await;
        }
        tokio::time::sleep(lease * 3).await;
        assert_eq!(replicas[0].keys(), 0, "{algorithm}: a slice outlived its lease");
        assert!(returned() > 0, "{algorithm}: nothing was given back");
        let second = hammer(&replicas[1], &key, limit, 2_000, 4).await;
        if hour() == started {
            assert_eq!(first + second, 1_000, "{algorithm}: {first} then {second}");
        }
        stop.cancel();
    }
}

/// A slice is timed on the monotonic clock: a wall clock stepped back (an NTP step) does not let it be
/// admitted from once its lease has passed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wall_clock_stepped_back_does_not_extend_a_slice() {
    require_redis!();
    let redis = RedisServer::start();
    let (store, connector) = connected_store(&redis.url(), "single").await;
    let wall_now = SystemClock.now_us();
    let clock = ManualClock::new(wall_now);
    let lease = Duration::from_secs(1);
    let options = HotKeyOptions { rate: 1, lease };
    let stop = CancellationToken::new();
    let hot = HotKeys::start(store, options, Arc::new(clock.clone()), stop.clone());
    let batch = one("wall_step_", limit(Algorithm::FixedWindow, 1_000));
    // Decisions until one is answered from a slice that still holds units (the first slices are small:
    // a slice is what a tenth of the lease brings at the key's rate).
    let mut holding = false;
    for _ in 0..200 {
        let decision = hot.apply(&batch).await.expect("Redis answers")[0];
        holding = decision.from_slice && hot.held_units() > 0;
        if holding {
            break;
        }
    }
    assert!(holding, "no slice held units");
    // The wall clock goes back an hour; twice the lease passes.
    clock.set_us(wall_now - 3_600_000_000);
    clock.advance_us(2 * lease.as_micros() as u64);
    let decision = hot.apply(&batch).await.expect("Redis answers")[0];
    assert!(decision.allowed);
    assert!(!decision.from_slice, "a slice was admitted from after its lease");
    stop.cancel();
    connector.cancel();
}

/// On a hot key with room to spare, almost every decision is answered locally.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_key_costs_redis_a_call_per_many_decisions() {
    require_redis!();
    let redis = RedisServer::start();
    let (replicas, stop) = replicas(&redis.url(), "single", 1, Duration::from_secs(1)).await;
    let limit = limit(Algorithm::FixedWindow, 1_000_000_000);
    let decisions = 20_000;
    let admitted = hammer(&replicas[0], "calls_", limit, decisions, 8).await;
    assert_eq!(admitted, decisions);
    let store = replicas[0].inner();
    let calls = store.batches() + replicas[0].counts().reservations.load(Ordering::Relaxed);
    let per_decision = calls as f64 / decisions as f64;
    assert!(
        per_decision <= 0.02,
        "{calls} Redis calls for {decisions} decisions"
    );
    stop.cancel();
}

/// Through the service: two instances with `TOLLGATE_HOT_KEY_RATE` on one Redis, 32 clients, a burst of
/// three times the limit for every algorithm (the sliding log, which never reserves, included): exactly
/// the limit passes, and `/metrics` shows decisions answered from slices.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_with_hot_keys_admit_exactly_the_limit() {
    require_redis!();
    let redis = RedisServer::start();
    let url = redis.url();
    let env = [
        ("REDIS_URL", url.as_str()),
        ("TOLLGATE_HOT_KEY_RATE", "1"),
        ("TOLLGATE_REDIS_DEADLINE", "2s"),
        // Without the over-limit cache: a replica refused once would refuse the key until the
        // denial's retry time, units given back after it included (docs/operations.md, Hot keys), and
        // the exact total below is what this test checks.
        ("LOCAL_CACHE_SIZE_IN_BYTES", "0"),
    ];
    let text = Algorithm::ALL
        .iter()
        .map(|a| {
            format!("  - key: {a}\n    rate_limit: {{unit: hour, requests_per_unit: 100, algorithm: {a}}}\n")
        })
        .collect::<String>();
    let text = format!("domain: hot\ndescriptors:\n{text}");
    let files = [("hot.yaml", text.as_str())];
    let servers = Arc::new([
        TestServer::start(&files, &env).await,
        TestServer::start(&files, &env).await,
    ]);
    for algorithm in Algorithm::ALL {
        let started = hour();
        let burst = Arc::new(AtomicUsize::new(300));
        let admitted = Arc::new(AtomicUsize::new(0));
        let key = algorithm.as_str();
        let clients: Vec<_> = (0..32)
            .map(|i| {
                let (servers, burst, admitted) =
                    (Arc::clone(&servers), Arc::clone(&burst), Arc::clone(&admitted));
                tokio::spawn(async move {
                    let mut client = servers[i % 2].client().await;
                    while burst
                        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| left.checked_sub(1))
                        .is_ok()
                    {
                        admitted.fetch_add(passes(&mut client, key).await, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        for client in clients {
            client.await.expect("client");
        }
        // Never more than the limit. A replica may still hold a unit its clients did not get to spend
        // when the burst ran out on the other: once its slice's lease ends it goes back, and a few
        // requests more take it (the budget is too small by then for anyone to reserve it again).
        let in_burst = admitted.load(Ordering::Relaxed);
        assert!(in_burst <= 100, "{algorithm}: {in_burst} admitted");
        let admit = async |i: usize| passes(&mut servers[i % 2].client().await, key).await;
        let (mut late, deadline) = (0, Instant::now() + Duration::from_secs(15));
        let mut i = 0;
        while in_burst + late < 100 && Instant::now() < deadline {
            late += admit(i).await;
            i += 1;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        for i in 0..4 {
            late += admit(i).await;
        }
        if hour() == started {
            assert_eq!(
                in_burst + late,
                100,
                "{algorithm}: {in_burst} in the burst, {late} after"
            );
        }
    }
    let local = servers[0].metric("tollgate_hot_key_local_decisions_total").await
        + servers[1].metric("tollgate_hot_key_local_decisions_total").await;
    assert!(local > 0, "no decision was answered from a slice");
    let [a, b] = Arc::into_inner(servers).expect("clients done");
    a.stop().await;
    b.stop().await;
}

/// 1 if a request for `key=x` in domain `hot` passes, else 0.
async fn passes(client: &mut RateLimitServiceClient<Channel>, key: &str) -> usize {
    let answer = client
        .should_rate_limit(wire_request("hot", &[&[(key, "x")]]))
        .await
        .expect("answer");
    usize::from(answer.into_inner().overall_code == Code::Ok as i32)
}

/// `per_second` requests a second on `key` through `replica`, sent on a schedule whatever the answers
/// (a tick missed on a busy machine is skipped, not sent late in a bunch), for `seconds`; (sent,
/// admitted).
async fn paced(replica: Replica, key: String, limit: Limit, per_second: u64, seconds: u64) -> (usize, usize) {
    let mut ticks = tokio::time::interval(Duration::from_micros(1_000_000 / per_second));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let until = tokio::time::Instant::now() + Duration::from_secs(seconds);
    let mut requests = Vec::new();
    while ticks.tick().await < until {
        let (replica, batch) = (Arc::clone(&replica), one(&key, limit));
        requests.push(tokio::spawn(async move { replica.apply(&batch).await }));
    }
    let sent = requests.len();
    let mut admitted = 0;
    for request in requests {
        let decision = request.await.expect("request runs").expect("Redis answers");
        admitted += usize::from(decision[0].allowed);
    }
    (sent, admitted)
}

/// Steady load at 90 % of a per-second limit, split 80/20 over two replicas: slices must not starve
/// either (at least 99 % admitted), although units a replica holds at a window's end lapse with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steady_load_at_ninety_percent_split_eighty_twenty_is_admitted() {
    require_redis!();
    let redis = RedisServer::start();
    let (replicas, stop) = replicas(&redis.url(), "single", 2, Duration::from_secs(1)).await;
    let limit = Limit {
        algorithm: Algorithm::FixedWindow,
        requests: 1_000,
        window_us: 1_000_000,
        burst: 1_000,
    };
    let key = "steady_".to_owned();
    let (a, b) = futures_util::future::join(
        paced(Arc::clone(&replicas[0]), key.clone(), limit, 720, 4),
        paced(Arc::clone(&replicas[1]), key, limit, 180, 4),
    )
    .await;
    let (sent, admitted) = (a.0 + b.0, a.1 + b.1);
    assert!(
        admitted * 100 >= sent * 99,
        "{admitted} of {sent} admitted ({a:?}, {b:?})"
    );
    let local: u64 = replicas
        .iter()
        .map(|r| r.counts().local_decisions.load(Ordering::Relaxed))
        .sum();
    assert!(
        local * 2 > sent as u64,
        "only {local} of {sent} answered from slices"
    );
    stop.cancel();
}

/// While Redis is away, the units a replica holds are still admitted (they were granted), and then
/// the store's error answers, as for any other key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slice_is_admitted_from_while_redis_is_away_and_then_the_error_answers() {
    require_redis!();
    let mut redis = RedisServer::start();
    let (replicas, stop) = replicas(&redis.url(), "single", 1, Duration::from_secs(5)).await;
    let replica = &replicas[0];
    let limit = limit(Algorithm::TokenBucket, 1_000_000);
    hammer(replica, "away_", limit, 2_000, 4).await;
    while replica.held_units() == 0 {
        hammer(replica, "away_", limit, 1, 1).await;
    }
    let held = replica.held_units();
    redis.kill();
    let batch = one("away_", limit);
    for _ in 0..held {
        let decision = replica.apply(&batch).await.expect("answered from the slice");
        assert!(decision[0].allowed && decision[0].from_slice);
    }
    assert!(
        replica.apply(&batch).await.is_err(),
        "the slice is spent: Redis must answer"
    );
    stop.cancel();
}

/// A give-back proves it owns what it returns: Redis takes back at most the units of the caller's own
/// last grant, once, and nothing for a replica id that holds none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_give_back_returns_only_the_callers_own_last_grant() {
    require_redis!();
    let redis = RedisServer::start();
    let (store, stop) = connected_store(&redis.url(), "single").await;
    let limit = limit(Algorithm::FixedWindow, 1_000);
    let take = BatchItem {
        key: "owned_".into(),
        limit,
        cost: 1,
        group: 0,
        go_format: false,
    };
    let give = BatchItem {
        cost: 0,
        ..take.clone()
    };
    let lease = 1_000_000;
    for attempt in 0..3 {
        // Every step is read first and judged after: a window that turned in between is retried.
        let started = hour();
        let granted = reserve(&store, &take, 50, 0, "a", lease).await;
        let after_grant = remaining(&store, &take).await;
        reserve(&store, &give, 0, 1_000, "b", lease).await;
        let after_stranger = remaining(&store, &take).await;
        reserve(&store, &give, 0, 1_000, "a", lease).await;
        let after_owner = remaining(&store, &take).await;
        reserve(&store, &give, 0, 1_000, "a", lease).await;
        let after_again = remaining(&store, &take).await;
        if hour() != started && attempt < 2 {
            redis.cli(&["FLUSHALL"]);
            continue;
        }
        assert!(granted.decision.allowed);
        assert_eq!(granted.extra, 50, "half the room is more than asked for");
        assert_eq!(after_grant, 949);
        assert_eq!(after_stranger, 949, "b holds nothing here");
        assert_eq!(after_owner, 999, "a gets back its 50 and no more");
        assert_eq!(after_again, 999, "once");
        break;
    }
    stop.cancel();
}

/// A replica gives back a slice once its lease has ended (its sweep runs every quarter lease). Another
/// replica's call in between must not drop the record the give-back is checked against, or the units
/// are lost to the key (a two-replica burst admitted 99 of 100 that way).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_give_back_after_its_lease_ended_is_taken_though_another_replica_called_first() {
    require_redis!();
    let redis = RedisServer::start();
    let (store, stop) = connected_store(&redis.url(), "single").await;
    let take = BatchItem {
        key: "late_".into(),
        limit: limit(Algorithm::TokenBucket, 1_000),
        cost: 1,
        group: 0,
        go_format: false,
    };
    let give = BatchItem {
        cost: 0,
        ..take.clone()
    };
    let granted = reserve(&store, &take, 50, 0, "a", 300_000).await;
    assert_eq!(granted.extra, 50);
    tokio::time::sleep(Duration::from_millis(400)).await;
    // b's call comes after a's lease ended (b's own lease, 60 s, is how long it waits for a).
    reserve(&store, &give, 0, 0, "b", 60_000_000).await;
    reserve(&store, &give, 0, 50, "a", 300_000).await;
    // The bucket refills 1,000 an hour, a token in 3.6 s: one may have come back meanwhile.
    let after = remaining(&store, &take).await;
    assert!((999..=1_000).contains(&after), "a's 50 came back: {after} left");
    stop.cancel();
}

/// A Redis store whose give-backs (a costless item asking for nothing: the sweep's calls), once armed,
/// wait at a gate, so a test can hold one in flight.
#[derive(Clone)]
struct HeldGiveBacks {
    store: Arc<RedisStore>,
    armed: Arc<AtomicBool>,
    /// Told when an armed give-back reaches the gate.
    held: Arc<tokio::sync::Notify>,
    gate: Arc<tokio::sync::Semaphore>,
}

impl Store for HeldGiveBacks {
    async fn apply(&self, batch: &Batch) -> Result<Vec<Decision>, StoreError> {
        self.store.apply(batch).await
    }

    fn name(&self) -> &'static str {
        self.store.name()
    }

    fn shares_with_go(&self) -> bool {
        self.store.shares_with_go()
    }
}

impl LeaseStore for HeldGiveBacks {
    async fn acquire(&self, request: &AcquireRequest) -> Result<Vec<LeaseSlot>, StoreError> {
        self.store.acquire(request).await
    }

    async fn release(&self, request: &ReleaseRequest) -> Result<Vec<Released>, StoreError> {
        self.store.release(request).await
    }
}

impl Reserve for HeldGiveBacks {
    async fn reserve(&self, request: ReserveRequest<'_>) -> Result<Reserved, StoreError> {
        if request.item.cost == 0 && request.want == 0 && self.armed.load(Ordering::Relaxed) {
            self.held.notify_one();
            let _open = self.gate.acquire().await;
        }
        self.store.reserve(request).await
    }
}

/// A request on a key whose ended slice is being given back waits for the give-back instead of
/// reserving beside it. Reserving, its call could reach Redis first, find the key spent, deny and
/// clear the replica's grant record, and the give-back (capped by that record) would return nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_while_its_slice_is_given_back_waits_for_the_give_back() {
    require_redis!();
    let redis = RedisServer::start();
    let (store, stop) = connected_store(&redis.url(), "single").await;
    let held = HeldGiveBacks {
        store: Arc::clone(&store),
        armed: Arc::new(AtomicBool::new(false)),
        held: Arc::new(tokio::sync::Notify::new()),
        gate: Arc::new(tokio::sync::Semaphore::new(0)),
    };
    let options = HotKeyOptions {
        rate: 1,
        lease: Duration::from_secs(1),
    };
    let replica = HotKeys::start(held.clone(), options, Arc::new(SystemClock), stop.clone());
    let limit = limit(Algorithm::TokenBucket, 1_000);
    // A burst leaves units in the replica's slice; the rest of the key is then spent in Redis directly.
    let (mut key, mut admitted) = (String::new(), 0);
    for attempt in 0.. {
        key = format!("during_{attempt}_");
        admitted = hammer(&replica, &key, limit, 200, 4).await;
        if replica.held_units() > 0 {
            break;
        }
        assert!(attempt < 10, "no burst left units in a slice");
    }
    held.armed.store(true, Ordering::Relaxed);
    let mut rest = one(&key, limit);
    let spent = remaining(&store, &rest.items[0]).await;
    rest.items[0].cost = spent;
    assert!(store.apply(&rest).await.expect("Redis answers")[0].allowed);
    let slice = replica.held_units() as usize;
    tokio::time::timeout(Duration::from_secs(10), held.held.notified())
        .await
        .expect("the ended slice is given back");
    let request = {
        let (replica, batch) = (Arc::clone(&replica), one(&key, limit));
        tokio::spawn(async move { replica.apply(&batch).await.expect("Redis answers")[0].allowed })
    };
    // Time for a request that does not wait to be decided; one that waits is released below either way.
    tokio::time::sleep(Duration::from_millis(300)).await;
    held.gate.add_permits(1_000);
    let admitted_during = usize::from(request.await.expect("request runs"));
    // Every unit is admitted, held or back in Redis: the slice's came back (a token may have refilled).
    let total = admitted
        + spent as usize
        + admitted_during
        + replica.held_units() as usize
        + remaining(&store, &rest.items[0]).await as usize;
    assert!(
        (1_000..=1_001).contains(&total),
        "{total}: {slice} units were in the slice being given back"
    );
    stop.cancel();
}

/// A request cancelled while its reservation is in flight (its caller gave up) must not leave the key
/// waiting for a reservation that will never land: once Redis answers again, slices answer again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_cancelled_in_flight_does_not_stall_its_key() {
    require_redis!();
    let redis = RedisServer::start();
    let (replicas, stop) = replicas(&redis.url(), "single", 1, Duration::from_secs(1)).await;
    let replica = &replicas[0];
    let limit = limit(Algorithm::TokenBucket, 1_000_000);
    let local = || replica.counts().local_decisions.load(Ordering::Relaxed);
    hammer(replica, "cancelled_", limit, 500, 4).await;
    redis.pause();
    let batch = one("cancelled_", limit);
    let mut cancelled = 0;
    for _ in 0..10_000 {
        if tokio::time::timeout(Duration::from_millis(50), replica.apply(&batch))
            .await
            .is_err()
        {
            cancelled += 1;
            if cancelled == 3 {
                break;
            }
        }
    }
    redis.resume();
    assert_eq!(cancelled, 3, "Redis paused, yet every request was answered");
    let before = local();
    hammer(replica, "cancelled_", limit, 500, 4).await;
    assert!(
        local() - before > 250,
        "slices did not answer again: {}",
        local() - before
    );
    stop.cancel();
}

/// A request with a hot descriptor and a cold one of two limits: the hot one is answered from a slice
/// or a reservation, the cold group goes to Redis as one batch, and every decision comes back in its
/// place; the hot key still admits exactly its limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_descriptor_beside_cold_ones_keeps_every_decision_in_its_place() {
    require_redis!();
    let redis = RedisServer::start();
    let (replicas, stop) = replicas(&redis.url(), "single", 1, Duration::from_secs(1)).await;
    let replica = &replicas[0];
    let hot = limit(Algorithm::TokenBucket, 100);
    let (per_hour, per_day) = (
        limit(Algorithm::FixedWindow, 7),
        Limit {
            window_us: 86_400_000_000,
            ..limit(Algorithm::FixedWindow, 9)
        },
    );
    let mut admitted = 0;
    for i in 0..300 {
        let item = |key: String, limit, group| BatchItem {
            key,
            limit,
            cost: 1,
            group,
            go_format: false,
        };
        let batch = Batch::new(
            vec![
                item(format!("cold_{i}_"), per_hour, 0),
                item(format!("cold_{i}_"), per_day, 0),
                item("mixed_hot_".into(), hot, 1),
            ],
            CommitPolicy::Independent,
        );
        let decisions = replica.apply(&batch).await.expect("Redis answers");
        assert_eq!(decisions.len(), 3);
        assert!(
            decisions[0].allowed && decisions[1].allowed,
            "request {i}: {decisions:?}"
        );
        assert_eq!(
            (decisions[0].remaining, decisions[1].remaining),
            (6, 8),
            "request {i}"
        );
        admitted += usize::from(decisions[2].allowed);
    }
    assert_eq!(admitted, 100);
    assert!(replica.counts().local_decisions.load(Ordering::Relaxed) > 0);
    stop.cancel();
}
