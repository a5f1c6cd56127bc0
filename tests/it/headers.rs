//! Client-facing headers and the 429 body, over the wire: envoyproxy/ratelimit's trio, `X-RateLimit-*`,
//! the IETF draft's `RateLimit` / `RateLimit-Policy`, `Retry-After`, and the JSON `raw_body`.

use std::collections::HashMap;

use tollgate::proto::rls::RateLimitResponse;
use tollgate::proto::rls::rate_limit_response::Code;

use crate::common::{TestServer, wire_request};

const RULES: &str = "domain: h\ndescriptors:\n  - key: user\n    rate_limit: {name: per-user, unit: minute, requests_per_unit: 2, algorithm: token_bucket}\n  - key: email\n    value: vip@example.com\n    rate_limit: {unit: hour, requests_per_unit: 5}\n";

const ALL_STYLES: [(&str, &str); 2] = [
    (
        "TOLLGATE_RESPONSE_HEADERS",
        "ratelimit,x-ratelimit,ietf,retry-after",
    ),
    ("TOLLGATE_RAW_BODY", "true"),
];

fn headers(response: &RateLimitResponse) -> HashMap<String, String> {
    response
        .response_headers_to_add
        .iter()
        .map(|h| (h.key.clone(), h.value.clone()))
        .collect()
}

async fn ask(server: &TestServer, entries: &[(&str, &str)]) -> RateLimitResponse {
    let mut client = server.client().await;
    client
        .should_rate_limit(wire_request("h", &[entries]))
        .await
        .expect("answer")
        .into_inner()
}

#[tokio::test]
async fn every_style_on_ok_and_on_over_limit() {
    let server = TestServer::start(&[("h.yaml", RULES)], &ALL_STYLES).await;
    let ok = ask(&server, &[("user", "alice")]).await;
    let h = headers(&ok);
    assert_eq!(h["RateLimit-Limit"], "2");
    assert_eq!(h["X-RateLimit-Remaining"], "1");
    assert_eq!(h["RateLimit-Policy"], "\"per-user\";q=2;w=60");
    assert!(h["RateLimit"].starts_with("\"per-user\";r=1;t="), "{h:?}");
    assert!(!h.contains_key("Retry-After"), "no Retry-After while allowed");
    assert!(ok.raw_body.is_empty());

    ask(&server, &[("user", "alice")]).await;
    let over = ask(&server, &[("user", "alice")]).await;
    assert_eq!(over.overall_code, Code::OverLimit as i32);
    let h = headers(&over);
    // 2 per minute: the next token comes 30 s after the first was taken (less the test's own runtime),
    // rounded up, so never earlier than the real retry time.
    let retry: u64 = h["Retry-After"].parse().expect("seconds");
    assert!((29..=30).contains(&retry), "{h:?}");
    assert_eq!(h["RateLimit"], format!("\"per-user\";r=0;t={retry}"));
    assert_eq!(h["X-RateLimit-Remaining"], "0");
    let body: serde_json::Value = serde_json::from_slice(&over.raw_body).expect("JSON body");
    assert_eq!(body["error"], "rate_limited");
    assert_eq!(body["retry_after"], retry);
    server.stop().await;
}

#[tokio::test]
async fn unnamed_policies_never_show_configured_values() {
    let server = TestServer::start(&[("h.yaml", RULES)], &ALL_STYLES).await;
    let response = ask(&server, &[("email", "vip@example.com")]).await;
    let h = headers(&response);
    let policy = &h["RateLimit-Policy"];
    assert!(
        policy.starts_with("\"r-") && policy.ends_with(";q=5;w=3600"),
        "{policy}"
    );
    assert!(
        !policy.contains("vip") && !h["RateLimit"].contains("vip"),
        "{h:?}"
    );
    server.stop().await;
}

#[tokio::test]
async fn styles_are_off_by_default_and_a_bad_style_is_refused() {
    let server = TestServer::start(&[("h.yaml", RULES)], &[]).await;
    let response = ask(&server, &[("user", "bob")]).await;
    assert!(response.response_headers_to_add.is_empty());
    server.stop().await;
    let env: HashMap<String, String> =
        [("TOLLGATE_RESPONSE_HEADERS".to_owned(), "draft-99".to_owned())].into();
    let error = tollgate::settings::Settings::load_from(None, &env, &[]).expect_err("unknown style");
    assert!(error.to_string().contains("draft-99"), "{error}");
}
