//! Envoy to Tollgate over TLS and mTLS, configured as an operator would: Envoy's `UpstreamTlsContext`
//! trusts the CA and checks Tollgate's SAN; with mTLS, Envoy presents its own certificate and
//! Tollgate checks it (`GRPC_CLIENT_TLS_CACERT`, `GRPC_CLIENT_TLS_SAN`). A certificate rotated on disk
//! while Envoy keeps sending is served to Envoy's next connections, and no request fails meanwhile.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::certs::{Ca, CertDir, Leaf, tls_channel, write_file};
use crate::harness::bootstrap::{generic_key, rate_limit_filter, route};
use crate::harness::client::Client;
use crate::harness::envoy::Envoy;
use crate::harness::envoy_in_front;
use crate::harness::tollgate::Tollgate;
use crate::require_envoy;

const RULES: &str = r#"
domain: tls
descriptors:
  - key: route
    value: tight
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: route
    value: loose
    rate_limit: {unit: hour, requests_per_unit: 100000}
"#;

/// Envoy's TLS towards Tollgate: trust the CA file `ca`, expect `san`, present `identity` if given.
fn upstream_tls(dir: &std::path::Path, ca: &str, san: &str, identity: Option<&Leaf>) -> Value {
    let mut common = json!({"validation_context": {
        "trusted_ca": {"filename": write_file(dir, "envoy-ca.pem", ca)},
        "match_typed_subject_alt_names": [{"san_type": "DNS", "matcher": {"exact": san}}],
    }});
    if let Some(leaf) = identity {
        common["tls_certificates"] = json!([{
            "certificate_chain": {"filename": write_file(dir, "envoy.crt", &leaf.cert)},
            "private_key": {"filename": write_file(dir, "envoy.key", &leaf.key)},
        }]);
    }
    json!({"transport_socket": {
        "name": "envoy.transport_sockets.tls",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
            "sni": "localhost",
            "common_tls_context": common,
        },
    }})
}

/// An Envoy asking Tollgate over TLS (`tls`, plus any other cluster `settings`) for `(route)`.
async fn envoy(tollgate: &Tollgate, tls: Value) -> (Envoy, Client) {
    let routes = vec![
        route(
            "/tight",
            "app",
            json!([{"actions": [generic_key("route", "tight")]}]),
        ),
        route(
            "/loose",
            "app",
            json!([{"actions": [generic_key("route", "loose")]}]),
        ),
    ];
    let (envoy, client) =
        envoy_in_front(tollgate, vec![rate_limit_filter("tls", json!({}))], routes, tls).await;
    (envoy, client)
}

/// Tollgate serving gRPC over TLS from `certs`, with `extra` settings.
async fn tollgate(certs: &CertDir, extra: &[(&str, &str)]) -> Tollgate {
    let mut env: Vec<(&str, String)> = certs.tls_env().into_iter().collect();
    env.extend(extra.iter().map(|(k, v)| (*k, (*v).to_owned())));
    env.push(("RELOAD_INTERVAL", "100ms".to_owned()));
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    Tollgate::start(&[("tls.yaml", RULES)], &env).await
}

#[tokio::test]
async fn envoy_checks_tollgates_certificate_and_san() {
    require_envoy!();
    let ca = Ca::new("tollgate CA");
    let certs = CertDir::new(&ca.server(&["localhost"]), &ca);
    let tollgate = tollgate(&certs, &[]).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let (trusting, client) = envoy(&tollgate, upstream_tls(dir.path(), &ca.pem(), "localhost", None)).await;
    let statuses = [
        client.get("/tight", &[]).await.status,
        client.get("/tight", &[]).await.status,
        client.get("/tight", &[]).await.status,
    ];
    assert_eq!(statuses, [200, 200, 429]);
    assert!(trusting.stat("cluster.tollgate.ssl.handshake").await >= 1);

    // Another name expected: Envoy refuses the certificate, so no answer, and failure_mode_deny.
    let (wary, client) = envoy(
        &tollgate,
        upstream_tls(dir.path(), &ca.pem(), "ratelimit.test", None),
    )
    .await;
    assert_eq!(client.get("/loose", &[]).await.status, 500);
    assert!(wary.stat("cluster.tollgate.ssl.fail_verify_san").await >= 1);
    assert_eq!(wary.stat("cluster.tollgate.ssl.handshake").await, 0);
}

#[tokio::test]
async fn with_mtls_tollgate_serves_envoys_certificate_and_refuses_others() {
    require_envoy!();
    let ca = Ca::new("mesh CA");
    let certs = CertDir::new(&ca.server(&["localhost"]), &ca);
    let client_ca = certs.path_str("ca.crt");
    let tollgate = tollgate(
        &certs,
        &[
            ("GRPC_CLIENT_TLS_CACERT", &client_ca),
            ("GRPC_CLIENT_TLS_SAN", "envoy.test"),
        ],
    )
    .await;
    let dir = tempfile::tempdir().expect("tempdir");
    let trusted = |identity: Option<&Leaf>| upstream_tls(dir.path(), &ca.pem(), "localhost", identity);

    let (_envoy, client) = envoy(&tollgate, trusted(Some(&ca.client(&["envoy.test"])))).await;
    assert_eq!(client.get("/loose", &[]).await.status, 200);
    // No certificate, and a certificate naming someone else: refused by Tollgate, 500 from Envoy.
    let (_bare, client) = envoy(&tollgate, trusted(None)).await;
    assert_eq!(client.get("/loose", &[]).await.status, 500);
    let (_intruder, client) = envoy(&tollgate, trusted(Some(&ca.client(&["intruder.test"])))).await;
    assert_eq!(client.get("/loose", &[]).await.status, 500);
    assert!(
        tollgate
            .metric("tollgate_grpc_tls_handshake_failures_total")
            .await
            >= 2
    );
}

#[tokio::test]
async fn a_certificate_rotated_on_disk_serves_envoys_next_connections_without_a_failed_request() {
    require_envoy!();
    // A CA rotation: Envoy trusts both CAs; Tollgate moves from the old CA's certificate to the new's.
    let (old_ca, new_ca) = (Ca::new("old CA"), Ca::new("new CA"));
    let certs = CertDir::new(&old_ca.server(&["localhost"]), &old_ca);
    let tollgate = tollgate(&certs, &[]).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut tls = upstream_tls(
        dir.path(),
        &format!("{}{}", old_ca.pem(), new_ca.pem()),
        "localhost",
        None,
    );
    // Each connection carries at most 5 calls, so Envoy keeps opening new ones.
    tls["typed_extension_protocol_options"] = json!({"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
        "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
        "common_http_protocol_options": {"max_requests_per_connection": 5},
        "explicit_http_config": {"http2_protocol_options": {}},
    }});
    let (envoy, client) = envoy(&tollgate, tls).await;
    let mut sent = 0;
    for _ in 0..20 {
        assert_eq!(client.get("/loose", &[]).await.status, 200);
        sent += 1;
    }
    certs.write(&new_ca.server(&["localhost"]), &old_ca);
    // Requests go on through the rotation, until Tollgate serves the new certificate only.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        assert_eq!(client.get("/loose", &[]).await.status, 200);
        sent += 1;
        let new_served = tls_channel(tollgate.grpc(), &new_ca, None).await.is_ok();
        let old_served = tls_channel(tollgate.grpc(), &old_ca, None).await.is_ok();
        if new_served && !old_served {
            break;
        }
        assert!(Instant::now() < deadline, "the new certificate was never served");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let handshakes = envoy.stat("cluster.tollgate.ssl.handshake").await;
    for _ in 0..20 {
        assert_eq!(client.get("/loose", &[]).await.status, 200);
        sent += 1;
    }
    // Envoy connected again since, and every one of those handshakes was with the new certificate.
    assert!(envoy.stat("cluster.tollgate.ssl.handshake").await >= handshakes + 3);
    assert_eq!(envoy.stat("cluster.tollgate.ssl.connection_error").await, 0);
    assert_eq!(envoy.wait_stat("cluster.app.ratelimit.ok", sent).await, sent);
    assert_eq!(envoy.stat("cluster.app.ratelimit.error").await, 0);
}
