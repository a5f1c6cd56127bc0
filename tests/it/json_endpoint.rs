//! envoyproxy/ratelimit's `POST /json` on the HTTP port: proto3 JSON in and out; 200 when OK, 429 when
//! over the limit, 400 for a bad body or a service error.

use serde_json::Value;

use crate::common::{TestServer, http};

const RULES: &str = "domain: web\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 2, name: per-user}\n";

fn body(domain: &str, user: &str) -> String {
    format!(r#"{{"domain":"{domain}","descriptors":[{{"entries":[{{"key":"user","value":"{user}"}}]}}]}}"#)
}

fn parse(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

#[tokio::test]
async fn ok_then_429_with_the_response_as_proto3_json() {
    let server = TestServer::start(&[("web.yaml", RULES)], &[]).await;
    let (status, text) = http(server.http, "POST", "/json", &body("web", "alice")).await;
    assert_eq!(status, 200, "{text}");
    let response = parse(&text);
    assert_eq!(response["overallCode"], "OK");
    let status0 = &response["statuses"][0];
    assert_eq!(status0["code"], "OK");
    assert_eq!(status0["currentLimit"]["requestsPerUnit"], 2);
    assert_eq!(status0["currentLimit"]["unit"], "HOUR");
    assert_eq!(status0["currentLimit"]["name"], "per-user");
    assert_eq!(status0["limitRemaining"], 1);
    assert!(
        status0["durationUntilReset"]
            .as_str()
            .is_some_and(|d| d.ends_with('s')),
        "{status0}"
    );
    http(server.http, "POST", "/json", &body("web", "alice")).await;
    let (status, text) = http(server.http, "POST", "/json", &body("web", "alice")).await;
    assert_eq!(status, 429, "{text}");
    let response = parse(&text);
    assert_eq!(response["overallCode"], "OVER_LIMIT");
    // Zero values are omitted, as in proto3 JSON.
    assert!(
        response["statuses"][0].get("limitRemaining").is_none(),
        "{response}"
    );
    server.stop().await;
}

#[tokio::test]
async fn bad_bodies_and_service_errors_are_400() {
    let server = TestServer::start(&[("web.yaml", RULES)], &[]).await;
    for bad in [
        "",
        "not json",
        "[1,2]",
        r#"{"domain":"web","descriptors":"nope"}"#,
        r#"{"domain":7}"#,
    ] {
        let (status, text) = http(server.http, "POST", "/json", bad).await;
        assert_eq!(status, 400, "{bad:?} gave {text}");
    }
    let (status, text) = http(server.http, "POST", "/json", r#"{"domain":"","descriptors":[]}"#).await;
    assert_eq!(status, 400);
    assert!(text.contains("rate limit domain must not be empty"), "{text}");
    let override_unknown = r#"{"domain":"web","descriptors":[{"entries":[{"key":"user","value":"u"}],"limit":{"requestsPerUnit":1,"unit":"UNKNOWN"}}]}"#;
    let (status, _) = http(server.http, "POST", "/json", override_unknown).await;
    assert_eq!(status, 400);
    server.stop().await;
}

#[tokio::test]
async fn snake_case_names_string_integers_and_headers() {
    let server = TestServer::start(
        &[("web.yaml", RULES)],
        &[("LIMIT_RESPONSE_HEADERS_ENABLED", "true")],
    )
    .await;
    let request = r#"{"domain":"web","hits_addend":1,"descriptors":[{"entries":[{"key":"user","value":"bob"}],"hits_addend":"2"}]}"#;
    let (status, text) = http(server.http, "POST", "/json", request).await;
    assert_eq!(status, 200, "{text}");
    let response = parse(&text);
    // hits_addend 2 on a limit of 2: nothing left.
    assert!(
        response["statuses"][0].get("limitRemaining").is_none(),
        "{response}"
    );
    let headers = response["responseHeadersToAdd"].as_array().expect("headers");
    let names: Vec<&str> = headers.iter().filter_map(|h| h["key"].as_str()).collect();
    assert_eq!(
        names,
        ["RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"]
    );
    let limit_override = r#"{"domain":"web","descriptors":[{"entries":[{"key":"user","value":"carol"}],"limit":{"requests_per_unit":"5","unit":2}}]}"#;
    let (status, text) = http(server.http, "POST", "/json", limit_override).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(parse(&text)["statuses"][0]["currentLimit"]["unit"], "MINUTE");
    server.stop().await;
}

/// Request bodies on the HTTP port have the same cap as gRPC messages (TOLLGATE_MAX_REQUEST_BYTES,
/// 1 MiB by default): a larger one is 413, on `/json` and on the native API's `/v1/*`, and the server
/// answers normally afterwards.
#[tokio::test]
async fn bodies_above_the_cap_are_413() {
    let server = TestServer::start(&[("web.yaml", RULES)], &[]).await;
    let huge = body("web", &"u".repeat(1 << 20));
    for path in ["/json", "/v1/check", "/v1/refund"] {
        let (status, text) = http(server.http, "POST", path, &huge).await;
        assert_eq!(status, 413, "{path}: {text}");
    }
    let (status, text) = http(server.http, "POST", "/json", &body("web", &"u".repeat(1000))).await;
    assert_eq!(status, 200, "{text}");
    server.stop().await;
}
