//! End to end over gRPC and HTTP against a real server on port-0 listeners: field presence as
//! envoyproxy/ratelimit sets it, response headers, dynamic metadata, global shadow mode, hits_addend,
//! health, reflection, `/healthcheck`,
//! `/rlconfig` and a clean stop.

use std::collections::BTreeMap;

use prost::Message as _;
use prost_types::value::Kind;
use prost_types::{Struct, Value};
use tollgate::proto::envoy::config::core::v3::HeaderValue;
use tollgate::proto::rls::rate_limit_response::{Code as WireCode, DescriptorStatus, rate_limit::Unit};
use tollgate::proto::rls::{RateLimitRequest, RateLimitResponse};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_reflection::pb::v1::ServerReflectionRequest;
use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;

use crate::common::{TestServer, http, wire_descriptor, wire_request};

const RULES: &str = r#"
domain: gate
descriptors:
  - key: user
    rate_limit:
      name: per-user
      unit: hour
      requests_per_unit: 2
  - key: open
    rate_limit:
      unlimited: true
  - key: blocked
    rate_limit:
      unit: day
      requests_per_unit: 0
  - key: plan
    value: free
    metadata:
      tier: free
      limits:
        burst: 5
    rate_limit:
      unit: day
      requests_per_unit: 5
  - key: plan
    value: basic
    metadata:
      tier: basic
      region: eu
      limits:
        burst: 9
        window: day
    rate_limit:
      unit: day
      requests_per_unit: 7
  - key: plan
    value: gold
    metadata:
      tier: gold
      vip: true
    rate_limit:
      unit: day
      requests_per_unit: 0
  - key: quota
    quota_mode: true
    rate_limit:
      unit: day
      requests_per_unit: 1
  - key: shadow
    shadow_mode: true
    rate_limit:
      unit: hour
      requests_per_unit: 1
  - key: org
    value: acme
    descriptors:
      - key: team
        rate_limit:
          unit: hour
          requests_per_unit: 10
"#;

const FILES: &[(&str, &str)] = &[("gate.yaml", RULES)];

const OK: i32 = WireCode::Ok as i32;
const OVER: i32 = WireCode::OverLimit as i32;

async fn ask(server: &TestServer, request: RateLimitRequest) -> RateLimitResponse {
    server
        .client()
        .await
        .should_rate_limit(request)
        .await
        .expect("ShouldRateLimit answered")
        .into_inner()
}

/// A status with a limit: everything present, reset within one unit.
fn assert_limited(
    status: &DescriptorStatus,
    code: i32,
    remaining: u32,
    requests_per_unit: u32,
    unit: Unit,
    name: &str,
) {
    assert_eq!(status.code, code, "code of {status:?}");
    assert_eq!(status.limit_remaining, remaining, "remaining of {status:?}");
    let limit = status.current_limit.as_ref().expect("current_limit present");
    assert_eq!(limit.requests_per_unit, requests_per_unit, "{status:?}");
    assert_eq!(limit.unit, unit as i32, "unit of {status:?}");
    assert_eq!(limit.name, name, "name of {status:?}");
    let reset = status
        .duration_until_reset
        .as_ref()
        .expect("duration_until_reset present");
    let unit_secs = match unit {
        Unit::Second => 1,
        Unit::Minute => 60,
        Unit::Hour => 3_600,
        Unit::Day => 86_400,
        other => panic!("unit {other:?} not used here"),
    };
    assert!(
        (1..=unit_secs).contains(&reset.seconds),
        "reset {reset:?} within 1..={unit_secs}"
    );
    assert_eq!(reset.nanos, 0, "whole seconds");
    assert!(status.quota.is_none());
}

/// A status without a limit: no current_limit, no duration_until_reset.
fn assert_unlimited(status: &DescriptorStatus, remaining: u32) {
    assert_eq!(status.code, OK, "code of {status:?}");
    assert_eq!(status.limit_remaining, remaining, "remaining of {status:?}");
    assert!(status.current_limit.is_none(), "no current_limit in {status:?}");
    assert!(
        status.duration_until_reset.is_none(),
        "no duration_until_reset in {status:?}"
    );
    assert!(status.quota.is_none());
}

fn assert_plain(response: &RateLimitResponse) {
    assert!(response.response_headers_to_add.is_empty());
    assert!(response.request_headers_to_add.is_empty());
    assert!(response.raw_body.is_empty());
    assert!(response.dynamic_metadata.is_none());
    assert!(response.quota.is_none());
}

fn headers(response: &RateLimitResponse) -> Vec<(String, String)> {
    response
        .response_headers_to_add
        .iter()
        .map(
            |HeaderValue {
                 key,
                 value,
                 raw_value,
             }| {
                assert!(raw_value.is_empty(), "value, not raw_value");
                (key.clone(), value.clone())
            },
        )
        .collect()
}

fn reset_secs(status: &DescriptorStatus) -> i64 {
    status
        .duration_until_reset
        .as_ref()
        .expect("duration_until_reset")
        .seconds
}

#[tokio::test]
async fn ok_then_over_limit_with_go_field_presence() {
    let server = TestServer::start(FILES, &[]).await;
    let request = wire_request(
        "gate",
        &[
            &[("user", "alice")],
            &[("nomatch", "x")],
            &[("open", "anything")],
            &[("plan", "free")],
        ],
    );
    let r = ask(&server, request.clone()).await;
    assert_eq!(r.overall_code, OK);
    assert_eq!(r.statuses.len(), 4);
    assert_limited(&r.statuses[0], OK, 1, 2, Unit::Hour, "per-user");
    assert_unlimited(&r.statuses[1], 0);
    assert_unlimited(&r.statuses[2], u32::MAX);
    assert_eq!(r.statuses[2].limit_remaining, 4_294_967_295);
    assert_limited(&r.statuses[3], OK, 4, 5, Unit::Day, "");
    assert_plain(&r);

    let r = ask(&server, request.clone()).await;
    assert_eq!(r.overall_code, OK);
    assert_limited(&r.statuses[0], OK, 0, 2, Unit::Hour, "per-user");
    assert_limited(&r.statuses[3], OK, 3, 5, Unit::Day, "");

    let r = ask(&server, request).await;
    assert_eq!(r.overall_code, OVER);
    assert_limited(&r.statuses[0], OVER, 0, 2, Unit::Hour, "per-user");
    assert_unlimited(&r.statuses[1], 0);
    assert_unlimited(&r.statuses[2], u32::MAX);
    // The other descriptors keep counting and stay OK.
    assert_limited(&r.statuses[3], OK, 2, 5, Unit::Day, "");
    assert_plain(&r);

    // Another user has its own counter.
    let r = ask(&server, wire_request("gate", &[&[("user", "bob")]])).await;
    assert_eq!(r.overall_code, OK);
    assert_limited(&r.statuses[0], OK, 1, 2, Unit::Hour, "per-user");
    server.stop().await;
}

#[tokio::test]
async fn statuses_keep_request_order() {
    let server = TestServer::start(FILES, &[]).await;
    let r = ask(
        &server,
        wire_request(
            "gate",
            &[
                &[("blocked", "x")],
                &[("open", "x")],
                &[("plan", "basic")],
                &[("user", "carol")],
                &[("nomatch", "x")],
            ],
        ),
    )
    .await;
    assert_eq!(r.overall_code, OVER);
    assert_eq!(r.statuses.len(), 5);
    assert_limited(&r.statuses[0], OVER, 0, 0, Unit::Day, "");
    assert_unlimited(&r.statuses[1], u32::MAX);
    assert_limited(&r.statuses[2], OK, 6, 7, Unit::Day, "");
    assert_limited(&r.statuses[3], OK, 1, 2, Unit::Hour, "per-user");
    assert_unlimited(&r.statuses[4], 0);
    server.stop().await;
}

#[tokio::test]
async fn unknown_domain_gets_no_limit() {
    let server = TestServer::start(FILES, &[]).await;
    let r = ask(
        &server,
        wire_request("elsewhere", &[&[("user", "alice")], &[("blocked", "x")]]),
    )
    .await;
    assert_eq!(r.overall_code, OK);
    assert_eq!(r.statuses.len(), 2);
    assert_unlimited(&r.statuses[0], 0);
    assert_unlimited(&r.statuses[1], 0);
    assert_plain(&r);
    server.stop().await;
}

#[tokio::test]
async fn response_headers_describe_the_tightest_descriptor() {
    let env = [("LIMIT_RESPONSE_HEADERS_ENABLED", "true")];
    let server = TestServer::start(FILES, &env).await;

    // Nothing limited: no headers.
    let r = ask(
        &server,
        wire_request("gate", &[&[("nomatch", "x")], &[("open", "x")]]),
    )
    .await;
    assert!(r.response_headers_to_add.is_empty(), "{r:?}");
    let r = ask(&server, wire_request("elsewhere", &[&[("user", "x")]])).await;
    assert!(r.response_headers_to_add.is_empty(), "{r:?}");

    // All OK: the smallest remaining (user, 1 left; plan free has 4).
    let r = ask(
        &server,
        wire_request(
            "gate",
            &[&[("plan", "free")], &[("open", "x")], &[("user", "dan")]],
        ),
    )
    .await;
    assert_eq!(r.overall_code, OK);
    let reset = reset_secs(&r.statuses[2]);
    assert_eq!(
        headers(&r),
        vec![
            ("RateLimit-Limit".to_owned(), "2".to_owned()),
            ("RateLimit-Remaining".to_owned(), "1".to_owned()),
            ("RateLimit-Reset".to_owned(), reset.to_string()),
        ]
    );

    // Ties on remaining: the first one. plan basic (7/day, 6 hits) and user u1 both have 1 left.
    let mut basic = wire_descriptor(&[("plan", "basic")]);
    basic.hits_addend = Some(6);
    let request = RateLimitRequest {
        domain: "gate".into(),
        descriptors: vec![basic, wire_descriptor(&[("user", "u1")])],
        hits_addend: 0,
    };
    let r = ask(&server, request).await;
    assert_eq!(r.statuses[0].limit_remaining, 1);
    assert_eq!(r.statuses[1].limit_remaining, 1);
    let hs = headers(&r);
    assert_eq!(
        (hs[0].1.as_str(), hs[1].1.as_str()),
        ("7", "1"),
        "plan basic described: {hs:?}"
    );
    // The other order: user u2 (2/hour) first, then plan free (4 left, 3 hits).
    let mut free = wire_descriptor(&[("plan", "free")]);
    free.hits_addend = Some(3);
    let request = RateLimitRequest {
        domain: "gate".into(),
        descriptors: vec![wire_descriptor(&[("user", "u2")]), free],
        hits_addend: 0,
    };
    let r = ask(&server, request).await;
    assert_eq!(r.statuses[0].limit_remaining, 1);
    assert_eq!(r.statuses[1].limit_remaining, 1);
    let hs = headers(&r);
    assert_eq!(
        (hs[0].1.as_str(), hs[1].1.as_str()),
        ("2", "1"),
        "user u2 described: {hs:?}"
    );

    // Over limit: the last over-limit descriptor wins over a smaller remaining elsewhere.
    let r = ask(
        &server,
        wire_request(
            "gate",
            &[
                &[("user", "dan")],
                &[("user", "dan")],
                &[("plan", "free")],
                &[("blocked", "x")],
            ],
        ),
    )
    .await;
    assert_eq!(r.overall_code, OVER);
    assert_eq!(r.statuses[1].code, OVER);
    assert_eq!(r.statuses[3].code, OVER);
    let reset = reset_secs(&r.statuses[3]);
    assert_eq!(
        headers(&r),
        vec![
            ("RateLimit-Limit".to_owned(), "0".to_owned()),
            ("RateLimit-Remaining".to_owned(), "0".to_owned()),
            ("RateLimit-Reset".to_owned(), reset.to_string()),
        ]
    );
    // Headers do not replace anything else.
    assert!(r.dynamic_metadata.is_none());
    server.stop().await;
}

#[tokio::test]
async fn response_headers_skip_quota_mode_descriptors() {
    let server = TestServer::start(FILES, &[("LIMIT_RESPONSE_HEADERS_ENABLED", "true")]).await;
    let mut quota = wire_descriptor(&[("quota", "q")]);
    quota.hits_addend = Some(5);
    // Both over; the quota-mode one is last but the headers describe the non-quota one.
    let request = RateLimitRequest {
        domain: "gate".into(),
        descriptors: vec![wire_descriptor(&[("blocked", "x")]), quota],
        hits_addend: 0,
    };
    let r = ask(&server, request).await;
    assert_eq!(r.overall_code, OVER);
    assert_limited(&r.statuses[0], OVER, 0, 0, Unit::Day, "");
    assert_limited(&r.statuses[1], OVER, 0, 1, Unit::Day, "");
    let hs = headers(&r);
    assert_eq!(hs.len(), 3);
    assert_eq!(hs[0], ("RateLimit-Limit".to_owned(), "0".to_owned()), "{hs:?}");
    server.stop().await;
}

#[tokio::test]
async fn per_rule_shadow_mode_and_nested_rules_over_the_wire() {
    let server = TestServer::start(FILES, &[]).await;
    let request = wire_request(
        "gate",
        &[
            &[("shadow", "s")],
            &[("org", "acme"), ("team", "core")],
            &[("org", "acme")],
        ],
    );
    let r = ask(&server, request.clone()).await;
    assert_eq!(r.overall_code, OK);
    assert_limited(&r.statuses[0], OK, 0, 1, Unit::Hour, "");
    assert_limited(&r.statuses[1], OK, 9, 10, Unit::Hour, "");
    // The parent has no limit of its own.
    assert_unlimited(&r.statuses[2], 0);
    // Over its limit, a shadow rule still says OK (remaining 0, limit present), and so does the overall code.
    let r = ask(&server, request).await;
    assert_eq!(r.overall_code, OK);
    assert_limited(&r.statuses[0], OK, 0, 1, Unit::Hour, "");
    assert_limited(&r.statuses[1], OK, 8, 10, Unit::Hour, "");
    server.stop().await;
}

#[tokio::test]
async fn response_header_names_are_configurable() {
    let env = [
        ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
        ("LIMIT_LIMIT_HEADER", "X-Limit"),
        ("LIMIT_REMAINING_HEADER", "X-Left"),
        ("LIMIT_RESET_HEADER", "X-Reset-In"),
    ];
    let server = TestServer::start(FILES, &env).await;
    let r = ask(&server, wire_request("gate", &[&[("plan", "basic")]])).await;
    let reset = reset_secs(&r.statuses[0]);
    assert!((1..=86_400).contains(&reset));
    assert_eq!(
        headers(&r),
        vec![
            ("X-Limit".to_owned(), "7".to_owned()),
            ("X-Left".to_owned(), "6".to_owned()),
            ("X-Reset-In".to_owned(), reset.to_string()),
        ]
    );
    server.stop().await;
}

#[tokio::test]
async fn headers_are_off_by_default() {
    let server = TestServer::start(FILES, &[]).await;
    let r = ask(&server, wire_request("gate", &[&[("blocked", "x")]])).await;
    assert_eq!(r.overall_code, OVER);
    assert_plain(&r);
    server.stop().await;
}

fn field<'a>(s: &'a Struct, name: &str) -> &'a Kind {
    s.fields
        .get(name)
        .and_then(|v| v.kind.as_ref())
        .unwrap_or_else(|| panic!("field {name} in {s:?}"))
}

fn as_struct(kind: &Kind) -> &Struct {
    match kind {
        Kind::StructValue(s) => s,
        other => panic!("expected a struct, got {other:?}"),
    }
}

fn as_list(kind: &Kind) -> &[Value] {
    match kind {
        Kind::ListValue(l) => &l.values,
        other => panic!("expected a list, got {other:?}"),
    }
}

fn as_str(kind: &Kind) -> &str {
    match kind {
        Kind::StringValue(s) => s,
        other => panic!("expected a string, got {other:?}"),
    }
}

fn kind(value: &Value) -> &Kind {
    value.kind.as_ref().expect("value has a kind")
}

fn entries_of(descriptor: &Value) -> Vec<String> {
    as_list(field(as_struct(kind(descriptor)), "entries"))
        .iter()
        .map(|v| as_str(kind(v)).to_owned())
        .collect()
}

#[tokio::test]
async fn dynamic_metadata_merges_passing_descriptors_only() {
    let server = TestServer::start(FILES, &[("RESPONSE_DYNAMIC_METADATA", "true")]).await;
    let mut request = wire_request(
        "gate",
        &[
            &[("plan", "free")],
            &[("plan", "gold")],
            &[("plan", "basic")],
            &[("user", "eve"), ("extra", "x")],
        ],
    );
    request.hits_addend = 1;
    let r = ask(&server, request).await;
    assert_eq!(r.overall_code, OVER);
    assert_eq!(r.statuses[1].code, OVER);
    let md = r.dynamic_metadata.as_ref().expect("dynamic_metadata present");
    assert_eq!(as_str(field(md, "domain")), "gate");
    let descriptors = as_list(field(md, "descriptors"));
    assert_eq!(descriptors.len(), 4);
    assert_eq!(entries_of(&descriptors[0]), vec!["plan=free"]);
    assert_eq!(entries_of(&descriptors[1]), vec!["plan=gold"]);
    assert_eq!(entries_of(&descriptors[3]), vec!["user=eve", "extra=x"]);
    assert!(matches!(field(md, "hitsAddend"), Kind::NumberValue(n) if *n == 1.0));
    // No descriptor-level hits_addend: no per-descriptor hitsAddend.
    assert!(!as_struct(kind(&descriptors[0])).fields.contains_key("hitsAddend"));

    let metadata = as_struct(field(md, "metadata"));
    // First value wins on conflicts (free before basic); gold failed, so none of its keys.
    assert_eq!(as_str(field(metadata, "tier")), "free");
    assert_eq!(as_str(field(metadata, "region")), "eu");
    assert!(!metadata.fields.contains_key("vip"), "{metadata:?}");
    // Nested maps are merged, first value winning inside too.
    let limits = as_struct(field(metadata, "limits"));
    assert!(matches!(field(limits, "burst"), Kind::NumberValue(n) if *n == 5.0));
    assert_eq!(as_str(field(limits, "window")), "day");
    let keys: BTreeMap<_, _> = metadata.fields.iter().collect();
    assert_eq!(
        keys.keys().map(|k| k.as_str()).collect::<Vec<_>>(),
        ["limits", "region", "tier"]
    );
    assert!(r.response_headers_to_add.is_empty());
    server.stop().await;
}

#[tokio::test]
async fn dynamic_metadata_without_passing_rules_has_no_metadata_field() {
    let server = TestServer::start(FILES, &[("RESPONSE_DYNAMIC_METADATA", "true")]).await;
    let mut gold = wire_descriptor(&[("plan", "gold")]);
    gold.hits_addend = Some(2);
    let request = RateLimitRequest {
        domain: "gate".into(),
        descriptors: vec![gold],
        hits_addend: 0,
    };
    let r = ask(&server, request).await;
    let md = r.dynamic_metadata.as_ref().expect("dynamic_metadata present");
    assert_eq!(as_str(field(md, "domain")), "gate");
    assert!(!md.fields.contains_key("metadata"), "{md:?}");
    assert!(
        !md.fields.contains_key("hitsAddend"),
        "request-level 0 is omitted: {md:?}"
    );
    let descriptors = as_list(field(md, "descriptors"));
    let first = as_struct(kind(&descriptors[0]));
    assert!(
        matches!(field(first, "hitsAddend"), Kind::NumberValue(n) if *n == 2.0),
        "{first:?}"
    );
    server.stop().await;
}

#[tokio::test]
async fn global_shadow_mode_keeps_statuses_but_answers_ok() {
    let server = TestServer::start(FILES, &[("SHADOW_MODE", "true")]).await;
    let request = wire_request("gate", &[&[("blocked", "x")], &[("user", "frank")]]);
    let r = ask(&server, request).await;
    assert_eq!(r.overall_code, OK);
    assert_limited(&r.statuses[0], OVER, 0, 0, Unit::Day, "");
    assert_limited(&r.statuses[1], OK, 1, 2, Unit::Hour, "per-user");
    server.stop().await;
}

#[tokio::test]
async fn descriptor_hits_addend_over_the_wire() {
    let server = TestServer::start(FILES, &[]).await;
    // Some(0): check only, nothing consumed.
    let mut check = wire_descriptor(&[("plan", "free")]);
    check.hits_addend = Some(0);
    let request = RateLimitRequest {
        domain: "gate".into(),
        descriptors: vec![check.clone()],
        hits_addend: 0,
    };
    for _ in 0..3 {
        let r = ask(&server, request.clone()).await;
        assert_eq!(r.overall_code, OK);
        assert_limited(&r.statuses[0], OK, 5, 5, Unit::Day, "");
    }
    // Some(3) consumes three; the request-level addend does not apply to it.
    let mut three = wire_descriptor(&[("plan", "free")]);
    three.hits_addend = Some(3);
    let r = ask(
        &server,
        RateLimitRequest {
            domain: "gate".into(),
            descriptors: vec![three.clone(), wire_descriptor(&[("plan", "basic")])],
            hits_addend: 2,
        },
    )
    .await;
    assert_limited(&r.statuses[0], OK, 2, 5, Unit::Day, "");
    // The request-level addend applies to descriptors without their own.
    assert_limited(&r.statuses[1], OK, 5, 7, Unit::Day, "");
    // Another 3 exceeds the remaining 2.
    let r = ask(
        &server,
        RateLimitRequest {
            domain: "gate".into(),
            descriptors: vec![three],
            hits_addend: 0,
        },
    )
    .await;
    assert_eq!(r.overall_code, OVER);
    assert_limited(&r.statuses[0], OVER, 0, 5, Unit::Day, "");
    server.stop().await;
}

#[tokio::test]
async fn request_hits_addend_over_the_wire() {
    let server = TestServer::start(FILES, &[]).await;
    let mut request = wire_request("gate", &[&[("plan", "basic")]]);
    request.hits_addend = 4;
    let r = ask(&server, request.clone()).await;
    assert_limited(&r.statuses[0], OK, 3, 7, Unit::Day, "");
    let r = ask(&server, request).await;
    assert_eq!(r.overall_code, OVER);
    assert_limited(&r.statuses[0], OVER, 0, 7, Unit::Day, "");
    // 0 means 1.
    let r = ask(&server, wire_request("gate", &[&[("plan", "free")]])).await;
    assert_limited(&r.statuses[0], OK, 4, 5, Unit::Day, "");
    server.stop().await;
}

#[tokio::test]
async fn grpc_health_reports_serving() {
    let server = TestServer::start(FILES, &[]).await;
    let mut health = HealthClient::new(server.channel().await);
    for service in ["", "ratelimit", "envoy.service.ratelimit.v3.RateLimitService"] {
        let answer = health
            .check(HealthCheckRequest {
                service: service.to_owned(),
            })
            .await
            .unwrap_or_else(|e| panic!("health of {service:?}: {e}"))
            .into_inner();
        assert_eq!(
            answer.status,
            ServingStatus::Serving as i32,
            "service {service:?}"
        );
    }
    let unknown = health
        .check(HealthCheckRequest {
            service: "no.such.Service".to_owned(),
        })
        .await
        .expect_err("unknown service");
    assert_eq!(unknown.code(), tonic::Code::NotFound);
    server.stop().await;
}

async fn reflect(
    client: &mut ServerReflectionClient<tonic::transport::Channel>,
    request: MessageRequest,
) -> MessageResponse {
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(request),
    };
    let mut stream = client
        .server_reflection_info(tokio_stream::iter(vec![request]))
        .await
        .expect("reflection call")
        .into_inner();
    let response = stream
        .message()
        .await
        .expect("reflection stream")
        .expect("one reflection response");
    response.message_response.expect("message_response")
}

#[tokio::test]
async fn reflection_lists_services_and_serves_descriptors() {
    let server = TestServer::start(FILES, &[]).await;
    let mut client = ServerReflectionClient::new(server.channel().await);
    let MessageResponse::ListServicesResponse(list) =
        reflect(&mut client, MessageRequest::ListServices(String::new())).await
    else {
        panic!("expected a service list");
    };
    let names: Vec<&str> = list.service.iter().map(|s| s.name.as_str()).collect();
    for expected in [
        "envoy.service.ratelimit.v3.RateLimitService",
        "tollgate.v1.RateLimiter",
        "grpc.health.v1.Health",
    ] {
        assert!(names.contains(&expected), "{expected} in {names:?}");
    }

    let response = reflect(
        &mut client,
        MessageRequest::FileContainingSymbol("envoy.service.ratelimit.v3.RateLimitService".to_owned()),
    )
    .await;
    let MessageResponse::FileDescriptorResponse(files) = response else {
        panic!("expected file descriptors, got {response:?}");
    };
    assert!(!files.file_descriptor_proto.is_empty());
    let files: Vec<prost_types::FileDescriptorProto> = files
        .file_descriptor_proto
        .iter()
        .map(|bytes| {
            prost_types::FileDescriptorProto::decode(bytes.as_slice()).expect("a FileDescriptorProto")
        })
        .collect();
    let rls = files
        .iter()
        .find(|f| f.package() == "envoy.service.ratelimit.v3")
        .unwrap_or_else(|| {
            panic!(
                "rls file among {:?}",
                files.iter().map(|f| f.name()).collect::<Vec<_>>()
            )
        });
    let service = rls
        .service
        .iter()
        .find(|s| s.name() == "RateLimitService")
        .expect("RateLimitService in its file");
    assert!(service.method.iter().any(|m| m.name() == "ShouldRateLimit"));
    // grpcurl then fetches every dependency by file name.
    assert!(!rls.dependency.is_empty());
    for dependency in &rls.dependency {
        let response = reflect(&mut client, MessageRequest::FileByFilename(dependency.clone())).await;
        let MessageResponse::FileDescriptorResponse(files) = response else {
            panic!("expected the file {dependency}, got {response:?}");
        };
        let file = prost_types::FileDescriptorProto::decode(files.file_descriptor_proto[0].as_slice())
            .expect("a FileDescriptorProto");
        assert_eq!(file.name(), dependency.as_str());
    }
    server.stop().await;
}

#[tokio::test]
async fn http_healthcheck_and_rlconfig() {
    let server = TestServer::start(FILES, &[]).await;
    let (status, body) = http(server.http, "GET", "/healthcheck", "").await;
    assert_eq!(status, 200);
    assert_eq!(body, "OK");

    let (status, body) = http(server.debug, "GET", "/rlconfig", "").await;
    assert_eq!(status, 200);
    let lines: Vec<&str> = body.lines().collect();
    for expected in [
        "gate.user: unit=HOUR requests_per_unit=2, shadow_mode: false, quota_mode: false",
        "gate.blocked: unit=DAY requests_per_unit=0, shadow_mode: false, quota_mode: false",
        "gate.plan_free: unit=DAY requests_per_unit=5, shadow_mode: false, quota_mode: false",
        "gate.plan_basic: unit=DAY requests_per_unit=7, shadow_mode: false, quota_mode: false",
        "gate.plan_gold: unit=DAY requests_per_unit=0, shadow_mode: false, quota_mode: false",
    ] {
        assert!(lines.contains(&expected), "{expected:?} in {body}");
    }
    assert!(lines.iter().any(|l| l.starts_with("gate.open: ")), "{body}");
    for expected in [
        "gate.quota: unit=DAY requests_per_unit=1, shadow_mode: false, quota_mode: true",
        "gate.shadow: unit=HOUR requests_per_unit=1, shadow_mode: true, quota_mode: false",
        "gate.org_acme.team: unit=HOUR requests_per_unit=10, shadow_mode: false, quota_mode: false",
    ] {
        assert!(lines.contains(&expected), "{expected:?} in {body}");
    }
    assert_eq!(lines.len(), 9, "one line per rule: {body}");
    server.stop().await;
}

/// A stopped server closes its own listeners. Checked by the listening sockets' identities, not by
/// connecting to their ports: once closed, a port is free for another test's server to bind.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn server_stops_cleanly_and_stops_listening() {
    use crate::common::sockets::{holds_socket, listening_socket};
    let server = TestServer::start(FILES, &[]).await;
    let r = ask(&server, wire_request("gate", &[&[("user", "x")]])).await;
    assert_eq!(r.overall_code, OK);
    let grpc = listening_socket(server.grpc).expect("the gRPC listener");
    let http_socket = listening_socket(server.http).expect("the HTTP listener");
    assert!(
        holds_socket(grpc) && holds_socket(http_socket),
        "both listeners are ours"
    );
    tokio::time::timeout(std::time::Duration::from_secs(10), server.stop())
        .await
        .expect("stops promptly");
    assert!(!holds_socket(grpc), "gRPC listener closed");
    assert!(!holds_socket(http_socket), "HTTP listener closed");
}
