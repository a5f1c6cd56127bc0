//! Rules over xDS (`CONFIG_TYPE=GRPC_XDS_SOTW`) against a real ADS server in the test process: ACKs,
//! NACKs with the file loader's messages, readiness before the first set, reconnects that resume from
//! the last ACKed version.

use std::time::{Duration, Instant};

use prost::Message as _;

use tollgate::proto::rls::rate_limit_response::Code;
use tollgate::proto::rls_config::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitReplace, RateLimitUnit,
};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use crate::common::ads::AdsServer;
use crate::common::{TestServer, http, try_http, wire_request};

/// One domain with one per-hour limit on `key`.
fn config(name: &str, domain: &str, key: &str, per_hour: u32) -> RateLimitConfig {
    RateLimitConfig {
        name: name.into(),
        domain: domain.into(),
        descriptors: vec![RateLimitDescriptor {
            key: key.into(),
            rate_limit: Some(RateLimitPolicy {
                unit: RateLimitUnit::Hour as i32,
                requests_per_unit: per_hour,
                ..Default::default()
            }),
            ..Default::default()
        }],
    }
}

/// The environment Envoy Gateway gives the rate limit service, minus TLS, pointing at `ads`, with
/// short retries.
fn xds_env(ads: &AdsServer, extra: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = [
        ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
        ("CONFIG_GRPC_XDS_SERVER_URL", &ads.addr.to_string()),
        ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit"),
        ("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "100ms"),
        ("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "100ms"),
        ("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "500ms"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    env
}

async fn start(env: &[(String, String)]) -> TestServer {
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    TestServer::start(&[], &env).await
}

/// The overall codes of `n` requests for `key=value` in `domain`.
async fn codes(server: &TestServer, domain: &str, key: &str, value: &str, n: usize) -> Vec<i32> {
    let mut client = server.client().await;
    let mut codes = Vec::new();
    for _ in 0..n {
        let answer = client
            .should_rate_limit(wire_request(domain, &[&[(key, value)]]))
            .await
            .expect("answered");
        codes.push(answer.into_inner().overall_code);
    }
    codes
}

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

#[tokio::test]
async fn rules_pushed_over_xds_are_served_acked_and_replaced() {
    let ads = AdsServer::start().await;
    ads.push("v1", &[config("edge-rules", "edge", "user", 2)]);
    let env = xds_env(
        &ads,
        &[
            ("CONFIG_GRPC_XDS_NODE_METADATA", "zone=a,team=edge"),
            ("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "x-tenant:blue"),
        ],
    );
    let server = start(&env).await;

    let subscribe = ads.request(|r| r.response_nonce.is_empty()).await;
    let node = subscribe.node.expect("node");
    assert_eq!(node.id, "envoy-ratelimit");
    let metadata = node.metadata.expect("metadata").fields;
    let zone = metadata.get("zone").and_then(|v| v.kind.clone());
    assert_eq!(
        zone,
        Some(prost_types::value::Kind::StringValue("a".into())),
        "{metadata:?}"
    );
    assert_eq!(
        subscribe.type_url,
        "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"
    );
    let streams = ads.state.streams.lock().expect("lock").clone();
    assert_eq!(
        streams[0].get("x-tenant").and_then(|v| v.to_str().ok()),
        Some("blue")
    );
    let ack = ads.ack("v1").await;
    assert_eq!(ack.response_nonce, "1");

    assert_eq!(codes(&server, "edge", "user", "alice", 3).await, [OK, OK, OVER]);
    let (_, dump) = http(server.debug, "GET", "/rlconfig", "").await;
    assert!(dump.contains("edge.user"), "{dump}");
    let (_, version) = http(server.debug, "GET", "/config", "").await;
    assert!(version.contains("\"version\":\"v1\""), "{version}");

    // A new set replaces the whole rule set; measured from the push to the first answer under it.
    let pushed = Instant::now();
    ads.push(
        "v2",
        &[
            config("edge-rules", "edge", "user", 5),
            config("api-rules", "api", "key", 1),
        ],
    );
    // A fresh value each round: the set may arrive between a round's two requests, and a value that
    // spent its one unit then would be refused in every later round.
    for round in 0.. {
        let probe = format!("probe-{round}");
        if codes(&server, "api", "key", &probe, 2).await == [OK, OVER] {
            break;
        }
        assert!(pushed.elapsed() < Duration::from_secs(10), "v2 never applied");
    }
    println!(
        "xDS push to first answer under the new rules: {:?}",
        pushed.elapsed()
    );
    ads.ack("v2").await;
    assert_eq!(
        codes(&server, "edge", "user", "bob", 6).await,
        [OK, OK, OK, OK, OK, OVER]
    );
    let (_, metrics) = http(server.http, "GET", "/metrics", "").await;
    assert!(
        metrics.contains("ratelimit_service_config_load_success 2"),
        "{metrics}"
    );
    server.stop().await;
}

#[tokio::test]
async fn an_invalid_set_is_nacked_with_the_file_loaders_message_and_the_rules_stay() {
    let ads = AdsServer::start().await;
    ads.push("v1", &[config("edge-rules", "edge", "user", 1)]);
    let server = start(&xds_env(&ads, &[])).await;
    ads.ack("v1").await;

    let unknown_unit = RateLimitConfig {
        descriptors: vec![RateLimitDescriptor {
            key: "user".into(),
            rate_limit: Some(RateLimitPolicy {
                unit: RateLimitUnit::Unknown as i32,
                requests_per_unit: 5,
                ..Default::default()
            }),
            ..Default::default()
        }],
        ..config("unit-rules", "edge", "user", 1)
    };
    let cases = [
        (
            vec![config("empty-domain", "", "user", 1)],
            "empty-domain: config file cannot have empty domain",
        ),
        (
            vec![config("a", "edge", "user", 1), config("b", "edge", "other", 1)],
            "b: duplicate domain 'edge' in config file",
        ),
        (
            vec![unknown_unit],
            "unit-rules: invalid rate limit unit 'UNKNOWN'",
        ),
    ];
    for (at, (configs, expected)) in cases.into_iter().enumerate() {
        let version = format!("bad{at}");
        ads.push(&version, &configs);
        let nack = ads
            .request(|r| r.error_detail.is_some() && r.response_nonce == (at + 2).to_string())
            .await;
        let detail = nack.error_detail.expect("error detail");
        assert!(
            detail.message.starts_with(expected),
            "{expected} vs {}",
            detail.message
        );
        assert_eq!(nack.version_info, "v1", "a NACK names the version still applied");
    }
    ads.push_raw(
        "garbage",
        vec![prost_types::Any {
            type_url: "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig".into(),
            value: vec![0xff, 0xff, 0xff],
        }],
    );
    let nack = ads
        .request(|r| r.response_nonce == "5" && r.error_detail.is_some())
        .await;
    assert!(
        nack.error_detail
            .expect("detail")
            .message
            .contains("cannot decode"),
        "undecodable resources are refused"
    );
    // A config that decodes, but one of whose descriptors does not: descriptors are decoded one at a
    // time as they are validated, and this one is refused all the same.
    let mut value = config("edge-rules", "edge", "user", 9).encode_to_vec();
    value.extend_from_slice(&[0x1a, 0x03, 0xff, 0xff, 0xff]);
    ads.push_raw(
        "garbage-descriptor",
        vec![prost_types::Any {
            type_url: "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig".into(),
            value,
        }],
    );
    let nack = ads
        .request(|r| r.response_nonce == "6" && r.error_detail.is_some())
        .await;
    let message = nack.error_detail.expect("detail").message;
    assert!(message.contains("cannot decode"), "{message}");

    assert_eq!(
        codes(&server, "edge", "user", "alice", 2).await,
        [OK, OVER],
        "v1 still applies"
    );
    let (_, metrics) = http(server.http, "GET", "/metrics", "").await;
    assert!(
        metrics.contains("ratelimit_service_config_load_error 5"),
        "{metrics}"
    );
    server.stop().await;
}

#[tokio::test]
async fn the_go_fields_of_a_pushed_set_mean_what_they_mean_in_a_file() {
    let ads = AdsServer::start().await;
    let nested = RateLimitConfig {
        name: "nested".into(),
        domain: "edge".into(),
        descriptors: vec![
            RateLimitDescriptor {
                key: "path".into(),
                value: "/login".into(),
                descriptors: vec![RateLimitDescriptor {
                    key: "ip".into(),
                    rate_limit: Some(RateLimitPolicy {
                        unit: RateLimitUnit::Minute as i32,
                        requests_per_unit: 1,
                        name: "login-ip".into(),
                        ..Default::default()
                    }),
                    shadow_mode: true,
                    ..Default::default()
                }],
                ..Default::default()
            },
            RateLimitDescriptor {
                key: "tier".into(),
                value: "free".into(),
                rate_limit: Some(RateLimitPolicy {
                    unlimited: true,
                    replaces: vec![RateLimitReplace {
                        name: "login-ip".into(),
                    }],
                    ..Default::default()
                }),
                ..Default::default()
            },
        ],
    };
    ads.push("v1", &[nested]);
    let server = start(&xds_env(&ads, &[])).await;
    // Shadow mode: the second request is over the limit and still answered OK.
    let mut client = server.client().await;
    for _ in 0..2 {
        let answer = client
            .should_rate_limit(wire_request("edge", &[&[("path", "/login"), ("ip", "10.0.0.1")]]))
            .await
            .expect("answered")
            .into_inner();
        assert_eq!(answer.overall_code, OK);
    }
    let (_, metrics) = http(server.http, "GET", "/metrics", "").await;
    assert!(
        metrics.contains(
            "ratelimit_service_rate_limit_shadow_mode{domain=\"edge\",key1=\"path_/login\",key2=\"ip\"} 1"
        ),
        "{metrics}"
    );
    server.stop().await;
}

#[tokio::test]
async fn without_force_start_it_is_not_ready_until_rules_arrive() {
    let ads = AdsServer::start().await;
    let env = xds_env(&ads, &[]);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let server = TestServer::start_unready(tempfile::tempdir().expect("dir"), &env).await;
    ads.request(|r| r.response_nonce.is_empty()).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let health = try_http(server.http, "GET", "/healthcheck", "").await;
    assert_eq!(
        health.map(|(status, _)| status),
        Some(500),
        "not ready without rules"
    );
    let mut health = HealthClient::new(server.channel().await);
    for (service, expected) in [
        ("", ServingStatus::Serving),
        ("ratelimit", ServingStatus::NotServing),
    ] {
        let status = health
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .expect("health answers")
            .into_inner()
            .status;
        assert_eq!(status, expected as i32, "{service:?}: alive, not ready");
    }
    let mut client = server.client().await;
    let refused = client
        .should_rate_limit(wire_request("edge", &[&[("user", "a")]]))
        .await
        .expect_err("no rules yet");
    assert_eq!(refused.code(), tonic::Code::Unknown, "the Go service's code");
    assert_eq!(refused.message(), "no rate limit configuration loaded");

    ads.push("v1", &[config("edge-rules", "edge", "user", 1)]);
    server.wait_ready().await;
    assert_eq!(codes(&server, "edge", "user", "a", 2).await, [OK, OVER]);
    server.stop().await;
}

/// As the Go service: force-started, the service is ready at once, and until the first rule set arrives
/// every request gets the Go service's error (an Envoy failing closed denies; one failing open counts
/// the errors), never an OK that would pass everything unlimited.
#[tokio::test]
async fn force_start_serves_at_once_with_no_rules_and_takes_them_when_they_come() {
    // No server at that address yet: the client keeps retrying while the service answers.
    let ads = AdsServer::start().await;
    let addr = ads.addr;
    let state = ads.stop().await;
    let env = [
        ("CONFIG_TYPE", "GRPC_XDS_SOTW".to_owned()),
        ("CONFIG_GRPC_XDS_SERVER_URL", addr.to_string()),
        (
            "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL",
            "100ms".to_owned(),
        ),
        ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true".to_owned()),
    ];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let server = TestServer::start(&[], &env).await;
    let mut client = server.client().await;
    let refused = client
        .should_rate_limit(wire_request("edge", &[&[("user", "a")]]))
        .await
        .expect_err("no rules yet");
    assert_eq!(refused.code(), tonic::Code::Unknown);
    assert_eq!(refused.message(), "no rate limit configuration loaded");
    let (status, _) = http(
        server.http,
        "POST",
        "/json",
        r#"{"domain":"edge","descriptors":[{"entries":[{"key":"user","value":"a"}]}]}"#,
    )
    .await;
    assert_eq!(status, 400, "/json answers an error as the Go service does");
    let (status, body) = http(
        server.http,
        "POST",
        "/v1/check",
        r#"{"domain":"edge","descriptors":[{"entries":[{"key":"user","value":"a"}]}]}"#,
    )
    .await;
    assert_eq!(status, 503, "the native API: not available yet ({body})");
    let ads = AdsServer::start_at(addr, state, None).await;
    ads.push("v1", &[config("edge-rules", "edge", "user", 1)]);
    ads.ack("v1").await;
    assert_eq!(codes(&server, "edge", "user", "b", 2).await, [OK, OVER]);
    server.stop().await;
}

#[tokio::test]
async fn a_restarted_xds_server_is_asked_for_the_last_acked_version() {
    let ads = AdsServer::start().await;
    ads.push("v7", &[config("edge-rules", "edge", "user", 1)]);
    let server = start(&xds_env(&ads, &[])).await;
    ads.ack("v7").await;
    let addr = ads.addr;
    let state = ads.stop().await;
    state.streams.lock().expect("lock").clear();

    // While the server is away the rules stay.
    assert_eq!(codes(&server, "edge", "user", "a", 2).await, [OK, OVER]);
    let ads = AdsServer::start_at(addr, state, None).await;
    let resumed = ads
        .request(|r| r.response_nonce.is_empty() && r.version_info == "v7")
        .await;
    assert_eq!(resumed.node.expect("node").id, "envoy-ratelimit");
    server.stop().await;
}
