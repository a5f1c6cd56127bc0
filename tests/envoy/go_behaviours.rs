//! What envoyproxy/ratelimit's own integration scripts check with Envoy in front, checked here in our
//! words against Tollgate: a plain request passes, the request after the limit gets 429, a shadow rule
//! counts but never refuses, `replaces` lifts a named limit, quota mode refuses only when every quota is
//! spent, a token quota is debited on the response path (`apply_on_stream_done`), the dynamic metadata
//! of `RESPONSE_DYNAMIC_METADATA` picks the backend that still has quota, and the stats reach a statsd
//! listener. Each test has its own Envoy and its own Tollgate (embedded store), so counts start at 0.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::net::UdpSocket;

use crate::harness::bootstrap::{
    bootstrap, generic_key, per_filter_route, rate_limit_filter, request_header, route, tollgate_cluster,
};
use crate::harness::client::Client;
use crate::harness::envoy::Envoy;
use crate::harness::envoy_in_front;
use crate::harness::tollgate::Tollgate;
use crate::require_envoy;

/// The rules: envoyproxy/ratelimit's example shapes, under our own names.
const RULES: &str = r#"
domain: rl
descriptors:
  - key: foo
    descriptors:
      - key: baz
        value: not-so-shady
        rate_limit: {unit: minute, requests_per_unit: 3}
      - key: baz
        value: shady
        shadow_mode: true
        rate_limit: {unit: minute, requests_per_unit: 3}
      - key: bar
        value: banned
        rate_limit: {name: banned_limit, unit: minute, requests_per_unit: 0}
  - key: source_cluster
    value: proxy
    descriptors:
      - key: destination_cluster
        value: override
        rate_limit:
          unit: minute
          requests_per_unit: 2
          replaces: [{name: banned_limit}]
  - key: service
    value: service_1
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
    metadata: {service_with_quota: {name: service_1}}
  - key: service
    value: service_2
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
    metadata: {service_with_quota: {name: service_2}}
  - key: unspec
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 2}
"#;

/// The routes every test but the multi-service one uses.
fn routes() -> Vec<Value> {
    let foo_baz = json!({"actions": [request_header("foo", "foo"), request_header("baz", "baz")]});
    let foo_bar = json!({"actions": [request_header("foo", "foo"), request_header("bar", "bar")]});
    let clusters = json!({"actions": [
        request_header("source_cluster", "source_cluster"),
        request_header("destination_cluster", "destination_cluster"),
    ]});
    let service = |name: &str| json!({"actions": [generic_key("service", name)]});
    // The token quota: asked with no cost on the way in, debited by one when the response is done.
    let token_quota = per_filter_route(
        "/tokenquota",
        "app",
        json!([
            {"actions": [generic_key("service", "service_2")], "hits_addend": {"number": 0}},
            {"actions": [generic_key("service", "service_2")], "hits_addend": {"number": 1},
             "apply_on_stream_done": true},
        ]),
    );
    vec![
        route("/twoheader", "app", json!([foo_baz, foo_bar])),
        route("/fourheader", "app", json!([foo_baz, foo_bar, clusters])),
        route(
            "/quota",
            "app",
            json!([service("service_1"), service("service_2")]),
        ),
        token_quota,
        route(
            "/unspec",
            "app",
            json!([{"actions": [request_header("unspec", "unspec")]}]),
        ),
    ]
}

/// Tollgate with [`RULES`] and `env`, and an Envoy in front of it with [`routes`].
async fn start(env: &[(&str, &str)]) -> (Tollgate, Envoy, Client) {
    let tollgate = Tollgate::start(&[("rl.yaml", RULES)], env).await;
    let filters = vec![rate_limit_filter("rl", json!({}))];
    let (envoy, client) = envoy_in_front(&tollgate, filters, routes(), json!({})).await;
    (tollgate, envoy, client)
}

#[tokio::test]
async fn a_plain_request_passes_and_the_one_after_the_limit_gets_429() {
    require_envoy!();
    let (mut tollgate, envoy, client) = start(&[("LOG_LEVEL", "debug")]).await;
    let reply = client
        .get("/twoheader", &[("foo", "test"), ("baz", "elsewhere")])
        .await;
    assert_eq!((reply.status, reply.body.as_str()), (200, "upstream\n"));
    let pelle = [("foo", "pelle"), ("baz", "not-so-shady")];
    assert_eq!(
        client.statuses("/twoheader", &pelle, 4).await,
        [200, 200, 200, 429]
    );
    // Another foo has a budget of its own.
    assert_eq!(
        client
            .get("/twoheader", &[("foo", "olle"), ("baz", "not-so-shady")])
            .await
            .status,
        200
    );

    // Envoy's own counts of Tollgate's answers are Tollgate's.
    assert_eq!(envoy.wait_stat("cluster.app.ratelimit.ok", 5).await, 5);
    assert_eq!(envoy.stat("cluster.app.ratelimit.over_limit").await, 1);
    assert_eq!(envoy.stat("cluster.app.ratelimit.error").await, 0);
    assert_eq!(envoy.stat("cluster.app.ratelimit.failure_mode_allowed").await, 0);
    assert_eq!(tollgate.metric("ratelimit_service_total_requests").await, 6);
    assert_eq!(
        tollgate.metric("ratelimit_service_rate_limit_over_limit").await,
        1
    );
    assert_eq!(
        tollgate.metric("ratelimit_service_rate_limit_within_limit").await,
        4
    );

    // The debug log says why the fourth was refused, and holds no HTTP/2 frames.
    let deadline = Instant::now() + Duration::from_secs(10);
    let refusal = loop {
        let log = tollgate.log();
        if let Some(line) = log.iter().find(|l| l.contains("verdict=\"over_limit\"")) {
            assert!(log.iter().all(|l| !l.contains("h2::")), "{log:#?}");
            break line.clone();
        }
        assert!(Instant::now() < deadline, "no refusal in the log: {log:#?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    for said in [
        "descriptor=\"foo=pelle, baz=not-so-shady\"",
        "count=3->3/3",
        "store=\"embedded\"",
    ] {
        assert!(refusal.contains(said), "{said} in {refusal}");
    }
}

#[tokio::test]
async fn a_shadow_rule_counts_but_never_refuses() {
    require_envoy!();
    let (tollgate, _envoy, client) = start(&[]).await;
    let shady = [("foo", "pelle"), ("baz", "shady")];
    assert_eq!(client.statuses("/twoheader", &shady, 5).await, [200; 5]);
    // Past its limit, the answer still says how much is left: nothing.
    let reply = client.get("/twoheader", &shady).await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.header("x-ratelimit-remaining"), Some("0"), "{reply:?}");
    assert_eq!(
        tollgate.metric("ratelimit_service_rate_limit_shadow_mode").await,
        3
    );
}

#[tokio::test]
async fn replaces_lifts_the_named_limit_only_where_the_replacing_rule_matched() {
    require_envoy!();
    let (_tollgate, _envoy, client) = start(&[]).await;
    let banned = [("foo", "bkthomps"), ("bar", "banned")];
    assert_eq!(client.get("/twoheader", &banned).await.status, 429);
    let to = |destination: &'static str| {
        [
            ("foo", "bkthomps"),
            ("bar", "banned"),
            ("source_cluster", "proxy"),
            ("destination_cluster", destination),
        ]
    };
    // No rule for this destination: banned_limit (0 a minute) stands.
    assert_eq!(client.get("/fourheader", &to("mock")).await.status, 429);
    // The override rule replaces banned_limit with its own 2 a minute.
    assert_eq!(
        client.statuses("/fourheader", &to("override"), 3).await,
        [200, 200, 429]
    );
}

#[tokio::test]
async fn quota_mode_refuses_only_when_every_quota_is_spent() {
    require_envoy!();
    let (_tollgate, _envoy, client) = start(&[]).await;
    // service_1 has 1 a minute, service_2 has 2; both are debited on every request.
    assert_eq!(client.statuses("/quota", &[], 3).await, [200, 200, 429]);
}

#[tokio::test]
async fn a_token_quota_is_debited_on_the_response_path() {
    require_envoy!();
    let (tollgate, _envoy, client) = start(&[]).await;
    // 2 a minute, checked at no cost before the request and debited after the response: the third
    // request still finds the count at the limit, not over it; the fourth is refused.
    let mut seen = Vec::new();
    for n in 1..=4 {
        seen.push(client.get("/tokenquota", &[]).await.status);
        // A refused request has no response-path call; an admitted one is followed by one.
        let calls = if n < 4 { 2 * n } else { 2 * n - 1 };
        wait_metric(&tollgate, "ratelimit_service_total_requests", calls).await;
    }
    assert_eq!(seen, [200, 200, 200, 429]);
}

/// Waits until Tollgate's metric reaches `at_least` (Envoy makes its response-path call after it
/// answered the client).
async fn wait_metric(tollgate: &Tollgate, name: &str, at_least: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let value = tollgate.metric(name).await;
        if value >= at_least {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{name} stayed at {value}, below {at_least}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// With `RESPONSE_DYNAMIC_METADATA`, Tollgate returns the `metadata` of every rule that still passed;
/// Envoy copies the first service with quota left into the request and its subset load balancer sends
/// the request there. Both services are asked at no cost before the request; the one that served it is
/// debited after the response.
#[tokio::test]
async fn the_dynamic_metadata_sends_each_request_to_the_service_with_quota_left() {
    require_envoy!();
    let tollgate = Tollgate::start(&[("rl.yaml", RULES)], &[("RESPONSE_DYNAMIC_METADATA", "true")]).await;
    let ask =
        |service: &str| json!({"actions": [generic_key("service", service)], "hits_addend": {"number": 0}});
    let route = per_filter_route(
        "/multiservice",
        "multiservice",
        json!([
            ask("service_1"),
            ask("service_2"),
            // After the response: debit the service that served it, read from the request header
            // the metadata was copied into.
            {"actions": [request_header("x-service-with-quota", "service")],
             "hits_addend": {"number": 1}, "apply_on_stream_done": true},
        ]),
    );
    let filters = vec![
        rate_limit_filter("rl", json!({"failure_mode_deny": false})),
        json!({
            "name": "envoy.filters.http.header_mutation",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutation",
                "mutations": {"request_mutations": [{"append": {
                    "header": {"key": "x-service-with-quota",
                               "value": "%DYNAMIC_METADATA(envoy.filters.http.ratelimit:metadata:service_with_quota:name)%"},
                    "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
                }}]},
            },
        }),
        json!({
            "name": "envoy.filters.http.header_to_metadata",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.header_to_metadata.v3.Config",
                "request_rules": [{"header": "x-service-with-quota", "on_header_present": {
                    "metadata_namespace": "envoy.lb", "key": "service", "type": "STRING"}}],
            },
        }),
    ];
    let endpoint = |service: &str| {
        json!({"endpoint": {"address": {"pipe": {"path": format!("@DIR@/{service}.sock")}}},
               "metadata": {"filter_metadata": {"envoy.lb": {"service": service}}}})
    };
    let multiservice = json!({
        "name": "multiservice",
        "type": "STATIC",
        "connect_timeout": "1s",
        "lb_subset_config": {"fallback_policy": "ANY_ENDPOINT", "subset_selectors": [{"keys": ["service"]}]},
        "load_assignment": {"cluster_name": "multiservice", "endpoints": [{"lb_endpoints": [
            endpoint("service_1"), endpoint("service_2")]}]},
    });
    let envoy = Envoy::start(&bootstrap(
        filters,
        vec![route],
        &[
            ("service_1", "from service 1\n"),
            ("service_2", "from service 2\n"),
        ],
        vec![tollgate_cluster(&[tollgate.grpc()], json!({})), multiservice],
    ))
    .await;
    let client = Client::new(envoy.listener("ingress").await);
    // service_1 serves 1 + 1 (debited after the response, the second still finds it at its limit),
    // then service_2 serves 2 + 1; then neither has quota left.
    let mut served = Vec::new();
    for n in 1..=6 {
        let reply = client.get("/multiservice", &[]).await;
        served.push(if reply.status == 200 {
            reply.body.trim().to_owned()
        } else {
            reply.status.to_string()
        });
        let calls = if reply.status == 200 { 2 * n } else { 2 * n - 1 };
        wait_metric(&tollgate, "ratelimit_service_total_requests", calls).await;
    }
    let expected = [
        "from service 1",
        "from service 1",
        "from service 2",
        "from service 2",
        "from service 2",
        "429",
    ];
    assert_eq!(served, expected);
}

/// The stats reach statsd as the Go service names them, `detailed_metric` ones with the request's value.
#[tokio::test]
async fn the_stats_reach_a_statsd_listener() {
    require_envoy!();
    let statsd = UdpSocket::bind("127.0.0.1:0").await.expect("bind statsd");
    let port = statsd.local_addr().expect("addr").port().to_string();
    let env = [
        ("USE_STATSD", "true"),
        ("STATSD_HOST", "127.0.0.1"),
        ("STATSD_PORT", port.as_str()),
        ("STATSD_PROTOCOL", "udp"),
        ("STATS_FLUSH_INTERVAL", "100ms"),
    ];
    let (_tollgate, _envoy, client) = start(&env).await;
    let pelle = [("foo", "pelle"), ("baz", "not-so-shady")];
    assert_eq!(
        client.statuses("/twoheader", &pelle, 4).await,
        [200, 200, 200, 429]
    );
    let unspecified = [("unspec", "unspecified_value")];
    assert_eq!(client.statuses("/unspec", &unspecified, 3).await, [200, 200, 429]);
    let wanted = [
        (
            "ratelimit.service.rate_limit.rl.foo.baz_not-so-shady.total_hits",
            4,
        ),
        (
            "ratelimit.service.rate_limit.rl.foo.baz_not-so-shady.over_limit",
            1,
        ),
        (
            "ratelimit.service.rate_limit.rl.unspec_unspecified_value.total_hits",
            3,
        ),
        (
            "ratelimit.service.rate_limit.rl.unspec_unspecified_value.over_limit",
            1,
        ),
        ("ratelimit_server.ShouldRateLimit.total_requests", 7),
    ];
    let mut counted = std::collections::BTreeMap::<String, u64>::new();
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut buffer = vec![0; 65_536];
    while !wanted.iter().all(|(name, n)| counted.get(*name) == Some(n)) {
        let left = deadline.saturating_duration_since(Instant::now());
        let Ok(received) = tokio::time::timeout(left, statsd.recv(&mut buffer)).await else {
            panic!("statsd never saw {wanted:?}; it saw {counted:?}");
        };
        let datagram = &buffer[..received.expect("receive")];
        for line in String::from_utf8_lossy(datagram).lines() {
            // `name:value|c`: counters arrive as increases since the last flush.
            if let Some((name, rest)) = line.split_once(':')
                && let Some(value) = rest.strip_suffix("|c")
            {
                *counted.entry(name.to_owned()).or_default() += value.parse::<u64>().expect("a count");
            }
        }
    }
}
