//! `examples/envoy/envoy.yaml`, run by Envoy as a user would run it, in front of `tollgate serve` of
//! `examples/config`: every limit the file documents refuses at its documented count, with the headers
//! it documents.
//!
//! The file is used unchanged except for what a shared test machine forces, each substitution made
//! on one exact text that must occur once ([`substituted`]): the four ports (admin 9901, listener
//! 10000, Tollgate 8081, the application 8000) become free ones, and the filter's 50 ms timeout
//! becomes 5 s, since a debug build on a busy machine may miss 50 ms, and a refusal by timeout would
//! make the counts below wrong. The application is a second Envoy answering 200 itself.

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::common::redis::free_port;
use crate::harness::bootstrap::http_listener;
use crate::harness::client::{Client, Reply};
use crate::harness::envoy::Envoy;
use crate::harness::tollgate::Tollgate;
use crate::require_envoy;

const EXAMPLE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/envoy/envoy.yaml");
const RULES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/config");
/// `login-per-ip` as a quota policy of the X-RateLimit-Limit header.
const LOGIN_POLICY: &str = "10;w=60;name=\"login-per-ip\"";

/// The example's text with each `(from, to)` replaced; each `from` must occur exactly once.
fn substituted(text: &str, replacements: &[(&str, String)]) -> String {
    let mut text = text.to_owned();
    for (from, to) in replacements {
        assert_eq!(text.matches(from).count(), 1, "{from:?} once in the example");
        text = text.replace(from, to);
    }
    text
}

/// Starts the example's Envoy against Tollgate at `tollgate` and the application at `app`.
async fn example_envoy(tollgate: SocketAddr, app: SocketAddr) -> Envoy {
    let text = std::fs::read_to_string(EXAMPLE).expect("read the example");
    let text = substituted(
        &text,
        &[
            ("port_value: 9901", "port_value: 0".to_owned()),
            ("port_value: 10000", "port_value: 0".to_owned()),
            ("port_value: 8081", format!("port_value: {}", tollgate.port())),
            ("port_value: 8000", format!("port_value: {}", app.port())),
            ("timeout: 0.05s", "timeout: 5s".to_owned()),
        ],
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("envoy.yaml");
    std::fs::write(&path, text).expect("write the example");
    Envoy::start_file(&path, dir).await
}

/// The application: an Envoy answering 200 to everything.
async fn application() -> Envoy {
    let listener = http_listener(
        "app",
        json!({"socket_address": {"address": "127.0.0.1", "port_value": 0}}),
        Vec::new(),
        json!({"virtual_hosts": [{"name": "app", "domains": ["*"], "routes": [{
            "match": {"prefix": "/"},
            "direct_response": {"status": 200, "body": {"inline_string": "application\n"}},
        }]}]}),
    );
    Envoy::start(&json!({
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}}},
        "static_resources": {"listeners": [listener]},
    }))
    .await
}

/// A caller at 127.0.0.`n`, as Envoy's `remote_address` sees it.
fn caller(envoy: SocketAddr, n: u8) -> Client {
    Client::from_address(envoy, IpAddr::from([127, 0, 0, n]))
}

/// How many requests a limit of `capacity` that refills `per_second` may admit in `elapsed`: at least
/// its capacity, at most that plus what refilled meanwhile (and one for the rounding).
fn refill_bound(capacity: usize, per_second: f64, elapsed: Duration) -> std::ops::RangeInclusive<usize> {
    capacity..=capacity + (per_second * elapsed.as_secs_f64()).ceil() as usize + 1
}

/// Requests `/` with `headers` until refused; the limit (`capacity`, refilled at `per_second`) must
/// have let through what [`refill_bound`] allows in the time taken. Returns that count and the refusal.
async fn admitted_by_refill(
    caller: &Client,
    headers: &[(&str, &str)],
    capacity: usize,
    per_second: f64,
    limit: &str,
) -> (usize, Reply) {
    let started = Instant::now();
    let (admitted, refusal) = caller.admitted_until_429("/", headers, 1000).await;
    let bound = refill_bound(capacity, per_second, started.elapsed());
    assert!(
        bound.contains(&admitted),
        "{limit} admitted {admitted}, not in {bound:?}"
    );
    (admitted, refusal)
}

/// The X-RateLimit headers of Envoy's `DRAFT_VERSION_03`: the count of the limit nearest to refusing,
/// then every limit the request met as a quota policy (`policy` among them), what is left of the
/// nearest, and seconds to its reset.
fn assert_headers(reply: &Reply, limit: u32, policy: &str, remaining: &str) {
    let limits = reply.header("x-ratelimit-limit").unwrap_or_default();
    assert!(
        limits.starts_with(&format!("{limit}, ")),
        "{limit} first in {reply:?}"
    );
    assert!(limits.split(", ").any(|p| p == policy), "{policy} in {reply:?}");
    assert_eq!(
        reply.header("x-ratelimit-remaining"),
        Some(remaining),
        "{reply:?}"
    );
    let reset: u64 = reply
        .header("x-ratelimit-reset")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("x-ratelimit-reset in {reply:?}"));
    assert!(reset <= 3600, "{reply:?}");
}

#[tokio::test]
async fn the_example_refuses_each_documented_limit_at_its_count() {
    require_envoy!();
    let tollgate = Tollgate::start_in(Path::new(RULES), "127.0.0.1:0", &[]).await;
    let app = application().await;
    let app_addr = app.listener("app").await;
    let envoy = example_envoy(tollgate.grpc(), app_addr).await;
    let ingress = envoy.listener("ingress").await;
    // Envoy's gRPC health check of the Tollgate cluster passed before Envoy became ready.
    assert_eq!(
        envoy
            .hosts("tollgate")
            .await
            .get(&tollgate.grpc().to_string())
            .map(String::as_str),
        Some("healthy")
    );
    let (mut ok, mut refused) = (0, 0);

    // login-per-ip: 10 a minute per client on /auth/login, exact (a sliding log).
    let login = caller(ingress, 2);
    for n in (0..10).rev() {
        let reply = login.get("/auth/login", &[]).await;
        assert_eq!(reply.status, 200, "{reply:?}");
        assert_headers(&reply, 10, LOGIN_POLICY, &n.to_string());
        ok += 1;
    }
    let reply = login.get("/auth/login", &[]).await;
    assert_eq!(reply.status, 429, "{reply:?}");
    assert_eq!(reply.header("x-envoy-ratelimited"), Some("true"));
    assert_headers(&reply, 10, LOGIN_POLICY, "0");
    refused += 1;
    // A gRPC caller is refused with RESOURCE_EXHAUSTED (8), which its client does not retry at once.
    let reply = login
        .get("/auth/login", &[("content-type", "application/grpc")])
        .await;
    assert_eq!(
        (reply.status, reply.header("grpc-status")),
        (200, Some("8")),
        "{reply:?}"
    );
    refused += 1;
    // Another client still logs in.
    assert_eq!(caller(ingress, 3).get("/auth/login", &[]).await.status, 200);
    ok += 1;

    // otp-per-phone: 5 an hour per phone number, trimmed, so " +1555..." and "+1555..." are one.
    let otp = caller(ingress, 4);
    for _ in 0..5 {
        assert_eq!(
            otp.get("/auth/otp", &[("x-phone-number", " +15551234567 ")])
                .await
                .status,
            200
        );
        ok += 1;
    }
    let reply = otp.get("/auth/otp", &[("x-phone-number", "+15551234567")]).await;
    assert_eq!(reply.status, 429, "{reply:?}");
    refused += 1;
    assert_eq!(
        otp.get("/auth/otp", &[("x-phone-number", "+15550000000")])
            .await
            .status,
        200
    );
    ok += 1;

    // per-user: a token bucket of 100 refilled at 10 a second.
    let per_user = [("x-user-id", "alice")];
    ok += admitted_by_refill(&caller(ingress, 5), &per_user, 100, 10.0, "per-user")
        .await
        .0;
    // api-key-per-second: a token bucket of 40 refilled at 20 a second (the daily 100,000 is far).
    let per_key = [("x-api-key", "key-123")];
    let (admitted, reply) = admitted_by_refill(&caller(ingress, 6), &per_key, 40, 20.0, "api-key").await;
    assert_headers(&reply, 20, "20;w=1;name=\"api-key-per-second\"", "0");
    ok += admitted;
    // per-ip: 300 a minute per client (a sliding window: at least 300, and no more than a minute
    // boundary crossed meanwhile could free).
    ok += admitted_by_refill(&caller(ingress, 7), &[], 300, 5.0, "per-ip")
        .await
        .0;
    refused += 3;

    // Envoy counted what Tollgate answered.
    assert_eq!(
        envoy.wait_stat("cluster.app.ratelimit.ok", ok as u64).await,
        ok as u64
    );
    assert_eq!(envoy.stat("cluster.app.ratelimit.over_limit").await, refused);
    assert_eq!(envoy.stat("cluster.app.ratelimit.error").await, 0);
    let decided = tollgate.metric("ratelimit_service_total_requests").await;
    assert_eq!(decided, (ok + refused as usize) as u64);
    // Each refusal here was one descriptor's.
    assert_eq!(
        tollgate.metric("ratelimit_service_rate_limit_over_limit").await,
        refused
    );

    // Tollgate gone: failure_mode_deny refuses with 500.
    drop(tollgate.served);
    let reply = caller(ingress, 8).get("/", &[]).await;
    assert_eq!(reply.status, 500, "{reply:?}");
    assert_eq!(envoy.wait_stat("cluster.app.ratelimit.error", 1).await, 1);

    let log = envoy.log();
    assert!(
        !log.to_lowercase().contains("deprecated"),
        "a deprecation warning:\n{log}"
    );
}

/// An Envoy that starts before Tollgate finds it healthy within the example's `no_traffic_interval`
/// (5 s), not Envoy's default 60 s: until some request has gone to a cluster, that interval is the only
/// one Envoy checks it at.
#[tokio::test]
async fn an_envoy_started_first_finds_tollgate_healthy_within_the_no_traffic_interval() {
    require_envoy!();
    let grpc: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("address");
    let app = application().await;
    let envoy = example_envoy(grpc, app.listener("app").await).await;
    envoy
        .wait_health("tollgate", grpc, false, Duration::from_secs(10))
        .await;
    let _tollgate = Tollgate::start_in(Path::new(RULES), &grpc.to_string(), &[]).await;
    // Five seconds with the example; the bound leaves room for a busy machine and none for 60 s.
    envoy
        .wait_health("tollgate", grpc, true, Duration::from_secs(30))
        .await;
}
