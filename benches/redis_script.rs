//! What the batch script costs Redis per item, algorithm by algorithm: the time inside `FCALL`
//! (`INFO commandstats`' `usec_per_call`, divided by the items a call carries), with one client sending
//! calls one after another to a `redis-server` this binary starts. Nothing else runs meanwhile, so the
//! figure is the script's own work, steadier than the end-to-end Redis CPU of `tollgate bench
//! --redis-url` (which shares the cores with Tollgate and the load generator): the measure for changes
//! to the Lua code (#15).
//!
//! Run with `cargo bench --bench redis_script` (needs `redis-server` on `PATH`). Each algorithm: 16 items
//! a call on keys cycling over 10,000 values, cost 1, limits that always allow and keep their state
//! between hits, a warm-up, then `CALLS` measured calls, `ROUNDS` times; it prints the fewest µs per
//! item and the median. Two more workloads follow the algorithms: `sliding_log_long` (logs of 100 to
//! 200 entries) and `floor` (what any script deciding from a stored state costs at least). Names given
//! after `--` (`cargo bench --bench redis_script -- gcra floor`) measure only those. Time moves with
//! the host's load; for a figure that does not, `scripts/bench/bench-redis-script-instructions.sh` runs this
//! bench against a `redis-server` under callgrind and counts the instructions Redis executes inside
//! `FCALL` per item.

#![allow(missing_docs)]

#[path = "support/redis_server.rs"]
mod redis_server;

use redis::aio::MultiplexedConnection;
use redis_server::RedisServer;
use tollgate_core::algorithm::{Algorithm, Limit};
use tollgate_core::store::CommitPolicy;
use tollgate_core::store::redis::script::{BatchScript, ScriptItem, Tail};

/// Items per call: about what a coalesced call carries at 64 requests in flight.
const ITEMS: usize = 16;
/// Distinct keys cycled through, at most (fewer when a round has fewer items, so that every measured
/// item finds its key's state).
const KEYS: usize = 10_000;
/// Calls per measurement (after as many unmeasured, which create the keys); `TOLLGATE_BENCH_CALLS`.
const CALLS: usize = 2_000;
/// Measurements per algorithm; the fewest µs is the figure (noise on a shared host only adds).
/// `TOLLGATE_BENCH_ROUNDS`; 0 runs the unmeasured calls alone.
const ROUNDS: usize = 7;

fn setting(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn limit(algorithm: Algorithm) -> Limit {
    // The sliding log keeps an entry per unit: a log of up to 100 entries a key, as the end-to-end
    // bench sizes it. The others never come near their limit, yet keep their state between two hits
    // on a key (at a billion a minute a bucket is full again within a millisecond, and every
    // decision would take the no-state path).
    if algorithm == Algorithm::SlidingLog {
        return Limit {
            algorithm,
            requests: 100,
            window_us: 60_000_000,
            burst: 100,
        };
    }
    Limit {
        algorithm,
        requests: 1_000,
        window_us: 86_400_000_000,
        burst: 1_000,
    }
}

/// `count` calls of `ITEMS` items each, starting at key index `first`.
/// The least any script deciding from a stored state must make Redis do per item: a function that
/// reads every key with one `MGET` and writes each with `SET key value PXAT at` (a 49-byte value, the
/// token bucket's size, and the instant passed ready-made), with no logic at all.
const FLOOR_LIBRARY: &str = "#!lua name=tollgate_bench_floor
redis.register_function('tollgate_bench_floor', function(keys, args)
  local values = redis.call('MGET', unpack(keys))
  for i = 1, #keys do
    redis.call('SET', keys[i], args[1], 'PXAT', args[2])
  end
  return #values
end)
";

/// An absolute expiry in ms, as a script would write it.
fn a_day_from_now_ms() -> u128 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("a clock after 1970");
    (now + std::time::Duration::from_secs(86_400)).as_millis()
}

/// What a round calls: the batch script for one algorithm, the script for long sliding logs, or the
/// floor function.
#[derive(Clone, Copy)]
enum Workload {
    Script(Algorithm),
    /// The sliding log on few keys, so that every round adds 100 entries to each (10,000 a day, never
    /// denied): the warm-up leaves 100, the first measured round goes from 100 to 200.
    LongLog,
    Floor,
}

impl Workload {
    /// The limit the script enforces; `None` for the floor, which runs no script.
    fn limit(self) -> Option<Limit> {
        match self {
            Self::Script(algorithm) => Some(limit(algorithm)),
            Self::LongLog => Some(Limit {
                algorithm: Algorithm::SlidingLog,
                requests: 10_000,
                window_us: 86_400_000_000,
                burst: 10_000,
            }),
            Self::Floor => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Script(algorithm) => algorithm.as_str(),
            Self::LongLog => "sliding_log_long",
            Self::Floor => "floor",
        }
    }
}

async fn calls(
    conn: &mut MultiplexedConnection,
    script: &BatchScript,
    workload: Workload,
    first: usize,
    count: usize,
) {
    let keys = match workload {
        // Few keys, so that each gets 100 entries a round.
        Workload::LongLog => count * ITEMS / 100,
        Workload::Script(_) | Workload::Floor => KEYS.min(count * ITEMS),
    }
    .max(1);
    let names: Vec<String> = (0..keys).map(|i| format!("bench_user_{i}")).collect();
    for call in 0..count {
        let key = |at: usize| names[(first + call * ITEMS + at) % keys].as_str();
        let Some(limit) = workload.limit() else {
            let mut fcall = redis::cmd("FCALL");
            fcall.arg("tollgate_bench_floor").arg(ITEMS);
            for at in 0..ITEMS {
                fcall.arg(key(at));
            }
            let _: i64 = fcall
                .arg([b'x'; 49].as_slice())
                .arg(a_day_from_now_ms())
                .query_async(conn)
                .await
                .expect("the floor call");
            continue;
        };
        let items: Vec<ScriptItem<'_>> = (0..ITEMS)
            .map(|at| ScriptItem {
                key: key(at),
                limit,
                cost: 1,
                group: at as u32,
                window_start_us: 0,
                ttl_secs: 0,
            })
            .collect();
        script
            .call(conn, &items, CommitPolicy::Independent, Tail::None)
            .await
            .expect("the batch call");
    }
}

/// `usec_per_call` of `FCALL` since the last `CONFIG RESETSTAT`.
async fn fcall_usec(conn: &mut MultiplexedConnection) -> f64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .expect("INFO");
    info.lines()
        .find_map(|line| line.strip_prefix("cmdstat_fcall:"))
        .and_then(|stats| stats.split(',').find_map(|f| f.strip_prefix("usec_per_call=")))
        .and_then(|v| v.parse().ok())
        .expect("FCALL in commandstats")
}

fn main() {
    let calls_per_round = setting("TOLLGATE_BENCH_CALLS", CALLS);
    let rounds_per_algorithm = setting("TOLLGATE_BENCH_ROUNDS", ROUNDS);
    let mut server = RedisServer::start_on_free_port();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let client = redis::Client::open(server.url()).expect("url");
        let mut conn = client.get_multiplexed_async_connection().await.expect("connect");
        let script = BatchScript::new();
        script.preload(&mut conn).await.expect("FUNCTION LOAD");
        let _: String = redis::cmd("FUNCTION")
            .arg("LOAD")
            .arg(FLOOR_LIBRARY)
            .query_async(&mut conn)
            .await
            .expect("FUNCTION LOAD of the floor");
        println!("time inside FCALL per item, {ITEMS} items a call, {calls_per_round} calls a round:");
        // `cargo bench --bench redis_script -- token_bucket floor` measures the workloads named (for
        // profiling one of them); no name measures all.
        let filters: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
        let workloads = Algorithm::ALL
            .into_iter()
            .map(Workload::Script)
            .chain([Workload::LongLog, Workload::Floor]);
        let chosen =
            workloads.filter(|workload| filters.is_empty() || filters.iter().any(|f| f == workload.name()));
        for workload in chosen {
            let _: () = redis::cmd("FLUSHALL")
                .query_async(&mut conn)
                .await
                .expect("FLUSHALL");
            calls(&mut conn, &script, workload, 0, calls_per_round).await;
            if rounds_per_algorithm == 0 {
                continue;
            }
            let mut rounds = Vec::with_capacity(rounds_per_algorithm);
            for round in 0..rounds_per_algorithm {
                let _: () = redis::cmd("CONFIG")
                    .arg("RESETSTAT")
                    .query_async(&mut conn)
                    .await
                    .expect("RESETSTAT");
                let first = (round + 1) * calls_per_round * ITEMS;
                calls(&mut conn, &script, workload, first, calls_per_round).await;
                rounds.push(fcall_usec(&mut conn).await / ITEMS as f64);
            }
            rounds.sort_by(f64::total_cmp);
            println!(
                "  {:<15} {:.2} µs (median {:.2} µs)",
                workload.name(),
                rounds[0],
                rounds[rounds_per_algorithm / 2]
            );
        }
    });
    server.shutdown();
}
