//! The gRPC listener's transport as Envoy Gateway uses it: TLS and mTLS (`GRPC_SERVER_USE_TLS`,
//! `GRPC_CLIENT_TLS_CACERT`, `GRPC_CLIENT_TLS_SAN`) with certificates rotated in place, a unix socket
//! (`GRPC_UDS`), and connections aged out (`GRPC_MAX_CONNECTION_AGE`).

use std::time::{Duration, Instant};

use tollgate::proto::rls::rate_limit_response::Code;
use tollgate::proto::rls::rate_limit_service_client::RateLimitServiceClient;
use tonic::transport::{Channel, Endpoint};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;
use tonic_reflection::pb::v1::ServerReflectionRequest;
use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;

use crate::common::certs::{Ca, CertDir, Leaf, borrowed, tls_channel};
use crate::common::{TestServer, http, wire_request};

const RULES: &str =
    "domain: edge\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 100}\n";

/// The SAN the server requires of clients.
const ENVOY_SAN: &str = "envoy.gateway.svc";

/// One decision over `channel`: `Ok` with the overall code, or the call's error.
async fn decide(channel: Channel) -> Result<i32, tonic::Status> {
    let mut client = RateLimitServiceClient::new(channel);
    let answer = client
        .should_rate_limit(wire_request("edge", &[&[("k", "v")]]))
        .await?;
    Ok(answer.into_inner().overall_code)
}

/// Whether a client presenting `identity` and trusting `trust` gets a decision.
async fn served(server: &TestServer, trust: &Ca, identity: Option<&Leaf>) -> bool {
    match tls_channel(server.grpc, trust, identity).await {
        Ok(channel) => decide(channel).await.is_ok(),
        Err(_) => false,
    }
}

async fn start_tls(certs: &CertDir, san: Option<&str>) -> TestServer {
    let mut env = certs.tls_env();
    env.push(("GRPC_CLIENT_TLS_CACERT", certs.path_str("ca.crt")));
    if let Some(san) = san {
        env.push(("GRPC_CLIENT_TLS_SAN", san.to_owned()));
    }
    TestServer::start(&[("edge.yaml", RULES)], &borrowed(&env)).await
}

#[tokio::test]
async fn mtls_serves_the_right_client_and_refuses_every_other() {
    let (server_ca, client_ca, stranger_ca) =
        (Ca::new("server CA"), Ca::new("client CA"), Ca::new("stranger"));
    let certs = CertDir::new(&server_ca.server(&["localhost"]), &client_ca);
    let server = start_tls(&certs, Some(ENVOY_SAN)).await;

    let envoy = client_ca.client(&[ENVOY_SAN]);
    let channel = tls_channel(server.grpc, &server_ca, Some(&envoy))
        .await
        .expect("the right client connects");
    assert_eq!(decide(channel.clone()).await.expect("decided"), Code::Ok as i32);
    // Health shares the listener, and so its TLS.
    let health = HealthClient::new(channel.clone())
        .check(HealthCheckRequest {
            service: "ratelimit".into(),
        })
        .await
        .expect("health over mTLS");
    assert_eq!(health.into_inner().status, 1, "SERVING");
    // And reflection: the services listed over the same mTLS connection.
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let listed = ServerReflectionClient::new(channel.clone())
        .server_reflection_info(tokio_stream::iter(vec![request]))
        .await
        .expect("reflection over mTLS")
        .into_inner()
        .message()
        .await
        .expect("reflection stream")
        .and_then(|r| r.message_response);
    let Some(MessageResponse::ListServicesResponse(services)) = listed else {
        panic!("no service list: {listed:?}");
    };
    let names: Vec<&str> = services.service.iter().map(|s| s.name.as_str()).collect();
    assert!(
        names.contains(&"envoy.service.ratelimit.v3.RateLimitService"),
        "{names:?}"
    );
    assert!(
        !names.iter().any(|n| n.contains("discovery")),
        "the xDS client's protocol is not listed as served: {names:?}"
    );

    let plain = Channel::from_shared(format!("http://{}", server.grpc)).expect("uri");
    let plain = match plain.connect().await {
        Ok(channel) => decide(channel).await.is_ok(),
        Err(_) => false,
    };
    assert!(!plain, "a plaintext client is refused");
    assert!(!served(&server, &server_ca, None).await, "no client certificate");
    assert!(
        !served(&server, &server_ca, Some(&stranger_ca.client(&[ENVOY_SAN]))).await,
        "a certificate from another CA"
    );
    assert!(
        !served(&server, &server_ca, Some(&client_ca.client(&["intruder.svc"]))).await,
        "the right CA but the wrong SAN"
    );
    assert!(
        !served(&server, &stranger_ca, Some(&envoy)).await,
        "the client does not trust a server it cannot verify"
    );

    let (_, metrics) = http(server.debug, "GET", "/metrics", "").await;
    let failures: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("tollgate_grpc_tls_handshake_failures_total "))
        .and_then(|v| v.trim().parse().ok())
        .expect("the handshake failure counter");
    assert!(failures >= 4, "refused handshakes are counted: {failures}");
    server.stop().await;
}

#[tokio::test]
async fn tls_without_client_certificates_serves_any_client() {
    let (server_ca, client_ca) = (Ca::new("server CA"), Ca::new("client CA"));
    let certs = CertDir::new(&server_ca.server(&["localhost"]), &client_ca);
    let server = TestServer::start(&[("edge.yaml", RULES)], &borrowed(&certs.tls_env())).await;
    assert!(served(&server, &server_ca, None).await);
    server.stop().await;
}

#[tokio::test]
async fn a_rotated_certificate_serves_new_connections_and_keeps_established_ones() {
    let (old_ca, new_ca, client_ca) = (Ca::new("old CA"), Ca::new("new CA"), Ca::new("client CA"));
    let certs = CertDir::new(&old_ca.server(&["localhost"]), &client_ca);
    let server = start_tls(&certs, None).await;
    let envoy = client_ca.client(&["envoy"]);
    let established = tls_channel(server.grpc, &old_ca, Some(&envoy))
        .await
        .expect("connects before the rotation");
    decide(established.clone()).await.expect("served before");

    certs.write(&new_ca.server(&["localhost"]), &client_ca);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !served(&server, &new_ca, Some(&envoy)).await {
        assert!(Instant::now() < deadline, "the new certificate was never served");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        !served(&server, &old_ca, Some(&envoy)).await,
        "new connections get the new certificate"
    );
    for _ in 0..3 {
        // A dropped connection would reconnect and fail: the old certificate is no longer served.
        decide(established.clone())
            .await
            .expect("the established connection keeps working");
    }

    // A broken rotation (a key that does not match) keeps the current certificate.
    std::fs::write(certs.path("tls.key"), new_ca.server(&["localhost"]).key).expect("write key");
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(served(&server, &new_ca, Some(&envoy)).await, "still served");
    server.stop().await;
}

#[tokio::test]
async fn grpc_serves_on_a_unix_socket() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("ratelimit.sock");
    // A stale socket file from an earlier run is replaced, as the Go service does.
    drop(std::os::unix::net::UnixListener::bind(&socket).expect("stale socket"));
    let path = socket.to_string_lossy().into_owned();
    let server = TestServer::start(&[("edge.yaml", RULES)], &[("GRPC_UDS", path.as_str())]).await;
    let channel = unix_channel(&socket, None)
        .await
        .expect("connects over the socket");
    assert_eq!(decide(channel).await.expect("decided"), Code::Ok as i32);
    server.stop().await;
    assert!(!socket.exists(), "the socket file is removed at shutdown");
}

/// A channel over the unix socket at `path`, with TLS when `tls` is given.
async fn unix_channel(
    path: &std::path::Path,
    tls: Option<tonic::transport::ClientTlsConfig>,
) -> Result<Channel, tonic::transport::Error> {
    let endpoint = match tls {
        Some(tls) => Endpoint::from_static("https://localhost").tls_config(tls)?,
        None => Endpoint::from_static("http://localhost"),
    };
    let path = path.to_owned();
    endpoint
        .connect_with_connector(tower::service_fn(move |_| {
            let path = path.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
            }
        }))
        .await
}

#[tokio::test]
async fn a_unix_socket_another_server_is_serving_is_not_taken_over() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("busy.sock");
    let _other = tokio::net::UnixListener::bind(&socket).expect("another server");
    let refused = tollgate::grpc::GrpcListener::bind_unix(socket.clone()).expect_err("in use");
    assert_eq!(refused.kind(), std::io::ErrorKind::AddrInUse);
    assert!(socket.exists(), "the other server's socket is left alone");
}

#[tokio::test]
async fn tls_applies_on_a_unix_socket_too() {
    let (ca, client_ca) = (Ca::new("server CA"), Ca::new("client CA"));
    let certs = CertDir::new(&ca.server(&["localhost"]), &client_ca);
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("tls.sock");
    let mut env = certs.tls_env();
    env.push(("GRPC_UDS", socket.to_string_lossy().into_owned()));
    env.push(("GRPC_CLIENT_TLS_CACERT", certs.path_str("ca.crt")));
    let server = TestServer::start(&[("edge.yaml", RULES)], &borrowed(&env)).await;
    let plain = match unix_channel(&socket, None).await {
        Ok(channel) => decide(channel).await.is_ok(),
        Err(_) => false,
    };
    assert!(!plain, "plaintext on the socket is refused");
    let leaf = client_ca.client(&["envoy"]);
    let tls = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(ca.pem()))
        .identity(tonic::transport::Identity::from_pem(&leaf.cert, &leaf.key))
        .domain_name("localhost");
    let channel = unix_channel(&socket, Some(tls))
        .await
        .expect("mTLS over the socket");
    assert_eq!(decide(channel).await.expect("decided"), Code::Ok as i32);
    server.stop().await;
}

#[tokio::test]
async fn connections_get_goaway_at_their_age_and_are_closed_after_the_grace() {
    let env = [
        ("GRPC_MAX_CONNECTION_AGE", "1s"),
        ("GRPC_MAX_CONNECTION_AGE_GRACE", "2s"),
    ];
    let server = TestServer::start(&[("edge.yaml", RULES)], &env).await;

    // An idle connection: GOAWAY at the age, and then it closes at once (nothing in flight), long
    // before age + grace.
    let tcp = tokio::net::TcpStream::connect(server.grpc)
        .await
        .expect("connect");
    let started = Instant::now();
    let (_send, connection) = h2::client::handshake(tcp).await.expect("HTTP/2 handshake");
    tokio::time::timeout(Duration::from_secs(10), connection)
        .await
        .expect("the server ends the connection")
        .expect("a graceful close (GOAWAY), not a reset");
    let lived = started.elapsed();
    assert!(
        (Duration::from_millis(900)..Duration::from_millis(2500)).contains(&lived),
        "GOAWAY at the age, not before and not at age + grace: {lived:?}"
    );

    // A call that never finishes (its request body never comes) holds the connection past the GOAWAY,
    // until the grace runs out.
    let tcp = tokio::net::TcpStream::connect(server.grpc)
        .await
        .expect("connect");
    let started = Instant::now();
    let (send, connection) = h2::client::handshake(tcp).await.expect("HTTP/2 handshake");
    let connection = tokio::spawn(connection);
    let mut send = send.ready().await.expect("ready");
    let request = tonic::codegen::http::Request::post(format!(
        "http://{}/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
        server.grpc
    ))
    .header("content-type", "application/grpc")
    .header("te", "trailers")
    .body(())
    .expect("request");
    let (_response, _body) = send.send_request(request, false).expect("stream opened");
    let _ = tokio::time::timeout(Duration::from_secs(10), connection)
        .await
        .expect("the server ends the connection");
    let lived = started.elapsed();
    assert!(
        (Duration::from_millis(2800)..Duration::from_secs(6)).contains(&lived),
        "closed at age + grace: {lived:?}"
    );
    server.stop().await;
}
