//! The Redis store over real `redis-server` processes: envoyproxy/ratelimit compatibility (same
//! environment, same keys), shared counters, exact admission under concurrency, one round trip per
//! request, the local over-limit cache, failure modes when Redis dies, and Redis Cluster.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tollgate::proto::native::rate_limiter_client::RateLimiterClient;
use tollgate::proto::native::{CheckRequest, Descriptor, Entry, RefundRequest};
use tollgate::proto::rls::RateLimitResponse;
use tollgate::proto::rls::rate_limit_response::Code;
use tollgate_core::algorithm::{Algorithm, Decision, Limit};
use tollgate_core::store::lease::{AcquireRequest, LeaseItem, LeaseStore, ReleaseRequest};
use tollgate_core::store::{Batch, BatchItem, CommitPolicy, Store};

use crate::common::redis::{
    RedisCluster, RedisSentinel, RedisServer, SentinelTls, cli, command_calls, connected_store,
};
use crate::common::{TestServer, http, wire_request};
use crate::require_redis;

/// Generous deadline for tests that are not about deadlines: a loaded CI machine must not turn a slow
/// reply into a failure-mode answer.
const TEST_DEADLINE: &str = "2s";

fn rules(algorithm: Algorithm, limit: u32) -> String {
    format!(
        "domain: rd\ndescriptors:\n  - key: k\n    rate_limit: {{unit: hour, requests_per_unit: {limit}, algorithm: {}}}\n  - key: open\n    rate_limit: {{unit: hour, requests_per_unit: {limit}, failure_mode: open}}\n  - key: closed\n    rate_limit: {{unit: hour, requests_per_unit: {limit}, failure_mode: closed}}\n",
        algorithm.as_str()
    )
}

async fn start(redis_env: &[(&str, &str)], rules_text: &str) -> TestServer {
    let mut env = vec![("TOLLGATE_REDIS_DEADLINE", TEST_DEADLINE)];
    env.extend_from_slice(redis_env);
    TestServer::start(&[("rd.yaml", rules_text)], &env).await
}

async fn ask(server: &TestServer, entries: &[&[(&str, &str)]]) -> Result<RateLimitResponse, tonic::Status> {
    let mut client = server.client().await;
    client
        .should_rate_limit(wire_request("rd", entries))
        .await
        .map(|r| r.into_inner())
}

#[tokio::test]
async fn go_style_redis_url_counts_in_redis_with_envoyproxy_ratelimit_keys() {
    require_redis!();
    let redis = RedisServer::start();
    let addr = redis.addr();
    let server = start(
        &[("REDIS_URL", &addr), ("REDIS_SOCKET_TYPE", "tcp")],
        &rules(Algorithm::FixedWindow, 2),
    )
    .await;
    for remaining in [1, 0] {
        let r = ask(&server, &[&[("k", "v")]]).await.expect("answer");
        assert_eq!(r.overall_code, Code::Ok as i32);
        assert_eq!(r.statuses[0].limit_remaining, remaining);
    }
    let r = ask(&server, &[&[("k", "v")]]).await.expect("answer");
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    // The counter is envoyproxy/ratelimit's: `domain_key_value_<hour start>`, INCRBY semantics.
    let keys = redis.cli(&["KEYS", "rd_k_v_*"]);
    let key = keys.lines().next().expect("a Go-format key").trim().to_owned();
    let start: u64 = key
        .trim_start_matches("rd_k_v_")
        .parse()
        .expect("window start in seconds");
    assert_eq!(start % 3600, 0, "{key}");
    assert_eq!(redis.cli(&["GET", &key]).trim(), "3");
    let ttl: u64 = redis.cli(&["TTL", &key]).trim().parse().expect("ttl");
    assert!(ttl > 0 && ttl <= 3600 + 300, "TTL {ttl}");
    // A value holding `_` or `%` is written as it is, as Go writes it (Tollgate's own keys escape it).
    ask(&server, &[&[("k", "x_y%z")]]).await.expect("answer");
    let keys = redis.cli(&["KEYS", "rd_k_x_y%z_*"]);
    assert_eq!(keys.lines().filter(|k| !k.is_empty()).count(), 1, "{keys}");
    server.stop().await;
}

#[tokio::test]
async fn two_instances_share_counters() {
    require_redis!();
    let redis = RedisServer::start();
    let env = [("REDIS_URL", redis.url())];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let a = start(&env, &rules(Algorithm::TokenBucket, 5)).await;
    let b = start(&env, &rules(Algorithm::TokenBucket, 5)).await;
    for server in [&a, &b, &a, &b, &a] {
        assert_eq!(
            ask(server, &[&[("k", "shared")]])
                .await
                .expect("answer")
                .overall_code,
            Code::Ok as i32
        );
    }
    assert_eq!(
        ask(&b, &[&[("k", "shared")]]).await.expect("answer").overall_code,
        Code::OverLimit as i32
    );
    a.stop().await;
    b.stop().await;
}

/// A refund token issued by one instance verifies on another that shares `TOLLGATE_REFUND_KEY`, and
/// 32 refunds with it racing over both instances give the units back exactly once.
async fn a_token_refunds_once_across_instances(redis_env: &[(&str, &str)]) {
    let mut env = vec![("TOLLGATE_REFUND_KEY", "0123456789abcdef0123456789abcdef-fleet")];
    env.extend_from_slice(redis_env);
    let text = rules(Algorithm::TokenBucket, 100);
    let servers = Arc::new([start(&env, &text).await, start(&env, &text).await]);
    let descriptors = || {
        vec![
            native_descriptor("k", "refund-race"),
            native_descriptor("k", "other"),
        ]
    };
    let mut client = RateLimiterClient::new(servers[0].channel().await);
    let checked = client
        .check(CheckRequest {
            domain: "rd".into(),
            descriptors: descriptors(),
            cost: 40,
            mode: 0,
        })
        .await
        .expect("check")
        .into_inner();
    assert!(checked.allowed && !checked.refund_token.is_empty(), "{checked:?}");
    let refunded = Arc::new(AtomicUsize::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for caller in 0..32 {
        let (servers, refunded) = (Arc::clone(&servers), Arc::clone(&refunded));
        let token = checked.refund_token.clone();
        tasks.spawn(async move {
            let mut client = RateLimiterClient::new(servers[caller % 2].channel().await);
            let request = RefundRequest {
                domain: "rd".into(),
                descriptors: descriptors(),
                cost: 0,
                refund_token: token,
            };
            match client.refund(request).await {
                Ok(_) => {
                    refunded.fetch_add(1, Ordering::SeqCst);
                }
                Err(status) => assert_eq!(status.code(), tonic::Code::PermissionDenied, "{status:?}"),
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("caller");
    }
    assert_eq!(refunded.load(Ordering::SeqCst), 1, "one refund per token");
    let peek = client
        .check(CheckRequest {
            domain: "rd".into(),
            descriptors: descriptors(),
            cost: 0,
            mode: 1,
        })
        .await
        .expect("peek")
        .into_inner();
    let left: Vec<u64> = peek.results.iter().map(|r| r.remaining).collect();
    assert_eq!(
        left,
        [100, 100],
        "40 consumed, 40 given back once, each descriptor"
    );
    let [a, b] = Arc::into_inner(servers).expect("tasks done");
    a.stop().await;
    b.stop().await;
}

fn native_descriptor(key: &str, value: &str) -> Descriptor {
    Descriptor {
        entries: vec![Entry {
            key: key.into(),
            value: value.into(),
        }],
        cost: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_racing_one_refund_token_refund_once() {
    require_redis!();
    let redis = RedisServer::start();
    let url = redis.url();
    a_token_refunds_once_across_instances(&[("REDIS_URL", url.as_str())]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_racing_one_refund_token_refund_once_in_a_cluster() {
    require_redis!();
    // The two descriptors' keys lie in different slots: the refund is two script calls.
    assert_ne!(
        tollgate_core::store::redis::slot("{rd_k_refund-race_}token_bucket_3600s"),
        tollgate_core::store::redis::slot("{rd_k_other_}token_bucket_3600s")
    );
    let cluster = RedisCluster::start();
    let addrs = cluster.addrs();
    a_token_refunds_once_across_instances(&[("REDIS_URL", addrs.as_str()), ("REDIS_TYPE", "cluster")]).await;
}

/// Redis stalls (`DEBUG SLEEP`) while requests keep coming, each answered by its rule's failure mode at
/// its deadline. Requests queued behind the stuck calls whose callers gave up are never sent: after
/// the stall, Redis's counter holds exactly the requests that were sent, no ghost hit from the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_whose_callers_gave_up_are_never_sent() {
    require_redis!();
    let redis = RedisServer::start_with(&["--enable-debug-command", "yes"]);
    let url = redis.url();
    let env = [
        ("REDIS_URL", url.as_str()),
        ("TOLLGATE_REDIS_DEADLINE", "150ms"),
        ("LOCAL_CACHE_SIZE_IN_BYTES", "0"),
    ];
    let server = TestServer::start(&[("rd.yaml", &rules(Algorithm::FixedWindow, 1_000_000))], &env).await;
    let port = redis.port;
    let sleeper = std::thread::spawn(move || {
        let reply = cli(port, &["DEBUG", "SLEEP", "1.5"]);
        assert_eq!(reply.trim(), "OK", "DEBUG SLEEP ran");
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let server = Arc::new(server);
    let mut asked = tokio::task::JoinSet::new();
    // Four requests one after another: four calls, each holding one of the four in-flight slots while
    // Redis sleeps. Then 120 at once, queued behind them.
    for at in 0..124 {
        let server = Arc::clone(&server);
        asked.spawn(async move {
            let started = Instant::now();
            let answer = ask(&server, &[&[("open", "stalled")]])
                .await
                .expect("failure mode answers");
            assert_eq!(answer.overall_code, Code::Ok as i32, "open");
            started.elapsed()
        });
        if at < 4 {
            tokio::time::sleep(Duration::from_millis(40)).await;
        }
    }
    while let Some(waited) = asked.join_next().await {
        let waited = waited.expect("caller");
        assert!(
            waited < Duration::from_millis(1000),
            "answered at its deadline, not Redis's: {waited:?}"
        );
    }
    sleeper.join().expect("DEBUG SLEEP ends");
    // Once Redis wakes, the stuck calls finish and the queue drains: every request ends either
    // counted by Redis or counted as abandoned. Wait for that rather than for a guessed time (a busy
    // machine drains late), then once more, so that a ghost hit sent late would still show.
    let settled = || async {
        let (_, text) = http(server.http, "GET", "/metrics", "").await;
        let abandoned = text
            .lines()
            .find_map(|l| {
                l.strip_prefix("tollgate_redis_abandoned_total")?
                    .trim()
                    .parse::<u64>()
                    .ok()
            })
            .unwrap_or_else(|| panic!("tollgate_redis_abandoned_total in {text}"));
        let keys = cli(port, &["--scan", "--pattern", "rd_open_stalled_*"]);
        let counted = keys.lines().next().map_or(0, |key| {
            cli(port, &["GET", key]).trim().parse::<u64>().expect("a count")
        });
        (counted, abandoned)
    };
    let give_up = Instant::now() + Duration::from_secs(10);
    let mut seen = settled().await;
    while seen.0 + seen.1 < 124 && Instant::now() < give_up {
        tokio::time::sleep(Duration::from_millis(50)).await;
        seen = settled().await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (counted, abandoned) = settled().await;
    assert_eq!(
        (counted, abandoned),
        seen,
        "nothing more was sent once every request had ended"
    );
    assert!(
        abandoned > 0,
        "some requests waited in the queue past their deadline"
    );
    assert!(counted > 0, "the calls in flight when Redis stalled were counted");
    assert_eq!(
        counted + abandoned,
        124,
        "Redis counted exactly the requests that were sent"
    );
    Arc::into_inner(server).expect("callers done").stop().await;
}

/// 64 concurrent clients split over two instances against a limit of 100: exactly 100 pass.
async fn exact_admission(redis_env: &[(&str, &str)]) {
    for algorithm in Algorithm::ALL {
        let text = rules(algorithm, 100);
        let servers = Arc::new([start(redis_env, &text).await, start(redis_env, &text).await]);
        let admitted = Arc::new(AtomicUsize::new(0));
        let key = format!("hot-{}", algorithm.as_str());
        let tasks: Vec<_> = (0..64)
            .map(|i| {
                let (servers, admitted, key) = (Arc::clone(&servers), Arc::clone(&admitted), key.clone());
                tokio::spawn(async move {
                    let mut client = servers[i % 2].client().await;
                    for _ in 0..4 {
                        let r = client
                            .should_rate_limit(wire_request("rd", &[&[("k", &key)]]))
                            .await
                            .expect("answer");
                        if r.into_inner().overall_code == Code::Ok as i32 {
                            admitted.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.expect("client");
        }
        assert_eq!(admitted.load(Ordering::SeqCst), 100, "{}", algorithm.as_str());
        let [a, b] = Arc::into_inner(servers).expect("clients done");
        a.stop().await;
        b.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_clients_on_two_instances_get_exactly_the_limit() {
    require_redis!();
    let redis = RedisServer::start();
    let url = redis.url();
    exact_admission(&[("REDIS_URL", &url)]).await;
}

/// 64 clients send 640 requests on 640 keys, each with two descriptors on the same key (the second
/// sees the first's hit): every answer must be exact however requests share Redis calls.
async fn sixty_four_clients_ten_pairs_each(server: &Arc<TestServer>) {
    let tasks: Vec<_> = (0..64)
        .map(|client| {
            let server = Arc::clone(server);
            tokio::spawn(async move {
                let mut rls = server.client().await;
                for n in 0..10 {
                    let key = format!("c{client}-{n}");
                    let request = wire_request("rd", &[&[("k", &key)], &[("k", &key)]]);
                    let answer = rls.should_rate_limit(request).await.expect("answer").into_inner();
                    let remaining: Vec<u32> = answer.statuses.iter().map(|s| s.limit_remaining).collect();
                    assert_eq!(remaining, [99, 98], "{key}");
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("client");
    }
}

/// How many times Redis ran `command` between two [`command_calls`].
fn calls_between(before: &HashMap<String, u64>, after: &HashMap<String, u64>, command: &str) -> u64 {
    let calls = |stats: &HashMap<String, u64>| stats.get(command).copied().unwrap_or(0);
    calls(after) - calls(before)
}

/// Concurrent independent requests share script calls (coalescing), and each still gets its own exact
/// answer: fewer calls than requests, every remaining exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_share_script_calls_and_keep_their_answers() {
    require_redis!();
    let redis = RedisServer::start();
    let url = redis.url();
    let server = Arc::new(start(&[("REDIS_URL", &url)], &rules(Algorithm::TokenBucket, 100)).await);
    ask(&server, &[&[("k", "warm-up")]])
        .await
        .expect("loads the library");
    let before = command_calls(redis.port).get("fcall").copied().unwrap_or(0);
    sixty_four_clients_ten_pairs_each(&server).await;
    let calls = command_calls(redis.port).get("fcall").copied().unwrap_or(0) - before;
    // About 150 here; one per request would be 640.
    assert!(calls < 480, "{calls} script calls for 640 concurrent requests");
    // /metrics tells operators the same.
    assert_eq!(server.metric("tollgate_redis_batches_total ").await, 641);
    assert_eq!(
        server.metric("tollgate_redis_script_calls_total ").await,
        calls + 1
    );
    Arc::into_inner(server).expect("clients done").stop().await;
}

/// Fixed windows are counted the Go service's way, with no script: concurrent requests share
/// pipelines of INCRBY + EXPIRE NX (one per item), and each still gets its own exact answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_fixed_windows_share_pipelines_of_incrby_without_a_script() {
    require_redis!();
    let redis = RedisServer::start();
    let url = redis.url();
    let server = Arc::new(start(&[("REDIS_URL", &url)], &rules(Algorithm::FixedWindow, 100)).await);
    let before = command_calls(redis.port);
    sixty_four_clients_ten_pairs_each(&server).await;
    let after = command_calls(redis.port);
    let delta = |command: &str| calls_between(&before, &after, command);
    assert_eq!(delta("fcall"), 0, "no script for fixed windows");
    assert_eq!(delta("incrby"), 1280, "one INCRBY per descriptor");
    assert_eq!(delta("expire"), 1280, "and one EXPIRE NX");
    let pipelines = server.metric("tollgate_redis_pipelines_total ").await;
    assert_eq!(delta("time"), pipelines, "one TIME per pipeline");
    assert!(
        pipelines < 480,
        "{pipelines} pipelines for 640 concurrent requests"
    );
    assert_eq!(server.metric("tollgate_redis_script_calls_total ").await, 0);
    // Every counter has its TTL: the hour's window plus the default jitter of up to 300 s.
    let key = redis.cli(&["KEYS", "rd_k_c0-0_*"]);
    let ttl: i64 = redis.cli(&["TTL", key.trim()]).trim().parse().expect("ttl");
    assert!((3000..=3900).contains(&ttl), "{ttl}");
    Arc::into_inner(server).expect("clients done").stop().await;
}

/// Eight requests for different counters, one every 2 ms, each from its own client; their answers in
/// order, and how long the whole took.
async fn eight_staggered_requests(server: &Arc<TestServer>) -> (Vec<RateLimitResponse>, Duration) {
    let started = Instant::now();
    let requests = (0..8).map(|i| {
        let server = Arc::clone(server);
        async move {
            tokio::time::sleep(Duration::from_millis(2 * i)).await;
            ask(&server, &[&[("k", &format!("staggered-{i}"))]])
                .await
                .expect("answer")
        }
    });
    let answers = futures_util::future::join_all(requests).await;
    (answers, started.elapsed())
}

/// `REDIS_PIPELINE_WINDOW` (the Go service's setting): a call waits that long after its first request
/// for others to join it, so requests that would each have gone alone share one pipeline or script
/// call; `REDIS_PIPELINE_LIMIT` sends a call once it carries that many items.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipeline_window_gathers_requests_into_one_call_up_to_the_limit() {
    require_redis!();
    let redis = RedisServer::start();
    let url = redis.url();
    let window = ("REDIS_PIPELINE_WINDOW", "300ms");
    for (algorithm, limit, calls, series) in [
        (Algorithm::FixedWindow, "0", 1, "tollgate_redis_pipelines_total "),
        (Algorithm::FixedWindow, "2", 4, "tollgate_redis_pipelines_total "),
        (
            Algorithm::TokenBucket,
            "0",
            1,
            "tollgate_redis_script_calls_total ",
        ),
    ] {
        let env = [
            ("REDIS_URL", url.as_str()),
            window,
            ("REDIS_PIPELINE_LIMIT", limit),
        ];
        let server = Arc::new(start(&env, &rules(algorithm, 100)).await);
        // Loads the library (and reads the server's version) before counting calls.
        ask(&server, &[&[("k", "warm-up")]]).await.expect("answer");
        let before = server.metric(series).await;
        let (answers, took) = eight_staggered_requests(&server).await;
        let remaining: Vec<u32> = answers.iter().map(|a| a.statuses[0].limit_remaining).collect();
        assert_eq!(remaining, [99; 8], "{algorithm:?}, limit {limit}");
        assert_eq!(
            server.metric(series).await - before,
            calls,
            "{algorithm:?}, limit {limit}: calls for 8 requests arriving within 14 ms"
        );
        // Without a limit the call waits out the window; with one, each call goes once full.
        let waited = took >= Duration::from_millis(300);
        assert_eq!(
            waited,
            limit == "0",
            "{algorithm:?}, limit {limit}: took {took:?}"
        );
        Arc::into_inner(server).expect("clients done").stop().await;
        redis.cli(&["FLUSHALL"]);
    }
}

/// A counter this instance has seen given a TTL is counted by INCRBY alone on later hits. Deleted
/// meanwhile (an operator's DEL, eviction, a failover that lost it), the INCRBY that creates it again
/// counts no more than its own cost, and the instance gives it its TTL back with EXPIRE NX.
#[tokio::test]
async fn a_counter_known_to_carry_a_ttl_is_counted_without_expire_and_repaired_when_deleted() {
    require_redis!();
    let redis = RedisServer::start();
    let url = redis.url();
    let server = start(&[("REDIS_URL", &url)], &rules(Algorithm::FixedWindow, 100)).await;
    let before = command_calls(redis.port);
    for _ in 0..5 {
        ask(&server, &[&[("k", "hot")]]).await.expect("answer");
    }
    let after = command_calls(redis.port);
    let delta = |command: &str| calls_between(&before, &after, command);
    assert_eq!(
        (delta("incrby"), delta("expire")),
        (5, 1),
        "EXPIRE on the first hit only"
    );
    assert_eq!(server.metric("tollgate_redis_expires_sent_total ").await, 1);
    assert_eq!(server.metric("tollgate_redis_expires_skipped_total ").await, 4);

    let keys = redis.cli(&["KEYS", "rd_k_hot_*"]);
    let key = keys.trim();
    redis.cli(&["DEL", key]);
    let monitor = Monitor::start(redis.port);
    let answer = ask(&server, &[&[("k", "hot")]]).await.expect("answer");
    assert_eq!(answer.statuses[0].limit_remaining, 99, "counted from zero again");
    // The repair goes out in the background, without holding the answer up.
    let deadline = Instant::now() + Duration::from_secs(5);
    let ttl = loop {
        let ttl: i64 = redis.cli(&["TTL", key]).trim().parse().expect("ttl");
        if ttl > 0 || Instant::now() > deadline {
            break ttl;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(
        (3000..=3900).contains(&ttl),
        "the recreated counter has its TTL: {ttl}"
    );
    let commands = monitor.client_commands();
    assert!(
        commands
            .iter()
            .any(|c| c.starts_with("\"EXPIRE\"") && c.ends_with("\"NX\"")),
        "repaired with EXPIRE NX, which cannot shorten a TTL another replica set: {commands:?}"
    );
    assert_eq!(server.metric("tollgate_redis_ttl_repairs_total ").await, 1);
    server.stop().await;
}

#[tokio::test]
async fn three_descriptors_cost_one_redis_command() {
    require_redis!();
    let redis = RedisServer::start();
    let url = redis.url();
    let text = "domain: rd\ndescriptors:\n  - key: a\n    rate_limit: {unit: hour, requests_per_unit: 100}\n  - key: b\n    rate_limit: {unit: hour, requests_per_unit: 100, algorithm: token_bucket}\n  - key: c\n    rate_limit: {unit: hour, requests_per_unit: 100, algorithm: sliding_log}\n";
    let server = start(&[("REDIS_URL", &url)], text).await;
    ask(&server, &[&[("a", "0")], &[("b", "0")], &[("c", "0")]])
        .await
        .expect("warm-up (loads the script)");
    // MONITOR shows every command with its source; commands run inside a script say `lua`.
    let monitor = Monitor::start(redis.port);
    for i in 1..=20 {
        let v = i.to_string();
        ask(&server, &[&[("a", &v)], &[("b", &v)], &[("c", &v)]])
            .await
            .expect("answer");
    }
    let commands = monitor.client_commands();
    let fcall = commands.iter().filter(|c| c.starts_with("\"FCALL\"")).count();
    let others: Vec<_> = commands
        .iter()
        .filter(|c| !c.starts_with("\"FCALL\"") && !c.starts_with("\"PING\""))
        .collect();
    assert_eq!(fcall, 20, "{commands:?}");
    assert!(
        others.is_empty(),
        "commands besides one FCALL per request: {others:?}"
    );
    server.stop().await;
}

/// `redis-cli MONITOR` in the background.
struct Monitor {
    child: std::process::Child,
}

impl Monitor {
    fn start(port: u16) -> Self {
        use std::io::BufRead;
        let mut child = std::process::Command::new("redis-cli")
            .args(["-p", &port.to_string(), "MONITOR"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("redis-cli MONITOR");
        // Wait for its "OK" so no command is missed.
        let stdout = child.stdout.as_mut().expect("stdout");
        let mut first = String::new();
        std::io::BufReader::new(stdout)
            .read_line(&mut first)
            .expect("MONITOR answers");
        assert_eq!(first.trim(), "OK");
        Self { child }
    }

    /// The commands clients sent (script-internal ones excluded), as `"NAME" "arg"...` text.
    fn client_commands(mut self) -> Vec<String> {
        use std::io::Read;
        std::thread::sleep(Duration::from_millis(200));
        let _ = self.child.kill();
        let mut out = String::new();
        self.child
            .stdout
            .take()
            .expect("stdout")
            .read_to_string(&mut out)
            .expect("read");
        let _ = self.child.wait();
        out.lines()
            .filter(|line| !line.contains(" lua] "))
            .filter_map(|line| line.split_once("] ").map(|(_, command)| command.to_owned()))
            .collect()
    }
}

#[tokio::test]
async fn a_key_over_its_limit_is_answered_from_the_local_cache() {
    require_redis!();
    let redis = RedisServer::start();
    let url = redis.url();
    let server = start(&[("REDIS_URL", &url)], &rules(Algorithm::FixedWindow, 1)).await;
    ask(&server, &[&[("k", "attacker")]]).await.expect("answer");
    let before = command_calls(redis.port).get("fcall").copied().unwrap_or(0);
    for _ in 0..100 {
        let r = ask(&server, &[&[("k", "attacker")]]).await.expect("answer");
        assert_eq!(r.overall_code, Code::OverLimit as i32);
        assert!(r.statuses[0].current_limit.is_some());
    }
    let after = command_calls(redis.port).get("fcall").copied().unwrap_or(0);
    assert!(
        after - before <= 1,
        "{} script calls for 100 requests on a blocked key",
        after - before
    );
    server.stop().await;
}

#[tokio::test]
async fn killed_redis_answers_within_the_deadline_by_failure_mode_then_recovers() {
    require_redis!();
    let mut redis = RedisServer::start();
    let url = redis.url();
    let env = [
        ("REDIS_URL", url.as_str()),
        ("TOLLGATE_REDIS_DEADLINE", "50ms"),
        ("LOCAL_CACHE_SIZE_IN_BYTES", "0"),
    ];
    let server = TestServer::start(&[("rd.yaml", &rules(Algorithm::TokenBucket, 1000))], &env).await;
    assert_eq!(
        ask(&server, &[&[("k", "x")]]).await.expect("answer").overall_code,
        Code::Ok as i32
    );
    redis.kill();
    for _ in 0..20 {
        let started = Instant::now();
        let open = ask(&server, &[&[("open", "x")]])
            .await
            .expect("failure_mode open answers");
        let closed = ask(&server, &[&[("closed", "x")]])
            .await
            .expect("failure_mode closed answers");
        let unset = ask(&server, &[&[("k", "x")]])
            .await
            .expect_err("no failure_mode: an error");
        assert!(
            started.elapsed() < Duration::from_millis(600),
            "three calls took {:?}",
            started.elapsed()
        );
        assert_eq!(open.overall_code, Code::Ok as i32);
        assert_eq!(closed.overall_code, Code::OverLimit as i32);
        assert_eq!(unset.code(), tonic::Code::Unavailable, "{unset:?}");
    }
    // As the Go service: ready through the outage (the failure modes answer); `/readyz` follows Redis.
    let (status, _) = http(server.http, "GET", "/healthcheck", "").await;
    assert_eq!(status, 200, "still ready while Redis is down");
    let (status, _) = http(server.http, "GET", "/readyz", "").await;
    assert_eq!(status, 500, "/readyz follows the store");
    redis.restart();
    let deadline = Instant::now() + Duration::from_secs(15);
    while ask(&server, &[&[("k", "y")]]).await.is_err() {
        assert!(Instant::now() < deadline, "Tollgate never reconnected to Redis");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    server.wait_ready().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_flush_under_load_fails_no_request() {
    flush_under_load_fails_no_request("SCRIPT").await;
}

/// `FUNCTION FLUSH` (what a restart without persistence amounts to) while requests are in flight: each
/// call that meets `Function not found` loads the library and retries; none fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn function_flush_under_load_fails_no_request() {
    flush_under_load_fails_no_request("FUNCTION").await;
}

/// `<what> FLUSH` five times under eight concurrent request loops; every request must succeed.
async fn flush_under_load_fails_no_request(what: &'static str) {
    require_redis!();
    let redis = RedisServer::start();
    let url = redis.url();
    let server = Arc::new(start(&[("REDIS_URL", &url)], &rules(Algorithm::Gcra, 1_000_000)).await);
    let load: Vec<_> = (0..8)
        .map(|i| {
            let server = Arc::clone(&server);
            tokio::spawn(async move {
                for n in 0..100 {
                    let v = format!("{i}-{n}");
                    ask(&server, &[&[("k", &v)]])
                        .await
                        .unwrap_or_else(|e| panic!("a request failed across {what} FLUSH: {e:?}"));
                }
            })
        })
        .collect();
    for _ in 0..5 {
        assert_eq!(redis.cli(&[what, "FLUSH"]).trim(), "OK");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for task in load {
        task.await.expect("load");
    }
    Arc::into_inner(server).expect("done").stop().await;
}

/// Where a key lives is the domain's choice ([`Batch::keep_together`]), not the call's: a peek or
/// refund placed otherwise than the consumption (per descriptor, where envoyproxy/ratelimit's key names
/// a lone fixed window, or in the domain's slot) names other keys, so it sees a fresh key and gives
/// nothing back. That peeks and refunds placed alike find what consumptions wrote is part of the store
/// contract (`store_contract::peeks_and_refunds_find_what_consumptions_wrote`).
async fn other_placements_miss_the_consumed_keys(url: &str, kind: &str) {
    let (store, stop) = connected_store(url, kind).await;
    let apply = |batch: Batch| {
        let store = Arc::clone(&store);
        async move {
            let decisions: Vec<Decision> = store.apply(&batch).await.expect("store answers");
            decisions.iter().map(|d| d.remaining).collect::<Vec<u64>>()
        }
    };
    let hour = 3_600_000_000;
    // On a cluster, STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT keeps a domain's keys together.
    let policies = [
        (CommitPolicy::Independent, false),
        (CommitPolicy::StopIncrementWhenOverLimit, store.is_cluster()),
        (CommitPolicy::AllOrNothing, true),
    ];
    for algorithm in Algorithm::ALL {
        for (consume, together) in policies {
            let scope = "pre:dom";
            let name = format!("{}_{consume:?}", algorithm.as_str());
            let item = |descriptor: &str, window_us: u64, cost: u64, group: u32| BatchItem {
                key: format!("{scope}_{descriptor}_{name}_"),
                limit: Limit {
                    algorithm,
                    requests: 5,
                    window_us,
                    burst: 5,
                },
                cost,
                group,
                go_format: false,
            };
            // A descriptor with one limit and one with two.
            let batch = |policy: CommitPolicy, cost: u64, keep_together: bool| Batch {
                items: vec![
                    item("lone", hour, cost, 0),
                    item("pair", hour, cost, 1),
                    item("pair", 24 * hour, cost, 1),
                ],
                policy,
                scope_len: scope.len(),
                keep_together,
                once: None,
            };
            let (peek, refund) = (CommitPolicy::Peek, CommitPolicy::Refund);
            let context = format!("{algorithm:?} {consume:?}");
            assert_eq!(apply(batch(consume, 2, together)).await, [3, 3, 3], "{context}");
            assert_eq!(
                apply(batch(peek, 1, !together)).await,
                [4, 4, 4],
                "{context}: a fresh key"
            );
            assert_eq!(
                apply(batch(refund, 2, !together)).await,
                [5, 5, 5],
                "{context}: a fresh key"
            );
            assert_eq!(
                apply(batch(peek, 0, together)).await,
                [3, 3, 3],
                "{context}: the refund missed"
            );
        }
    }
    stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peeks_and_refunds_placed_otherwise_miss_the_consumed_keys() {
    require_redis!();
    let redis = RedisServer::start();
    other_placements_miss_the_consumed_keys(&redis.url(), "single").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peeks_and_refunds_placed_otherwise_miss_the_consumed_keys_in_a_cluster() {
    require_redis!();
    let cluster = RedisCluster::start();
    other_placements_miss_the_consumed_keys(&cluster.addrs(), "cluster").await;
}

/// Every lease key has a TTL, that of its latest-expiring lease (not of the last one written), so an
/// abandoned key disappears with its last lease and no earlier; a key left without leases is deleted.
/// (What leases admit, across keys and over time, is in the store contract.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_keys_expire_with_their_last_lease() {
    require_redis!();
    let redis = RedisServer::start();
    let (store, stop) = connected_store(&redis.url(), "single").await;
    let scope = "pre:jobs";
    let key = |name: &str| format!("{scope}_job_{name}_");
    let acquire = |names: &[&str], id: &str, ttl_ms: u64| AcquireRequest {
        items: names
            .iter()
            .map(|name| LeaseItem {
                key: key(name),
                max_in_flight: 2,
            })
            .collect(),
        lease_id: id.to_owned(),
        renew: false,
        ttl_us: ttl_ms * 1000,
        scope_len: scope.len(),
    };
    let taken = store.acquire(&acquire(&["a", "b"], "long", 60_000)).await;
    assert!(taken.expect("store").iter().all(|s| s.available));
    let taken = store.acquire(&acquire(&["a"], "short", 150)).await;
    assert!(taken.expect("store")[0].available);
    let release = ReleaseRequest {
        keys: vec![key("b")],
        lease_id: "long".to_owned(),
        scope_len: scope.len(),
    };
    let released = store.release(&release).await.expect("store");
    assert_eq!((released[0].released, released[0].in_flight), (true, 0));
    let keys: Vec<String> = redis
        .cli(&["KEYS", "*"])
        .lines()
        .filter(|k| !k.is_empty())
        .map(str::to_owned)
        .collect();
    assert_eq!(keys.len(), 1, "only the key still holding leases: {keys:?}");
    let ttl: i64 = redis.cli(&["PTTL", &keys[0]]).trim().parse().expect("PTTL");
    assert!((59_000..=60_000).contains(&ttl), "{} has PTTL {ttl}", keys[0]);
    stop.cancel();
}

#[tokio::test]
async fn starting_with_redis_down_is_not_ready_then_ready_when_redis_comes() {
    require_redis!();
    let mut redis = RedisServer::start();
    let url = redis.url();
    redis.kill();
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("rd.yaml"), rules(Algorithm::FixedWindow, 10)).expect("rules");
    let env = [
        ("REDIS_URL", url.as_str()),
        ("TOLLGATE_REDIS_DEADLINE", TEST_DEADLINE),
    ];
    let server = TestServer::start_unready(dir, &env).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (status, _) = http(server.http, "GET", "/healthcheck", "").await;
    assert_eq!(status, 500);
    let (_, metrics) = http(server.http, "GET", "/metrics", "").await;
    assert!(
        metrics.contains("\ntollgate_store_up{store=\"redis\"} 0\n"),
        "{metrics}"
    );
    redis.restart();
    server.wait_ready().await;
    assert_eq!(
        ask(&server, &[&[("k", "v")]]).await.expect("answer").overall_code,
        Code::Ok as i32
    );
    let (_, metrics) = http(server.http, "GET", "/metrics", "").await;
    assert!(
        metrics.contains("\ntollgate_store_up{store=\"redis\"} 1\n"),
        "{metrics}"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_counts_exactly_across_slots() {
    require_redis!();
    let cluster = RedisCluster::start();
    let addrs = cluster.addrs();
    let env = [("REDIS_URL", addrs.as_str()), ("REDIS_TYPE", "cluster")];
    // One request touching descriptors in different slots is answered whole: by a script call per
    // slot, pipelined per master, or for fixed windows by a pipeline of INCRBY + EXPIRE per master.
    for algorithm in [Algorithm::SlidingWindow, Algorithm::FixedWindow] {
        let server = start(&env, &rules(algorithm, 3)).await;
        // Until the slot map is read, every call goes alone through the cluster connection.
        first_ask_reads_the_slot_map(&cluster, &server, "warm").await;
        let calls = async || {
            let scripts = server.metric("tollgate_redis_script_calls_total ").await;
            (scripts, server.metric("tollgate_redis_pipelines_total ").await)
        };
        let (scripts_before, pipelines_before) = calls().await;
        for expected in [2, 1, 0] {
            let r = ask(&server, &[&[("k", "alpha")], &[("k", "beta")], &[("k", "gamma")]])
                .await
                .expect("answer");
            assert!(r.statuses.iter().all(|s| s.limit_remaining == expected), "{r:?}");
        }
        let over = ask(&server, &[&[("k", "alpha")]]).await.expect("answer");
        assert_eq!(over.overall_code, 2, "over the limit: {over:?}");
        let (scripts, pipelines) = calls().await;
        let (scripts, pipelines) = (scripts - scripts_before, pipelines - pipelines_before);
        if algorithm == Algorithm::FixedWindow {
            assert_eq!(scripts, 0, "fixed windows need no script");
        } else {
            assert!(
                scripts >= pipelines,
                "a script call per slot: {scripts}, {pipelines}"
            );
        }
        assert!(pipelines > 0, "pipelines per master");
        server.stop().await;
    }
    exact_admission(&env).await;
}

/// Asks for `value` of `k` once, waits until the cluster's slot map has been read because of it (in
/// the background), then asks for `links-ready` until requests go out over the links to the masters.
async fn first_ask_reads_the_slot_map(cluster: &RedisCluster, server: &TestServer, value: &str) {
    let slot_map_reads = || -> u64 {
        cluster
            .nodes
            .iter()
            .map(|node| {
                command_calls(node.port)
                    .get("cluster|slots")
                    .copied()
                    .unwrap_or(0)
            })
            .sum()
    };
    let before = slot_map_reads();
    ask(server, &[&[("k", value)]]).await.expect("answer");
    let deadline = Instant::now() + Duration::from_secs(5);
    while slot_map_reads() == before {
        assert!(Instant::now() < deadline, "the slot map was never read");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The links to the masters are opened after the map is read: once they are, requests go out as
    // pipelines per master (before, each call goes alone through the cluster connection).
    let before = server.metric("tollgate_redis_pipelines_total ").await;
    while server.metric("tollgate_redis_pipelines_total ").await == before {
        assert!(Instant::now() < deadline, "the links to the masters never opened");
        ask(server, &[&[("k", "links-ready")]]).await.expect("answer");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// In a Redis Cluster, a master that dies fails only the requests whose counters it serves: requests
/// that shared a coalesced group with them, counted by the other masters, are answered from Redis. For
/// fixed windows (pipelines of INCRBY per master) and the script (pipelines of FCALL per master).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_cluster_master_fails_only_the_requests_it_serves() {
    require_redis!();
    for algorithm in [Algorithm::FixedWindow, Algorithm::TokenBucket] {
        let mut cluster = RedisCluster::start();
        let addrs = cluster.addrs();
        let env = [("REDIS_URL", addrs.as_str()), ("REDIS_TYPE", "cluster")];
        let server = Arc::new(start(&env, &rules(algorithm, 100)).await);
        first_ask_reads_the_slot_map(&cluster, &server, "warm").await;
        let warm = cluster
            .nodes
            .iter()
            .map(|node| node.cli(&["KEYS", "*warm*"]).trim().to_owned())
            .find(|key| !key.is_empty())
            .expect("the first key");
        // A key in the slot of value's key: the Go-format counter, or one with its hash tag.
        let key_of = |value: &str| match warm.strip_prefix("rd_k_warm_") {
            Some(window) => format!("rd_k_{value}_{window}"),
            None => format!("{{rd_k_{value}_}}"),
        };
        let values: Vec<String> = (0..64).map(|i| format!("v{i}")).collect();
        // A node answers MOVED for the keys it does not serve.
        let on_dead: Vec<bool> = values
            .iter()
            .map(|value| !cluster.nodes[0].cli(&["GET", &key_of(value)]).contains("MOVED"))
            .collect();
        assert!(on_dead.iter().any(|&dead| dead) && on_dead.iter().any(|&dead| !dead));
        cluster.nodes[0].kill();
        // Before the other masters see it gone (cluster-node-timeout 2 s) and refuse every command.
        let answers = futures_util::future::join_all(values.iter().map(|value| {
            let server = Arc::clone(&server);
            async move { ask(&server, &[&[("k", value.as_str())]]).await }
        }))
        .await;
        for ((value, dead), answer) in values.iter().zip(&on_dead).zip(&answers) {
            match answer {
                Ok(answer) => {
                    assert!(!dead, "{algorithm:?} {value}: answered though its master is dead");
                    assert_eq!(answer.statuses[0].limit_remaining, 99, "{algorithm:?} {value}");
                }
                Err(status) => assert!(
                    dead,
                    "{algorithm:?} {value}: failed though a live master serves it: {status}"
                ),
            }
        }
        Arc::into_inner(server).expect("clients done").stop().await;
    }
}

/// In a Redis Cluster, before Tollgate has read the slot map, a request's counters are decided by the
/// script per slot, not pipelined through redis-rs' cluster connection: that one resends a whole
/// pipeline when one reply is ASK, so in a slot caught mid-migration, with one counter moved and one
/// not, it counted the unmoved one on both nodes. Each counter is counted at most once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_caught_mid_migration_never_counts_a_counter_twice() {
    require_redis!();
    let cluster = RedisCluster::start();
    let addrs = cluster.addrs();
    let env = [("REDIS_URL", addrs.as_str()), ("REDIS_TYPE", "cluster")];
    let server = Arc::new(start(&env, &rules(Algorithm::FixedWindow, 100)).await);
    // The hour's window, named as the Go service names it; not within a few seconds of its end.
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970")
            .as_secs()
    };
    if now() % 3600 > 3590 {
        tokio::time::sleep(Duration::from_secs(12)).await;
    }
    let window = now() / 3600 * 3600;
    let key = |value: &str| format!("rd_k_{value}_{window}");
    // Two counters of one request in one slot.
    let slot = tollgate_core::store::redis::slot(&key("moved"));
    let stayed = (0..)
        .map(|i| format!("stayed-{i}"))
        .find(|value| tollgate_core::store::redis::slot(&key(value)) == slot)
        .expect("a value in the same slot");
    let serves = |node: &RedisServer| !node.cli(&["GET", &key("moved")]).contains("MOVED");
    let from = cluster.nodes.iter().position(serves).expect("the slot's master");
    let (source, target) = (&cluster.nodes[from], &cluster.nodes[(from + 1) % 3]);
    source.cli(&["SET", &key("moved"), "5"]);
    source.cli(&["SET", &key(&stayed), "5"]);
    // Half-way through resharding the slot: one counter moved, the other not yet.
    let id = |node: &RedisServer| node.cli(&["CLUSTER", "MYID"]).trim().to_owned();
    let slot = slot.to_string();
    target.cli(&["CLUSTER", "SETSLOT", &slot, "IMPORTING", &id(source)]);
    source.cli(&["CLUSTER", "SETSLOT", &slot, "MIGRATING", &id(target)]);
    source.cli(&[
        "MIGRATE",
        "127.0.0.1",
        &target.port.to_string(),
        &key("moved"),
        "0",
        "5000",
    ]);
    // The first request: the slot map is not read yet.
    let answer = ask(&server, &[&[("k", "moved")], &[("k", &stayed)]]).await;
    // What each node holds (a node answers ASK or MOVED for a key it does not hold: 0); the importing
    // node is read after ASKING, on the same connection.
    let counted = |value: &str| -> u64 {
        [source, target]
            .iter()
            .map(|node| {
                let mut cli = std::process::Command::new("redis-cli")
                    .args(["-p", &node.port.to_string()])
                    .stdin(std::process::Stdio::piped())
                    .stdout(std::process::Stdio::piped())
                    .spawn()
                    .expect("redis-cli");
                let commands = format!("ASKING\nGET {}\n", key(value));
                std::io::Write::write_all(&mut cli.stdin.take().expect("stdin"), commands.as_bytes())
                    .expect("commands");
                let output = cli.wait_with_output().expect("redis-cli output");
                let text = String::from_utf8_lossy(&output.stdout).into_owned();
                text.lines()
                    .nth(1)
                    .and_then(|line| line.trim().parse::<u64>().ok())
                    .unwrap_or(0)
            })
            .sum()
    };
    for value in ["moved", stayed.as_str()] {
        assert!(
            counted(value) <= 6,
            "{value} counted more than once: {} ({answer:?})",
            counted(value)
        );
    }
    // The resharding ends: each counter is counted once where it lives.
    source.cli(&[
        "MIGRATE",
        "127.0.0.1",
        &target.port.to_string(),
        &key(&stayed),
        "0",
        "5000",
    ]);
    for node in &cluster.nodes {
        node.cli(&["CLUSTER", "SETSLOT", &slot, "NODE", &id(target)]);
    }
    let before = [counted("moved"), counted(&stayed)];
    let answer = ask(&server, &[&[("k", "moved")], &[("k", &stayed)]])
        .await
        .expect("answer");
    let remaining: Vec<u64> = answer
        .statuses
        .iter()
        .map(|s| u64::from(s.limit_remaining))
        .collect();
    assert_eq!(remaining, [99 - before[0], 99 - before[1]]);
    assert_eq!(
        [counted("moved"), counted(&stayed)],
        [before[0] + 1, before[1] + 1]
    );
    Arc::into_inner(server).expect("clients done").stop().await;
}

/// In a Redis Cluster, concurrent fixed-window requests share one pipeline per master (grouped by the
/// slot map Tollgate reads), and a counter whose slot moved after the map was read is still counted
/// exactly: its old master answers MOVED without counting, and the script counts it where it lives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_shares_pipelines_per_master_and_follows_a_slot_that_moved() {
    require_redis!();
    let cluster = RedisCluster::start();
    let addrs = cluster.addrs();
    let env = [("REDIS_URL", addrs.as_str()), ("REDIS_TYPE", "cluster")];
    let server = Arc::new(start(&env, &rules(Algorithm::FixedWindow, 100)).await);
    first_ask_reads_the_slot_map(&cluster, &server, "moved").await;
    let pipelines_before = server.metric("tollgate_redis_pipelines_total ").await;
    sixty_four_clients_ten_pairs_each(&server).await;
    let pipelines = server.metric("tollgate_redis_pipelines_total ").await - pipelines_before;
    // One per request (and slot) without coalescing.
    assert!(
        pipelines < 480,
        "{pipelines} pipelines for 640 concurrent requests on three masters"
    );

    // Move the counter's slot to another master, as resharding does.
    let holders: Vec<(usize, String)> = (0..cluster.nodes.len())
        .filter_map(|at| {
            let keys = cluster.nodes[at].cli(&["KEYS", "rd_k_moved_*"]);
            let key = keys.trim();
            (!key.is_empty()).then(|| (at, key.to_owned()))
        })
        .collect();
    let [(from, key)] = holders.as_slice() else {
        panic!("one master holds the counter: {holders:?}")
    };
    let (source, target) = (&cluster.nodes[*from], &cluster.nodes[(from + 1) % 3]);
    let id = |node: &RedisServer| node.cli(&["CLUSTER", "MYID"]).trim().to_owned();
    let slot = tollgate_core::store::redis::slot(key).to_string();
    target.cli(&["CLUSTER", "SETSLOT", &slot, "IMPORTING", &id(source)]);
    source.cli(&["CLUSTER", "SETSLOT", &slot, "MIGRATING", &id(target)]);
    source.cli(&["MIGRATE", "127.0.0.1", &target.port.to_string(), key, "0", "5000"]);
    for node in &cluster.nodes {
        node.cli(&["CLUSTER", "SETSLOT", &slot, "NODE", &id(target)]);
    }
    // A counter in another slot of the old master, which shares the moved counter's pipeline.
    let window = key.strip_prefix("rd_k_moved_").expect("a Go-format key");
    let (stayed, stayed_key) = (0..)
        .map(|i| format!("stayed-{i}"))
        .map(|value| {
            let key = format!("rd_k_{value}_{window}");
            (value, key)
        })
        .find(|(_, key)| !source.cli(&["GET", key]).contains("MOVED"))
        .expect("a key the old master serves");
    let scripts_before = server.metric("tollgate_redis_script_calls_total ").await;
    for expected in [[98, 99], [97, 98]] {
        let answer = ask(&server, &[&[("k", "moved")], &[("k", &stayed)]])
            .await
            .expect("answer");
        let remaining: Vec<u32> = answer.statuses.iter().map(|s| s.limit_remaining).collect();
        assert_eq!(remaining, expected);
    }
    assert_eq!(
        target.cli(&["GET", key]).trim(),
        "3",
        "counted where the slot lives now"
    );
    assert_eq!(
        source.cli(&["GET", &stayed_key]).trim(),
        "2",
        "the counter sharing the pipeline counted once a request"
    );
    assert!(
        server.metric("tollgate_redis_script_calls_total ").await > scripts_before,
        "the old master answered MOVED, and the script counted the counter"
    );
    Arc::into_inner(server).expect("clients done").stop().await;
}

/// `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT` on Redis Cluster is exact: the descriptors of one request
/// would land in different slots (their envoyproxy/ratelimit keys do), yet one over its limit leaves the
/// others untouched, because every domain's keys are kept in one slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_increment_on_a_cluster_leaks_no_increment_across_slots() {
    require_redis!();
    let cluster = RedisCluster::start();
    let addrs = cluster.addrs();
    let values: Vec<String> = (0..8).map(|i| format!("caller-{i}")).collect();
    let go_slots: std::collections::BTreeSet<u16> = values
        .iter()
        .map(|v| tollgate_core::store::redis::slot(&format!("rd_k_{v}_0")))
        .collect();
    assert!(go_slots.len() > 1, "the values must spread over slots");
    let env = [
        ("REDIS_URL", addrs.as_str()),
        ("REDIS_TYPE", "cluster"),
        ("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "true"),
    ];
    let server = start(&env, &rules(Algorithm::FixedWindow, 2)).await;
    // The last value at its limit.
    let last = values.last().expect("values").as_str();
    for _ in 0..2 {
        ask(&server, &[&[("k", last)]]).await.expect("answer");
    }
    let entries: Vec<[(&str, &str); 1]> = values.iter().map(|v| [("k", v.as_str())]).collect();
    let request: Vec<&[(&str, &str)]> = entries.iter().map(|e| &e[..]).collect();
    for _ in 0..3 {
        let r = ask(&server, &request).await.expect("answer");
        assert_eq!(r.overall_code, Code::OverLimit as i32);
    }
    // None of the others was incremented by the three refused requests.
    for value in &values[..values.len() - 1] {
        let r = ask(&server, &[&[("k", value)]]).await.expect("answer");
        assert_eq!(r.statuses[0].limit_remaining, 1, "{value}: {r:?}");
    }
    server.stop().await;
}

/// The store's side of it: a batch that settles across descriptors but spans slots cannot be decided
/// by one script, so it is refused rather than half applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_refuses_to_settle_across_slots() {
    require_redis!();
    let cluster = RedisCluster::start();
    let (store, stop) = connected_store(&cluster.addrs(), "cluster").await;
    let limit = Limit {
        algorithm: Algorithm::FixedWindow,
        requests: 5,
        window_us: 3_600_000_000,
        burst: 5,
    };
    let items: Vec<BatchItem> = ["alpha", "beta", "gamma", "delta"]
        .iter()
        .zip(0..)
        .map(|(value, group)| BatchItem {
            key: format!("rd_k_{value}_"),
            limit,
            cost: 1,
            group,
            go_format: false,
        })
        .collect();
    for policy in [
        CommitPolicy::StopIncrementWhenOverLimit,
        CommitPolicy::AllOrNothing,
    ] {
        let batch = Batch::new(items.clone(), policy);
        assert_eq!(
            store.apply(&batch).await,
            Err(tollgate_core::store::StoreError::CrossSlot),
            "{policy:?}"
        );
    }
    for node in &cluster.nodes {
        assert_eq!(node.cli(&["DBSIZE"]).trim(), "0", "nothing written");
    }
    stop.cancel();
}

/// envoyproxy/ratelimit's `REDIS_SENTINEL_AUTH`: the sentinels' own password, apart from the master's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinels_that_require_a_password_get_redis_sentinel_auth() {
    require_redis!();
    let sentinel = RedisSentinel::start_with_password(Some("s3ntinel"));
    let url = sentinel.url();
    let env = [
        ("REDIS_TYPE", "sentinel"),
        ("REDIS_URL", url.as_str()),
        ("REDIS_SENTINEL_AUTH", "s3ntinel"),
    ];
    let server = start(&env, &rules(Algorithm::FixedWindow, 2)).await;
    for expected in [Code::Ok, Code::Ok, Code::OverLimit] {
        let answer = ask(&server, &[&[("k", "guarded")]]).await.expect("answer");
        assert_eq!(answer.overall_code, expected as i32);
    }
    server.stop().await;

    // Without the password the sentinel refuses, so Tollgate never finds the master: not ready, and
    // decisions fail as with Redis down.
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("rd.yaml"), rules(Algorithm::FixedWindow, 2)).expect("rules");
    let env = [("REDIS_TYPE", "sentinel"), ("REDIS_URL", url.as_str())];
    let refused = TestServer::start_unready(dir, &env).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (status, _) = http(refused.http, "GET", "/healthcheck", "").await;
    assert_eq!(status, 500);
    refused.stop().await;
}

/// `REDIS_TLS` with Sentinel, as the Go service: the sentinels and the master they name are both reached
/// over TLS, verified by `REDIS_TLS_CACERT`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_over_tls_reaches_sentinels_and_master_over_tls() {
    require_redis!();
    let ca = crate::common::certs::Ca::new("redis CA");
    let leaf = ca.peer(&["localhost", "127.0.0.1"]);
    let certs = tempfile::tempdir().expect("tempdir");
    let write = |name: &str, text: &str| crate::common::certs::write_file(certs.path(), name, text);
    let tls = SentinelTls {
        cert: write("redis.crt", &leaf.cert),
        key: write("redis.key", &leaf.key),
        ca: write("ca.crt", &ca.pem()),
    };
    let sentinel = RedisSentinel::start_tls(&tls);
    let url = sentinel.tls_url();
    let env = [
        ("REDIS_TYPE", "sentinel"),
        ("REDIS_URL", url.as_str()),
        ("REDIS_TLS", "true"),
        ("REDIS_TLS_CACERT", tls.ca.as_str()),
    ];
    let server = start(&env, &rules(Algorithm::FixedWindow, 2)).await;
    for expected in [Code::Ok, Code::Ok, Code::OverLimit] {
        let answer = ask(&server, &[&[("k", "sentinel-tls")]]).await.expect("answer");
        assert_eq!(answer.overall_code, expected as i32);
    }
    // The counter is on the master (read back over its plain port).
    assert!(
        sentinel
            .master
            .cli(&["KEYS", "rd_k_sentinel-tls_*"])
            .contains("rd_k_sentinel-tls_")
    );
    server.stop().await;

    // A CA that did not sign the sentinel's certificate: the master is never found.
    let stranger = crate::common::certs::Ca::new("stranger");
    let other_ca = crate::common::certs::write_file(certs.path(), "other.crt", &stranger.pem());
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("rd.yaml"), rules(Algorithm::FixedWindow, 2)).expect("rules");
    let env = [
        ("REDIS_TYPE", "sentinel"),
        ("REDIS_URL", url.as_str()),
        ("REDIS_TLS", "true"),
        ("REDIS_TLS_CACERT", other_ca.as_str()),
    ];
    let refused = TestServer::start_unready(dir, &env).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (status, _) = http(refused.http, "GET", "/healthcheck", "").await;
    assert_eq!(status, 500, "unverified TLS is not ready");
    refused.stop().await;
}

/// Waits (up to 5 s) until the sentinel fixture's replica has applied everything its master wrote.
fn wait_for_replica(sentinel: &RedisSentinel) {
    let offset = |text: String| {
        text.lines()
            .find_map(|l| l.strip_prefix("master_repl_offset:"))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        let written = offset(sentinel.master.cli(&["INFO", "replication"]));
        if offset(sentinel.replica.cli(&["INFO", "replication"])) >= written {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("the replica never caught up with its master");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_failover_is_followed_without_a_restart() {
    require_redis!();
    let mut sentinel = RedisSentinel::start();
    let url = sentinel.url();
    let env = [
        ("REDIS_TYPE", "sentinel"),
        ("REDIS_URL", url.as_str()),
        ("LOCAL_CACHE_SIZE_IN_BYTES", "0"),
    ];
    let server = start(&env, &rules(Algorithm::FixedWindow, 1000)).await;
    let mut before = None;
    for _ in 0..3 {
        let answer = ask(&server, &[&[("k", "v")]]).await.expect("answer");
        assert_eq!(answer.overall_code, Code::Ok as i32);
        before = answer.statuses[0].duration_until_reset;
    }
    // When the hour window ends during the failover, the count starts afresh, rightly (the reset is
    // rounded up to whole seconds, hence the second less).
    let window_ends =
        Instant::now() + Duration::from_secs(before.map_or(0, |d| (d.seconds as u64).saturating_sub(1)));
    // Replication is asynchronous: kill the master only once the replica has every write, or the
    // promoted replica may not hold the counter yet (that lag is Redis', not Tollgate's, to answer for).
    wait_for_replica(&sentinel);
    let old_master = sentinel.master.port;
    sentinel.master.kill();
    let deadline = Instant::now() + Duration::from_secs(30);
    let after = loop {
        if let Ok(response) = ask(&server, &[&[("k", "v")]]).await {
            break response;
        }
        assert!(
            Instant::now() < deadline,
            "Tollgate never reached the promoted master"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        sentinel.master_port(),
        Some(sentinel.replica.port),
        "the replica was promoted"
    );
    assert_ne!(sentinel.replica.port, old_master);
    assert_eq!(after.overall_code, Code::Ok as i32);
    // The replica had the counter: the count goes on (3 before, this one is the 4th or later).
    if Instant::now() < window_ends {
        assert!(after.statuses[0].limit_remaining <= 996, "{after:?}");
    }
    server.stop().await;
}

/// A private CA and a certificate for 127.0.0.1 signed by it, made with the `openssl` command.
fn private_ca(dir: &std::path::Path) -> Option<()> {
    let openssl = |args: &[&str]| {
        std::process::Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .ok()
            .filter(|s| s.success())
    };
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "2",
        "-subj",
        "/CN=tollgate-test-ca",
    ])?;
    openssl(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=localhost",
    ])?;
    std::fs::write(dir.join("san.ext"), "subjectAltName=DNS:localhost,IP:127.0.0.1\n").ok()?;
    openssl(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.crt",
        "-days",
        "2",
        "-extfile",
        "san.ext",
    ])?;
    Some(())
}

#[tokio::test]
async fn tls_to_redis_verified_by_a_private_ca() {
    require_redis!();
    let certs = tempfile::tempdir().expect("tempdir");
    if private_ca(certs.path()).is_none() {
        assert!(
            std::env::var("TOLLGATE_REQUIRE_REDIS").is_err(),
            "openssl is needed to test TLS"
        );
        return;
    }
    let path = |name: &str| certs.path().join(name).to_string_lossy().into_owned();
    let tls_port = crate::common::redis::free_port().to_string();
    let (cert, key, ca) = (path("server.crt"), path("server.key"), path("ca.crt"));
    let redis = RedisServer::start_with(&[
        "--tls-port",
        &tls_port,
        "--tls-cert-file",
        &cert,
        "--tls-key-file",
        &key,
        "--tls-ca-cert-file",
        &ca,
        "--tls-auth-clients",
        "no",
    ]);
    let url = format!("127.0.0.1:{tls_port}");
    let env = [
        ("REDIS_URL", url.as_str()),
        ("REDIS_TLS", "true"),
        ("REDIS_TLS_CACERT", ca.as_str()),
    ];
    let server = start(&env, &rules(Algorithm::FixedWindow, 5)).await;
    let response = ask(&server, &[&[("k", "over-tls")]])
        .await
        .expect("answered through TLS");
    assert_eq!(response.statuses[0].limit_remaining, 4);
    // The counter landed in this Redis (read back over its plain port).
    assert!(redis.cli(&["KEYS", "rd_k_over-tls_*"]).contains("rd_k_over-tls_"));
    server.stop().await;

    // Without the CA, the certificate cannot be verified: never ready, and requests fail clearly.
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("rd.yaml"), rules(Algorithm::FixedWindow, 5)).expect("rules");
    let unverified =
        TestServer::start_unready(dir, &[("REDIS_URL", url.as_str()), ("REDIS_TLS", "true")]).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (status, _) = http(unverified.http, "GET", "/healthcheck", "").await;
    assert_eq!(status, 500);
    let error = ask(&unverified, &[&[("k", "x")]])
        .await
        .expect_err("no trusted connection");
    assert_eq!(error.code(), tonic::Code::Unavailable);
    unverified.stop().await;
}

/// `REDIS_PERSECOND`: per-second limits in their own Redis, the rest in the main one, with the Go
/// service's keys in each; a request with both is split and answered in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_second_limits_are_counted_in_their_own_redis() {
    require_redis!();
    let (main, mut per_second) = (RedisServer::start(), RedisServer::start());
    let (main_url, second_url) = (main.url(), per_second.url());
    let rules = "domain: rd\ndescriptors:\n  - key: ps\n    rate_limit: {unit: second, requests_per_unit: 100}\n  - key: pm\n    rate_limit: {unit: minute, requests_per_unit: 2}\n";
    let env = [
        ("REDIS_URL", main_url.as_str()),
        ("REDIS_PERSECOND", "true"),
        ("REDIS_PERSECOND_URL", second_url.as_str()),
    ];
    let server = start(&env, rules).await;
    let mut codes = Vec::new();
    for _ in 0..3 {
        let answer = ask(&server, &[&[("ps", "a")], &[("pm", "b")]])
            .await
            .expect("answer");
        assert_eq!(answer.statuses.len(), 2);
        assert_eq!(
            answer.statuses[0]
                .current_limit
                .as_ref()
                .map(|l| l.requests_per_unit),
            Some(100),
            "the per-second status comes first, as asked"
        );
        codes.push(answer.statuses[1].code);
    }
    assert_eq!(codes, [Code::Ok as i32, Code::Ok as i32, Code::OverLimit as i32]);
    assert!(
        per_second.cli(&["KEYS", "rd_ps_a_*"]).contains("rd_ps_a_"),
        "per-second key in the per-second Redis"
    );
    assert!(
        main.cli(&["KEYS", "rd_ps_a_*"]).trim().is_empty(),
        "and not in the main one"
    );
    assert!(
        main.cli(&["KEYS", "rd_pm_b_*"]).contains("rd_pm_b_"),
        "per-minute key in the main Redis"
    );
    assert!(per_second.cli(&["KEYS", "rd_pm_b_*"]).trim().is_empty());
    server.stop().await;

    // A domain that is all-or-nothing across the two cannot be atomic: refused when the rules load.
    let all_or_nothing = format!("all_or_nothing: true\n{rules}");
    let domain = tollgate_core::rules::file::parse_file("rd.yaml", &all_or_nothing).expect("valid file");
    let options = tollgate_core::rules::CompileOptions {
        split_per_second: true,
        ..Default::default()
    };
    let error = tollgate_core::rules::RuleSet::compile(vec![domain], options).expect_err("two Redis");
    assert!(error.to_string().contains("REDIS_PERSECOND"), "{error}");

    // A single all-or-nothing call across the two: FAILED_PRECONDITION, nothing counted.
    let server = start(&env, rules).await;
    let mut native = RateLimiterClient::new(server.channel().await);
    let call = |entries: &[(&str, &str)]| CheckRequest {
        domain: "rd".into(),
        descriptors: entries
            .iter()
            .map(|(k, v)| Descriptor {
                entries: vec![Entry {
                    key: (*k).into(),
                    value: (*v).into(),
                }],
                cost: None,
            })
            .collect(),
        cost: 1,
        mode: 2,
    };
    let refused = native
        .check(call(&[("ps", "c"), ("pm", "d")]))
        .await
        .expect_err("not atomic");
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition, "{refused:?}");
    assert!(main.cli(&["KEYS", "rd_pm_d_*"]).trim().is_empty());
    native
        .check(call(&[("ps", "c")]))
        .await
        .expect("one Redis is fine");

    // `/readyz` needs both to answer; `/healthcheck` stays ready, as the Go service's does.
    per_second.kill();
    let deadline = Instant::now() + Duration::from_secs(5);
    while http(server.http, "GET", "/readyz", "").await.0 != 500 {
        assert!(
            Instant::now() < deadline,
            "/readyz still ready without the per-second Redis"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(http(server.http, "GET", "/healthcheck", "").await.0, 200);
    server.stop().await;
}

/// A rolling upgrade shares counters: an instance that counts fixed windows with the script (as every
/// earlier Tollgate did) and one that pipelines INCRBY read and write the same Go-format key, taking
/// turns on one caller, and the budget runs down exactly across both. A native refund (a script with
/// KEEPTTL) gives back into a counter the pipeline wrote.
#[tokio::test]
async fn scripted_and_pipelined_instances_share_fixed_window_counters() {
    require_redis!();
    let redis = RedisServer::start();
    let url = redis.url();
    let scripted = start(
        &[
            ("REDIS_URL", &url),
            ("TOLLGATE_REDIS_PIPELINE_FIXED_WINDOWS", "false"),
        ],
        &rules(Algorithm::FixedWindow, 5),
    )
    .await;
    let pipelined = start(&[("REDIS_URL", &url)], &rules(Algorithm::FixedWindow, 5)).await;
    let mut remaining = Vec::new();
    for turn in 0..7 {
        let server = if turn % 2 == 0 { &pipelined } else { &scripted };
        let answer = ask(server, &[&[("k", "shared")]]).await.expect("answer");
        remaining.push((answer.overall_code, answer.statuses[0].limit_remaining));
    }
    let (ok, over) = (1, 2);
    assert_eq!(
        remaining,
        [(ok, 4), (ok, 3), (ok, 2), (ok, 1), (ok, 0), (over, 0), (over, 0)]
    );
    let keys = redis.cli(&["KEYS", "rd_k_shared_*"]);
    let key = keys.trim();
    assert_eq!(
        redis.cli(&["GET", key]).trim(),
        "7",
        "denied requests count too, as in Go"
    );
    let calls = command_calls(redis.port);
    assert_eq!(calls.get("incrby").copied(), Some(4), "the pipelined turns");

    // The pipeline wrote the counter; the script refunds into it, keeping its TTL.
    let body = r#"{"domain":"rd","descriptors":[{"entries":[{"key":"k","value":"refundable"}]}],"cost":2}"#;
    let (status, checked) = http(pipelined.http, "POST", "/v1/check", body).await;
    assert_eq!(status, 200, "{checked}");
    let checked: serde_json::Value = serde_json::from_str(&checked).expect("json");
    assert_eq!(checked["results"][0]["remaining"], 3);
    let refund = format!(
        r#"{{"domain":"rd","descriptors":[{{"entries":[{{"key":"k","value":"refundable"}}]}}],"refund_token":"{}"}}"#,
        checked["refund_token"].as_str().expect("token")
    );
    let (status, refunded) = http(pipelined.http, "POST", "/v1/refund", &refund).await;
    assert_eq!(status, 200, "{refunded}");
    let keys = redis.cli(&["KEYS", "rd_k_refundable_*"]);
    assert_eq!(redis.cli(&["GET", keys.trim()]).trim(), "0");
    let ttl: i64 = redis.cli(&["TTL", keys.trim()]).trim().parse().expect("ttl");
    assert!(ttl > 0, "the refund kept the counter's TTL: {ttl}");
    scripted.stop().await;
    pipelined.stop().await;
}

/// A counter key holding something INCRBY refuses (not an integer) is decided by the script instead,
/// which reads it as no count and overwrites it, as it always did; the request's other descriptors
/// are counted once.
#[tokio::test]
async fn a_counter_incrby_refuses_is_decided_by_the_script() {
    require_redis!();
    let redis = RedisServer::start();
    let url = redis.url();
    let server = start(&[("REDIS_URL", &url)], &rules(Algorithm::FixedWindow, 5)).await;
    ask(&server, &[&[("k", "garbled")]]).await.expect("answer");
    let keys = redis.cli(&["KEYS", "rd_k_garbled_*"]);
    let key = keys.trim();
    redis.cli(&["SET", key, "not a number", "KEEPTTL"]);
    let answer = ask(&server, &[&[("k", "garbled")], &[("k", "fine")]])
        .await
        .expect("answer");
    let remaining: Vec<u32> = answer.statuses.iter().map(|s| s.limit_remaining).collect();
    assert_eq!(remaining, [4, 4]);
    assert_eq!(redis.cli(&["GET", key]).trim(), "1", "overwritten with a count");
    let fine = redis.cli(&["KEYS", "rd_k_fine_*"]);
    assert_eq!(redis.cli(&["GET", fine.trim()]).trim(), "1", "counted once");
    server.stop().await;
}
