//! Hostile clients at the transport, each attack performed over real sockets against a real server:
//! unfinished gRPC messages and HTTP bodies (the bytes-in-flight budgets), silent and trickling
//! connections (the read timeout), floods of connections (the caps), and silent TLS peers (handshake
//! slots per client). Each test asserts what the server controls: which requests are refused and with
//! what, that a refused connection is closed, that the other listeners and clients are still served,
//! and the metric counted. Timings are lower bounds (the server never acts early) and generous upper
//! bounds (it acts, on a busy machine too).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpSocket, TcpStream};
use tollgate::proto::rls::rate_limit_response::Code;

use crate::common::certs::{Ca, CertDir, borrowed};
use crate::common::{TestServer, http, read_answer, wire_request};

const RULES: &str =
    "domain: edge\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1000}\n";

/// Upper bound for anything the server should do "at once" or "at the timeout", on a busy machine.
const PATIENCE: Duration = Duration::from_secs(20);

/// gRPC status codes as `grpc-status` carries them.
const RESOURCE_EXHAUSTED: &str = "8";
const DEADLINE_EXCEEDED: &str = "4";

/// A gRPC status from a stream's trailers (or trailers-only headers).
async fn grpc_status(response: h2::client::ResponseFuture) -> String {
    let response = tokio::time::timeout(PATIENCE, response)
        .await
        .expect("an answer in time")
        .expect("a response");
    if let Some(status) = response.headers().get("grpc-status") {
        return status.to_str().expect("ascii").to_owned();
    }
    let mut body = response.into_body();
    while body.data().await.is_some_and(|chunk| chunk.is_ok()) {}
    let trailers = body.trailers().await.expect("trailers").expect("some trailers");
    trailers["grpc-status"].to_str().expect("ascii").to_owned()
}

/// Opens `streams` Envoy calls on one new HTTP/2 connection, each announcing a `claimed`-byte message
/// and sending only `sent` bytes of it; returns each stream's gRPC status.
async fn unfinished_calls(server: SocketAddr, streams: usize, claimed: u32, sent: usize) -> Vec<String> {
    let tcp = TcpStream::connect(server).await.expect("connect");
    let (send, connection) = h2::client::handshake(tcp).await.expect("HTTP/2 handshake");
    let connection = tokio::spawn(connection);
    let mut answers = Vec::new();
    let mut bodies = Vec::new();
    for _ in 0..streams {
        let mut send = send.clone().ready().await.expect("ready");
        let request = http::Request::post(format!(
            "http://{server}/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
        ))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .expect("request");
        let (response, mut body) = send.send_request(request, false).expect("stream opened");
        let mut message = vec![0u8; 5 + sent];
        message[1..5].copy_from_slice(&claimed.to_be_bytes());
        body.reserve_capacity(message.len());
        body.send_data(Bytes::from(message), false).expect("data queued");
        answers.push(tokio::spawn(grpc_status(response)));
        bodies.push(body);
    }
    let mut statuses = Vec::new();
    for answer in answers {
        statuses.push(answer.await.expect("answer task"));
    }
    drop(bodies);
    connection.abort();
    statuses
}

/// One normal decision on a fresh connection.
async fn decided(server: &TestServer) -> i32 {
    let mut client = server.client().await;
    let answer = tokio::time::timeout(
        PATIENCE,
        client.should_rate_limit(wire_request("edge", &[&[("k", "v")]])),
    )
    .await
    .expect("answered in time")
    .expect("decided");
    answer.into_inner().overall_code
}

fn count(statuses: &[String], code: &str) -> usize {
    statuses.iter().filter(|s| *s == code).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unfinished_grpc_messages_stop_at_the_connection_budget() {
    // 64 KiB messages: each connection may hold 4 × 64 KiB of unfinished ones.
    let env = [
        ("TOLLGATE_MAX_REQUEST_BYTES", "65536"),
        ("TOLLGATE_READ_TIMEOUT", "2s"),
    ];
    let server = TestServer::start(&[("edge.yaml", RULES)], &env).await;
    let started = Instant::now();
    let statuses = unfinished_calls(server.grpc, 20, 60_000, 50_000).await;
    // 262,144 bytes hold at most five 50,005-byte partial messages (a sixth may be cut part way).
    let refused = count(&statuses, RESOURCE_EXHAUSTED);
    let timed_out = count(&statuses, DEADLINE_EXCEEDED);
    assert_eq!(refused + timed_out, 20, "{statuses:?}");
    assert!(refused >= 14, "beyond the connection's budget: {statuses:?}");
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "the held ones fail at the read timeout, not before"
    );
    assert_eq!(decided(&server).await, Code::Ok as i32, "everyone else is served");
    assert_eq!(
        server.metric("tollgate_request_bytes_over_budget_total").await,
        refused as u64
    );
    assert_eq!(
        server.metric("tollgate_request_read_timeouts_total").await,
        timed_out as u64
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unfinished_messages_on_many_connections_stop_at_the_process_budget() {
    let env = [
        ("TOLLGATE_MAX_REQUEST_BYTES", "65536"),
        ("TOLLGATE_MAX_REQUEST_BYTES_IN_FLIGHT", "131072"),
        ("TOLLGATE_READ_TIMEOUT", "2s"),
    ];
    let server = TestServer::start(&[("edge.yaml", RULES)], &env).await;
    let attacks: Vec<_> = (0..5)
        .map(|_| tokio::spawn(unfinished_calls(server.grpc, 1, 60_000, 50_000)))
        .collect();
    let mut statuses = Vec::new();
    for attack in attacks {
        statuses.extend(attack.await.expect("attack"));
    }
    // 131,072 bytes hold two of the five (a third may be cut part way).
    assert!(
        count(&statuses, RESOURCE_EXHAUSTED) >= 2,
        "beyond the process's budget: {statuses:?}"
    );
    assert_eq!(
        decided(&server).await,
        Code::Ok as i32,
        "a whole message is served"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_body_that_stalls_fails_at_the_read_timeout() {
    let server = TestServer::start(&[("edge.yaml", RULES)], &[("TOLLGATE_READ_TIMEOUT", "1s")]).await;
    let mut tcp = TcpStream::connect(server.http).await.expect("connect");
    let started = Instant::now();
    tcp.write_all(b"POST /json HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"domain\":")
        .await
        .expect("send");
    let mut answer = String::new();
    tokio::time::timeout(PATIENCE, tcp.read_to_string(&mut answer))
        .await
        .expect("answered in time")
        .expect("read");
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "not before the timeout"
    );
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(answer.contains("not received whole within 1s"), "{answer}");
    assert_eq!(server.metric("tollgate_request_read_timeouts_total").await, 1);
    server.stop().await;
}

/// Whether the server closes `tcp` (EOF or reset) within `within`, while the client trickles `trickle`
/// every 200 ms when given.
pub async fn closed_within(tcp: &mut TcpStream, within: Duration, trickle: Option<&[u8]>) -> bool {
    let deadline = Instant::now() + within;
    let mut buffer = [0u8; 256];
    while Instant::now() < deadline {
        match tokio::time::timeout(Duration::from_millis(200), tcp.read(&mut buffer)).await {
            Ok(Ok(0) | Err(_)) => return true,
            Ok(Ok(_)) => {}
            Err(_) => {
                if let Some(bytes) = trickle
                    && tcp.write_all(bytes).await.is_err()
                {
                    return true;
                }
            }
        }
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_and_trickling_connections_are_closed_at_the_read_timeout() {
    let server = TestServer::start(&[("edge.yaml", RULES)], &[("TOLLGATE_READ_TIMEOUT", "1s")]).await;
    let started = Instant::now();
    // Silent on the gRPC port: no HTTP/2 preface.
    let mut silent = TcpStream::connect(server.grpc).await.expect("connect");
    // Headers one line at a time on the HTTP port (slowloris), and an idle keep-alive connection.
    let mut trickling = TcpStream::connect(server.http).await.expect("connect");
    trickling
        .write_all(b"GET /healthcheck HTTP/1.1\r\nHost: t\r\n")
        .await
        .expect("send");
    let mut idle = TcpStream::connect(server.http).await.expect("connect");
    assert!(
        closed_within(&mut silent, PATIENCE, None).await,
        "silent gRPC connection closed"
    );
    assert!(
        closed_within(&mut trickling, PATIENCE, Some(b"X-Slow: 1\r\n")).await,
        "trickled headers closed"
    );
    assert!(
        closed_within(&mut idle, PATIENCE, None).await,
        "idle HTTP connection closed"
    );
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "not before the timeout"
    );
    assert_eq!(server.metric("tollgate_connections_timed_out_total").await, 3);
    assert_eq!(decided(&server).await, Code::Ok as i32);
    server.stop().await;
}

/// Retries `attempt` until it gives a value: a connection just closed may hold its slot for a moment
/// after the client has seen it close.
pub async fn eventually<T, F: std::future::Future<Output = Option<T>>>(
    what: &str,
    attempt: impl Fn() -> F,
) -> T {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(value) = attempt().await {
            return value;
        }
        assert!(Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A keep-alive HTTP connection that has been served one request (not a health check, which alone does
/// not hold a slot), or `None` if it was closed.
async fn served_http(addr: SocketAddr) -> Option<TcpStream> {
    let mut tcp = TcpStream::connect(addr).await.ok()?;
    tcp.write_all(b"GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n")
        .await
        .ok()?;
    (read_answer(&mut tcp).await?.0 == 200).then_some(tcp)
}

/// A gRPC connection that has been served one decision, or `None` if it was closed.
async fn served_grpc(addr: SocketAddr) -> Option<tonic::transport::Channel> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("uri")
        .connect()
        .await
        .ok()?;
    let mut client =
        tollgate::proto::rls::rate_limit_service_client::RateLimitServiceClient::new(channel.clone());
    let answer = client
        .should_rate_limit(wire_request("edge", &[&[("k", "v")]]))
        .await
        .ok()?;
    (answer.into_inner().overall_code == Code::Ok as i32).then_some(channel)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_cap_silent_connections_give_way_and_then_new_ones_are_refused() {
    let env = [
        ("TOLLGATE_MAX_CONNECTIONS", "3"),
        ("TOLLGATE_HTTP_MAX_CONNECTIONS", "3"),
    ];
    let server = TestServer::start(&[("edge.yaml", RULES)], &env).await;
    for addr in [server.http, server.grpc] {
        // Three silent connections fill the cap; each new client pushes the oldest silent one out.
        let mut silent = Vec::new();
        for _ in 0..3 {
            silent.push(TcpStream::connect(addr).await.expect("connect"));
        }
        let client = TcpStream::connect(addr).await.expect("connect");
        assert!(
            closed_within(&mut silent[0], PATIENCE, None).await,
            "the oldest silent connection to {addr} gave way"
        );
        drop((silent, client));
    }
    assert!(server.metric("tollgate_connections_evicted_total").await >= 2);

    // Connections that have been served are never pushed out: beyond them, a new one is closed at once.
    let http_clients = [
        eventually("an HTTP client served", || served_http(server.http)).await,
        eventually("an HTTP client served", || served_http(server.http)).await,
        eventually("an HTTP client served", || served_http(server.http)).await,
    ];
    let grpc_clients = [
        eventually("a gRPC client served", || served_grpc(server.grpc)).await,
        eventually("a gRPC client served", || served_grpc(server.grpc)).await,
        eventually("a gRPC client served", || served_grpc(server.grpc)).await,
    ];
    let refused_before = server.metric("tollgate_connections_refused_total").await;
    for addr in [server.http, server.grpc] {
        let mut over = TcpStream::connect(addr).await.expect("connect");
        assert!(
            closed_within(&mut over, PATIENCE, None).await,
            "a connection beyond the cap of {addr} is closed"
        );
    }
    assert_eq!(
        server.metric("tollgate_connections_refused_total").await,
        refused_before + 2
    );
    // The debug port has a cap of its own: health and metrics stay reachable.
    let (status, _) = http(server.debug, "GET", "/rlconfig", "").await;
    assert_eq!(status, 200);
    // A slot given back is a slot for the next client.
    drop(grpc_clients);
    eventually("a freed slot serves a new client", || served_grpc(server.grpc)).await;
    drop(http_clients);
    server.stop().await;
}

/// A gRPC connection that was served and then sends no request (its HTTP/2 handshake done, nothing
/// else) is back on probation after `TOLLGATE_IDLE_CONNECTION_PROBATION`: while in use it holds its
/// slot at the cap, once idle it gives way to a new client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_grpc_connections_give_way_at_the_cap() {
    let env = [
        ("TOLLGATE_MAX_CONNECTIONS", "2"),
        ("TOLLGATE_IDLE_CONNECTION_PROBATION", "1s"),
    ];
    let server = TestServer::start(&[("edge.yaml", RULES)], &env).await;
    let served_at = Instant::now();
    let idle = [
        eventually("a gRPC client served", || served_grpc(server.grpc)).await,
        eventually("a gRPC client served", || served_grpc(server.grpc)).await,
    ];
    // Both just sent a request: a third connection is refused, not let in at their expense.
    let mut over = TcpStream::connect(server.grpc).await.expect("connect");
    assert!(
        closed_within(&mut over, PATIENCE, None).await,
        "a connection beyond the cap is closed while the others are in use"
    );
    // Idle for a check or two (1-2 s), they are on probation again: a new client takes one's place,
    // and never before a whole check has passed.
    let newcomer = eventually("a new client served once the others are idle", || {
        served_grpc(server.grpc)
    })
    .await;
    assert!(
        served_at.elapsed() >= Duration::from_secs(1),
        "a connection in use gave way before it was idle for a whole check"
    );
    assert!(server.metric("tollgate_connections_evicted_total").await >= 1);
    drop((idle, newcomer));
    server.stop().await;
}

/// A TLS channel to `server` from the local address `from` (any loopback address on Linux).
async fn tls_decided_from(server: &TestServer, ca: &Ca, from: [u8; 4]) -> Result<i32, String> {
    let addr = server.grpc;
    let local = SocketAddr::from((from, 0));
    let connector = tower::service_fn(move |_: http::Uri| async move {
        let socket = TcpSocket::new_v4()?;
        socket.bind(local)?;
        let tcp = socket.connect(addr).await?;
        Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tcp))
    });
    let tls = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(ca.pem()))
        .domain_name("localhost");
    let channel = tonic::transport::Endpoint::from_shared(format!("https://{addr}"))
        .expect("uri")
        .tls_config(tls)
        .expect("tls")
        .connect_with_connector(connector)
        .await
        .map_err(|e| format!("{e:?}"))?;
    let mut client = tollgate::proto::rls::rate_limit_service_client::RateLimitServiceClient::new(channel);
    let answer = tokio::time::timeout(
        PATIENCE,
        client.should_rate_limit(wire_request("edge", &[&[("k", "v")]])),
    )
    .await
    .map_err(|_| "no answer in time".to_owned())?
    .map_err(|e| e.to_string())?;
    Ok(answer.into_inner().overall_code)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_tls_peers_hold_only_their_own_address_handshake_slots() {
    let (server_ca, client_ca) = (Ca::new("server CA"), Ca::new("client CA"));
    let certs = CertDir::new(&server_ca.server(&["localhost"]), &client_ca);
    let mut env = certs.tls_env();
    env.push(("TOLLGATE_TLS_HANDSHAKES_PER_CLIENT", "2".to_owned()));
    let server = TestServer::start(&[("edge.yaml", RULES)], &borrowed(&env)).await;
    // Two silent connections from 127.0.0.1 take its two slots (for up to 5 s each).
    let silent: Vec<TcpStream> =
        futures_util::future::join_all((0..2).map(|_| TcpStream::connect(server.grpc)))
            .await
            .into_iter()
            .map(|tcp| tcp.expect("connect"))
            .collect();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        tls_decided_from(&server, &server_ca, [127, 0, 0, 1])
            .await
            .is_err(),
        "a third handshake from the same address is closed at once"
    );
    assert_eq!(
        tls_decided_from(&server, &server_ca, [127, 0, 0, 2]).await,
        Ok(Code::Ok as i32),
        "another address still gets its handshake"
    );
    drop(silent);
    // Slots are given back when the silent peers go; 127.0.0.1 is served again.
    let deadline = Instant::now() + PATIENCE;
    while tls_decided_from(&server, &server_ca, [127, 0, 0, 1])
        .await
        .is_err()
    {
        assert!(Instant::now() < deadline, "127.0.0.1 served again");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    server.stop().await;
}

/// A `GET /healthcheck` on a new connection whose head carries `headers` (whole header lines): the
/// answer, or `None` if the connection was closed without one.
async fn with_head(addr: SocketAddr, headers: &str) -> Option<(u16, String)> {
    let mut tcp = TcpStream::connect(addr).await.ok()?;
    let head = format!("GET /healthcheck HTTP/1.1\r\nHost: t\r\n{headers}\r\n");
    // The server may answer and close before it has read a head it refuses.
    let _ = tcp.write_all(head.as_bytes()).await;
    read_answer(&mut tcp).await
}

/// `count` header lines of about `bytes` bytes each.
fn header_lines(count: usize, bytes: usize) -> String {
    (0..count)
        .map(|i| format!("X-Forwarded-{i}: {}\r\n", "v".repeat(bytes)))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_heads_are_bounded_and_larger_ones_get_431() {
    let server = TestServer::start(&[("edge.yaml", RULES)], &[]).await;
    let ok = Some((200, "OK".to_owned()));
    // A browser's worth of headers forwarded by a proxy (forward auth): 40 KiB in 30 headers, and 100
    // headers.
    assert_eq!(with_head(server.http, &header_lines(30, 1365)).await, ok);
    assert_eq!(with_head(server.http, &header_lines(98, 10)).await, ok);
    // Past the default 64 KiB, or past 100 headers: 431, on the debug port too.
    for addr in [server.http, server.debug] {
        let too_large = with_head(addr, &header_lines(1, 70 << 10)).await;
        assert_eq!(too_large.map(|a| a.0), Some(431), "one 70 KiB header to {addr}");
        let too_many = with_head(addr, &header_lines(101, 10)).await;
        assert_eq!(too_many.map(|a| a.0), Some(431), "101 headers to {addr}");
    }
    server.stop().await;
    let env = [("TOLLGATE_HTTP_MAX_HEADER_BYTES", "16384")];
    let server = TestServer::start(&[("edge.yaml", RULES)], &env).await;
    assert_eq!(with_head(server.http, &header_lines(10, 1200)).await, ok);
    let too_large = with_head(server.http, &header_lines(10, 2000)).await;
    assert_eq!(too_large.map(|a| a.0), Some(431), "20 KiB past a bound of 16 KiB");
    server.stop().await;
}
