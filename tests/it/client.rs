//! The application-side client and tower layer (`tollgate::client`), as `examples/limited_app.rs` uses
//! them: an axum app asks a real Tollgate before its work and answers 429 with `Retry-After`.

use std::net::SocketAddr;

use axum::Router;
use axum::body::Body;
use axum::http::Request;
use axum::routing::post;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tollgate::client::{Client, Descriptor, RateLimitLayer};

use crate::common::TestServer;

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
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let request =
        format!("POST {path} HTTP/1.1\r\nHost: app\r\nConnection: close\r\nContent-Length: 0\r\n\r\n");
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
