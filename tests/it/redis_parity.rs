//! The batch script decides EXACTLY like the Rust algorithms: random timelines of batches (consuming,
//! peeking and refunding) run against a real `redis-server` and, at the Redis clock reading each reply
//! reports, through a `MemoryStore` (whose batch semantics are the reference); every field of every
//! decision must be equal. Windows are
//! small so that real time exercises refill and roll-over; a second set of limits is huge so that the
//! script's exact arithmetic beyond 2^53 intermediate products is exercised too.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis::aio::MultiplexedConnection;
use tollgate_core::algorithm::{Algorithm, Limit};
use tollgate_core::clock::ManualClock;
use tollgate_core::store::memory::MemoryStore;
use tollgate_core::store::redis::script::{BatchScript, ScriptItem, ScriptReply, Tail};
use tollgate_core::store::{Batch, BatchItem, CommitPolicy, Store};

use crate::common::redis::{RedisServer, command_calls};
use crate::require_redis;

/// A fixed-window call is only compared when the local clock is at least this far from the window's
/// end when the call is sent, so that the Redis clock reading falls in the window the key names.
const BOUNDARY_MARGIN_US: u64 = 6_000;

const POLICIES: [CommitPolicy; 3] = [
    CommitPolicy::Independent,
    CommitPolicy::AllOrNothing,
    CommitPolicy::StopIncrementWhenOverLimit,
];

const PEEK: CommitPolicy = CommitPolicy::Peek;

const REFUND: CommitPolicy = CommitPolicy::Refund;

/// SplitMix64: a seeded, dependency-free generator, so a failure replays with the printed seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }

    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[(self.next() % items.len() as u64) as usize]
    }
}

fn local_now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_micros() as u64
}

/// A limit under test and the name of its key.
#[derive(Debug, Clone)]
struct Spec {
    name: String,
    limit: Limit,
}

/// One item of a step: which spec, what cost, which group.
#[derive(Debug, Clone, Copy)]
struct Req {
    spec: usize,
    cost: u64,
    group: u32,
}

/// A real Redis server and the reference store, kept in step.
struct Harness {
    server: RedisServer,
    conn: MultiplexedConnection,
    script: BatchScript,
    clock: ManualClock,
    memory: MemoryStore,
    /// Prefix of every key; bumped (with a fresh reference store) after a fixed-window boundary race,
    /// whose outcome legitimately differs, so that later steps compare like with like again.
    generation: u32,
    races: u32,
    compared: u32,
    /// Decisions compared, allowed and denied (to see that a timeline exercised both).
    verdicts: [u32; 2],
}

impl Harness {
    async fn start() -> Self {
        let server = RedisServer::start();
        let client = redis::Client::open(server.url()).expect("redis url");
        let conn = client
            .get_multiplexed_async_connection()
            .await
            .expect("connect to redis");
        let clock = ManualClock::new(0);
        let memory = MemoryStore::new(Arc::new(clock.clone()));
        Self {
            server,
            conn,
            script: BatchScript::new(),
            clock,
            memory,
            generation: 0,
            races: 0,
            compared: 0,
            verdicts: [0; 2],
        }
    }

    fn base_key(&self, spec: &Spec) -> String {
        format!("g{}:{}", self.generation, spec.name)
    }

    async fn call(&mut self, items: &[ScriptItem<'_>], policy: CommitPolicy) -> ScriptReply {
        let reply: redis::Value = self
            .script
            .call(&mut self.conn, items, policy, Tail::None)
            .await
            .expect("script runs");
        BatchScript::decode(reply, items.len()).expect("reply decodes")
    }

    /// Runs one batch through the script and the reference store and compares every decision. Returns
    /// false when the step was not compared (fixed-window boundary race).
    async fn step(&mut self, specs: &[Spec], reqs: &[Req], policy: CommitPolicy, context: &str) -> bool {
        // Keep clear of fixed-window boundaries: the script must run in the window its keys name.
        loop {
            let now = local_now_us();
            let wait = reqs
                .iter()
                .map(|r| specs[r.spec].limit)
                .filter(|l| l.algorithm == Algorithm::FixedWindow)
                .map(|l| {
                    let w = l.window_us.max(1);
                    let left = w - now % w;
                    if left < BOUNDARY_MARGIN_US { left + 200 } else { 0 }
                })
                .max()
                .unwrap_or(0);
            if wait == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_micros(wait)).await;
        }
        let local = local_now_us();
        let named: Vec<(String, String, u64)> = reqs
            .iter()
            .map(|r| {
                let spec = &specs[r.spec];
                let base = self.base_key(spec);
                if spec.limit.algorithm == Algorithm::FixedWindow {
                    let w = spec.limit.window_us.max(1);
                    let start = local / w * w;
                    (format!("{base}_{start}"), base, start)
                } else {
                    (base.clone(), base, 0)
                }
            })
            .collect();
        let items: Vec<ScriptItem<'_>> = reqs
            .iter()
            .zip(&named)
            .map(|(r, (key, _, start))| {
                let limit = specs[r.spec].limit;
                let fixed = limit.algorithm == Algorithm::FixedWindow;
                ScriptItem {
                    key,
                    limit,
                    cost: r.cost,
                    group: r.group,
                    window_start_us: *start,
                    ttl_secs: if fixed { 5 } else { 0 },
                }
            })
            .collect();
        let reply = self.call(&items, policy).await;
        let raced = items.iter().any(|i| {
            let w = i.limit.window_us.max(1);
            i.limit.algorithm == Algorithm::FixedWindow && reply.now_us / w * w != i.window_start_us
        });
        if raced {
            self.races += 1;
            self.generation += 1;
            self.memory = MemoryStore::new(Arc::new(self.clock.clone()));
            return false;
        }
        self.clock.set_us(reply.now_us);
        let batch_items: Vec<BatchItem> = reqs
            .iter()
            .zip(&named)
            .map(|(r, (_, base, _))| BatchItem {
                key: base.clone(),
                limit: specs[r.spec].limit,
                cost: r.cost,
                group: r.group,
                go_format: false,
            })
            .collect();
        let expected = self
            .memory
            .apply(&Batch::new(batch_items.clone(), policy))
            .await
            .expect("memory store");
        assert_eq!(
            reply.decisions, expected,
            "{context}: policy {policy:?}, now {}, items {batch_items:#?}",
            reply.now_us
        );
        // The Go-compatible counters hold exactly what the reference state holds.
        for (item, (key, _, _)) in batch_items.iter().zip(&named) {
            if item.limit.algorithm == Algorithm::FixedWindow {
                self.check_counter(key, item, context).await;
            }
        }
        for d in &expected {
            self.verdicts[usize::from(d.allowed)] += 1;
        }
        self.compared += 1;
        true
    }

    /// `GET key` against a zero-cost check of the reference store at the same instant.
    async fn check_counter(&mut self, key: &str, item: &BatchItem, context: &str) {
        let count: Option<u64> = redis::cmd("GET")
            .arg(key)
            .query_async(&mut self.conn)
            .await
            .expect("GET");
        let count = count.unwrap_or(0);
        let peek = BatchItem {
            cost: 0,
            ..item.clone()
        };
        let seen = self
            .memory
            .apply(&Batch::new(vec![peek], CommitPolicy::Independent))
            .await
            .expect("peek")[0];
        if count <= item.limit.requests {
            assert!(
                seen.allowed,
                "{context}: counter {key} = {count}, reference denies a peek"
            );
            assert_eq!(
                seen.remaining,
                item.limit.requests - count,
                "{context}: counter {key}"
            );
        } else {
            assert!(
                !seen.allowed,
                "{context}: counter {key} = {count} > limit, reference allows a peek"
            );
        }
    }

    /// Every key with its value and absolute expiry (`PEXPIRETIME`, ms), sorted by name.
    async fn snapshot(&mut self) -> Vec<(String, Vec<u8>, i64)> {
        let mut keys: Vec<String> = redis::cmd("KEYS")
            .arg("*")
            .query_async(&mut self.conn)
            .await
            .expect("KEYS");
        keys.sort();
        let mut out = Vec::with_capacity(keys.len());
        for key in keys {
            let value: Vec<u8> = redis::cmd("GET")
                .arg(&key)
                .query_async(&mut self.conn)
                .await
                .expect("GET");
            let expires: i64 = redis::cmd("PEXPIRETIME")
                .arg(&key)
                .query_async(&mut self.conn)
                .await
                .expect("PEXPIRETIME");
            out.push((key, value, expires));
        }
        out
    }

    /// Write commands run so far, the script's own included (`INFO commandstats` counts those too).
    fn writes(&self) -> u64 {
        let calls = command_calls(self.server.port);
        ["set", "del", "incrby", "expire", "pexpire", "unlink"]
            .iter()
            .map(|name| calls.get(*name).copied().unwrap_or(0))
            .sum()
    }

    /// Every key in the server has a TTL (`PTTL` is -1 for a key without one; 0 or -2 mean it is
    /// expiring or just expired).
    async fn assert_every_key_has_a_ttl(&mut self) {
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg("*")
            .query_async(&mut self.conn)
            .await
            .expect("KEYS");
        for key in keys {
            let pttl: i64 = redis::cmd("PTTL")
                .arg(&key)
                .query_async(&mut self.conn)
                .await
                .expect("PTTL");
            assert!(pttl >= 0 || pttl == -2, "key {key} has no TTL (PTTL {pttl})");
        }
    }
}

/// A small random limit of `algorithm` (windows of 20-200 ms so that real time matters).
fn small_limit(rng: &mut Rng, algorithm: Algorithm) -> Limit {
    let requests = if rng.chance(5) { 0 } else { rng.range(1, 12) };
    let burst = match algorithm {
        Algorithm::TokenBucket | Algorithm::Gcra => rng.range(requests.max(1), requests.max(1) * 2),
        _ => requests,
    };
    Limit {
        algorithm,
        requests,
        window_us: rng.range(20_000, 200_000),
        burst,
    }
}

/// A huge limit: products such as burst × window exceed 2^53 (the script must stay exact), while the
/// true results stay below 2^53.
fn large_limit(rng: &mut Rng, algorithm: Algorithm) -> Limit {
    let window_us = rng.pick(&[
        86_400_000_000,
        365 * 86_400_000_000,
        3_600_000_001,
        604_800_000_000,
    ]);
    // 4_001 with a burst of 10^6: durations near 2^53 µs, where naive double division is wrong.
    let requests = rng.pick(&[1_000_000, 999_999, 123_457, 86_399, 4_001]);
    let burst = match algorithm {
        Algorithm::TokenBucket | Algorithm::Gcra => rng.pick(&[requests, 1_000_000]),
        _ => requests,
    };
    Limit {
        algorithm,
        requests,
        window_us,
        burst,
    }
}

/// A random cost: often 0 (a peek) or above the limit, sometimes absurd.
fn cost(rng: &mut Rng, limit: &Limit) -> u64 {
    let top = limit.requests.max(limit.burst).max(1);
    match rng.range(0, 99) {
        0..=14 => 0,
        15..=24 => rng.range(top + 1, top * 2 + 1),
        25 => u64::MAX,
        26..=29 => top,
        _ => rng.range(1, (top / 3).max(1)),
    }
}

/// Mostly consuming batches, so that state builds up, with peeks and refunds of it among them.
fn policy(rng: &mut Rng) -> CommitPolicy {
    match rng.range(0, 99) {
        0..=59 => rng.pick(&POLICIES),
        60..=79 => PEEK,
        _ => REFUND,
    }
}

/// 1 to `max` items over `specs` (keys may repeat), groups contiguous and sometimes shared.
fn random_batch(rng: &mut Rng, specs: &[Spec], max: u64) -> Vec<Req> {
    let n = rng.range(1, max);
    let mut group = 0;
    (0..n)
        .map(|i| {
            if i > 0 && rng.chance(50) {
                group += 1;
            }
            let spec = rng.range(0, specs.len() as u64 - 1) as usize;
            Req {
                spec,
                cost: cost(rng, &specs[spec].limit),
                group,
            }
        })
        .collect()
}

/// A random timeline for `algorithms` (each spec picks one), with real sleeps between steps.
async fn timeline(seed: u64, algorithms: &[Algorithm], steps: usize, large: bool) {
    timeline_on(BatchScript::new(), seed, algorithms, steps, large).await;
}

/// [`timeline`] through `script` (the function, or the EVAL fallback).
async fn timeline_on(script: BatchScript, seed: u64, algorithms: &[Algorithm], steps: usize, large: bool) {
    let mut rng = Rng(seed);
    let mut h = Harness::start().await;
    h.script = script;
    let specs: Vec<Spec> = (0..4)
        .map(|i| {
            let algorithm = rng.pick(algorithms);
            let limit = if large {
                large_limit(&mut rng, algorithm)
            } else {
                small_limit(&mut rng, algorithm)
            };
            Spec {
                name: format!("{}{i}", algorithm.as_str()),
                limit,
            }
        })
        .collect();
    let max_window = specs
        .iter()
        .map(|s| s.limit.window_us)
        .max()
        .unwrap_or(1)
        .min(200_000);
    for step in 0..steps {
        let reqs = random_batch(&mut rng, &specs, 4);
        let policy = policy(&mut rng);
        let context = format!("seed {seed} step {step} specs {specs:?}");
        h.step(&specs, &reqs, policy, &context).await;
        if rng.chance(70) {
            tokio::time::sleep(Duration::from_micros(rng.range(0, max_window / 3))).await;
        }
    }
    h.assert_every_key_has_a_ttl().await;
    eprintln!(
        "seed {seed}: {} steps compared, {} races, {} denied, {} allowed",
        h.compared, h.races, h.verdicts[0], h.verdicts[1]
    );
    assert!(
        h.verdicts.iter().all(|&n| n > 0),
        "seed {seed}: verdicts {:?}",
        h.verdicts
    );
    assert!(
        h.compared as usize >= steps * 3 / 4,
        "seed {seed}: only {} of {steps} steps compared ({} boundary races)",
        h.compared,
        h.races
    );
}

/// Seeds are fixed so that a failure replays; `TOLLGATE_PARITY_SEED=n` shifts them all to explore more.
fn seed(base: u64) -> u64 {
    let shift: u64 = std::env::var("TOLLGATE_PARITY_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    base.wrapping_mul(1_000)
        .wrapping_add(shift.wrapping_mul(1_000_003))
}

async fn algorithm_parity(algorithm: Algorithm, seed: u64) {
    for round in 0..3 {
        timeline(seed + round, &[algorithm], 60, false).await;
    }
    timeline(seed + 100, &[algorithm], 40, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixed_window_matches_rust() {
    require_redis!();
    algorithm_parity(Algorithm::FixedWindow, seed(0xF1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sliding_window_matches_rust() {
    require_redis!();
    algorithm_parity(Algorithm::SlidingWindow, seed(0x51)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sliding_log_matches_rust() {
    require_redis!();
    algorithm_parity(Algorithm::SlidingLog, seed(0x52)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_bucket_matches_rust() {
    require_redis!();
    algorithm_parity(Algorithm::TokenBucket, seed(0x7B)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gcra_matches_rust() {
    require_redis!();
    algorithm_parity(Algorithm::Gcra, seed(0x6C)).await;
}

/// Every policy, every algorithm mixed in one batch, duplicate keys, shared groups.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_batches_match_rust_under_every_policy() {
    require_redis!();
    timeline(seed(0xAB), &Algorithm::ALL, 120, false).await;
    timeline(seed(0xAC), &Algorithm::ALL, 40, true).await;
}

/// One spec per algorithm, all with the same small limit over a minute (no real-time effects).
fn one_spec_per_algorithm() -> Vec<Spec> {
    Algorithm::ALL
        .iter()
        .map(|&algorithm| Spec {
            name: algorithm.as_str().to_owned(),
            limit: Limit {
                algorithm,
                requests: 5,
                window_us: 60_000_000,
                burst: 5,
            },
        })
        .collect()
}

fn req(spec: usize, cost: u64, group: u32) -> Req {
    Req { spec, cost, group }
}

/// Hand-written batches over specs `a` and `b`: the same key twice (the second sees the first), a
/// denial in a shared group, a zero-cost item, a key filled to its limit then asked for more.
fn duplicate_key_batches(a: usize, b: usize) -> [Vec<Req>; 4] {
    [
        vec![req(a, 3, 0), req(a, 2, 0), req(b, 1, 1)],
        vec![req(a, 1, 0), req(b, 9, 0), req(a, 0, 1)],
        vec![req(b, 2, 0), req(a, 4, 1), req(b, 4, 1)],
        vec![req(a, 5, 0), req(a, 1, 0)],
    ]
}

/// Runs every [`duplicate_key_batches`] of algorithm `a` (and the next one) through `policies` in turn,
/// each batch through all of them before the next batch, comparing every step field by field.
async fn step_duplicate_key_batches(h: &mut Harness, specs: &[Spec], a: usize, policies: &[CommitPolicy]) {
    let b = (a + 1) % specs.len();
    for (i, reqs) in duplicate_key_batches(a, b).iter().enumerate() {
        for &policy in policies {
            let context = format!("{policy:?} algorithm {a} batch {i}");
            assert!(
                h.step(specs, reqs, policy, &context).await,
                "{context}: raced a 60 s window"
            );
        }
    }
}

/// Hand-written batches hitting each settling rule with duplicate keys, compared field by field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settling_with_duplicate_keys_matches_rust() {
    require_redis!();
    let mut h = Harness::start().await;
    let specs = one_spec_per_algorithm();
    for policy in POLICIES {
        for a in 0..specs.len() {
            step_duplicate_key_batches(&mut h, &specs, a, &[policy]).await;
        }
        h.generation += 1;
    }
    h.assert_every_key_has_a_ttl().await;
}

/// The same batches consumed, peeked at and refunded in turn: repeated keys see the earlier items of a
/// peek or refund, and refunds land on the state consumptions left, compared field by field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peeks_and_refunds_with_duplicate_keys_match_rust() {
    require_redis!();
    let mut h = Harness::start().await;
    let specs = one_spec_per_algorithm();
    let rounds = [
        CommitPolicy::Independent,
        PEEK,
        REFUND,
        PEEK,
        CommitPolicy::AllOrNothing,
        REFUND,
        REFUND,
    ];
    for a in 0..specs.len() {
        step_duplicate_key_batches(&mut h, &specs, a, &rounds).await;
        h.generation += 1;
    }
    h.assert_every_key_has_a_ttl().await;
}

/// The fixed window writes envoyproxy/ratelimit's key: a plain counter bumped with INCRBY (denied
/// requests included), expiring after the TTL the caller passes; peeks write nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixed_window_writes_the_go_key() {
    require_redis!();
    let mut h = Harness::start().await;
    let limit = Limit {
        algorithm: Algorithm::FixedWindow,
        requests: 3,
        window_us: 60_000_000,
        burst: 3,
    };
    let start = local_now_us() / 60_000_000 * 60_000_000;
    let key = format!("domain_key_value_{}", start / 1_000_000);
    let item = |cost| ScriptItem {
        key: &key,
        limit,
        cost,
        group: 0,
        window_start_us: start,
        ttl_secs: 67,
    };
    let reply = h.call(&[item(0)], CommitPolicy::Independent).await;
    assert!(reply.decisions[0].allowed);
    assert_eq!(
        h.server.cli(&["EXISTS", &key]).trim(),
        "0",
        "a peek writes nothing"
    );
    let mut total = 0;
    for cost in [1, 2, 4, 1] {
        let reply = h.call(&[item(cost)], CommitPolicy::Independent).await;
        total += cost;
        assert_eq!(reply.decisions[0].allowed, total <= 3, "after {total}");
        assert_eq!(
            h.server.cli(&["GET", &key]).trim(),
            total.to_string(),
            "denied requests count too"
        );
        let end = start + 60_000_000;
        if reply.now_us < end {
            assert_eq!(reply.decisions[0].reset_after_us, end - reply.now_us);
        }
    }
    let ttl: u64 = h.server.cli(&["TTL", &key]).trim().parse().expect("TTL");
    assert!((66..=67).contains(&ttl), "TTL {ttl}");
    assert_eq!(h.server.cli(&["TYPE", &key]).trim(), "string");
    assert_eq!(
        h.server.cli(&["OBJECT", "ENCODING", &key]).trim(),
        "int",
        "a plain integer, as Go stores it"
    );
}

/// A peek writes nothing, whatever it decides: no key is created, changed or given a new expiry, and
/// no write command runs at all, for every algorithm, allowed or denied, repeated keys included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peek_writes_nothing() {
    require_redis!();
    let mut h = Harness::start().await;
    let specs = one_spec_per_algorithm();
    let every = |cost: u64| -> Vec<Req> {
        (0..specs.len())
            .flat_map(|s| [req(s, cost, 0), req(s, cost, 1)])
            .collect()
    };
    assert!(
        h.step(&specs, &every(2), CommitPolicy::Independent, "consume")
            .await
    );
    let before = h.snapshot().await;
    assert_eq!(before.len(), specs.len());
    let writes = h.writes();
    assert!(writes >= 5, "the consumption wrote, and commandstats saw it");
    for cost in [0, 1, 2, 9] {
        assert!(h.step(&specs, &every(cost), PEEK, &format!("peek {cost}")).await);
    }
    // Keys nobody consumed yet: decided as fresh, and still not created.
    h.generation += 1;
    assert!(h.step(&specs, &every(3), PEEK, "peek at absent keys").await);
    assert_eq!(h.snapshot().await, before);
    assert_eq!(h.writes(), writes);
}

/// A refund never writes a key without state: absent keys stay absent, a key holding another
/// algorithm's state is left alone. A refund that leaves no state deletes the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_writes_nothing_without_state() {
    require_redis!();
    let mut h = Harness::start().await;
    let specs = one_spec_per_algorithm();
    let every = |cost: u64| -> Vec<Req> { (0..specs.len()).map(|s| req(s, cost, s as u32)).collect() };
    assert!(h.step(&specs, &every(2), REFUND, "refund absent keys").await);
    assert_eq!(h.server.cli(&["DBSIZE"]).trim(), "0");
    assert_eq!(h.writes(), 0);

    let item = |algorithm: Algorithm, cost: u64| ScriptItem {
        key: "shared",
        limit: Limit {
            algorithm,
            requests: 5,
            window_us: 60_000_000,
            burst: 5,
        },
        cost,
        group: 0,
        window_start_us: 0,
        ttl_secs: 0,
    };
    h.call(&[item(Algorithm::Gcra, 2)], CommitPolicy::Independent)
        .await;
    let before = h.snapshot().await;
    let refund = h.call(&[item(Algorithm::TokenBucket, 2)], REFUND).await;
    assert_eq!(refund.decisions[0].remaining, 5, "a fresh bucket's");
    assert_eq!(
        h.snapshot().await,
        before,
        "another algorithm's state is not this one's"
    );

    // Giving back everything consumed leaves no state, and so no key.
    assert!(
        h.step(&specs, &every(2), CommitPolicy::Independent, "consume")
            .await
    );
    assert!(h.step(&specs, &every(2), REFUND, "refund all").await);
    let left: Vec<String> = h.snapshot().await.into_iter().map(|(key, _, _)| key).collect();
    let fixed = h.base_key(&specs[0]);
    assert!(
        left.iter().all(|key| key == "shared" || key.starts_with(&fixed)),
        "only the foreign key and the fixed-window counter are left: {left:?}"
    );
}

/// A fixed-window refund lowers envoyproxy/ratelimit's counter in place and keeps its TTL (so a Go
/// replica's INCRBY and EXPIRE go on working), saturates at 0, and never creates the counter of a
/// window that has none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixed_window_refund_keeps_the_go_counter_and_its_ttl() {
    require_redis!();
    let mut h = Harness::start().await;
    let limit = Limit {
        algorithm: Algorithm::FixedWindow,
        requests: 3,
        window_us: 60_000_000,
        burst: 3,
    };
    let start = local_now_us() / 60_000_000 * 60_000_000;
    let key = format!("domain_key_value_{}", start / 1_000_000);
    let next_key = format!("domain_key_value_{}", start / 1_000_000 + 60);
    let consume = ScriptItem {
        key: &key,
        limit,
        cost: 2,
        group: 0,
        window_start_us: start,
        ttl_secs: 67,
    };
    h.call(&[consume], CommitPolicy::Independent).await;
    let expires = h.server.cli(&["PEXPIRETIME", &key]);
    // Long enough for a fresh `EX 67` to land on another millisecond.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let reply = h.call(&[ScriptItem { cost: 1, ..consume }], REFUND).await;
    assert_eq!(
        (reply.decisions[0].allowed, reply.decisions[0].remaining),
        (true, 2)
    );
    assert_eq!(h.server.cli(&["GET", &key]).trim(), "1");
    assert_eq!(h.server.cli(&["PEXPIRETIME", &key]), expires, "KEEPTTL");
    assert_eq!(h.server.cli(&["OBJECT", "ENCODING", &key]).trim(), "int");
    let reply = h.call(&[ScriptItem { cost: 5, ..consume }], REFUND).await;
    assert_eq!(reply.decisions[0].remaining, 3);
    assert_eq!(h.server.cli(&["GET", &key]).trim(), "0", "saturated at 0");
    assert_eq!(
        h.server.cli(&["INCRBY", &key, "1"]).trim(),
        "1",
        "still Go's counter"
    );
    let next_window = ScriptItem {
        key: &next_key,
        window_start_us: start + 60_000_000,
        ..consume
    };
    h.call(&[next_window], REFUND).await;
    assert_eq!(h.server.cli(&["EXISTS", &next_key]).trim(), "0", "never created");
}

/// After `FUNCTION FLUSH` (or a restart without persistence) the next call loads the library again
/// and succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_function_is_loaded_after_function_flush() {
    require_redis!();
    let mut h = Harness::start().await;
    let limit = Limit {
        algorithm: Algorithm::Gcra,
        requests: 10,
        window_us: 1_000_000,
        burst: 10,
    };
    let item = ScriptItem {
        key: "k",
        limit,
        cost: 1,
        group: 0,
        window_start_us: 0,
        ttl_secs: 0,
    };
    let function = h.script.function().to_owned();
    assert_eq!(
        h.server.cli(&["FCALL", &function, "0", "0", ""]).trim(),
        "ERR Function not found"
    );
    h.call(&[item], CommitPolicy::Independent).await;
    assert!(h.server.cli(&["FUNCTION", "LIST"]).contains(&function));
    assert_eq!(h.server.cli(&["FUNCTION", "FLUSH"]).trim(), "OK");
    assert!(!h.server.cli(&["FUNCTION", "LIST"]).contains(&function));
    let reply = h.call(&[item], CommitPolicy::Independent).await;
    assert_eq!(
        reply.decisions[0].remaining, 8,
        "the second call saw the first one's state"
    );
    assert!(h.server.cli(&["FUNCTION", "LIST"]).contains(&function));
    assert_eq!(
        h.server.cli(&["SCRIPT", "EXISTS", h.script.sha()]).trim(),
        "0",
        "no EVAL script was needed"
    );
}

/// The EVAL fallback (Redis < 7.0) decides like the function: random mixed timelines through
/// `EVALSHA`, small and huge limits, against the reference store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eval_fallback_matches_rust() {
    require_redis!();
    timeline_on(BatchScript::eval_only(), seed(31), &Algorithm::ALL, 60, false).await;
    timeline_on(BatchScript::eval_only(), seed(32), &Algorithm::ALL, 40, true).await;
}

/// On the EVAL fallback, after `SCRIPT FLUSH` (or a restart) the next invocation reloads the script
/// transparently.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn noscript_is_handled_after_script_flush() {
    require_redis!();
    let mut h = Harness::start().await;
    h.script = BatchScript::eval_only();
    let limit = Limit {
        algorithm: Algorithm::Gcra,
        requests: 10,
        window_us: 1_000_000,
        burst: 10,
    };
    let item = ScriptItem {
        key: "k",
        limit,
        cost: 1,
        group: 0,
        window_start_us: 0,
        ttl_secs: 0,
    };
    h.call(&[item], CommitPolicy::Independent).await;
    let sha = h.script.sha().to_owned();
    assert_eq!(h.server.cli(&["SCRIPT", "EXISTS", &sha]).trim(), "1");
    assert_eq!(h.server.cli(&["SCRIPT", "FLUSH"]).trim(), "OK");
    assert_eq!(h.server.cli(&["SCRIPT", "EXISTS", &sha]).trim(), "0");
    let reply = h.call(&[item], CommitPolicy::Independent).await;
    assert_eq!(
        reply.decisions[0].remaining, 8,
        "the second call saw the first one's state"
    );
    assert_eq!(h.server.cli(&["SCRIPT", "EXISTS", &sha]).trim(), "1");
}

/// Every key the script writes has a TTL derived from the algorithm's expiry, and keys whose state
/// stops mattering disappear by themselves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_written_key_has_a_ttl_and_expires() {
    require_redis!();
    let mut h = Harness::start().await;
    let mut keys = HashMap::new();
    for algorithm in Algorithm::ALL {
        let limit = Limit {
            algorithm,
            requests: 4,
            // Long enough that no key can expire while the checks below spawn redis-cli (a 50 ms
            // window made this test fail about one run in ten).
            window_us: 500_000,
            burst: 4,
        };
        let start = local_now_us() / 500_000 * 500_000;
        let key = format!("ttl:{}", algorithm.as_str());
        let item = ScriptItem {
            key: &key,
            limit,
            cost: 2,
            group: 0,
            window_start_us: start,
            ttl_secs: 1,
        };
        h.call(&[item], CommitPolicy::Independent).await;
        keys.insert(algorithm, key);
    }
    for (algorithm, key) in &keys {
        let pttl: i64 = h.server.cli(&["PTTL", key]).trim().parse().expect("PTTL");
        // Expiry: 1 s for the Go counter; at most two 500 ms windows (+1 ms rounding) for the others.
        let max = if *algorithm == Algorithm::FixedWindow {
            1_000
        } else {
            1_001
        };
        assert!(pttl > 0 && pttl <= max, "{algorithm:?}: PTTL {pttl}");
    }
    h.assert_every_key_has_a_ttl().await;
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    for (algorithm, key) in &keys {
        if *algorithm != Algorithm::FixedWindow {
            assert_eq!(
                h.server.cli(&["EXISTS", key]).trim(),
                "0",
                "{algorithm:?} state outlived its expiry"
            );
        }
    }
}

/// A sliding log longer than the script packs or unpacks in one struct call (1,000 entries) is read
/// and written whole: every one of 1,500 admissions counts, and a refund gives back from the newest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sliding_log_of_more_than_one_chunk_round_trips() {
    require_redis!();
    let mut h = Harness::start().await;
    let limit = Limit {
        algorithm: Algorithm::SlidingLog,
        requests: 3_000,
        window_us: 3_600_000_000,
        burst: 3_000,
    };
    let item = |cost| ScriptItem {
        key: "long_log",
        limit,
        cost,
        group: 0,
        window_start_us: 0,
        ttl_secs: 0,
    };
    for admitted in 1..=1_500_u64 {
        let reply = h.call(&[item(1)], CommitPolicy::Independent).await;
        assert!(reply.decisions[0].allowed, "admission {admitted}");
        assert_eq!(
            reply.decisions[0].remaining,
            3_000 - admitted,
            "admission {admitted}"
        );
    }
    // One entry per call unless two calls read the same Redis µs: well over one chunk either way.
    let bytes: usize = h
        .server
        .cli(&["STRLEN", "long_log"])
        .trim()
        .parse()
        .expect("STRLEN");
    assert!(bytes > 9 + 16 * 1_200, "{bytes} bytes");
    let refund = h.call(&[item(5)], REFUND).await;
    assert_eq!(refund.decisions[0].remaining, 1_505);
    let peek = h.call(&[item(0)], PEEK).await;
    assert_eq!(peek.decisions[0].remaining, 1_505);
    assert_eq!(
        h.server
            .cli(&["STRLEN", "long_log"])
            .trim()
            .parse::<usize>()
            .expect("STRLEN"),
        bytes - 5 * 16,
        "the five newest entries (cost 1 each) are gone"
    );
}

/// Logs of up to 100 entries, with costs of 1 to 3, and denials whose retry hint lands anywhere in the
/// log: the script sums and searches a log eight entries at a time, and every decision must still be
/// the reference store's. The first log's window outlasts the test, so it grows however slow the host
/// is; the second's entries expire under real time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_sliding_logs_match_rust() {
    require_redis!();
    let mut rng = Rng(seed(0x5106));
    let mut h = Harness::start().await;
    let specs: Vec<Spec> = [(100, 60_000_000), (37, 500_000)]
        .into_iter()
        .enumerate()
        .map(|(i, (requests, window_us))| Spec {
            name: format!("long_log{i}"),
            limit: Limit {
                algorithm: Algorithm::SlidingLog,
                requests,
                window_us,
                burst: requests,
            },
        })
        .collect();
    let mut longest = 0;
    for step in 0..400 {
        // Peeks ask for a lot, so that their retry hints land anywhere in a log that admissions of
        // 1 to 3 keep long.
        let policy = match rng.range(0, 99) {
            0..=79 => CommitPolicy::Independent,
            80..=94 => PEEK,
            _ => REFUND,
        };
        let reqs: Vec<Req> = (0..rng.range(1, 3))
            .map(|group| {
                let spec = rng.range(0, 1) as usize;
                let top = specs[spec].limit.requests;
                let cost = if policy == PEEK {
                    rng.range(0, top + 2)
                } else {
                    rng.range(1, 3)
                };
                req(spec, cost, group as u32)
            })
            .collect();
        h.step(&specs, &reqs, policy, &format!("step {step}")).await;
        let bytes: usize = h
            .server
            .cli(&["STRLEN", "g0:long_log0"])
            .trim()
            .parse()
            .unwrap_or(0);
        longest = longest.max(bytes.saturating_sub(9) / 16);
        tokio::time::sleep(Duration::from_micros(rng.range(0, 3_000))).await;
    }
    eprintln!(
        "longest log {longest} entries, verdicts (denied, allowed) {:?}",
        h.verdicts
    );
    assert!(
        longest >= 32,
        "the log stayed short ({longest} entries): the test misses its point"
    );
    assert!(
        h.verdicts.iter().all(|&n| n > 50),
        "verdicts (denied, allowed) {:?}",
        h.verdicts
    );
}

/// A log at its limit for many windows keeps its size bounded: expired entries are cut once they are a
/// quarter of it, so it never holds more than about 4/3 of `requests` entries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sliding_log_cuts_its_expired_entries() {
    require_redis!();
    let mut h = Harness::start().await;
    let limit = Limit {
        algorithm: Algorithm::SlidingLog,
        requests: 12,
        window_us: 60_000,
        burst: 12,
    };
    let item = ScriptItem {
        key: "busy_log",
        limit,
        cost: 1,
        group: 0,
        window_start_us: 0,
        ttl_secs: 0,
    };
    let (mut admitted, mut longest) = (0, 0);
    for _ in 0..200 {
        let reply = h.call(&[item], CommitPolicy::Independent).await;
        admitted += u32::from(reply.decisions[0].allowed);
        let bytes: usize = h
            .server
            .cli(&["STRLEN", "busy_log"])
            .trim()
            .parse()
            .expect("STRLEN");
        // The log expires with its window: on a busy machine it may be gone by the time it is read.
        longest = longest.max(bytes.saturating_sub(9) / 16);
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    // 200 calls over several windows: far more admitted than one log can hold.
    assert!(admitted > 40, "admitted {admitted}");
    assert!(longest <= 12 * 4 / 3 + 1, "a log of {longest} entries");
}

/// Malformed arguments are an error reply, never a crashed or half-applied script.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_arguments_are_rejected() {
    require_redis!();
    let mut h = Harness::start().await;
    let function = h.script.function().to_owned();
    let reply = h
        .script
        .call(&mut h.conn, &[], CommitPolicy::Independent, Tail::None)
        .await
        .expect("empty batch (loads the library)");
    assert_eq!(
        BatchScript::decode(reply, 0).expect("reply decodes").decisions,
        []
    );
    // Unsigned fields: a negative, fractional, NaN or infinite value cannot be written at all.
    let words = |fields: &[u64]| -> Vec<u8> { fields.iter().flat_map(|f| f.to_le_bytes()).collect() };
    let limit = words(&[3, 1, 1, 1]);
    let item = words(&[1, 1, 0, 0, 0]);
    let cases: Vec<(&str, Vec<Vec<u8>>)> = vec![
        ("no items argument", vec![b"0".to_vec(), limit.clone()]),
        (
            "policy out of range",
            vec![b"7".to_vec(), limit.clone(), item.clone()],
        ),
        (
            "items too short",
            vec![b"0".to_vec(), limit.clone(), item[..39].to_vec()],
        ),
        (
            "limits too short",
            vec![b"0".to_vec(), limit[..31].to_vec(), item.clone()],
        ),
        (
            "too many arguments",
            vec![b"0".to_vec(), limit.clone(), item.clone(), b"x".to_vec()],
        ),
        (
            "unknown algorithm",
            vec![b"0".to_vec(), words(&[9, 1, 1, 1]), item.clone()],
        ),
        (
            "algorithm beyond 2^53",
            vec![b"0".to_vec(), words(&[u64::MAX, 1, 1, 1]), item.clone()],
        ),
        (
            "an item naming no limit",
            vec![b"0".to_vec(), limit.clone(), words(&[2, 1, 0, 0, 0])],
        ),
        (
            "an item naming limit 0",
            vec![b"0".to_vec(), limit.clone(), words(&[0, 1, 0, 0, 0])],
        ),
    ];
    for (case, args) in cases {
        let mut fcall = redis::cmd("FCALL");
        fcall.arg(&function).arg(1).arg("k");
        for arg in &args {
            fcall.arg(arg.as_slice());
        }
        let error = fcall
            .query_async::<redis::Value>(&mut h.conn)
            .await
            .expect_err(case);
        assert!(error.to_string().contains("tollgate"), "{case}: {error}");
    }
    assert_eq!(h.server.cli(&["DBSIZE"]).trim(), "0");
}

/// The script's exact-arithmetic helpers (`lua/exact.lua`) agree with `u128` arithmetic on operands
/// whose products are far beyond 2^53 (where a plain double division would be off).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exact_helpers_match_u128() {
    require_redis!();
    let mut h = Harness::start().await;
    let probe = redis::Script::new(concat!(
        include_str!("../../core/lua/exact.lua"),
        r"
local out = {}
for i = 1, #ARGV, 4 do
  local a, b, c, e = tonumber(ARGV[i]), tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3])
  local q, r = muldiv(a, b, c)
  local q2, r2 = muldiv_add(a, b, e, c)
  out[#out + 1] = int_str(q) .. ' ' .. int_str(r) .. ' ' .. int_str(q2) .. ' ' .. int_str(r2) .. ' '
    .. int_str(ceil_sub(a, b, e, c))
end
return out
"
    ));
    let mut rng = Rng(0xE7AC7);
    const MAX: u64 = 1 << 52;
    for _ in 0..20 {
        let mut cases = Vec::new();
        let mut invocation = probe.prepare_invoke();
        for _ in 0..100 {
            // Operand sizes vary so that small, mixed and huge products all occur.
            let bits = rng.range(1, 52);
            let a = rng.next() % (1 << bits);
            let bits = rng.range(1, 52);
            let b = rng.range(1, (1 << bits).min(MAX - 1));
            let floor_c = ((u128::from(a) * u128::from(b)) >> 52) as u64 + 1;
            let c = rng.range(floor_c.min(MAX - 1), MAX - 1).max(1);
            let e = rng.next() % b;
            invocation.arg(a).arg(b).arg(c).arg(e);
            cases.push((a, b, c, e));
        }
        let got: Vec<String> = invocation.invoke_async(&mut h.conn).await.expect("probe runs");
        for ((a, b, c, e), got) in cases.into_iter().zip(got) {
            let (a, b, c, e) = (u128::from(a), u128::from(b), u128::from(c), u128::from(e));
            let product = a * b;
            let expected = format!(
                "{} {} {} {} {}",
                product / c,
                product % c,
                (product + e) / c,
                (product + e) % c,
                (product - e.min(product)).div_ceil(c)
            );
            assert_eq!(got, expected, "a {a} b {b} c {c} e {e}");
        }
    }
}
