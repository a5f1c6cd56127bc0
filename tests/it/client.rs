//! The application-side client crate (`tollgate-client`, in `clients/rust`) against real servers: its
//! calls, its deadline and failure policy (a Tollgate that is down at start, one that accepts connections
//! and never answers), the lease guard, and its tower layers in front of an axum app and a tonic service.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::http::Request;
use axum::routing::post;
use tollgate_client::{Acquired, Client, DEFAULT_DEADLINE, Descriptor, Error, FailurePolicy, RateLimitLayer};
use tonic::Code;

use crate::common::{Guard, TestServer, header, send_with_headers};

const API_RULES: &str = include_str!("../../examples/config/api.yaml");

/// The example app's descriptors for `/send-otp`.
fn describe(request: &Request<Body>) -> Option<Vec<Descriptor>> {
    let phone = request
        .uri()
        .query()?
        .split('&')
        .find_map(|pair| pair.strip_prefix("phone="))?;
    Some(vec![Descriptor::from([("path", "/auth/otp"), ("phone", phone)])])
}

/// Real-server tests must not fail open because a busy machine was slow (a check that missed its
/// deadline may still have been counted, or never sent): they get a long deadline. The deadline tests
/// set the default one themselves.
const PATIENT_DEADLINE: Duration = Duration::from_secs(10);

fn client(tollgate: SocketAddr, policy: FailurePolicy) -> Client {
    Client::connect_lazy(&format!("http://{tollgate}"), "api")
        .expect("address")
        .with_failure_policy(policy)
        .with_deadline(PATIENT_DEADLINE)
}

async fn app(client: Client) -> SocketAddr {
    let router = Router::new()
        .route("/send-otp", post(|| async { "code sent\n" }))
        .layer(RateLimitLayer::new(client, describe));
    serve(router).await
}

async fn serve(router: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, router).await });
    addr
}

fn export(user: &str) -> [Descriptor; 1] {
    [Descriptor::from([("export_user", user)])]
}

/// POSTs and returns (status, lower-cased headers, body).
async fn post_to(addr: SocketAddr, path: &str) -> (u16, Vec<(String, String)>, String) {
    send_with_headers(addr, "POST", path, "").await
}

#[tokio::test]
async fn the_sixth_otp_in_an_hour_gets_429_with_retry_after() {
    let server = TestServer::start(
        &[("api.yaml", API_RULES)],
        &[("TOLLGATE_RESPONSE_HEADERS", "ietf")],
    )
    .await;
    let app = app(client(server.grpc, FailurePolicy::Open)).await;
    for sent in 1..=5 {
        let (status, headers, body) = post_to(app, "/send-otp?phone=5550100").await;
        assert_eq!(status, 200, "send {sent}: {body}");
        let policy = header(&headers, "ratelimit-policy").expect("IETF policy header on allowed answers");
        assert!(policy.contains("\"otp-per-phone\";q=5;w=3600"), "{policy}");
        assert_eq!(
            header(&headers, "ratelimit"),
            Some(format!("\"otp-per-phone\";r={};t=3600", 5 - sent).as_str())
        );
    }
    let (status, headers, body) = post_to(app, "/send-otp?phone=5550100").await;
    assert_eq!(status, 429, "{body}");
    let retry: u64 = header(&headers, "retry-after")
        .and_then(|v| v.parse().ok())
        .expect("Retry-After");
    assert!(
        (3590..=3600).contains(&retry),
        "an hour's sliding log frees its oldest entry in an hour: {retry}"
    );
    assert!(body.is_empty(), "{body}");
    // Another phone number is not affected; an unrelated route is not checked at all.
    assert_eq!(post_to(app, "/send-otp?phone=5550199").await.0, 200);
    server.stop().await;
}

#[tokio::test]
async fn an_unreachable_tollgate_fails_open_or_closed_as_chosen() {
    let server = TestServer::start(&[("api.yaml", API_RULES)], &[]).await;
    let open = app(client(server.grpc, FailurePolicy::Open)).await;
    let closed = app(client(server.grpc, FailurePolicy::Closed)).await;
    server.stop().await;
    assert_eq!(post_to(open, "/send-otp?phone=5550100").await.0, 200);
    assert_eq!(post_to(closed, "/send-otp?phone=5550100").await.0, 503);
}

/// The example app's binary (`clients/rust/examples/limited_app.rs`), built by `cargo test` for the
/// workspace, next to this test binary.
fn example_binary() -> std::path::PathBuf {
    let test_binary = std::env::current_exe().expect("test binary path");
    let debug_dir = test_binary
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target dir");
    debug_dir.join("examples").join("limited_app")
}

/// The client crate's `examples/limited_app.rs` run as the README says (its own process, Tollgate's address in
/// `TOLLGATE_ADDR`): the sixth OTP in an hour gets 429 with `Retry-After`; a failed export is refunded,
/// a peek shows the budget, and a finished export spends it.
#[tokio::test]
async fn the_example_app_answers_429_with_retry_after_once_its_budget_is_spent() {
    let server = TestServer::start(
        &[("api.yaml", API_RULES)],
        &[("TOLLGATE_RESPONSE_HEADERS", "ietf,retry-after")],
    )
    .await;
    let app_addr = format!("127.0.0.1:{}", crate::common::redis::free_port());
    let _app = Guard(
        std::process::Command::new(example_binary())
            .env("TOLLGATE_ADDR", format!("http://{}", server.grpc))
            .env("TOLLGATE_DEADLINE_MS", PATIENT_DEADLINE.as_millis().to_string())
            .env("APP_ADDR", &app_addr)
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("the example is built by cargo test"),
    );
    let addr: SocketAddr = app_addr.parse().expect("addr");
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    while tokio::net::TcpStream::connect(addr).await.is_err() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the example never listened"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }

    let statuses: Vec<u16> =
        futures_util::future::join_all((0..5).map(|_| post_to(addr, "/send-otp?phone=5550100")))
            .await
            .into_iter()
            .map(|(status, _, _)| status)
            .collect();
    assert_eq!(statuses, [200; 5]);
    let (status, headers, _) = post_to(addr, "/send-otp?phone=5550100").await;
    assert_eq!(status, 429);
    let retry: u64 = header(&headers, "retry-after")
        .and_then(|v| v.parse().ok())
        .expect("Retry-After");
    assert!((3590..=3600).contains(&retry), "{retry}");

    let user = "x-user-id: ada\r\n";
    let (status, _, body) = send_with_headers(addr, "POST", "/export?fail=1", user).await;
    assert_eq!(status, 502, "{body}");
    assert_eq!(
        send_with_headers(addr, "GET", "/exports-left", user).await.2,
        "3\n",
        "the failed export was refunded"
    );
    assert_eq!(send_with_headers(addr, "POST", "/export", user).await.0, 200);
    assert_eq!(
        send_with_headers(addr, "GET", "/exports-left", user).await.2,
        "2\n"
    );
    server.stop().await;
}

/// `RateLimitLayer::concurrency`: each request holds a lease of `export_user`'s concurrency rule (2 at
/// once in `examples/config/api.yaml`) while its handler runs, and releases it when the handler returns.
#[tokio::test]
async fn the_concurrency_layer_caps_requests_in_flight() {
    let server = TestServer::start(&[("api.yaml", API_RULES)], &[]).await;
    let client = client(server.grpc, FailurePolicy::Closed);
    let describe = |request: &Request<Body>| {
        let user = request.headers().get("x-user-id")?.to_str().ok()?;
        Some(export(user).to_vec())
    };
    let slow = || async {
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        "exported\n"
    };
    let router = Router::new()
        .route("/export", post(slow))
        .layer(RateLimitLayer::new(client, describe).concurrency());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, router).await });

    let user = "x-user-id: grace\r\n";
    let three = (0..3).map(|_| send_with_headers(addr, "POST", "/export", user));
    let mut statuses: Vec<(u16, Option<String>)> = futures_util::future::join_all(three)
        .await
        .into_iter()
        .map(|(status, headers, _)| (status, header(&headers, "retry-after").map(str::to_owned)))
        .collect();
    statuses.sort();
    assert_eq!(statuses[..2], [(200, None), (200, None)], "{statuses:?}");
    assert_eq!(statuses[2].0, 429, "{statuses:?}");
    assert!(statuses[2].1.is_some(), "Retry-After on the refusal");
    // The two leases were released when their handlers returned: both slots are free again.
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let again =
        futures_util::future::join_all((0..2).map(|_| send_with_headers(addr, "POST", "/export", user)))
            .await;
    assert!(again.iter().all(|(status, _, _)| *status == 200), "{again:?}");
    server.stop().await;
}

/// A "Tollgate" that accepts connections and never answers (a hung process, a full accept queue behind
/// a load balancer). Returns its address; the accepted sockets stay open for the test's lifetime.
async fn stalled_tollgate() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    addr
}

/// With a Tollgate that never answers, each call gives up at its deadline and the one policy decides:
/// open lets the work through (counted), closed returns `Unavailable`; an app behind the layer answers
/// within the deadline plus its own time.
#[tokio::test]
async fn a_stalled_tollgate_costs_one_deadline_and_the_policy_decides() {
    let stalled = stalled_tollgate().await;
    let open = Client::connect_lazy(&format!("http://{stalled}"), "api")
        .expect("address")
        .with_failure_policy(FailurePolicy::Open);
    assert_eq!(open.deadline(), DEFAULT_DEADLINE);
    for call in 1..=3 {
        let started = Instant::now();
        let decision = open.check(&export("ada"), 1).await.expect("fails open");
        let took = started.elapsed();
        assert!(decision.allowed && decision.failed_open, "{decision:?}");
        assert!(
            took >= DEFAULT_DEADLINE && took < DEFAULT_DEADLINE + Duration::from_millis(400),
            "call {call} took {took:?}"
        );
        assert_eq!(open.failed_open(), call);
    }
    let peeked = open.peek(&export("ada"), 0).await.expect("fails open");
    assert!(peeked.failed_open && peeked.remaining.is_none());
    match open.acquire(&export("ada")).await.expect("fails open") {
        Acquired::Held(lease) => assert!(!lease.is_held() && lease.id().is_none()),
        refused => panic!("{refused:?}"),
    }
    assert_eq!(open.failed_open(), 5);

    let closed = client(stalled, FailurePolicy::Closed).with_deadline(Duration::from_millis(50));
    let started = Instant::now();
    let error = closed.check(&export("ada"), 1).await.expect_err("fails closed");
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "{:?}",
        started.elapsed()
    );
    assert!(error.is_unavailable(), "{error}");
    assert_eq!(error.status().code(), Code::DeadlineExceeded);
    assert!(matches!(
        closed.acquire(&export("ada")).await,
        Err(Error::Unavailable(_))
    ));
    assert_eq!(closed.failed_open(), 0);

    // Refunds have nothing to fail open to, whatever the policy.
    let token = tollgate_client::RefundToken::new("anything");
    assert!(matches!(
        open.refund(&token, &export("ada"), 0).await,
        Err(Error::Unavailable(_))
    ));

    // Through the layer: the app answers, fail open, in about one deadline.
    let app = app(client(stalled, FailurePolicy::Open).with_deadline(DEFAULT_DEADLINE)).await;
    let started = Instant::now();
    assert_eq!(post_to(app, "/send-otp?phone=5550100").await.0, 200);
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "{:?}",
        started.elapsed()
    );
}

/// A client made while nothing listens at Tollgate's address: construction succeeds, calls fail open,
/// and once a real `tollgate serve` comes up on that address the same client gets real answers.
#[tokio::test]
async fn a_client_made_while_tollgate_is_down_works_once_it_is_up() {
    let port = crate::common::redis::free_port();
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let client = client(addr, FailurePolicy::Open);
    let decision = client.check(&export("ada"), 1).await.expect("fails open");
    assert!(decision.failed_open);
    assert_eq!(client.failed_open(), 1);

    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("api.yaml"), API_RULES).expect("rules");
    let grpc = addr.to_string();
    let config_dir = dir.path().to_string_lossy().into_owned();
    let args = [
        "serve",
        "--config-dir",
        &config_dir,
        "--grpc-addr",
        &grpc,
        "--http-addr",
        "127.0.0.1:0",
        "--debug-addr",
        "127.0.0.1:0",
    ];
    let served =
        crate::common::process::Served::start_command(crate::common::process::tollgate(&args, &[])).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    let decision = loop {
        let decision = client
            .check(&export("ada"), 1)
            .await
            .expect("answers or fails open");
        if !decision.failed_open {
            break decision;
        }
        assert!(Instant::now() < deadline, "the client never reconnected");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(decision.allowed);
    assert_eq!(decision.remaining, Some(2), "3 exports a day, one spent");
    assert!(decision.refund_token.is_some());
    assert_eq!(served.terminate().await, Some(0));
}

/// Check, peek and refund: the refund token gives the units back once; a token the server did not
/// mint is `PERMISSION_DENIED`, and the policy does not hide it.
#[tokio::test]
async fn refunds_need_the_checks_token_and_work_once() {
    let server = TestServer::start(&[("api.yaml", API_RULES)], &[]).await;
    let client = client(server.grpc, FailurePolicy::Open);
    let ada = export("ada");
    let spent = client.check(&ada, 1).await.expect("check");
    assert!(spent.allowed && !spent.failed_open);
    assert_eq!(spent.remaining, Some(2));
    assert_eq!(client.peek(&ada, 0).await.expect("peek").remaining, Some(2));
    let token = spent.refund_token.expect("a consuming check hands out a token");
    assert!(
        !format!("{token:?}").contains(token.as_str()),
        "tokens stay out of logs"
    );

    let refunded = client.refund(&token, &ada, 0).await.expect("refund");
    assert_eq!(refunded.remaining, Some(3));
    assert_eq!(client.peek(&ada, 0).await.expect("peek").remaining, Some(3));
    let again = client.refund(&token, &ada, 0).await.expect_err("once");
    assert_eq!(again.status().code(), Code::PermissionDenied, "{again}");
    let forged = tollgate_client::RefundToken::new("forged");
    let error = client.refund(&forged, &ada, 0).await.expect_err("forged");
    assert!(matches!(error, Error::Rejected(_)), "{error}");
    assert_eq!(client.failed_open(), 0);
    server.stop().await;
}

/// The lease guard: two slots for `export_user`; a third acquire is refused with a wait; a dropped
/// lease gives its slot back in the background; renew extends a held lease; an explicit release
/// reports it held the slot, and renewing it afterwards is `NOT_FOUND`.
#[tokio::test]
async fn leases_hold_slots_until_released_or_dropped() {
    let server = TestServer::start(&[("api.yaml", API_RULES)], &[]).await;
    let client = client(server.grpc, FailurePolicy::Closed);
    let grace = export("grace");
    let Acquired::Held(mut first) = client.acquire(&grace).await.expect("acquire") else {
        panic!("a free slot")
    };
    assert!(first.is_held());
    assert_eq!(first.ttl(), Duration::from_secs(300));
    let Acquired::Held(second) = client.acquire(&grace).await.expect("acquire") else {
        panic!("a free slot")
    };
    match client.acquire(&grace).await.expect("acquire") {
        Acquired::Refused { retry_after } => {
            let wait = retry_after.expect("a wait");
            assert!(
                wait > Duration::from_secs(290) && wait <= Duration::from_secs(300),
                "{wait:?}"
            );
        }
        held => panic!("two slots only: {held:?}"),
    }
    assert_eq!(first.renew().await.expect("renew"), Duration::from_secs(300));

    drop(second);
    let deadline = Instant::now() + Duration::from_secs(5);
    let third = loop {
        match client.acquire(&grace).await.expect("acquire") {
            Acquired::Held(lease) => break lease,
            Acquired::Refused { .. } => {
                assert!(Instant::now() < deadline, "the dropped lease was never released");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    };
    assert!(third.release().await.expect("release"), "held its slot");
    let id = first.id().expect("held").to_owned();
    assert!(first.release().await.expect("release"));

    // The released id is gone: a renew under it takes nothing.
    let stale = tollgate_client::proto::v1::AcquireRequest {
        domain: "api".into(),
        descriptors: vec![tollgate_client::proto::v1::Descriptor {
            entries: vec![tollgate_client::proto::v1::Entry {
                key: "export_user".into(),
                value: "grace".into(),
            }],
            cost: None,
        }],
        lease_id: id,
        ttl: None,
    };
    let mut raw =
        tollgate_client::proto::v1::rate_limiter_client::RateLimiterClient::new(server.channel().await);
    let status = raw.acquire(stale).await.expect_err("not held");
    assert_eq!(status.code(), Code::NotFound);
    server.stop().await;
}

/// The gRPC layer in front of a tonic service (here the health service): allowed calls run and
/// carry the server's rate-limit headers as metadata; a refused call is `RESOURCE_EXHAUSTED` with a
/// `google.rpc.RetryInfo` detail holding the exact wait.
#[tokio::test]
async fn the_grpc_layer_answers_resource_exhausted_with_retry_info() {
    use tonic_types::StatusExt;

    const RULES: &str = "domain: grpc\ndescriptors:\n  - key: method\n    rate_limit:\n      name: per-method\n      unit: minute\n      requests_per_unit: 2\n";
    let server = TestServer::start(&[("grpc.yaml", RULES)], &[("TOLLGATE_RESPONSE_HEADERS", "ietf")]).await;
    let client = Client::connect_lazy(&format!("http://{}", server.grpc), "grpc")
        .expect("address")
        .with_deadline(PATIENT_DEADLINE);
    let describe = |request: &Request<tonic::body::Body>| {
        Some(vec![Descriptor::from([("method", request.uri().path())])])
    };
    let (_, health) = tonic_health::server::health_reporter();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(
        tonic::transport::Server::builder()
            .layer(RateLimitLayer::new(client, describe).grpc())
            .add_service(health)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .expect("uri")
        .connect()
        .await
        .expect("connect");
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    let ask = || tonic_health::pb::HealthCheckRequest {
        service: String::new(),
    };
    for left in [1, 0] {
        let response = health.check(ask()).await.expect("allowed");
        let ratelimit = response.metadata().get("ratelimit").expect("RateLimit metadata");
        let ratelimit = ratelimit.to_str().expect("ascii");
        assert!(
            ratelimit.starts_with(&format!("\"per-method\";r={left};t=")),
            "{ratelimit}"
        );
    }
    let status = health.check(ask()).await.expect_err("refused");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    let retry = status.get_details_retry_info().expect("RetryInfo detail");
    let wait = retry.retry_delay.expect("a delay");
    assert!(
        wait > Duration::ZERO && wait <= Duration::from_secs(60),
        "{wait:?}"
    );
    server.stop().await;
}

/// Outside a tokio runtime tonic would panic making the connection's task: the client says so instead.
#[test]
fn connect_lazy_outside_a_runtime_is_an_error_not_a_panic() {
    let error = Client::connect_lazy("http://127.0.0.1:8081", "api").expect_err("no runtime");
    assert!(error.to_string().contains("no tokio runtime"), "{error}");
    let error = Client::connect_lazy("http://[::1", "api").expect_err("bad address");
    assert!(
        !error.to_string().contains("runtime"),
        "the address is named first: {error}"
    );
}
