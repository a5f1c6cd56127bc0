//! Envoy Gateway's shape, end to end: one control plane (the test's) renders each HTTPRoute's
//! BackendTrafficPolicy with global limits into what Envoy Gateway renders from it, the listener with
//! the rate limit filter, the route's `rate_limits` in the filter's per-route configuration, the
//! `ratelimit_cluster` (DNS, HTTP/2, TLS with Envoy's certificate), for Envoy; and the
//! `RateLimitConfig` of the listener's domain, pushed over gRPC xDS (ADS, mTLS) to Tollgate, which runs
//! as Envoy Gateway runs its rate limit container (`/bin/ratelimit`, its environment, its Secret).
//!
//! Envoy takes its resources from files (`path_config_source`: LDS, RDS, CDS), rewritten by rename, not
//! over gRPC: Envoy's own xDS messages (Listener, RouteConfiguration, Cluster and what they hold) are not
//! among the protos this repository carries, and hand-written copies would be read by Envoy with any
//! field we numbered wrong silently ignored, while Envoy checks a file's every field by name. The
//! rendered resources are the same either way; what Envoy Gateway adds, the gRPC transport to Envoy,
//! is Envoy's code, not Tollgate's. Tollgate's side is the real thing: gRPC ADS with ACKs.
//!
//! The policies: an exact header match, distinct header values, a source CIDR (shared, and distinct
//! per address), an inverted header match, a request cost; then a new route and its policy, pushed to
//! both sides while Envoy keeps running.

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tollgate::proto::rls_config::{RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit};

use crate::common::ads::{self, AdsServer};
use crate::common::certs::{Ca, CertDir, write_file};
use crate::common::envoy_gateway::{envoy_gateway_env, ratelimit_command};
use crate::common::process::Served;
use crate::harness::bootstrap::{RATE_LIMIT, RATE_LIMIT_PER_ROUTE, http_listener};
use crate::harness::client::Client;
use crate::harness::envoy::Envoy;
use crate::require_envoy;

/// The Gateway's listener, named as Envoy Gateway names it; also the rate limit domain.
const LISTENER: &str = "default/eg/http";
/// The backend every route sends to.
const BACKEND: &str = "httproute/default/backend/rule/0";

/// One HTTPRoute with one global rule, as Envoy Gateway translates it: the actions after the route's
/// own generic key, the descriptors below the route's in the rules, and the limit (per hour).
struct Policy {
    route: &'static str,
    path: &'static str,
    actions: Vec<Value>,
    /// Envoy Gateway's request cost: the route's `hits_addend`.
    cost: Option<u32>,
    descriptors: Vec<(&'static str, &'static str)>,
    per_hour: u32,
}

fn header_match(header: &str, value: &str, expect_match: bool) -> Value {
    json!({"header_value_match": {
        "descriptor_key": "rule-0-match-0",
        "descriptor_value": "rule-0-match-0",
        "expect_match": expect_match,
        "headers": [{"name": header, "string_match": {"exact": value}}],
    }})
}

fn cidr_match(key: &str, value: &str, prefix: &str, len: u32) -> Value {
    json!({"remote_address_match": {
        "descriptor_key": key,
        "descriptor_value": value,
        "address_matcher": {"ranges": [{"address_prefix": prefix, "prefix_len": len}]},
    }})
}

/// The policies of the first version.
fn policies() -> Vec<Policy> {
    vec![
        Policy {
            route: "httproute/default/exact/rule/0/match/0/*",
            path: "/exact",
            actions: vec![header_match("x-user-id", "one", true)],
            cost: None,
            descriptors: vec![("rule-0-match-0", "rule-0-match-0")],
            per_hour: 3,
        },
        Policy {
            route: "httproute/default/distinct/rule/0/match/0/*",
            path: "/distinct",
            actions: vec![
                json!({"request_headers": {"header_name": "x-user-id", "descriptor_key": "rule-0-match-0"}}),
            ],
            cost: None,
            descriptors: vec![("rule-0-match-0", "")],
            per_hour: 2,
        },
        Policy {
            route: "httproute/default/cidr/rule/0/match/0/*",
            path: "/cidr",
            actions: vec![cidr_match(
                "masked_remote_address",
                "127.0.0.8/29",
                "127.0.0.8",
                29,
            )],
            cost: None,
            descriptors: vec![("masked_remote_address", "127.0.0.8/29")],
            per_hour: 2,
        },
        Policy {
            route: "httproute/default/per-address/rule/0/match/0/*",
            path: "/per-address",
            actions: vec![
                cidr_match("masked_remote_address", "127.0.0.16/29", "127.0.0.16", 29),
                cidr_match(
                    "remote_address",
                    "%DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT%",
                    "127.0.0.16",
                    29,
                ),
            ],
            cost: None,
            descriptors: vec![("masked_remote_address", "127.0.0.16/29"), ("remote_address", "")],
            per_hour: 1,
        },
        Policy {
            route: "httproute/default/invert/rule/0/match/0/*",
            path: "/invert",
            actions: vec![header_match("x-org-id", "admin", false)],
            cost: None,
            descriptors: vec![("rule-0-match-0", "rule-0-match-0")],
            per_hour: 2,
        },
        Policy {
            route: "httproute/default/cost/rule/0/match/0/*",
            path: "/cost",
            actions: vec![json!({"generic_key": {
                "descriptor_key": "rule-0-match--1", "descriptor_value": "rule-0-match--1"}})],
            cost: Some(3),
            descriptors: vec![("rule-0-match--1", "rule-0-match--1")],
            per_hour: 10,
        },
    ]
}

/// The route Envoy Gateway renders for a policy: the backend, and the rate limits in the filter's
/// per-route configuration, beginning with the route's own generic key.
fn envoy_route(policy: &Policy) -> Value {
    let mut actions =
        vec![json!({"generic_key": {"descriptor_key": policy.route, "descriptor_value": policy.route}})];
    actions.extend(policy.actions.iter().cloned());
    let mut rate_limit = json!({"actions": actions});
    if let Some(cost) = policy.cost {
        rate_limit["hits_addend"] = json!({"number": cost});
    }
    json!({
        "name": policy.route,
        "match": {"prefix": policy.path},
        "route": {"cluster": BACKEND},
        "typed_per_filter_config": {"envoy.filters.http.ratelimit": {
            "@type": RATE_LIMIT_PER_ROUTE,
            "domain": LISTENER,
            "rate_limits": [rate_limit],
        }},
    })
}

/// The listener's rules as Envoy Gateway's translator builds them: per policy, a chain from the route's
/// descriptor down, the limit on its last link.
fn rate_limit_config(policies: &[Policy]) -> RateLimitConfig {
    let descriptors = policies
        .iter()
        .map(|policy| {
            let mut chain: Vec<(&str, &str)> = vec![(policy.route, policy.route)];
            chain.extend(policy.descriptors.iter().copied());
            let mut link = RateLimitDescriptor::default();
            for (at, (key, value)) in chain.iter().enumerate().rev() {
                let below = std::mem::take(&mut link);
                link = RateLimitDescriptor {
                    key: (*key).to_owned(),
                    value: (*value).to_owned(),
                    ..Default::default()
                };
                if at + 1 == chain.len() {
                    link.rate_limit = Some(RateLimitPolicy {
                        unit: RateLimitUnit::Hour as i32,
                        requests_per_unit: policy.per_hour,
                        ..Default::default()
                    });
                } else {
                    link.descriptors = vec![below];
                }
            }
            link
        })
        .collect();
    RateLimitConfig {
        name: LISTENER.into(),
        domain: LISTENER.into(),
        descriptors,
    }
}

/// The test's control plane: Envoy's resources as files in `dir`, Tollgate's rules over ADS.
struct ControlPlane {
    dir: tempfile::TempDir,
    ads: AdsServer,
}

impl ControlPlane {
    /// Writes one resource file as Envoy reads it (a DiscoveryResponse), by rename.
    fn write(&self, name: &str, version: &str, type_url: &str, resources: Vec<Value>) {
        let resources: Vec<Value> = resources
            .into_iter()
            .map(|mut r| {
                r["@type"] = json!(format!("type.googleapis.com/{type_url}"));
                r
            })
            .collect();
        let text = json!({"version_info": version, "resources": resources}).to_string();
        let staged = self.dir.path().join(format!(".{name}.new"));
        std::fs::write(&staged, text).expect("write resources");
        std::fs::rename(&staged, self.dir.path().join(name)).expect("rename resources");
    }

    /// Publishes `version`: the rules to Tollgate first (and its ACK awaited), so that no route
    /// reaches Envoy before its limits reach Tollgate; then the routes to Envoy.
    async fn publish(&self, version: &str, policies: &[Policy]) {
        self.ads.push(version, &[rate_limit_config(policies)]);
        self.ads.ack(version).await;
        let routes: Vec<Value> = policies.iter().map(envoy_route).collect();
        let route_config = json!({
            "name": LISTENER,
            "ignore_port_in_host_matching": true,
            "virtual_hosts": [{"name": format!("{LISTENER}/*"), "domains": ["*"], "routes": routes}],
        });
        self.write(
            "rds.json",
            version,
            "envoy.config.route.v3.RouteConfiguration",
            vec![route_config],
        );
    }

    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).to_string_lossy().into_owned()
    }
}

/// The listener Envoy Gateway renders for the Gateway: its routes over RDS, the rate limit filter of
/// its domain (Envoy Gateway's defaults, the timeout an EnvoyGateway's `rateLimit.timeout` would set).
fn listener(plane: &ControlPlane) -> Value {
    let filter = json!({"name": "envoy.filters.http.ratelimit", "typed_config": {
        "@type": RATE_LIMIT,
        "domain": LISTENER,
        "timeout": "5s",
        "disable_x_envoy_ratelimited_header": true,
        "enable_x_ratelimit_headers": "DRAFT_VERSION_03",
        "rate_limit_service": {
            "grpc_service": {"envoy_grpc": {"cluster_name": "ratelimit_cluster"}},
            "transport_api_version": "V3",
        },
    }});
    let mut listener = http_listener(
        LISTENER,
        json!({"socket_address": {"address": "127.0.0.1", "port_value": 0}}),
        vec![filter],
        Value::Null,
    );
    let hcm = &mut listener["filter_chains"][0]["filters"][0]["typed_config"];
    hcm.as_object_mut().expect("HCM").remove("route_config");
    hcm["rds"] = json!({
        "config_source": {"path_config_source": {"path": plane.path("rds.json")}, "resource_api_version": "V3"},
        "route_config_name": LISTENER,
    });
    hcm["use_remote_address"] = json!(true);
    hcm["stat_prefix"] = json!("http-10080");
    listener
}

/// The clusters: the backend, and `ratelimit_cluster` as Envoy Gateway renders it (DNS resolution of
/// the Service's name, here `localhost`; HTTP/2; TLS trusting Envoy Gateway's CA, presenting Envoy's
/// certificate).
fn clusters(plane: &ControlPlane, grpc_port: u16, certs: &Path) -> Vec<Value> {
    let s = |p: &Path, name: &str| p.join(name).to_string_lossy().into_owned();
    vec![
        json!({
            "name": BACKEND,
            "type": "STATIC",
            "connect_timeout": "10s",
            "load_assignment": {"cluster_name": BACKEND, "endpoints": [{"lb_endpoints": [
                {"endpoint": {"address": {"pipe": {"path": plane.path("backend.sock")}}}}]}]},
        }),
        json!({
            "name": "ratelimit_cluster",
            "connect_timeout": "10s",
            "cluster_type": {"name": "envoy.cluster.dns", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.clusters.dns.v3.DnsCluster",
                "dns_lookup_family": "V4_ONLY",
            }},
            "load_assignment": {"cluster_name": "ratelimit_cluster", "endpoints": [{"lb_endpoints": [
                {"endpoint": {"address": {"socket_address": {"address": "localhost", "port_value": grpc_port}}}}]}]},
            "load_balancing_policy": {"policies": [{"typed_extension_config": {
                "name": "envoy.load_balancing_policies.least_request",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.load_balancing_policies.least_request.v3.LeastRequest",
                },
            }}]},
            "transport_socket": {"name": "envoy.transport_sockets.tls", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
                "common_tls_context": {
                    "tls_certificates": [{
                        "certificate_chain": {"filename": s(certs, "envoy.crt")},
                        "private_key": {"filename": s(certs, "envoy.key")},
                    }],
                    "validation_context": {"trusted_ca": {"filename": s(certs, "ca.crt")}},
                },
            }},
            "typed_extension_protocol_options": {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": {"http2_protocol_options": {}},
            }},
        }),
    ]
}

/// Requests `path` from 127.0.0.`from` with `headers` `n` times; the statuses.
async fn statuses(envoy: SocketAddr, from: u8, path: &str, headers: &[(&str, &str)], n: usize) -> Vec<u16> {
    Client::from_address(envoy, IpAddr::from([127, 0, 0, from]))
        .statuses(path, headers, n)
        .await
}

#[tokio::test]
async fn envoy_gateways_rendered_policies_are_enforced_and_updated_over_xds() {
    require_envoy!();
    // One CA signs every component, as Envoy Gateway's certgen does.
    let ca = Ca::new("envoy-gateway");
    let certs = CertDir::new(&ca.peer(&["localhost", "envoy-ratelimit"]), &ca);
    let envoy_leaf = ca.client(&["envoy"]);
    write_file(certs.dir.path(), "envoy.crt", &envoy_leaf.cert);
    write_file(certs.dir.path(), "envoy.key", &envoy_leaf.key);
    let xds_cert = ca.server(&["127.0.0.1", "envoy-gateway"]);
    let ads = AdsServer::start_at(
        "127.0.0.1:0".parse().expect("addr"),
        Default::default(),
        Some(ads::tls(&xds_cert.cert, &xds_cert.key, Some(&ca.pem()))),
    )
    .await;
    let bin = tempfile::tempdir().expect("tempdir");
    let env = envoy_gateway_env(&certs, &ads.addr.to_string(), true);
    let tollgate = Served::start_command(ratelimit_command(bin.path(), &env)).await;
    let plane = ControlPlane {
        dir: tempfile::tempdir().expect("tempdir"),
        ads,
    };
    plane.publish("1", &policies()).await;
    plane.write(
        "lds.json",
        "1",
        "envoy.config.listener.v3.Listener",
        vec![listener(&plane)],
    );
    let clusters = clusters(&plane, tollgate.grpc.port(), certs.dir.path());
    plane.write("cds.json", "1", "envoy.config.cluster.v3.Cluster", clusters);
    let backend = http_listener(
        "backend",
        json!({"pipe": {"path": plane.path("backend.sock")}}),
        Vec::new(),
        json!({"virtual_hosts": [{"name": "backend", "domains": ["*"], "routes": [{
            "match": {"prefix": "/"},
            "direct_response": {"status": 200, "body": {"inline_string": "backend\n"}},
        }]}]}),
    );
    let envoy = Envoy::start(&json!({
        "node": {"id": "envoy-default-eg", "cluster": "envoy-default-eg"},
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}}},
        "dynamic_resources": {
            "lds_config": {"path_config_source": {"path": plane.path("lds.json")}, "resource_api_version": "V3"},
            "cds_config": {"path_config_source": {"path": plane.path("cds.json")}, "resource_api_version": "V3"},
        },
        "static_resources": {"listeners": [backend]},
    }))
    .await;
    let gateway = envoy.listener(LISTENER).await;
    let (mut ok, mut refused) = (0, 0);
    let mut tally = |statuses: &[u16]| {
        ok += statuses.iter().filter(|s| **s == 200).count() as u64;
        refused += statuses.iter().filter(|s| **s == 429).count() as u64;
    };

    // Header match: x-user-id "one" has 3 an hour; any other value is not limited (and not asked).
    let one = statuses(gateway, 1, "/exact", &[("x-user-id", "one")], 4).await;
    assert_eq!(one, [200, 200, 200, 429]);
    tally(&one);
    assert_eq!(
        statuses(gateway, 1, "/exact", &[("x-user-id", "two")], 4).await,
        [200; 4]
    );
    // Distinct header values: 2 an hour each.
    let alice = statuses(gateway, 1, "/distinct", &[("x-user-id", "alice")], 3).await;
    assert_eq!(alice, [200, 200, 429]);
    tally(&alice);
    let bob = statuses(gateway, 1, "/distinct", &[("x-user-id", "bob")], 1).await;
    assert_eq!(bob, [200]);
    tally(&bob);
    // Source CIDR 127.0.0.8/29: 2 an hour for the whole range, whatever address in it asks.
    let range = [
        statuses(gateway, 9, "/cidr", &[], 1).await[0],
        statuses(gateway, 10, "/cidr", &[], 1).await[0],
        statuses(gateway, 11, "/cidr", &[], 1).await[0],
    ];
    assert_eq!(range, [200, 200, 429]);
    tally(&range);
    assert_eq!(
        statuses(gateway, 20, "/cidr", &[], 3).await,
        [200; 3],
        "outside the range"
    );
    // Source CIDR 127.0.0.16/29, distinct: 1 an hour per address.
    for from in [17, 18] {
        let per_address = statuses(gateway, from, "/per-address", &[], 2).await;
        assert_eq!(per_address, [200, 429]);
        tally(&per_address);
    }
    // Inverted header match: anyone but x-org-id "admin" (no header included) shares 2 an hour.
    assert_eq!(
        statuses(gateway, 1, "/invert", &[("x-org-id", "admin")], 3).await,
        [200; 3]
    );
    let others = [
        statuses(gateway, 1, "/invert", &[("x-org-id", "guest")], 1).await[0],
        statuses(gateway, 1, "/invert", &[], 1).await[0],
        statuses(gateway, 1, "/invert", &[("x-org-id", "guest")], 1).await[0],
    ];
    assert_eq!(others, [200, 200, 429]);
    tally(&others);
    // Request cost 3 against 10 an hour: three pass.
    let costly = statuses(gateway, 1, "/cost", &[], 4).await;
    assert_eq!(costly, [200, 200, 200, 429]);
    tally(&costly);

    // A new HTTPRoute and its policy: the rules reach Tollgate, then the route reaches Envoy, which
    // keeps serving meanwhile.
    assert_eq!(statuses(gateway, 1, "/added", &[], 1).await, [404]);
    let mut second = policies();
    second.push(Policy {
        route: "httproute/default/added/rule/0/match/0/*",
        path: "/added",
        actions: vec![json!({"generic_key": {
            "descriptor_key": "rule-0-match--1", "descriptor_value": "rule-0-match--1"}})],
        cost: None,
        descriptors: vec![("rule-0-match--1", "rule-0-match--1")],
        per_hour: 1,
    });
    plane.publish("2", &second).await;
    let deadline = Instant::now() + Duration::from_secs(15);
    let client = Client::new(gateway);
    let first = loop {
        let status = client.get("/added", &[]).await.status;
        if status != 404 {
            break status;
        }
        assert!(Instant::now() < deadline, "Envoy never loaded the new route");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let added = [first, client.get("/added", &[]).await.status];
    assert_eq!(added, [200, 429]);
    tally(&added);
    // The limits of the first version still count where they were.
    assert_eq!(
        statuses(gateway, 1, "/exact", &[("x-user-id", "one")], 1).await,
        [429]
    );
    tally(&[429]);

    // Envoy counted what Tollgate answered; Envoy Gateway turns off x-envoy-ratelimited.
    let stat = |name: &str| format!("cluster.{BACKEND}.ratelimit.{name}");
    assert_eq!(envoy.wait_stat(&stat("ok"), ok).await, ok);
    assert_eq!(envoy.stat(&stat("over_limit")).await, refused);
    assert_eq!(envoy.stat(&stat("error")).await, 0);
    let reply = client.get("/added", &[]).await;
    assert_eq!((reply.status, reply.header("x-envoy-ratelimited")), (429, None));
    drop(tollgate);
}
