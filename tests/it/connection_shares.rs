//! Hostile clients against the listeners' connection caps, each attack performed over real sockets
//! against a real server: connections that stop reading their answers (the write timeout), one address
//! that takes a whole listener or pushes a well-behaved client out of it (the shares by source), and
//! health checks used to hold a slot. Clients come from distinct loopback addresses (127.0.0.x) where
//! the source matters. The listeners do not depend on the store, so these run on whichever store the
//! suite runs on. Each test asserts what the server controls: who is answered, who is closed, and the
//! counters.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use prost::Message as _;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt as _, ReadBuf};
use tokio::net::TcpStream;
use tokio::net::tcp::OwnedReadHalf;
use tokio::task::JoinHandle;
use tollgate::proto::rls::rate_limit_response::Code;
use tollgate::proto::rls::rate_limit_service_client::RateLimitServiceClient;
use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;
use tonic_reflection::pb::v1::ServerReflectionRequest;
use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;

use crate::common::{TestServer, connect_from, read_answer, wire_request};
use crate::transport_bounds::{closed_within, eventually};

const RULES: &str =
    "domain: edge\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1000000}\n";

/// Upper bound for anything the server should do "at once" or "at the timeout", on a busy machine.
const PATIENCE: Duration = Duration::from_secs(20);

/// The attacker's address, and well-behaved clients' others.
const ATTACKER: [u8; 4] = [127, 0, 0, 1];
const ENVOY: [u8; 4] = [127, 0, 0, 2];
const PROBE: [u8; 4] = [127, 0, 0, 3];

/// One request on a new connection from `from` (`Connection: close`): the answer, or `None` if the
/// connection was closed without one.
async fn ask_from(
    addr: SocketAddr,
    from: [u8; 4],
    method: &str,
    path: &str,
    body: &str,
) -> Option<(u16, String)> {
    let mut tcp = connect_from(addr, from, None).await.ok()?;
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    tcp.write_all(request.as_bytes()).await.ok()?;
    read_answer(&mut tcp).await
}

/// A decision over `/json`, as a well-behaved client from `from` asks for it.
async fn decided_over_http(addr: SocketAddr, from: [u8; 4]) -> Option<u16> {
    let check = r#"{"domain":"edge","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}"#;
    Some(ask_from(addr, from, "POST", "/json", check).await?.0)
}

/// An HTTP connection that was served once (so it is in use), then pipelines thousands of
/// `GET /metrics` with its receive buffer shrunk to a few KiB and never reads again: the server soon
/// blocks writing to it. Dropping it closes the connection.
struct StuckHttp {
    _read: OwnedReadHalf,
    writer: JoinHandle<()>,
}

impl Drop for StuckHttp {
    fn drop(&mut self) {
        self.writer.abort();
    }
}

async fn stuck_http(addr: SocketAddr, from: [u8; 4]) -> Option<StuckHttp> {
    const REQUEST: &[u8] = b"GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n";
    let mut tcp = connect_from(addr, from, Some(4096)).await.ok()?;
    tcp.write_all(REQUEST).await.ok()?;
    if read_answer(&mut tcp).await?.0 != 200 {
        return None;
    }
    let (read, mut write) = tcp.into_split();
    let writer = tokio::spawn(async move {
        // Blocks once the server stops reading; the write half stays open until the task is aborted.
        let _ = write.write_all(&REQUEST.repeat(3000)).await;
        std::future::pending::<()>().await;
    });
    Some(StuckHttp { _read: read, writer })
}

/// A transport that writes and never reads, so that the peer's answers pile up unread.
struct WriteOnly(TcpStream);

impl AsyncRead for WriteOnly {
    fn poll_read(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        _: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Poll::Pending
    }
}

impl AsyncWrite for WriteOnly {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
    }
}

/// A gRPC connection that sends a thousand reflection calls, whose answers are large (with
/// flow-control windows wide open, so the server may write every answer at once), and never reads its
/// answers. Dropping it closes it.
struct StuckGrpc {
    driver: JoinHandle<()>,
    _streams: Vec<h2::SendStream<Bytes>>,
}

impl Drop for StuckGrpc {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

async fn stuck_grpc(addr: SocketAddr, from: [u8; 4]) -> Option<StuckGrpc> {
    let tcp = connect_from(addr, from, Some(4096)).await.ok()?;
    let (mut send, connection) = h2::client::Builder::new()
        .initial_window_size(i32::MAX as u32)
        .initial_connection_window_size(i32::MAX as u32)
        .handshake::<_, Bytes>(WriteOnly(tcp))
        .await
        .ok()?;
    let driver = tokio::spawn(async move {
        let _ = connection.await;
    });
    let message = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::FileContainingSymbol(
            "envoy.service.ratelimit.v3.RateLimitService".to_owned(),
        )),
    }
    .encode_to_vec();
    let mut frame = vec![0u8; 5];
    frame[1..5].copy_from_slice(&u32::try_from(message.len()).ok()?.to_be_bytes());
    frame.extend_from_slice(&message);
    let frame = Bytes::from(frame);
    let mut streams = Vec::new();
    // Fewer than the server's 1,024 streams at once: more would be refused, and h2 closes a
    // connection that makes it refuse that many.
    for _ in 0..1000 {
        send = send.ready().await.ok()?;
        let request = http::Request::post(format!(
            "http://{addr}/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"
        ))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .ok()?;
        let (_, mut body) = send.send_request(request, false).ok()?;
        body.send_data(frame.clone(), true).ok()?;
        streams.push(body);
    }
    Some(StuckGrpc {
        driver,
        _streams: streams,
    })
}

/// A gRPC channel to `addr` from `from` over one connection; `connects` counts the connections it opened.
async fn channel_from(addr: SocketAddr, from: [u8; 4], connects: Arc<AtomicUsize>) -> Option<Channel> {
    let connector = tower::service_fn(move |_: http::Uri| {
        let connects = Arc::clone(&connects);
        async move {
            connects.fetch_add(1, Ordering::SeqCst);
            let tcp = connect_from(addr, from, None).await?;
            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tcp))
        }
    });
    tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .ok()?
        .connect_with_connector(connector)
        .await
        .ok()
}

/// A decision on `channel`, `None` if it failed.
async fn decide(channel: &Channel) -> Option<i32> {
    let mut client = RateLimitServiceClient::new(channel.clone());
    let call = client.should_rate_limit(wire_request("edge", &[&[("k", "v")]]));
    let answer = tokio::time::timeout(PATIENCE, call).await.ok()?.ok()?;
    Some(answer.into_inner().overall_code)
}

/// A gRPC health check on `channel`, `None` if it failed.
async fn health_check(channel: &Channel) -> Option<i32> {
    let mut client = HealthClient::new(channel.clone());
    let call = client.check(HealthCheckRequest::default());
    let answer = tokio::time::timeout(PATIENCE, call).await.ok()?.ok()?;
    Some(answer.into_inner().status)
}

/// A new connection from `from` that is served one decision, or `None` if it was closed.
async fn served_grpc_from(addr: SocketAddr, from: [u8; 4]) -> Option<Channel> {
    let channel = channel_from(addr, from, Arc::default()).await?;
    (decide(&channel).await? == Code::Ok as i32).then_some(channel)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_is_answered_while_slow_readers_fill_the_http_listener() {
    // The write timeout is far away: what answers the probes is the share of the cap by address.
    let env = [
        ("TOLLGATE_HTTP_MAX_CONNECTIONS", "4"),
        ("TOLLGATE_WRITE_TIMEOUT", "120s"),
    ];
    let server = TestServer::start(&[("edge.yaml", RULES)], &env).await;
    let mut stuck = Vec::new();
    for _ in 0..4 {
        stuck.push(eventually("a slow reader served once", || stuck_http(server.http, ATTACKER)).await);
    }
    // Each is in use: one more from the same address is closed at once.
    let mut over = connect_from(server.http, ATTACKER, None).await.expect("connect");
    assert!(
        closed_within(&mut over, PATIENCE, None).await,
        "the attacker's address gets no more than the cap"
    );
    for round in 0..3 {
        // kubelet's probe, from its own address, takes the place of one of the attacker's connections...
        let answer = ask_from(server.http, PROBE, "GET", "/healthcheck", "").await;
        assert_eq!(answer, Some((200, "OK".to_owned())), "probe {round}");
        assert_eq!(
            decided_over_http(server.http, ENVOY).await,
            Some(200),
            "a decision, round {round}"
        );
        // ...and the attacker fills the listener again.
        stuck.push(
            eventually("the attacker back at the cap", || {
                stuck_http(server.http, ATTACKER)
            })
            .await,
        );
    }
    assert_eq!(
        server.metric("tollgate_connections_stalled_total").await,
        0,
        "answered thanks to the shares, not the write timeout"
    );
    assert!(server.metric("tollgate_connections_evicted_total").await >= 3);
    drop(stuck);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_that_do_not_read_their_answers_are_closed_at_the_write_timeout() {
    let env = [
        ("TOLLGATE_HTTP_MAX_CONNECTIONS", "3"),
        ("TOLLGATE_MAX_CONNECTIONS", "2"),
        ("TOLLGATE_WRITE_TIMEOUT", "1s"),
    ];
    let server = TestServer::start(&[("edge.yaml", RULES)], &env).await;
    let started = Instant::now();
    // Both listeners full of connections in use that stopped reading, all from one address, so no share
    // of the cap lets anyone from that address in: only the write timeout can.
    let mut http_stuck = Vec::new();
    for _ in 0..3 {
        http_stuck.push(eventually("a slow HTTP reader", || stuck_http(server.http, ATTACKER)).await);
    }
    let grpc_stuck = [
        eventually("a slow gRPC reader", || stuck_grpc(server.grpc, ATTACKER)).await,
        eventually("a slow gRPC reader", || stuck_grpc(server.grpc, ATTACKER)).await,
    ];
    eventually("HTTP served again", || decided_over_http(server.http, ATTACKER)).await;
    eventually("gRPC served again", || served_grpc_from(server.grpc, ATTACKER)).await;
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "not before the write timeout"
    );
    // Each of the five is closed for it, in time.
    eventually("every slow reader closed", || async {
        (server.metric("tollgate_connections_stalled_total").await >= 5).then_some(())
    })
    .await;
    drop((http_stuck, grpc_stuck));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_envoy_connection_is_neither_evicted_nor_locked_out() {
    let env = [
        ("TOLLGATE_MAX_CONNECTIONS", "4"),
        ("TOLLGATE_IDLE_CONNECTION_PROBATION", "1s"),
    ];
    let server = TestServer::start(&[("edge.yaml", RULES)], &env).await;
    let envoy_connects = Arc::new(AtomicUsize::new(0));
    let envoy = channel_from(server.grpc, ENVOY, Arc::clone(&envoy_connects))
        .await
        .expect("Envoy connects");
    assert_eq!(decide(&envoy).await, Some(Code::Ok as i32));
    // The attacker holds the rest of the cap, each connection kept busy with a health check.
    let mut attacker = Vec::new();
    for _ in 0..3 {
        attacker.push(
            channel_from(server.grpc, ATTACKER, Arc::default())
                .await
                .expect("connect"),
        );
    }
    let keep_busy = {
        let attacker = attacker.clone();
        tokio::spawn(async move {
            loop {
                for channel in &attacker {
                    let _ = health_check(channel).await;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
    };
    // Envoy's connection idles for more than a probation period, then the attacker opens more and
    // keeps them open.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let mut more = Vec::new();
    for _ in 0..5 {
        if let Ok(mut tcp) = connect_from(server.grpc, ATTACKER, None).await {
            let _ = tcp.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await;
            more.push(tcp);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    // Envoy's own connection is still there and still answers.
    for _ in 0..20 {
        assert_eq!(decide(&envoy).await, Some(Code::Ok as i32));
    }
    assert_eq!(envoy_connects.load(Ordering::SeqCst), 1, "never reconnected");

    // The attacker takes the whole cap with connections in use: a new client from another address is
    // still let in, at the attacker's expense.
    keep_busy.abort();
    drop((envoy, attacker, more));
    let mut busy = Vec::new();
    while busy.len() < 4 {
        busy.push(
            eventually("the attacker at the cap", || {
                served_grpc_from(server.grpc, ATTACKER)
            })
            .await,
        );
    }
    let keep_busy = {
        let busy = busy.clone();
        tokio::spawn(async move {
            loop {
                for channel in &busy {
                    let _ = decide(channel).await;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
    };
    let refused = server.metric("tollgate_connections_refused_total").await;
    let mut over = connect_from(server.grpc, ATTACKER, None).await.expect("connect");
    assert!(closed_within(&mut over, PATIENCE, None).await);
    assert_eq!(
        server.metric("tollgate_connections_refused_total").await,
        refused + 1,
        "the attacker's address gets no more"
    );
    let newcomer = served_grpc_from(server.grpc, ENVOY).await;
    assert!(newcomer.is_some(), "a new Envoy connection is let in");
    let health = channel_from(server.grpc, PROBE, Arc::default())
        .await
        .expect("connect");
    assert_eq!(
        health_check(&health).await,
        Some(1),
        "and a health probe from a third address"
    );
    keep_busy.abort();
    drop((busy, newcomer, health));
    server.stop().await;
}

/// A keep-alive HTTP connection from the attacker's address that was asked for health only.
async fn health_only_http(addr: SocketAddr) -> Option<TcpStream> {
    let mut tcp = connect_from(addr, ATTACKER, None).await.ok()?;
    tcp.write_all(b"GET /healthcheck HTTP/1.1\r\nHost: t\r\n\r\n")
        .await
        .ok()?;
    (read_answer(&mut tcp).await? == (200, "OK".to_owned())).then_some(tcp)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_checks_alone_do_not_hold_a_slot() {
    let env = [
        ("TOLLGATE_HTTP_MAX_CONNECTIONS", "2"),
        ("TOLLGATE_MAX_CONNECTIONS", "2"),
    ];
    let server = TestServer::start(&[("edge.yaml", RULES)], &env).await;
    // HTTP: two keep-alive connections that were only ever asked for health.
    let mut health_only = Vec::new();
    for _ in 0..2 {
        health_only.push(eventually("a health check answered", || health_only_http(server.http)).await);
    }
    assert_eq!(
        decided_over_http(server.http, ATTACKER).await,
        Some(200),
        "a client from the same address takes the place of one"
    );
    assert!(
        closed_within(&mut health_only[0], PATIENCE, None).await,
        "the oldest gave way"
    );
    // gRPC: the same with health checks.
    let mut channels = Vec::new();
    for _ in 0..2 {
        channels.push(
            eventually("a health check answered", || async {
                let channel = channel_from(server.grpc, ATTACKER, Arc::default()).await?;
                (health_check(&channel).await? == 1).then_some(channel)
            })
            .await,
        );
    }
    assert!(
        served_grpc_from(server.grpc, ATTACKER).await.is_some(),
        "a client from the same address takes the place of one"
    );
    assert!(server.metric("tollgate_connections_evicted_total").await >= 2);
    drop((health_only, channels));
    server.stop().await;
}
