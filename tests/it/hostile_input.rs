//! Bad input over real gRPC gets a clear status, never a panic or a hang. Every call is bounded by a
//! timeout, and every test ends by checking that the same connection still gets a normal answer (a
//! panic in a handler would have torn the connection down).

use std::time::Duration;

use tollgate::proto::descriptor::RateLimitDescriptor;
use tollgate::proto::rls::rate_limit_response::Code as WireCode;
use tollgate::proto::rls::rate_limit_service_client::RateLimitServiceClient;
use tollgate::proto::rls::{RateLimitRequest, RateLimitResponse};
use tollgate_core::limiter::DEFAULT_MAX_DESCRIPTORS;
use tonic::transport::Channel;
use tonic::{Code, Status};

use crate::common::{TestServer, wire_descriptor, wire_override, wire_request};

const RULES: &str = r#"
domain: hostile
descriptors:
  - key: user
    rate_limit:
      unit: hour
      requests_per_unit: 2
  - key: item
    rate_limit:
      unit: hour
      requests_per_unit: 1
  - key: big
    rate_limit:
      unit: day
      requests_per_unit: 4294967295
"#;

const FILES: &[(&str, &str)] = &[("hostile.yaml", RULES)];

const OK: i32 = WireCode::Ok as i32;
const OVER: i32 = WireCode::OverLimit as i32;

/// Generous for a debug build with 16k descriptors; a hang still fails well inside the test budget.
const BOUND: Duration = Duration::from_secs(10);

struct Conn {
    server: TestServer,
    client: RateLimitServiceClient<Channel>,
    channel: Channel,
}

impl Conn {
    async fn start() -> Self {
        Self::start_with(&[]).await
    }

    async fn start_with(env: &[(&str, &str)]) -> Self {
        let server = TestServer::start(FILES, env).await;
        let channel = server.channel().await;
        Self {
            client: RateLimitServiceClient::new(channel.clone())
                .max_decoding_message_size(64 << 20)
                .max_encoding_message_size(64 << 20),
            channel,
            server,
        }
    }

    async fn call(&mut self, request: RateLimitRequest) -> Result<RateLimitResponse, Status> {
        tokio::time::timeout(BOUND, self.client.should_rate_limit(request))
            .await
            .expect("answered within the bound")
            .map(tonic::Response::into_inner)
    }

    async fn ok(&mut self, request: RateLimitRequest) -> RateLimitResponse {
        self.call(request).await.expect("answered with a response")
    }

    async fn refused(&mut self, request: RateLimitRequest) -> Status {
        self.call(request).await.expect_err("refused with a status")
    }

    /// The server still answers a normal request on the same connection, then stops cleanly.
    async fn still_alive_then_stop(mut self) {
        let r = self.ok(wire_request("hostile", &[&[("user", "healthy")]])).await;
        assert_eq!(r.overall_code, OK);
        assert_eq!(r.statuses.len(), 1);
        assert_eq!(r.statuses[0].code, OK);
        tokio::time::timeout(BOUND, self.server.stop())
            .await
            .expect("stops within the bound");
    }
}

fn request(descriptors: Vec<RateLimitDescriptor>, hits_addend: u32) -> RateLimitRequest {
    RateLimitRequest {
        domain: "hostile".into(),
        descriptors,
        hits_addend,
    }
}

#[tokio::test]
async fn empty_domain_is_invalid_argument() {
    let mut c = Conn::start().await;
    let status = c.refused(wire_request("", &[&[("user", "a")]])).await;
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert_eq!(status.message(), "rate limit domain must not be empty");
    c.still_alive_then_stop().await;
}

#[tokio::test]
async fn no_descriptors_is_invalid_argument() {
    let mut c = Conn::start().await;
    let status = c.refused(wire_request("hostile", &[])).await;
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert_eq!(status.message(), "rate limit descriptor list must not be empty");
    // Both missing: the domain is checked first, as in Go.
    let status = c.refused(wire_request("", &[])).await;
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert_eq!(status.message(), "rate limit domain must not be empty");
    c.still_alive_then_stop().await;
}

#[tokio::test]
async fn override_with_an_invalid_unit_is_invalid_argument() {
    let mut c = Conn::start().await;
    // A valid override first, so the refusals below are about the unit alone.
    let mut valid = wire_descriptor(&[("user", "ovr")]);
    valid.limit = wire_override(3, 3); // HOUR
    let r = c.ok(request(vec![valid], 0)).await;
    assert_eq!(r.overall_code, OK);
    let limit = r.statuses[0].current_limit.as_ref().expect("override limit");
    assert_eq!(limit.requests_per_unit, 3);
    assert_eq!(r.statuses[0].limit_remaining, 2);

    for unit in [0, 99, -1, i32::MAX] {
        let mut bad = wire_descriptor(&[("user", "ovr")]);
        bad.limit = wire_override(10, unit);
        // The bad descriptor second: the whole request is refused, nothing partially answered.
        let status = c
            .refused(request(vec![wire_descriptor(&[("user", "x")]), bad], 0))
            .await;
        assert_eq!(status.code(), Code::InvalidArgument, "unit {unit}: {status:?}");
        assert!(
            status.message().contains(&format!("invalid unit {unit}")),
            "unit {unit}: {}",
            status.message()
        );
    }
    // Refused requests consumed nothing: user=x still has both of its requests.
    let r = c.ok(wire_request("hostile", &[&[("user", "x")]])).await;
    assert_eq!(r.statuses[0].limit_remaining, 1);
    c.still_alive_then_stop().await;
}

fn many(n: usize) -> Vec<RateLimitDescriptor> {
    (0..n)
        .map(|i| wire_descriptor(&[("item", &i.to_string())]))
        .collect()
}

#[tokio::test]
async fn ten_thousand_descriptors_are_answered() {
    let mut c = Conn::start().await;
    let r = c.ok(request(many(10_000), 0)).await;
    assert_eq!(r.overall_code, OK);
    assert_eq!(r.statuses.len(), 10_000);
    for status in &r.statuses {
        assert_eq!(status.code, OK);
        assert_eq!(status.limit_remaining, 0);
        assert!(status.current_limit.is_some());
    }
    // The same again: every one is now over its own limit of 1.
    let r = c.ok(request(many(10_000), 0)).await;
    assert_eq!(r.overall_code, OVER);
    assert!(r.statuses.iter().all(|s| s.code == OVER));
    c.still_alive_then_stop().await;
}

#[tokio::test]
async fn more_than_the_maximum_descriptors_is_invalid_argument() {
    let mut c = Conn::start().await;
    assert_eq!(DEFAULT_MAX_DESCRIPTORS, 16_384);
    let r = c.ok(request(many(DEFAULT_MAX_DESCRIPTORS), 0)).await;
    assert_eq!(r.statuses.len(), DEFAULT_MAX_DESCRIPTORS);
    let status = c.refused(request(many(DEFAULT_MAX_DESCRIPTORS + 1), 0)).await;
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().contains("16385") && status.message().contains("16384"),
        "{}",
        status.message()
    );
    c.still_alive_then_stop().await;
}

/// Above the default 1 MiB a message is refused unread; with a larger limit, megabyte values still work.
#[tokio::test]
async fn megabyte_values_are_answered_and_counted_apart() {
    let mut c = Conn::start_with(&[("TOLLGATE_MAX_REQUEST_BYTES", "8388608")]).await;
    let base = "v".repeat(1 << 20);
    let a = format!("{base}a");
    let b = format!("{base}b");
    // Values that differ only at their last byte, far beyond any prefix kept in the storage key.
    let r = c
        .ok(wire_request("hostile", &[&[("user", &a)], &[("user", &b)]]))
        .await;
    assert_eq!(r.overall_code, OK);
    assert_eq!(r.statuses[0].limit_remaining, 1);
    assert_eq!(r.statuses[1].limit_remaining, 1);
    let r = c.ok(wire_request("hostile", &[&[("user", &a)]])).await;
    assert_eq!(r.statuses[0].limit_remaining, 0);
    let r = c.ok(wire_request("hostile", &[&[("user", &a)]])).await;
    assert_eq!(r.overall_code, OVER);
    let r = c.ok(wire_request("hostile", &[&[("user", &b)]])).await;
    assert_eq!(r.overall_code, OK, "b has its own counter");
    assert_eq!(r.statuses[0].limit_remaining, 0);
    // A megabyte key that matches nothing.
    let r = c.ok(wire_request("hostile", &[&[(&base, "x")]])).await;
    assert_eq!(r.overall_code, OK);
    assert!(r.statuses[0].current_limit.is_none());
    c.still_alive_then_stop().await;
}

/// `RateLimitRequest` with the entry value as raw bytes (same tags), to send invalid UTF-8.
#[derive(Clone, PartialEq, prost::Message)]
struct RawRequest {
    #[prost(string, tag = "1")]
    domain: String,
    #[prost(message, repeated, tag = "2")]
    descriptors: Vec<RawDescriptor>,
    #[prost(uint32, tag = "3")]
    hits_addend: u32,
}

#[derive(Clone, PartialEq, prost::Message)]
struct RawDescriptor {
    #[prost(message, repeated, tag = "1")]
    entries: Vec<RawEntry>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct RawEntry {
    #[prost(bytes = "vec", tag = "1")]
    key: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    value: Vec<u8>,
}

async fn raw_call(channel: Channel, request: RawRequest) -> Result<RateLimitResponse, Status> {
    let mut grpc = tonic::client::Grpc::new(channel);
    tokio::time::timeout(BOUND, async move {
        grpc.ready()
            .await
            .map_err(|e| Status::unavailable(e.to_string()))?;
        let path = tonic::codegen::http::uri::PathAndQuery::from_static(
            "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
        );
        let codec = tonic_prost::ProstCodec::<RawRequest, RateLimitResponse>::default();
        grpc.unary(tonic::Request::new(request), path, codec)
            .await
            .map(tonic::Response::into_inner)
    })
    .await
    .expect("answered within the bound")
}

fn raw(key: &[u8], value: &[u8]) -> RawRequest {
    RawRequest {
        domain: "hostile".into(),
        descriptors: vec![RawDescriptor {
            entries: vec![RawEntry {
                key: key.to_vec(),
                value: value.to_vec(),
            }],
        }],
        hits_addend: 0,
    }
}

#[tokio::test]
async fn invalid_utf8_gets_an_error_status() {
    let c = Conn::start().await;
    // The mirror message is wire-identical for valid text: it is answered normally.
    let r = raw_call(c.channel.clone(), raw(b"user", b"mirror"))
        .await
        .expect("the mirror message works for valid UTF-8");
    assert_eq!(r.overall_code, OK);
    assert_eq!(r.statuses[0].limit_remaining, 1);

    for (key, value) in [
        (&b"user"[..], &b"\xff\xfe"[..]),
        (b"user", b"ok\xc3"),
        (b"\x80user", b"v"),
    ] {
        let status = raw_call(c.channel.clone(), raw(key, value))
            .await
            .expect_err("invalid UTF-8 is refused");
        assert!(
            matches!(status.code(), Code::Internal | Code::InvalidArgument),
            "a decode error status, got {status:?}"
        );
    }
    c.still_alive_then_stop().await;
}

#[tokio::test]
async fn enormous_hits_addends_are_over_limit_without_panicking() {
    let mut c = Conn::start().await;
    // Request-level u32::MAX on a limit of 2.
    let r = c
        .ok(request(vec![wire_descriptor(&[("user", "greedy")])], u32::MAX))
        .await;
    assert_eq!(r.overall_code, OVER);
    assert_eq!(r.statuses[0].code, OVER);
    assert_eq!(r.statuses[0].limit_remaining, 0);
    // Again on the same counter (it may already hold u32::MAX).
    let r = c
        .ok(request(vec![wire_descriptor(&[("user", "greedy")])], u32::MAX))
        .await;
    assert_eq!(r.overall_code, OVER);

    // Descriptor-level u64::MAX, twice on one counter, then a normal hit on it: no overflow.
    for _ in 0..2 {
        let mut huge = wire_descriptor(&[("user", "huge")]);
        huge.hits_addend = Some(u64::MAX);
        let r = c.ok(request(vec![huge], 0)).await;
        assert_eq!(r.overall_code, OVER);
        assert_eq!(r.statuses[0].limit_remaining, 0);
    }
    let r = c.ok(wire_request("hostile", &[&[("user", "huge")]])).await;
    assert_eq!(r.overall_code, OVER);

    // Even against the largest possible limit.
    let mut huge = wire_descriptor(&[("big", "x")]);
    huge.hits_addend = Some(u64::MAX);
    let r = c.ok(request(vec![huge.clone(), huge], 0)).await;
    assert_eq!(r.overall_code, OVER);
    let mut max = wire_descriptor(&[("big", "y")]);
    max.hits_addend = Some(u64::from(u32::MAX));
    let r = c.ok(request(vec![max], 0)).await;
    assert_eq!(r.overall_code, OK, "exactly the limit passes");
    assert_eq!(r.statuses[0].limit_remaining, 0);

    // An override with u64::MAX hits.
    let mut over = wire_descriptor(&[("user", "ovr")]);
    over.limit = wire_override(u32::MAX, 1);
    over.hits_addend = Some(u64::MAX);
    let r = c.ok(request(vec![over], 0)).await;
    assert_eq!(r.overall_code, OVER);
    c.still_alive_then_stop().await;
}

#[tokio::test]
async fn odd_but_valid_shapes_are_answered() {
    let mut c = Conn::start().await;
    // A descriptor without entries, an empty key, an empty value, an unknown domain: no limit.
    let empty = RateLimitDescriptor::default();
    let r = c
        .ok(request(
            vec![
                empty,
                wire_descriptor(&[("", "v")]),
                wire_descriptor(&[("user", "")]),
            ],
            0,
        ))
        .await;
    assert_eq!(r.statuses.len(), 3);
    assert_eq!(r.overall_code, OK);
    assert!(r.statuses[0].current_limit.is_none());
    assert!(r.statuses[1].current_limit.is_none());
    // The empty value is a literal value for the key default, as in Go.
    assert_eq!(r.statuses[2].limit_remaining, 1);
    let r = c.ok(wire_request("no-such-domain", &[&[("user", "a")]])).await;
    assert_eq!(r.overall_code, OK);
    // A very deep descriptor: refused before any work on it (at most 64 entries, see below).
    let deep: Vec<(String, String)> = (0..5_000).map(|i| (format!("k{i}"), "v".to_owned())).collect();
    let deep: Vec<(&str, &str)> = deep.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let status = c.refused(wire_request("hostile", &[&deep])).await;
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    c.still_alive_then_stop().await;
}

/// A message above TOLLGATE_MAX_REQUEST_BYTES (1 MiB by default) is RESOURCE_EXHAUSTED, as gRPC's own
/// servers answer, before it is decoded; a descriptor with more than 64 entries is INVALID_ARGUMENT.
#[tokio::test]
async fn oversized_messages_and_descriptors_are_refused() {
    let mut c = Conn::start().await;
    let big = "v".repeat(1 << 20);
    let status = c.refused(wire_request("hostile", &[&[("user", &big)]])).await;
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    let just_under = "v".repeat((1 << 20) - 64);
    assert_eq!(
        c.ok(wire_request("hostile", &[&[("user", &just_under)]]))
            .await
            .overall_code,
        OK
    );
    let names: Vec<String> = (0..65).map(|i| format!("k{i}")).collect();
    let entries: Vec<(&str, &str)> = names.iter().map(|k| (k.as_str(), "v")).collect();
    let status = c.refused(wire_request("hostile", &[&entries])).await;
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("65 entries"), "{status:?}");
    let r = c.ok(wire_request("hostile", &[&entries[..64]])).await;
    assert_eq!(r.overall_code, OK);
    c.still_alive_then_stop().await;
}

#[tokio::test]
async fn the_server_survives_everything_in_a_row() {
    let mut c = Conn::start().await;
    let _ = c.refused(wire_request("", &[&[("user", "a")]])).await;
    let _ = c.refused(wire_request("hostile", &[])).await;
    let mut bad = wire_descriptor(&[("user", "a")]);
    bad.limit = wire_override(1, 0);
    let _ = c.refused(request(vec![bad], 0)).await;
    let _ = c.refused(request(many(DEFAULT_MAX_DESCRIPTORS + 1), 0)).await;
    let mut huge = wire_descriptor(&[("user", "a")]);
    huge.hits_addend = Some(u64::MAX);
    let _ = c.ok(request(vec![huge], u32::MAX)).await;
    let _ = raw_call(c.channel.clone(), raw(b"user", b"\xff"))
        .await
        .expect_err("invalid UTF-8");
    c.still_alive_then_stop().await;
}

/// A value that spells another descriptor's key (`_` separates entries in envoyproxy/ratelimit's keys)
/// does not reach that descriptor's counter where the key is Tollgate's own: values are escaped there.
/// (A lone fixed window keeps Go's key, so that Go replicas share it; there the two still meet, as they
/// do in the Go service: docs/design.md#keys.)
#[tokio::test]
async fn a_value_cannot_spell_another_descriptors_key() {
    let rules = "domain: spell
descriptors:
  - key: path
    rate_limit: {unit: hour, requests_per_unit: 1, algorithm: token_bucket}
    descriptors:
      - key: remote_address
        rate_limit: {unit: hour, requests_per_unit: 1, algorithm: token_bucket}
";
    let server = TestServer::start(&[("spell.yaml", rules)], &[]).await;
    let mut client = server.client().await;
    let mut ask = async |entries: &[(&str, &str)]| {
        let answer = tokio::time::timeout(BOUND, client.should_rate_limit(wire_request("spell", &[entries])))
            .await
            .expect("answered in time")
            .expect("answer")
            .into_inner();
        answer.overall_code
    };
    // The attacker's one request spends the limit of its own value...
    let spelled = [("path", "/auth/login_remote_address_192.0.2.9")];
    assert_eq!(ask(&spelled).await, OK);
    assert_eq!(ask(&spelled).await, OVER, "its own budget is spent");
    // ...and not the victim's, whose key it spells in Go's format.
    let victim = [("path", "/auth/login"), ("remote_address", "192.0.2.9")];
    assert_eq!(ask(&victim).await, OK, "the victim's budget is its own");
    // Values holding the escape character itself stay apart from their escaped twins.
    assert_eq!(ask(&[("path", "a%5Fb")]).await, OK);
    assert_eq!(ask(&[("path", "a_b")]).await, OK, "`a_b` is not `a%5Fb`");
    server.stop().await;
}
