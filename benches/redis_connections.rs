//! How should the Redis store talk to a single node: one redis-rs multiplexed `ConnectionManager`, a few
//! of them round-robin, or a bb8 checkout pool? This measures all of them on Tollgate's real workload:
//! one `EVALSHA` of the batch script per decision (one token-bucket item, a limit that always allows,
//! keys cycling over 10,000 values), against a `redis-server` this binary starts on a free loopback port.
//!
//! Run with `cargo bench --bench redis_connections` (needs `redis-server` on `PATH`). For each variant and
//! concurrency it prints successful calls per second, p50/p99/max latency over all calls (failed ones
//! included, since the caller waited for them too) and errors; then, per variant, what happens when
//! Redis is killed (time until the first call fails) and restarted (time until calls succeed again).
//! The load generator shares the machine with `redis-server`, as Tollgate would on a small node.
//! Arguments other than `--bench` select variants by name, e.g. `-- manager` or `-- "bb8 max"`.
//!
//! The variants:
//! - `manager xN`: N `ConnectionManager`s used round-robin, configured as the store configures them
//!   (`core/src/store/redis/mod.rs`: connection and response timeouts of 1 s, one retry), each call taking
//!   a clone, as `RedisStore::apply` does. `x2` is the current default (`REDIS_POOL_SIZE`).
//! - `bb8 max N`: a bb8 pool over redis's own bb8 manager (`redis::Client`, handing out
//!   `MultiplexedConnection`s), tuned as the ecosystem notes say it must be: `test_on_check_out(false)`,
//!   `connection_timeout(100 ms)`, `max_size` N. A connection is held for the whole call, as a checkout
//!   pool is used.
//! - `bb8 defaults`: `Pool::builder()` untouched (PING on every checkout, 30 s checkout timeout,
//!   `max_size` 10), to show what the defaults cost.

// A bench binary with `harness = false` is a `main` with helpers; the crate's `missing_docs` lint is
// meant for the library's public API, not for these private items.
#![allow(missing_docs)]

#[path = "support/redis_server.rs"]
mod redis_server;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis_server::RedisServer;
use tollgate_core::algorithm::{Algorithm, Limit};
use tollgate_core::store::CommitPolicy;
use tollgate_core::store::redis::script::{BatchScript, ScriptItem, Tail};

/// Distinct keys cycled through.
const KEYS: usize = 10_000;
/// Tasks issuing calls back to back.
const CONCURRENCY: [usize; 3] = [1, 16, 64];
/// Measured time per variant and concurrency.
const MEASURE: Duration = Duration::from_secs(3);
/// Unmeasured calls before each measurement (connections made, script loaded, caches warm).
const WARM_UP: Duration = Duration::from_millis(300);
/// A throughput-phase call slower than this counts as an error (nothing should come near it).
const CALL_CAP: Duration = Duration::from_secs(1);
/// Resilience: longest we wait for the first call after the kill to come back.
const FAIL_CAP: Duration = Duration::from_secs(3);
/// Resilience: longest we wait for a call to succeed after the restart.
const RECOVER_CAP: Duration = Duration::from_secs(5);
/// Resilience: Redis stays down at least this long.
const OUTAGE: Duration = Duration::from_millis(500);

#[derive(Debug, Clone, Copy)]
enum Kind {
    Managers(usize),
    Bb8Tuned(u32),
    Bb8Defaults,
}

impl Kind {
    fn name(self) -> String {
        match self {
            Kind::Managers(n) => format!("manager x{n}"),
            Kind::Bb8Tuned(n) => format!("bb8 max {n}"),
            Kind::Bb8Defaults => "bb8 defaults".into(),
        }
    }
}

const VARIANTS: [Kind; 6] = [
    Kind::Managers(1),
    Kind::Managers(2),
    Kind::Managers(4),
    Kind::Bb8Tuned(4),
    Kind::Bb8Tuned(16),
    Kind::Bb8Defaults,
];

/// One way of getting a connection for a call.
enum Client {
    Managers {
        pool: Vec<ConnectionManager>,
        next: AtomicUsize,
    },
    Pool(bb8::Pool<redis::Client>),
}

impl Client {
    async fn connect(kind: Kind, url: &str) -> Self {
        let client = redis::Client::open(url).expect("valid redis URL");
        match kind {
            Kind::Managers(n) => {
                // As RedisStore::connect with the default settings (REDIS_TIMEOUT 1 s, deadline 10 ms).
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(Duration::from_secs(1)))
                    .set_response_timeout(Some(Duration::from_secs(1)))
                    .set_number_of_retries(1);
                let mut pool = Vec::with_capacity(n);
                for _ in 0..n {
                    pool.push(
                        ConnectionManager::new_with_config(client.clone(), config.clone())
                            .await
                            .expect("connect a ConnectionManager"),
                    );
                }
                Client::Managers {
                    pool,
                    next: AtomicUsize::new(0),
                }
            }
            Kind::Bb8Tuned(max) => Client::Pool(
                bb8::Pool::builder()
                    .max_size(max)
                    .test_on_check_out(false)
                    .connection_timeout(Duration::from_millis(100))
                    .build(client)
                    .await
                    .expect("build a bb8 pool"),
            ),
            Kind::Bb8Defaults => Client::Pool(
                bb8::Pool::builder()
                    .build(client)
                    .await
                    .expect("build a bb8 pool"),
            ),
        }
    }

    /// One decision: the batch script for one always-allowing token-bucket item on `key`.
    async fn call(&self, script: &BatchScript, key: &str) -> Result<(), String> {
        let limit = Limit {
            algorithm: Algorithm::TokenBucket,
            requests: 1_000_000_000,
            window_us: 1_000_000,
            burst: 1_000_000_000,
        };
        let item = ScriptItem {
            key,
            limit,
            cost: 1,
            group: 0,
            window_start_us: 0,
            ttl_secs: 0,
        };
        let items = [item];
        let invocation = script.invocation(&items, CommitPolicy::Independent, Tail::None);
        let reply = match self {
            Client::Managers { pool, next } => {
                let mut conn = pool[next.fetch_add(1, Ordering::Relaxed) % pool.len()].clone();
                invocation.invoke_async::<redis::Value>(&mut conn).await
            }
            Client::Pool(pool) => {
                let mut conn = pool.get().await.map_err(|e| format!("checkout: {e}"))?;
                invocation.invoke_async::<redis::Value>(&mut *conn).await
            }
        }
        .map_err(|e| e.to_string())?;
        let decoded = BatchScript::decode(reply, 1).map_err(|e| e.to_string())?;
        match decoded.decisions.first() {
            Some(decision) if decision.allowed => Ok(()),
            other => Err(format!("unexpected decision {other:?}")),
        }
    }
}

struct Measured {
    ops_per_sec: f64,
    p50_us: f64,
    p99_us: f64,
    max_us: f64,
    errors: usize,
    first_error: Option<String>,
}

/// Runs `concurrency` tasks calling back to back: a warm-up, then `MEASURE` of recorded calls.
async fn measure(
    client: &Arc<Client>,
    script: &Arc<BatchScript>,
    keys: &Arc<Vec<String>>,
    concurrency: usize,
) -> Measured {
    let recording = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let tasks: Vec<_> = (0..concurrency)
        .map(|task| {
            let (client, script, keys) = (Arc::clone(client), Arc::clone(script), Arc::clone(keys));
            let (recording, stop) = (Arc::clone(&recording), Arc::clone(&stop));
            tokio::spawn(async move {
                let mut latencies_ns: Vec<u64> = Vec::with_capacity(1 << 16);
                let mut errors = 0usize;
                let mut first_error = None;
                // Tasks start at different points of the key space so they do not move in lockstep.
                let mut at = task * (KEYS / concurrency.max(1));
                while !stop.load(Ordering::Relaxed) {
                    let key = &keys[at % KEYS];
                    at += 1;
                    let started = Instant::now();
                    let result = tokio::time::timeout(CALL_CAP, client.call(&script, key)).await;
                    let took = started.elapsed();
                    if !recording.load(Ordering::Relaxed) {
                        continue;
                    }
                    // Failed calls count in the latencies too: a decision that waited 100 ms for a
                    // checkout and then failed was still 100 ms of waiting for the caller.
                    latencies_ns.push(u64::try_from(took.as_nanos()).unwrap_or(u64::MAX));
                    match result {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => {
                            errors += 1;
                            first_error.get_or_insert(e);
                        }
                        Err(_) => {
                            errors += 1;
                            first_error.get_or_insert_with(|| format!("no reply within {CALL_CAP:?}"));
                        }
                    }
                }
                (latencies_ns, errors, first_error)
            })
        })
        .collect();
    tokio::time::sleep(WARM_UP).await;
    recording.store(true, Ordering::Relaxed);
    let started = Instant::now();
    tokio::time::sleep(MEASURE).await;
    recording.store(false, Ordering::Relaxed);
    let elapsed = started.elapsed();
    stop.store(true, Ordering::Relaxed);

    let mut all = Vec::new();
    let mut errors = 0;
    let mut first_error = None;
    for task in tasks {
        let (latencies, task_errors, task_first) = task.await.expect("load task panicked");
        all.extend(latencies);
        errors += task_errors;
        if first_error.is_none() {
            first_error = task_first;
        }
    }
    all.sort_unstable();
    let percentile_us = |p: f64| -> f64 {
        if all.is_empty() {
            return f64::NAN;
        }
        let rank = ((p * all.len() as f64).ceil() as usize).clamp(1, all.len());
        all[rank - 1] as f64 / 1_000.0
    };
    let calls = all.len();
    Measured {
        ops_per_sec: calls.saturating_sub(errors) as f64 / elapsed.as_secs_f64(),
        p50_us: percentile_us(0.50),
        p99_us: percentile_us(0.99),
        max_us: percentile_us(1.0),
        errors,
        first_error,
    }
}

struct Resilience {
    /// How the first call after the kill ended, and how long it took.
    first_call: String,
    /// Time from the restarted server answering PING to the first successful call.
    recovered: String,
    /// Failed calls in that time.
    failed_while_recovering: usize,
}

/// Kills Redis under a warmed-up client, times the first call, restarts Redis on the same port and
/// times the return to service. Calls here have no outer deadline (up to the caps), to show what the
/// client itself does; the store adds its own 10 ms deadline on top.
async fn resilience(kind: Kind, server: &mut RedisServer, script: &BatchScript) -> Resilience {
    let client = Client::connect(kind, &server.url()).await;
    for i in 0..200 {
        client
            .call(script, &format!("resilience:{i}"))
            .await
            .expect("calls succeed before the kill");
    }

    server.kill();
    let killed = Instant::now();
    let first = tokio::time::timeout(FAIL_CAP, client.call(script, "resilience:0")).await;
    let took = killed.elapsed();
    let first_call = match first {
        Ok(Err(_)) => format!("fails in {}", human(took)),
        Ok(Ok(())) => format!("succeeded?! ({})", human(took)),
        Err(_) => format!("hangs > {}", human(FAIL_CAP)),
    };
    if let Some(rest) = OUTAGE.checked_sub(killed.elapsed()) {
        tokio::time::sleep(rest).await;
    }

    server.start();
    let back = Instant::now();
    let mut failed = 0;
    let recovered = loop {
        let remaining = RECOVER_CAP.saturating_sub(back.elapsed());
        if remaining.is_zero() {
            break format!("not within {}", human(RECOVER_CAP));
        }
        match tokio::time::timeout(remaining, client.call(script, "resilience:0")).await {
            Ok(Ok(())) => break human(back.elapsed()),
            Ok(Err(_)) => {
                failed += 1;
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            Err(_) => {
                failed += 1;
            }
        }
    };
    Resilience {
        first_call,
        recovered,
        failed_while_recovering: failed,
    }
}

fn human(d: Duration) -> String {
    if d < Duration::from_millis(1) {
        format!("{} µs", d.as_micros())
    } else if d < Duration::from_secs(1) {
        format!("{:.1} ms", d.as_secs_f64() * 1e3)
    } else {
        format!("{:.2} s", d.as_secs_f64())
    }
}

fn main() {
    // `cargo bench` passes `--bench`; any other argument is a filter on the variant name.
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let selected: Vec<Kind> = VARIANTS
        .into_iter()
        .filter(|kind| filter.is_empty() || filter.iter().any(|f| kind.name().contains(f.as_str())))
        .collect();

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("build the tokio runtime");
    let mut server = RedisServer::start_on_free_port();
    let script = Arc::new(BatchScript::new());
    let keys: Arc<Vec<String>> = Arc::new((0..KEYS).map(|i| format!("bench:user:{i}")).collect());

    println!(
        "redis-server on 127.0.0.1:{}, {} worker threads, {} s per row after {} ms warm-up",
        server.port,
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        MEASURE.as_secs(),
        WARM_UP.as_millis()
    );
    println!();
    println!(
        "{:<14} {:>5} {:>10} {:>9} {:>9} {:>9} {:>7}",
        "variant", "tasks", "ok ops/s", "p50 µs", "p99 µs", "max ms", "errors"
    );
    let mut notes = Vec::new();
    for &kind in &selected {
        let client = Arc::new(runtime.block_on(Client::connect(kind, &server.url())));
        for concurrency in CONCURRENCY {
            let m = runtime.block_on(measure(&client, &script, &keys, concurrency));
            println!(
                "{:<14} {:>5} {:>10.0} {:>9.0} {:>9.0} {:>9.1} {:>7}",
                kind.name(),
                concurrency,
                m.ops_per_sec,
                m.p50_us,
                m.p99_us,
                m.max_us / 1_000.0,
                m.errors
            );
            if let Some(e) = m.first_error {
                notes.push(format!("{} at {concurrency}: first error: {e}", kind.name()));
            }
        }
    }
    for note in &notes {
        println!("  {note}");
    }

    println!();
    println!(
        "{:<14} {:<26} {:<20} {:>8}",
        "variant", "kill: first call", "restart: back after", "failures"
    );
    for &kind in &selected {
        let r = runtime.block_on(resilience(kind, &mut server, &script));
        println!(
            "{:<14} {:<26} {:<20} {:>8}",
            kind.name(),
            r.first_call,
            r.recovered,
            r.failed_while_recovering
        );
    }
    // Ends the runtime (and its connections) before the server, so nothing logs a lost connection.
    drop(runtime);
    drop(server);
}
