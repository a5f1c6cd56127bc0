//! Envoy bootstraps for the tests, as JSON: one HTTP listener (`ingress`) whose filters end with the
//! router, upstream services answered by Envoy itself (`direct_response` listeners on unix sockets in
//! Envoy's directory, so no port is guessed), and Tollgate's cluster over HTTP/2.
//!
//! `@DIR@` in a bootstrap stands for the directory Envoy runs in ([`super::envoy::Envoy::start`]
//! replaces it).

use std::net::SocketAddr;

use serde_json::{Value, json};

/// The HTTP rate limit filter's type.
pub const RATE_LIMIT: &str = "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit";
/// The per-route configuration of the rate limit filter.
pub const RATE_LIMIT_PER_ROUTE: &str =
    "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimitPerRoute";
const HCM: &str =
    "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager";
const ROUTER: &str = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router";
const HTTP_OPTIONS: &str = "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions";

/// The name of the cluster the rate limit filter asks.
pub const TOLLGATE: &str = "tollgate";

/// Envoy's ratelimit filter asking [`TOLLGATE`] for `domain`, with `settings` over the defaults: a
/// generous timeout (a debug build on a busy machine), failure_mode_deny, the X-RateLimit headers.
pub fn rate_limit_filter(domain: &str, settings: Value) -> Value {
    let mut config = json!({
        "@type": RATE_LIMIT,
        "domain": domain,
        "request_type": "external",
        "timeout": "5s",
        "failure_mode_deny": true,
        "enable_x_ratelimit_headers": "DRAFT_VERSION_03",
        "rate_limit_service": {
            "grpc_service": {"envoy_grpc": {"cluster_name": TOLLGATE}},
            "transport_api_version": "V3",
        },
    });
    merge(&mut config, settings);
    json!({"name": "envoy.filters.http.ratelimit", "typed_config": config})
}

/// A route for requests whose path starts with `prefix`, to `cluster`, with these `rate_limits`.
pub fn route(prefix: &str, cluster: &str, rate_limits: Value) -> Value {
    json!({
        "match": {"prefix": prefix},
        "route": {"cluster": cluster, "rate_limits": rate_limits},
    })
}

/// A route for requests whose path starts with `prefix`, to `cluster`, with `rate_limits` in the rate
/// limit filter's per-route configuration. Envoy applies a `hits_addend` only there: on the route's
/// own `rate_limits` ([`route`]) it is accepted and ignored.
pub fn per_filter_route(prefix: &str, cluster: &str, rate_limits: Value) -> Value {
    json!({
        "match": {"prefix": prefix},
        "route": {"cluster": cluster},
        "typed_per_filter_config": {"envoy.filters.http.ratelimit": {
            "@type": RATE_LIMIT_PER_ROUTE,
            "rate_limits": rate_limits,
        }},
    })
}

/// A `request_headers` action: the header's value under `key`.
pub fn request_header(header: &str, key: &str) -> Value {
    json!({"request_headers": {"header_name": header, "descriptor_key": key}})
}

/// A `generic_key` action: a constant entry.
pub fn generic_key(key: &str, value: &str) -> Value {
    json!({"generic_key": {"descriptor_key": key, "descriptor_value": value}})
}

/// Tollgate's cluster: HTTP/2 to `hosts`, with `settings` over that (health checks, TLS).
pub fn tollgate_cluster(hosts: &[SocketAddr], settings: Value) -> Value {
    let endpoints: Vec<Value> = hosts
        .iter()
        .map(|host| {
            json!({"endpoint": {"address": {"socket_address": {
            "address": host.ip().to_string(), "port_value": host.port()}}}})
        })
        .collect();
    let mut cluster = json!({
        "name": TOLLGATE,
        "type": "STATIC",
        "connect_timeout": "1s",
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": HTTP_OPTIONS,
                "explicit_http_config": {"http2_protocol_options": {}},
            },
        },
        "load_assignment": {"cluster_name": TOLLGATE, "endpoints": [{"lb_endpoints": endpoints}]},
    });
    merge(&mut cluster, settings);
    cluster
}

/// Envoy's gRPC health check of Tollgate's readiness (`ratelimit`), every `interval`, also when the
/// cluster has had no traffic yet; one failure marks a host unhealthy, one success healthy again.
pub fn health_check(interval: &str) -> Value {
    json!({"health_checks": [{
        "timeout": "1s",
        "interval": interval,
        "no_traffic_interval": interval,
        "unhealthy_threshold": 1,
        "healthy_threshold": 1,
        "grpc_health_check": {"service_name": "ratelimit"},
    }]})
}

/// A bootstrap: the `ingress` HTTP listener with `filters` (the router appended) and `routes`,
/// `services` answered by Envoy itself (name → body: a listener on `@DIR@/NAME.sock` and a cluster
/// NAME to it), and `clusters`.
pub fn bootstrap(
    filters: Vec<Value>,
    routes: Vec<Value>,
    services: &[(&str, &str)],
    clusters: Vec<Value>,
) -> Value {
    let mut listeners = vec![http_listener(
        "ingress",
        json!({"socket_address": {"address": "127.0.0.1", "port_value": 0}}),
        filters,
        json!({"virtual_hosts": [{"name": "all", "domains": ["*"], "routes": routes}]}),
    )];
    let mut clusters = clusters;
    for (name, body) in services {
        let path = format!("@DIR@/{name}.sock");
        listeners.push(http_listener(
            name,
            json!({"pipe": {"path": path}}),
            Vec::new(),
            json!({"virtual_hosts": [{"name": name, "domains": ["*"], "routes": [{
                "match": {"prefix": "/"},
                "direct_response": {"status": 200, "body": {"inline_string": body}},
            }]}]}),
        ));
        clusters.push(json!({
            "name": name,
            "type": "STATIC",
            "connect_timeout": "1s",
            "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [
                {"endpoint": {"address": {"pipe": {"path": path}}}}]}]},
        }));
    }
    json!({
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}}},
        "static_resources": {"listeners": listeners, "clusters": clusters},
    })
}

/// An HTTP listener at `address` with `filters` (the router appended) and `route_config`.
pub fn http_listener(name: &str, address: Value, filters: Vec<Value>, route_config: Value) -> Value {
    let mut http_filters = filters;
    http_filters.push(json!({"name": "envoy.filters.http.router", "typed_config": {"@type": ROUTER}}));
    json!({
        "name": name,
        "address": address,
        "filter_chains": [{"filters": [{
            "name": "envoy.filters.network.http_connection_manager",
            "typed_config": {
                "@type": HCM,
                "stat_prefix": name,
                "route_config": route_config,
                "http_filters": http_filters,
            },
        }]}],
    })
}

/// Deep-merges `patch` into `base`: objects key by key, anything else replaced.
pub fn merge(base: &mut Value, patch: Value) {
    match (base, patch) {
        (Value::Object(base), Value::Object(patch)) => {
            for (key, value) in patch {
                merge(base.entry(key).or_insert(Value::Null), value);
            }
        }
        (base, patch) => *base = patch,
    }
}
