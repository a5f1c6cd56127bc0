//! No value spells another caller's counter, over real gRPC on whichever store the suite runs
//! (`TOLLGATE_TEST_STORE`; `scripts/test.sh` runs this module on both): a short value equal to the
//! hash a long value enters its key as, a limit override's value equal to a hashed value, and a value
//! in Go's format equal to the escaped key of a rule with several limits. Each attacker spends its own
//! budget, never the victim's (docs/design.md, "Keys").

use std::time::Duration;

use tollgate::proto::descriptor::RateLimitDescriptor;
use tollgate::proto::rls::RateLimitRequest;
use tollgate::proto::rls::rate_limit_response::Code as WireCode;
use tollgate::proto::rls::rate_limit_service_client::RateLimitServiceClient;
use tollgate_core::rules::file::Unit;
use tollgate_core::rules::{HASH_MARK, ValueHasher};
use tonic::transport::Channel;

use crate::common::{TestServer, store_under_test_is_redis, wire_descriptor, wire_override, wire_request};

const OK: i32 = WireCode::Ok as i32;
const OVER: i32 = WireCode::OverLimit as i32;

/// A hang still fails well inside the test budget.
const BOUND: Duration = Duration::from_secs(10);

/// A limit of 3 an hour on `path` alone; 3 an hour and 100 a day on `k1` then `k2`, beside 3 an
/// hour on `k1` alone (the limits the attacker's and the victim's keys would share); 3 an hour on
/// `user`, hashed; and, nested, 1 an hour on `route` and on `route` then `remote_address`.
const RULES: &str = r#"
domain: spell
descriptors:
  - key: path
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: k1
    rate_limit: {unit: hour, requests_per_unit: 3}
    descriptors:
      - key: k2
        rate_limits:
          - {unit: hour, requests_per_unit: 3}
          - {unit: day, requests_per_unit: 100}
  - key: user
    hash: true
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: route
    rate_limit: {unit: hour, requests_per_unit: 1}
    descriptors:
      - key: remote_address
        rate_limit: {unit: hour, requests_per_unit: 1}
"#;

struct Client {
    server: TestServer,
    client: RateLimitServiceClient<Channel>,
}

impl Client {
    async fn start() -> Self {
        let server = TestServer::start(&[("spell.yaml", RULES)], &[]).await;
        let client = server.client().await;
        Self { server, client }
    }

    /// One request's overall code and its first status's remaining budget.
    async fn ask(&mut self, request: RateLimitRequest) -> (i32, u32) {
        let answer = tokio::time::timeout(BOUND, self.client.should_rate_limit(request))
            .await
            .expect("answered in time")
            .expect("an answer")
            .into_inner();
        (answer.overall_code, answer.statuses[0].limit_remaining)
    }

    async fn one(&mut self, entries: &[(&str, &str)]) -> (i32, u32) {
        self.ask(wire_request("spell", &[entries])).await
    }

    /// Spends `entries`' budget of 3 and checks that it is spent.
    async fn spend(&mut self, entries: &[(&str, &str)]) {
        for remaining in [2, 1, 0] {
            assert_eq!(self.one(entries).await, (OK, remaining), "{entries:?}");
        }
        assert_eq!(
            self.one(entries).await.0,
            OVER,
            "{entries:?}: its own budget is spent"
        );
    }

    /// The victim's first request finds its budget of 3 whole; then the server stops.
    async fn victim_keeps_its_budget(mut self, entries: &[(&str, &str)]) {
        assert_eq!(
            self.one(entries).await,
            (OK, 2),
            "{entries:?}: the victim's budget is its own"
        );
        self.server.stop().await;
    }
}

/// The 32 hex digits a value hashes to with the default (empty) `TOLLGATE_HASH_KEY`: what an attacker
/// computes, or reads from a key name.
fn digest(value: &str) -> String {
    let mut hex = String::new();
    ValueHasher::default().append_hash(&mut hex, value);
    hex
}

/// A value over 256 bytes enters its key hashed; a short value equal to that hash, bare or with the
/// hash's mark, is another caller.
#[tokio::test]
async fn a_value_cannot_spell_a_long_values_hash() {
    let mut c = Client::start().await;
    let long = format!("/search?q={}", "a".repeat(300));
    let hex = digest(&long);
    c.spend(&[("path", &hex)]).await;
    c.spend(&[("path", &format!("{HASH_MARK}{hex}"))]).await;
    c.victim_keeps_its_budget(&[("path", &long)]).await;
}

/// A limit override's descriptor is keyed with its values as they are (hashed only when long); one
/// equal to a `hash: true` rule's hash of another value does not reach that value's counter.
#[tokio::test]
async fn an_overrides_value_cannot_spell_a_hashed_value() {
    let mut c = Client::start().await;
    let hex = digest("alice@example.com");
    for spelled in [hex.clone(), format!("{HASH_MARK}{hex}")] {
        let mut descriptor: RateLimitDescriptor = wire_descriptor(&[("user", &spelled)]);
        descriptor.limit = wire_override(100, Unit::Hour as i32);
        let request = RateLimitRequest {
            domain: "spell".into(),
            descriptors: vec![descriptor],
            hits_addend: 3,
        };
        assert_eq!(c.ask(request).await, (OK, 97), "{spelled}");
    }
    c.victim_keeps_its_budget(&[("user", "alice@example.com")]).await;
}

/// `k1` = `v_k2_w` in Go's format (a lone fixed window) reads as `k1` = `v`, `k2` = `w` escaped (a rule
/// with two limits): the embedded store and the over-limit cache in front of Redis tell them apart.
#[tokio::test]
async fn a_go_format_value_cannot_spell_an_escaped_key() {
    let mut c = Client::start().await;
    c.spend(&[("k1", "v_k2_w")]).await;
    c.victim_keeps_its_budget(&[("k1", "v"), ("k2", "w")]).await;
}

/// Where no Go replica can share a counter (the embedded store) every key is Tollgate's own, so a
/// lone fixed window's value cannot spell a nested descriptor either. On Redis such a rule keeps
/// envoyproxy/ratelimit's key so that Go replicas share it, and there the two meet, as in the Go
/// service (SECURITY.md, "Keys a value can spell").
#[tokio::test]
async fn on_the_embedded_store_no_value_spells_a_nested_descriptor() {
    let mut c = Client::start().await;
    assert_eq!(
        c.one(&[("route", "/login_remote_address_192.0.2.9")]).await,
        (OK, 0)
    );
    let victim = c
        .one(&[("route", "/login"), ("remote_address", "192.0.2.9")])
        .await;
    if store_under_test_is_redis() {
        assert_eq!(victim.0, OVER, "Go's key, shared as the Go service shares it");
    } else {
        assert_eq!(victim, (OK, 0), "the victim's budget is its own");
    }
    c.server.stop().await;
}
