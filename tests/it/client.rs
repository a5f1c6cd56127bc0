//! The application-side client and tower layer (`tollgate::client`), as `examples/limited_app.rs` uses
//! them: an axum app asks a real Tollgate before its work and answers 429 with `Retry-After`.

use std::net::SocketAddr;

use axum::Router;
use axum::body::Body;
use axum::http::Request;
use axum::routing::post;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tollgate::client::{Client, Descriptor, RateLimitLayer};

use crate::common::{Guard, TestServer};

const API_RULES: &str = include_str!("../../examples/config/api.yaml");

/// The example app's descriptors for `/send-otp`.
fn describe(request: &Request<Body>) -> Option<Vec<Descriptor>> {
    let phone = request
        .uri()
        .query()?
        .split('&')
        .find_map(|pair| pair.strip_prefix("phone="))?;
    Some(vec![vec![
        ("path".into(), "/auth/otp".into()),
        ("phone".into(), phone.into()),
    ]])
}

async fn app(tollgate: SocketAddr, fail_closed: bool) -> SocketAddr {
    let client = Client::connect(format!("http://{tollgate}"), "api")
        .await
        .expect("connect");
    let layer = RateLimitLayer::new(client, describe);
    let layer = if fail_closed { layer.fail_closed() } else { layer };
    let router = Router::new()
        .route("/send-otp", post(|| async { "code sent\n" }))
        .layer(layer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, router).await });
    addr
}

/// POSTs and returns (status, lower-cased headers, body).
async fn post_to(addr: SocketAddr, path: &str) -> (u16, Vec<(String, String)>, String) {
    send(addr, "POST", path, "").await
}

/// Sends a request with extra header lines (each ending in CRLF); returns (status, lower-cased headers,
/// body).
async fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &str,
) -> (u16, Vec<(String, String)>, String) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: app\r\nConnection: close\r\nContent-Length: 0\r\n{headers}\r\n"
    );
    stream.write_all(request.as_bytes()).await.expect("write");
    let mut text = String::new();
    stream.read_to_string(&mut text).await.expect("read");
    let (head, body) = text.split_once("\r\n\r\n").expect("a response");
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .expect("status");
    let headers = lines
        .filter_map(|l| {
            l.split_once(": ")
                .map(|(k, v)| (k.to_ascii_lowercase(), v.to_owned()))
        })
        .collect();
    (status, headers, body.to_owned())
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

#[tokio::test]
async fn the_sixth_otp_in_an_hour_gets_429_with_retry_after() {
    let server = TestServer::start(
        &[("api.yaml", API_RULES)],
        &[("TOLLGATE_RESPONSE_HEADERS", "ietf")],
    )
    .await;
    let app = app(server.grpc, false).await;
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
    let body: serde_json::Value = serde_json::from_str(&body).expect("JSON body");
    assert_eq!(body["error"], "rate_limited");
    // Another phone number is not affected; an unrelated route is not checked at all.
    assert_eq!(post_to(app, "/send-otp?phone=5550199").await.0, 200);
    server.stop().await;
}

#[tokio::test]
async fn an_unreachable_tollgate_fails_open_or_closed_as_chosen() {
    let server = TestServer::start(&[("api.yaml", API_RULES)], &[]).await;
    let open = app(server.grpc, false).await;
    let closed = app(server.grpc, true).await;
    server.stop().await;
    assert_eq!(post_to(open, "/send-otp?phone=5550100").await.0, 200);
    assert_eq!(post_to(closed, "/send-otp?phone=5550100").await.0, 503);
}

/// The example app's binary, built by `cargo test` next to this test binary.
fn example_binary() -> std::path::PathBuf {
    let test_binary = std::env::current_exe().expect("test binary path");
    let debug_dir = test_binary
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target dir");
    debug_dir.join("examples").join("limited_app")
}

/// `examples/limited_app.rs` run as the README says (its own process, Tollgate's address in
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
    let (status, _, body) = send(addr, "POST", "/export?fail=1", user).await;
    assert_eq!(status, 502, "{body}");
    assert_eq!(
        send(addr, "GET", "/exports-left", user).await.2,
        "3\n",
        "the failed export was refunded"
    );
    assert_eq!(send(addr, "POST", "/export", user).await.0, 200);
    assert_eq!(send(addr, "GET", "/exports-left", user).await.2, "2\n");
    server.stop().await;
}

/// `RateLimitLayer::concurrency`: each request holds a lease of `export_user`'s concurrency rule (2 at
/// once in `examples/config/api.yaml`) while its handler runs, and releases it when the handler returns.
#[tokio::test]
async fn the_concurrency_layer_caps_requests_in_flight() {
    let server = TestServer::start(&[("api.yaml", API_RULES)], &[]).await;
    let client = Client::connect(format!("http://{}", server.grpc), "api")
        .await
        .expect("connect");
    let describe = |request: &Request<Body>| {
        let user = request.headers().get("x-user-id")?.to_str().ok()?;
        Some(vec![vec![("export_user".to_owned(), user.to_owned())]])
    };
    let slow = || async {
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        "exported\n"
    };
    let router = Router::new()
        .route("/export", post(slow))
        .layer(RateLimitLayer::concurrency(client, describe));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, router).await });

    let user = "x-user-id: grace\r\n";
    let three = (0..3).map(|_| send(addr, "POST", "/export", user));
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
    let again = futures_util::future::join_all((0..2).map(|_| send(addr, "POST", "/export", user))).await;
    assert!(again.iter().all(|(status, _, _)| *status == 200), "{again:?}");
    server.stop().await;
}
