//! The debug log an operator debugging a limit reads: at `LOG_LEVEL=debug`, one line per descriptor
//! decided (domain, descriptor, key, rule, limit, hits, count before and after, verdict, store), a
//! hashed value never in clear, and none of the transport crates' frames unless a directive names them.

use tollgate::proto::rls::rate_limit_service_client::RateLimitServiceClient;

use crate::common::process::{Served, serve_args};
use crate::common::wire_request;

const RULES: &str = r#"
domain: shop
descriptors:
  - key: api_key
    hash: true
    rate_limit: {name: per-key, unit: minute, requests_per_unit: 2}
  - key: path
    value: /checkout
    rate_limit: {unit: hour, requests_per_unit: 10}
"#;

/// The secret a client sends as its API key: it must never be logged.
const SECRET: &str = "sk-live-0123456789";

/// Serves [`RULES`] at `level`, sends three requests for the same key and one that matches nothing,
/// and returns every line the server logged.
async fn logged_at(level: &str, format: &str) -> Vec<String> {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("shop.yaml"), RULES).expect("write rules");
    let config = dir.path().to_str().expect("utf-8");
    let served = Served::start(
        &serve_args(config),
        &[("LOG_LEVEL", level), ("LOG_FORMAT", format)],
    )
    .await;
    let mut client = RateLimitServiceClient::connect(format!("http://{}", served.grpc))
        .await
        .expect("connect");
    for _ in 0..3 {
        let request = wire_request("shop", &[&[("api_key", SECRET)], &[("path", "/checkout")]]);
        client.should_rate_limit(request).await.expect("decided");
    }
    let unmatched = wire_request("shop", &[&[("api_key", SECRET), ("extra", "x")]]);
    client.should_rate_limit(unmatched).await.expect("decided");
    drop(client);
    let (code, log) = served.terminate_logged().await;
    assert_eq!(code, Some(0));
    log
}

fn decisions(log: &[String]) -> Vec<&String> {
    log.iter()
        .filter(|line| line.contains("tollgate::decision") || line.contains("\"decision\""))
        .collect()
}

#[tokio::test]
async fn at_debug_each_decision_is_a_line_with_what_decided_it() {
    let log = logged_at("debug", "text").await;
    let lines = decisions(&log);
    // Three requests of two descriptors, and one that matched nothing.
    assert_eq!(lines.len(), 7, "{log:#?}");
    let third_key = lines[4];
    for said in [
        "domain=\"shop\"",
        "rule=\"shop.api_key\"",
        "limit=2 per 60s (fixed_window, per-key)",
        "hits=1",
        "count=2->2/2",
        "verdict=\"over_limit\"",
        "store=\"embedded\"",
    ] {
        assert!(third_key.contains(said), "{said} in {third_key}");
    }
    assert!(
        lines[0].contains("count=0->1/2") && lines[0].contains("verdict=\"ok\""),
        "{}",
        lines[0]
    );
    assert!(
        lines[1].contains("descriptor=\"path=/checkout\"") && lines[1].contains("key=\"shop_path_/checkout_")
    );
    assert!(
        lines[6].contains("verdict=\"no_limit\"") && lines[6].contains("extra="),
        "{}",
        lines[6]
    );
    // The API key is hashed in the rule's storage key, so in the log too, matched or not.
    assert!(log.iter().all(|line| !line.contains(SECRET)), "{log:#?}");
    // The transport's frames are not there...
    assert!(
        log.iter()
            .all(|line| !line.contains("h2::") && !line.contains("hyper")),
        "{log:#?}"
    );
    // ...unless asked for by their own directive.
    let framed = logged_at("debug,h2=debug", "text").await;
    assert!(
        framed.iter().any(|line| line.contains("h2::codec")),
        "{framed:#?}"
    );
    assert_eq!(decisions(&framed).len(), 7);
}

#[tokio::test]
async fn the_decision_lines_alone_and_in_the_go_services_json() {
    let log = logged_at("warn,tollgate::decision=debug", "json").await;
    let lines = decisions(&log);
    assert_eq!(lines.len(), 7, "{log:#?}");
    let refused: serde_json::Value = serde_json::from_str(lines[4]).expect("a JSON line");
    assert_eq!(refused["level"], "debug");
    assert_eq!(refused["@message"], "decision");
    assert_eq!(refused["verdict"], "over_limit");
    assert_eq!(refused["count"], "2->2/2");
    assert!(
        refused["retry_after_ms"].as_u64().is_some_and(|ms| ms > 0),
        "{refused}"
    );
    // Nothing else at debug.
    assert!(
        log.iter()
            .all(|line| !line.contains("\"level\":\"debug\"") || line.contains("\"decision\""))
    );
}
