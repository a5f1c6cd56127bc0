//! Istio's shape, as its "Enabling Rate Limits using Envoy" task sets it up on the ingress gateway: an
//! EnvoyFilter inserts the rate limit filter before the router (domain `ratelimit`,
//! `failure_mode_deny`, a 10 s timeout, the service's `outbound|8081||…` cluster) and merges
//! `rate_limits` into the virtual host (the request's `:path` as the `PATH` descriptor), and the rules
//! are the task's ConfigMap: `/productpage` 1 a minute, any other path 100.

use std::net::SocketAddr;

use serde_json::json;

use crate::harness::bootstrap::{RATE_LIMIT, http_listener, request_header, tollgate_cluster};
use crate::harness::client::Client;
use crate::harness::envoy::Envoy;
use crate::harness::tollgate::Tollgate;
use crate::require_envoy;

/// The task's rules, as its ConfigMap holds them.
const RULES: &str = r#"
domain: ratelimit
descriptors:
  - key: PATH
    value: "/productpage"
    rate_limit:
      unit: minute
      requests_per_unit: 1
  - key: PATH
    value: "api"
    rate_limit:
      unit: minute
      requests_per_unit: 2
  - key: PATH
    rate_limit:
      unit: minute
      requests_per_unit: 100
"#;

/// Istio's name for the rate limit Service's cluster (port 8081 of `ratelimit` in `default`).
const CLUSTER: &str = "outbound|8081||ratelimit.default.svc.cluster.local";

/// The ingress gateway's listener after the EnvoyFilter's two patches.
fn gateway(tollgate: SocketAddr) -> serde_json::Value {
    // HTTP_FILTER, INSERT_BEFORE envoy.filters.http.router.
    let filter = json!({"name": "envoy.filters.http.ratelimit", "typed_config": {
        "@type": RATE_LIMIT,
        "domain": "ratelimit",
        "failure_mode_deny": true,
        "timeout": "10s",
        "rate_limit_service": {
            "grpc_service": {"envoy_grpc": {
                "cluster_name": CLUSTER,
                "authority": "ratelimit.default.svc.cluster.local",
            }},
            "transport_api_version": "V3",
        },
    }});
    // VIRTUAL_HOST, MERGE: the rate limits on the virtual host, none on the routes.
    let route_config = json!({"name": "http.8080", "virtual_hosts": [{
        "name": "*:80",
        "domains": ["*"],
        "rate_limits": [{"actions": [request_header(":path", "PATH")]}],
        "routes": [{"match": {"prefix": "/"}, "route": {"cluster": "outbound|9080||productpage.default.svc.cluster.local"}}],
    }]});
    let listener = http_listener(
        "0.0.0.0_8080",
        json!({"socket_address": {"address": "127.0.0.1", "port_value": 0}}),
        vec![filter],
        route_config,
    );
    let mut cluster = tollgate_cluster(&[tollgate], json!({}));
    cluster["name"] = json!(CLUSTER);
    cluster["load_assignment"]["cluster_name"] = json!(CLUSTER);
    let productpage = http_listener(
        "productpage",
        json!({"pipe": {"path": "@DIR@/productpage.sock"}}),
        Vec::new(),
        json!({"virtual_hosts": [{"name": "productpage", "domains": ["*"], "routes": [{
            "match": {"prefix": "/"},
            "direct_response": {"status": 200, "body": {"inline_string": "bookinfo\n"}},
        }]}]}),
    );
    json!({
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}}},
        "static_resources": {
            "listeners": [listener, productpage],
            "clusters": [cluster, {
                "name": "outbound|9080||productpage.default.svc.cluster.local",
                "type": "STATIC",
                "connect_timeout": "1s",
                "load_assignment": {"cluster_name": "outbound|9080||productpage.default.svc.cluster.local", "endpoints": [{"lb_endpoints": [
                    {"endpoint": {"address": {"pipe": {"path": "@DIR@/productpage.sock"}}}}]}]},
            }],
        },
    })
}

#[tokio::test]
async fn istios_envoyfilter_shape_limits_by_path() {
    require_envoy!();
    let tollgate = Tollgate::start(&[("config.yaml", RULES)], &[]).await;
    let envoy = Envoy::start(&gateway(tollgate.grpc())).await;
    let client = Client::new(envoy.listener("0.0.0.0_8080").await);
    let productpage = [
        client.get("/productpage", &[]).await.status,
        client.get("/productpage", &[]).await.status,
    ];
    assert_eq!(productpage, [200, 429]);
    // Every other path has 100 a minute of its own.
    for path in ["/reviews/1", "/ratings/1", "/reviews/1"] {
        assert_eq!(client.get(path, &[]).await.status, 200, "{path}");
    }
    let stat =
        |name: &str| format!("cluster.outbound|9080||productpage.default.svc.cluster.local.ratelimit.{name}");
    assert_eq!(envoy.wait_stat(&stat("ok"), 4).await, 4);
    assert_eq!(envoy.stat(&stat("over_limit")).await, 1);
    assert_eq!(tollgate.metric("ratelimit_service_total_requests").await, 5);
}
