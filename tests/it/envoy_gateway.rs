//! Tollgate as Envoy Gateway runs envoyproxy/ratelimit: the binary invoked as `ratelimit` with no
//! arguments and exactly the environment Envoy Gateway's infrastructure gives the container (see
//! `docs/envoy-gateway.md`), certificates laid out as its `envoy-rate-limit` Secret mounts them, rules
//! pushed over xDS with mTLS by a test management server, Envoy's side over TLS.
//!
//! Two differences from a pod, both forced by the test machine: the certificates live in a temporary
//! directory instead of `/certs`, and the ports are 0 (free) instead of 8081/8080/6070.

use std::time::Duration;

use tollgate::proto::rls::rate_limit_response::Code;
use tollgate::proto::rls::rate_limit_service_client::RateLimitServiceClient;
use tollgate::proto::rls_config::{RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit};

use crate::common::ads::{self, AdsServer};
use crate::common::certs::{Ca, CertDir, tls_channel};
use crate::common::envoy_gateway::{envoy_gateway_env, ratelimit_command};
use crate::common::process::Served;
use crate::common::{http, wire_request};

fn rules() -> RateLimitConfig {
    RateLimitConfig {
        name: "default/eg/httproute/default/backend/rule/0".into(),
        domain: "default/eg/http".into(),
        descriptors: vec![RateLimitDescriptor {
            key: "httproute/default/backend/rule/0/match/0".into(),
            value: "httproute/default/backend/rule/0/match/0".into(),
            rate_limit: Some(RateLimitPolicy {
                unit: RateLimitUnit::Hour as i32,
                requests_per_unit: 1,
                ..Default::default()
            }),
            ..Default::default()
        }],
    }
}

async fn start(client_ca: bool) -> (Ca, CertDir, AdsServer, Served, tempfile::TempDir) {
    // One CA signs every component, as Envoy Gateway's certgen does.
    let ca = Ca::new("envoy-gateway");
    let certs = CertDir::new(&ca.peer(&["localhost", "envoy-ratelimit"]), &ca);
    let xds_cert = ca.server(&["127.0.0.1", "envoy-gateway"]);
    let tls = ads::tls(&xds_cert.cert, &xds_cert.key, Some(&ca.pem()));
    let xds = AdsServer::start_at(
        "127.0.0.1:0".parse().expect("addr"),
        Default::default(),
        Some(tls),
    )
    .await;
    let bin_dir = tempfile::tempdir().expect("tempdir");
    let env = envoy_gateway_env(&certs, &xds.addr.to_string(), client_ca);
    let served = Served::start_command(ratelimit_command(bin_dir.path(), &env)).await;
    (ca, certs, xds, served, bin_dir)
}

#[tokio::test]
async fn envoy_gateways_container_starts_tollgate_in_xds_and_tls_mode() {
    let (ca, _certs, xds, served, _bin) = start(false).await;
    // FORCE_START_WITHOUT_INITIAL_CONFIG=true: ready at once, before any rules.
    let (status, _) = http(served.http, "GET", "/healthcheck", "").await;
    assert_eq!(status, 200);
    for said in ["ignoring GRPC_SERVER_TLS_CA_CERT", "ignoring RUNTIME_WATCH_ROOT"] {
        assert!(
            served.log.iter().any(|line| line.contains(said)),
            "{said} not in the log:\n{}",
            served.log.join("\n")
        );
    }

    xds.push("1", &[rules()]);
    xds.ack("1").await;
    let envoy = ca.peer(&["envoy"]);
    let channel = tls_channel(served.grpc, &ca, Some(&envoy))
        .await
        .expect("Envoy connects over TLS");
    let mut client = RateLimitServiceClient::new(channel);
    let entry = "httproute/default/backend/rule/0/match/0";
    let mut codes = Vec::new();
    for _ in 0..2 {
        let answer = client
            .should_rate_limit(wire_request("default/eg/http", &[&[(entry, entry)]]))
            .await
            .expect("decided")
            .into_inner();
        codes.push(answer.overall_code);
    }
    assert_eq!(codes, [Code::Ok as i32, Code::OverLimit as i32]);
    let plain = tonic::transport::Channel::from_shared(format!("http://{}", served.grpc))
        .expect("uri")
        .connect()
        .await;
    if let Ok(plain) = plain {
        let answer = RateLimitServiceClient::new(plain)
            .should_rate_limit(wire_request("default/eg/http", &[&[(entry, entry)]]))
            .await;
        assert!(answer.is_err(), "plaintext is refused");
    }
    assert_eq!(served.terminate().await, Some(0));
}

#[tokio::test]
async fn with_the_guides_client_ca_only_envoys_certificate_is_served() {
    let (ca, _certs, xds, served, _bin) = start(true).await;
    xds.push("1", &[rules()]);
    xds.ack("1").await;
    let stranger = Ca::new("stranger");
    let refused = match tls_channel(served.grpc, &ca, Some(&stranger.client(&["envoy"]))).await {
        Ok(channel) => RateLimitServiceClient::new(channel)
            .should_rate_limit(wire_request("default/eg/http", &[&[("k", "v")]]))
            .await
            .is_err(),
        Err(_) => true,
    };
    assert!(refused, "a certificate from another CA is refused");
    let channel = tls_channel(served.grpc, &ca, Some(&ca.peer(&["envoy"])))
        .await
        .expect("Envoy's certificate connects");
    tokio::time::timeout(
        Duration::from_secs(5),
        RateLimitServiceClient::new(channel)
            .should_rate_limit(wire_request("default/eg/http", &[&[("k", "v")]])),
    )
    .await
    .expect("bounded")
    .expect("served");
    assert_eq!(served.terminate().await, Some(0));
}
