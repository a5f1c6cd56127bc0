//! State in Redis is not trusted: values under Tollgate's key names that no Tollgate could have written
//! (NaN, infinities, negative or huge counts, instants far ahead of Redis's clock, a lease key or a hot
//! key's reservers hash of the wrong type), written by hand with no TTL, are read as no state,
//! repaired, counted, and never give a permanent error, a permanent denial or a limit that admits
//! everything.

use std::time::Duration;

use redis::AsyncCommands;
use tokio::time::Instant;
use tollgate_core::algorithm::{Algorithm, Decision, Limit};
use tollgate_core::store::hot_keys::{Reserve, ReserveRequest};
use tollgate_core::store::lease::{AcquireRequest, LeaseItem, LeaseStore};
use tollgate_core::store::redis::RedisStore;
use tollgate_core::store::{Batch, BatchItem, CommitPolicy, Store};

use crate::common::redis::{RedisCluster, RedisServer, connected_store};
use crate::require_redis;

const HOUR_US: u64 = 3_600_000_000;

fn limit(algorithm: Algorithm) -> Limit {
    Limit {
        algorithm,
        requests: 10,
        window_us: HOUR_US,
        burst: 10,
    }
}

/// One request of cost 1 on `key` under `algorithm`'s limit of 10 an hour.
async fn hit(store: &std::sync::Arc<RedisStore>, key: &str, algorithm: Algorithm) -> Decision {
    let item = BatchItem {
        key: key.to_owned(),
        limit: limit(algorithm),
        cost: 1,
        group: 0,
        go_format: false,
    };
    let batch = Batch::new(vec![item], CommitPolicy::Independent);
    store.apply(&batch).await.expect("a decision, not an error")[0]
}

/// A Redis of the test's own, a store connected to it, what stops the store, and a connection of the
/// test's own.
async fn connected() -> (
    RedisServer,
    std::sync::Arc<RedisStore>,
    tokio_util::sync::CancellationToken,
    redis::aio::MultiplexedConnection,
) {
    let redis = RedisServer::start();
    let (store, stop) = connected_store(&redis.url(), "single").await;
    let client = redis::Client::open(redis.url()).expect("client");
    let conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connection");
    (redis, store, stop, conn)
}

/// The Redis key `key` is stored under, found after a first request created it.
async fn stored_key(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> String {
    // Go's key for a fixed window; `{key}algorithm_window` for the others.
    let keys: Vec<String> = conn.keys(format!("*{key}*")).await.expect("KEYS");
    assert_eq!(keys.len(), 1, "one key for {key}: {keys:?}");
    keys.into_iter().next().expect("a key")
}

/// A stored state as the algorithm's Lua file packs it: the algorithm byte, the window, the fields.
fn packed(code: u8, fields: &[f64]) -> Vec<u8> {
    let mut bytes = vec![code];
    bytes.extend_from_slice(&(HOUR_US as f64).to_le_bytes());
    for field in fields {
        bytes.extend_from_slice(&field.to_le_bytes());
    }
    bytes
}

/// For each algorithm other than the fixed window: its code, and the fields of a valid state holding
/// one request, given Redis's clock `now` (µs).
fn valid_fields(algorithm: Algorithm, now: f64) -> (u8, Vec<f64>) {
    match algorithm {
        // window start (windows are aligned to their length), current, previous
        Algorithm::SlidingWindow => (1, vec![(now / HOUR_US as f64).floor() * HOUR_US as f64, 1.0, 0.0]),
        // one entry: timestamp, cost
        Algorithm::SlidingLog => (2, vec![now, 1.0]),
        // requests, burst (recorded only), tokens, fraction, updated
        Algorithm::TokenBucket => (3, vec![10.0, 10.0, 9.0, 0.0, now]),
        // TAT (one emission interval ahead), fraction
        Algorithm::Gcra => (4, vec![now + (HOUR_US / 10) as f64, 0.0]),
        Algorithm::FixedWindow => unreachable!("stored as a decimal counter"),
    }
}

/// Redis's clock in µs.
async fn redis_now_us(conn: &mut redis::aio::MultiplexedConnection) -> f64 {
    let (seconds, micros): (u64, u64) = redis::cmd("TIME").query_async(conn).await.expect("TIME");
    (seconds * 1_000_000 + micros) as f64
}

/// Every numeric field of every algorithm's state set in turn to NaN, ±infinity, -1e18 and 1e18 (far
/// ahead, for an instant; far beyond any count otherwise), stored without a TTL: each next request is
/// decided as the key's first, the key is left with a TTL, and the state is counted as impossible.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn impossible_states_are_decided_as_none_and_repaired() {
    require_redis!();
    let (_redis, store, stop, mut conn) = connected().await;
    let mut found = 0;
    for algorithm in [
        Algorithm::SlidingWindow,
        Algorithm::SlidingLog,
        Algorithm::TokenBucket,
        Algorithm::Gcra,
    ] {
        let key = format!("rd_k_{}_", algorithm.as_str());
        assert_eq!(hit(&store, &key, algorithm).await.remaining, 9, "{algorithm:?}");
        let name = stored_key(&mut conn, &key).await;
        let now = redis_now_us(&mut conn).await;
        let (code, fields) = valid_fields(algorithm, now);
        for at in 0..fields.len() {
            if algorithm == Algorithm::TokenBucket && at < 2 {
                // Requests and burst are recorded, never read.
                continue;
            }
            for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -1e18, 1e18] {
                let mut state = fields.clone();
                state[at] = bad;
                let () = conn.set(&name, packed(code, &state)).await.expect("SET");
                let decision = hit(&store, &key, algorithm).await;
                let case = format!("{algorithm:?}, field {at} = {bad}");
                assert!(decision.allowed, "{case}: {decision:?}");
                assert_eq!(decision.remaining, 9, "{case}: decided as the first request");
                assert_eq!(decision.retry_after_us, 0, "{case}");
                // A sliding window resets at the end of the next window at the latest.
                assert!(decision.reset_after_us <= 2 * HOUR_US, "{case}: {decision:?}");
                let ttl: i64 = conn.pttl(&name).await.expect("PTTL");
                assert!(ttl > 0, "{case}: the key has a TTL again ({ttl})");
                // A log whose newest entry lies in the past has expired, and reads as none (and is
                // replaced) as any expired state does, whether or not its time could be.
                let expired = algorithm == Algorithm::SlidingLog && at == 0 && bad < 0.0;
                if !expired {
                    found += 1;
                }
                assert_eq!(store.impossible_states(), found, "{case}: counted");
            }
        }
        // A valid state is not counted.
        let () = conn.set(&name, packed(code, &fields)).await.expect("SET");
        assert_eq!(hit(&store, &key, algorithm).await.remaining, 8, "{algorithm:?}");
        assert_eq!(
            store.impossible_states(),
            found,
            "{algorithm:?}: a valid state is not counted"
        );
    }
    stop.cancel();
}

/// On a Redis Cluster, coalesced script calls reach each master as one pipeline
/// (`cluster_scripts.rs`), whose replies are settled apart from a lone call's: an impossible state
/// found there is counted too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_impossible_state_found_on_a_masters_pipeline_is_counted() {
    require_redis!();
    let cluster = RedisCluster::start();
    let (store, stop) = connected_store(&cluster.addrs(), "cluster").await;
    let (key, algorithm) = ("rd_k_cluster_", Algorithm::TokenBucket);
    // Until the slot map is read, calls go through the cluster connection; then by the pipelines.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let before = store.pipelines();
        hit(&store, key, algorithm).await;
        if store.pipelines() > before {
            break;
        }
        assert!(Instant::now() < deadline, "no call went by a master's pipeline");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut holder = None;
    for node in &cluster.nodes {
        let client = redis::Client::open(node.url()).expect("client");
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .expect("connection");
        let keys: Vec<String> = conn.keys(format!("*{key}*")).await.expect("KEYS");
        if let Some(name) = keys.into_iter().next() {
            holder = Some((conn, name));
        }
    }
    let (mut conn, name) = holder.expect("a master holds the key");
    let now = redis_now_us(&mut conn).await;
    let (code, mut fields) = valid_fields(algorithm, now);
    fields[2] = f64::NAN;
    let () = conn.set(&name, packed(code, &fields)).await.expect("SET");
    let before = store.pipelines();
    let decision = hit(&store, key, algorithm).await;
    assert!(store.pipelines() > before, "decided on a master's pipeline");
    assert_eq!(decision.remaining, 9, "decided as the first request");
    assert_eq!(store.impossible_states(), 1, "counted");
    stop.cancel();
}

/// A fixed-window counter holding something no `INCRBY` leaves (negative, NaN, infinite) counts from
/// zero, with a TTL, on the pipeline (a negative count) and on the script (what `INCRBY` refuses).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn impossible_counters_count_from_zero() {
    require_redis!();
    let (_redis, store, stop, mut conn) = connected().await;
    let key = "rd_k_fixed_";
    assert_eq!(hit(&store, key, Algorithm::FixedWindow).await.remaining, 9);
    let name = stored_key(&mut conn, key).await;
    for (found, bad) in (1..).zip(["-1000000000000000000", "-1", "nan", "inf", "-inf"]) {
        let () = conn.set(&name, bad).await.expect("SET");
        let decision = hit(&store, key, Algorithm::FixedWindow).await;
        assert!(decision.allowed, "{bad}: {decision:?}");
        assert_eq!(decision.remaining, 9, "{bad}: counted from zero");
        let count: String = conn.get(&name).await.expect("GET");
        assert_eq!(count, "1", "{bad}: the counter holds this request");
        // The pipeline gives a counter it finds created without a TTL one in the background.
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            let ttl: i64 = conn.pttl(&name).await.expect("PTTL");
            if ttl > 0 {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{bad}: the counter has a TTL again ({ttl})"
            );
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert_eq!(store.impossible_states(), found, "{bad}: counted");
    }
    stop.cancel();
}

/// A lease key holding something other than a sorted set no longer fails every acquire: it is replaced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_key_of_the_wrong_type_is_replaced() {
    require_redis!();
    let (_redis, store, stop, mut conn) = connected().await;
    let scope = "rd";
    let acquire = |id: &str| AcquireRequest {
        items: vec![LeaseItem {
            key: "rd_job_a_".to_owned(),
            max_in_flight: 2,
        }],
        lease_id: id.to_owned(),
        renew: false,
        ttl_us: 60_000_000,
        scope_len: scope.len(),
    };
    assert!(store.acquire(&acquire("first")).await.expect("store")[0].available);
    let keys: Vec<String> = conn.keys("*concurrency").await.expect("KEYS");
    let () = conn.set(&keys[0], "not a sorted set").await.expect("SET");
    let slot = &store.acquire(&acquire("second")).await.expect("no error")[0];
    assert!(slot.available, "{slot:?}");
    assert_eq!(slot.in_flight, 1, "the key starts afresh with this lease");
    assert_eq!(store.impossible_states(), 1);
    stop.cancel();
}

/// A hot key's reservers hash (`{tag}reservers:…`) replaced by something no Tollgate writes: another
/// type, a hash without a TTL (here holding a reserver whose lease never ends, which would halve every
/// slice for good), a hash with more fields than reservers are ever admitted. Each is found by the
/// next reservation, removed, counted, and the key's reservations go on, the hash rebuilt with a TTL
/// (no request fails, not once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservers_hash_no_tollgate_writes_is_replaced() {
    require_redis!();
    let (_redis, store, stop, mut conn) = connected().await;
    let item = BatchItem {
        key: "rd_k_hot_".to_owned(),
        limit: Limit {
            requests: 1_000,
            burst: 1_000,
            ..limit(Algorithm::FixedWindow)
        },
        cost: 1,
        group: 0,
        go_format: true,
    };
    let reserve = async |replica: &str| {
        let request = ReserveRequest {
            item: &item,
            want: 2,
            give_back: 0,
            replica,
            lease_us: 60_000_000,
        };
        store.reserve(request).await.expect("a reservation, not an error")
    };
    assert_eq!(reserve("first").await.extra, 2);
    let names: Vec<String> = conn.keys("*reservers:*").await.expect("KEYS");
    let [name] = names.as_slice() else {
        panic!("one reservers hash: {names:?}")
    };
    let too_many: Vec<(String, String)> = (0..600).map(|i| (format!("r{i}"), "1:1:1".to_owned())).collect();
    for (found, crafted) in (1..).zip(["string", "list", "hash without a TTL", "600 fields"]) {
        let () = conn.del(name).await.expect("DEL");
        match crafted {
            "string" => conn.set(name, "1:1:1").await.expect("SET"),
            "list" => conn.rpush(name, "1:1:1").await.expect("RPUSH"),
            "hash without a TTL" => conn
                .hset(name, "ghost", "9:99999999999999:0")
                .await
                .expect("HSET"),
            _ => conn.hset_multiple(name, &too_many).await.expect("HSET"),
        }
        let reserved = reserve(&format!("replica-{found}")).await;
        assert!(reserved.decision.allowed, "{crafted}: {reserved:?}");
        assert_eq!(reserved.extra, 2, "{crafted}: the key reserves as before");
        let kind: String = redis::cmd("TYPE")
            .arg(name)
            .query_async(&mut conn)
            .await
            .expect("TYPE");
        assert_eq!(kind, "hash", "{crafted}: rebuilt");
        let fields: u64 = conn.hlen(name).await.expect("HLEN");
        assert_eq!(fields, 1, "{crafted}: this reservation alone");
        let ttl: i64 = conn.pttl(name).await.expect("PTTL");
        assert!(ttl > 0, "{crafted}: a TTL again ({ttl})");
        assert_eq!(store.impossible_states(), found, "{crafted}: counted");
    }
    // A hash as Tollgate leaves it is not counted.
    assert_eq!(reserve("replica-4").await.extra, 2);
    assert_eq!(store.impossible_states(), 4);
    stop.cancel();
}
