//! What Envoy puts into a request beyond the entries, and what it does with an answer beyond the
//! code: a route's `hits_addend` (a number, or read from the request), a limit override taken from
//! dynamic metadata, `rate_limited_as_resource_exhausted` for a gRPC upstream (Tollgate's own health
//! service, reached through Envoy), and the `response_headers_to_add` of `LIMIT_RESPONSE_HEADERS_ENABLED`.

use serde_json::json;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

use crate::harness::bootstrap::{TOLLGATE, generic_key, per_filter_route, rate_limit_filter, route};
use crate::harness::client::Client;
use crate::harness::envoy::Envoy;
use crate::harness::envoy_in_front;
use crate::harness::tollgate::Tollgate;
use crate::require_envoy;

const RULES: &str = r#"
domain: desc
descriptors:
  - key: cost
    value: fixed
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: cost
    value: priced
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: plan
    value: pro
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: method
    value: health
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: page
    value: headers
    rate_limit: {unit: minute, requests_per_unit: 3}
"#;

/// Tollgate with [`RULES`] and `env`, and an Envoy with `settings` on its rate limit filter and every
/// route of this module.
async fn start(env: &[(&str, &str)], settings: serde_json::Value) -> (Tollgate, Envoy, Client) {
    let tollgate = Tollgate::start(&[("desc.yaml", RULES)], env).await;
    let routes = vec![
        per_filter_route(
            "/fixed",
            "app",
            json!([{"actions": [generic_key("cost", "fixed")], "hits_addend": {"number": 3}}]),
        ),
        per_filter_route(
            "/priced",
            "app",
            json!([{"actions": [generic_key("cost", "priced")], "hits_addend": {"format": "%REQ(x-cost)%"}}]),
        ),
        // A limit for this request from dynamic metadata (set here by the set_metadata filter; in
        // production by an authentication filter, say), instead of the rule's 100 a minute.
        route(
            "/pro",
            "app",
            json!([{
                "actions": [generic_key("plan", "pro")],
                "limit": {"dynamic_metadata": {"metadata_key": {"key": "test.plan", "path": [{"key": "limit"}]}}},
            }]),
        ),
        route(
            "/grpc.health.v1.Health/",
            TOLLGATE,
            json!([{"actions": [generic_key("method", "health")]}]),
        ),
        route(
            "/headers",
            "app",
            json!([{"actions": [generic_key("page", "headers")]}]),
        ),
    ];
    let set_metadata = json!({
        "name": "envoy.filters.http.set_metadata",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.set_metadata.v3.Config",
            "metadata": [{"metadata_namespace": "test.plan",
                          "value": {"limit": {"requests_per_unit": 2, "unit": "MINUTE"}}}],
        },
    });
    let filters = vec![set_metadata, rate_limit_filter("desc", settings)];
    let (envoy, client) = envoy_in_front(&tollgate, filters, routes, json!({})).await;
    (tollgate, envoy, client)
}

#[tokio::test]
async fn a_routes_hits_addend_is_what_the_request_costs() {
    require_envoy!();
    let (tollgate, _envoy, client) = start(&[], json!({})).await;
    // 3 a request against 10: three pass (9), the fourth would make 12.
    let mut statuses = Vec::new();
    for _ in 0..4 {
        let reply = client.get("/fixed", &[]).await;
        statuses.push((
            reply.status,
            reply.header("x-ratelimit-remaining").map(str::to_owned),
        ));
    }
    let remaining = |n: &str| Some(n.to_owned());
    assert_eq!(
        statuses,
        [
            (200, remaining("7")),
            (200, remaining("4")),
            (200, remaining("1")),
            (429, remaining("0"))
        ]
    );
    // The cost read from the request: 6 passes, 5 is more than the 4 left; and since a fixed window
    // counts refused hits too, as the Go service's does, not even 1 passes after that.
    assert_eq!(client.get("/priced", &[("x-cost", "6")]).await.status, 200);
    assert_eq!(client.get("/priced", &[("x-cost", "5")]).await.status, 429);
    assert_eq!(client.get("/priced", &[("x-cost", "1")]).await.status, 429);
    // The Go service's stats count hits, not requests: 12 + 6 + 5 + 1.
    assert_eq!(
        tollgate.metric("ratelimit_service_rate_limit_total_hits").await,
        24
    );
}

#[tokio::test]
async fn a_limit_from_dynamic_metadata_overrides_the_rule() {
    require_envoy!();
    let (_tollgate, _envoy, client) = start(&[], json!({})).await;
    let replies = [
        client.get("/pro", &[]).await,
        client.get("/pro", &[]).await,
        client.get("/pro", &[]).await,
    ];
    let statuses: Vec<u16> = replies.iter().map(|r| r.status).collect();
    assert_eq!(statuses, [200, 200, 429]);
    assert_eq!(
        replies[0].header("x-ratelimit-limit"),
        Some("2, 2;w=60"),
        "{:?}",
        replies[0]
    );
}

#[tokio::test]
async fn a_refused_grpc_call_gets_resource_exhausted_or_unavailable_as_envoy_is_told() {
    require_envoy!();
    for (exhausted, code) in [
        (true, tonic::Code::ResourceExhausted),
        (false, tonic::Code::Unavailable),
    ] {
        let settings = json!({"rate_limited_as_resource_exhausted": exhausted});
        let (_tollgate, envoy, _client) = start(&[], settings).await;
        let ingress = envoy.listener("ingress").await;
        let channel = tonic::transport::Channel::from_shared(format!("http://{ingress}"))
            .expect("uri")
            .connect()
            .await
            .expect("connect to Envoy");
        let mut health = HealthClient::new(channel);
        let ask = || HealthCheckRequest {
            service: "ratelimit".into(),
        };
        // Tollgate's own health service is the upstream: two calls pass through Envoy to it...
        for _ in 0..2 {
            let answer = health
                .check(ask())
                .await
                .expect("served through Envoy")
                .into_inner();
            assert_eq!(
                answer.status,
                tonic_health::pb::health_check_response::ServingStatus::Serving as i32
            );
        }
        // ...the third is refused by Envoy with the code it was told to use.
        let refused = health.check(ask()).await.expect_err("refused");
        assert_eq!(refused.code(), code, "{refused:?}");
    }
}

#[tokio::test]
async fn limit_response_headers_reach_the_client() {
    require_envoy!();
    let settings = json!({"enable_x_ratelimit_headers": "OFF"});
    let (_tollgate, _envoy, client) = start(&[("LIMIT_RESPONSE_HEADERS_ENABLED", "true")], settings).await;
    for remaining in ["2", "1", "0"] {
        let reply = client.get("/headers", &[]).await;
        assert_eq!(reply.status, 200);
        assert_eq!(reply.header("ratelimit-limit"), Some("3"), "{reply:?}");
        assert_eq!(reply.header("ratelimit-remaining"), Some(remaining), "{reply:?}");
        let reset: u64 = reply
            .header("ratelimit-reset")
            .expect("reset")
            .parse()
            .expect("seconds");
        assert!((1..=60).contains(&reset), "{reply:?}");
        assert_eq!(
            reply.header("x-ratelimit-limit"),
            None,
            "Envoy's own headers are off"
        );
    }
    let reply = client.get("/headers", &[]).await;
    assert_eq!(reply.status, 429);
    assert_eq!(reply.header("ratelimit-remaining"), Some("0"), "{reply:?}");
}
