//! The gRPC listener's connections: TCP (`GRPC_HOST:GRPC_PORT`) or a unix socket (`GRPC_UDS`), plain
//! or TLS (`GRPC_SERVER_USE_TLS`, on either), as one stream of [`Conn`]s for tonic.
//!
//! One accept task per listener. TLS handshakes run in their own tasks, so a client that connects and
//! says nothing holds neither the accept loop nor anyone else's handshake; each has
//! [`HANDSHAKE_TIMEOUT`], at most [`MAX_HANDSHAKES`] run at once, and at most
//! `TOLLGATE_TLS_HANDSHAKES_PER_CLIENT` from one address. Beyond those a new connection is closed at
//! once (and counted as a failed handshake) while accepting goes on, so silent connections from one
//! client cannot hold the slots everyone else's handshakes need.
//!
//! At most `TOLLGATE_MAX_CONNECTIONS` connections are open at once, so descriptors stay for the HTTP
//! port and Redis, shared by source address ([`crate::connections`]): at the cap a connection on
//! probation (in its TLS handshake, or that has sent no request but health checks, or none for a
//! while) gives way to its own address's new one, and the address holding the most gives way to one
//! holding fewer. A connection that has not sent its preface within the read timeout is closed
//! (`tollgate_connections_timed_out_total`); one whose writes make no progress within the write
//! timeout too (`tollgate_connections_stalled_total`, [`crate::write_timeout`]). After the preface,
//! HTTP/2 pings find a silent peer. Each connection carries its share of the request-bytes budget
//! ([`crate::inflight`]).
//!
//! A connection also ends, forcibly, [`ConnectionAge::hard_limit`] after it was accepted: tonic sends
//! GOAWAY at `GRPC_MAX_CONNECTION_AGE` and waits for the calls in flight, and this bounds that wait to
//! `GRPC_MAX_CONNECTION_AGE_GRACE`. (tonic's own grace setting closes the connection without the
//! GOAWAY, so it is not used.)

use std::future::Future as _;
use std::io;
use std::net::SocketAddr;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::{Semaphore, mpsc};
use tokio::time::Sleep;
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::{Connected, TcpConnectInfo};

use super::tls::ServerTls;
use crate::connections::{ACCEPT_ERROR_PAUSE, ConnectionCap, RateLimitedLog, Slot, Source, source_of};
use crate::inflight::{ConnectionBudget, RequestBudget};
use crate::server_counters::ServerCounters;
use crate::write_timeout::WriteTimeout;

/// Longest a TLS handshake may take before the connection is dropped. Envoy's take milliseconds.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// Most TLS handshakes in progress at once.
const MAX_HANDSHAKES: usize = 256;

/// The HTTP/2 client preface, which a gRPC client sends first.
const PREFACE_LEN: usize = 24;

/// What the listener admits: how many connections at once, how many TLS handshakes per client address,
/// and each connection's request budget.
#[derive(Debug, Clone)]
pub(super) struct Admission {
    pub(super) max_connections: usize,
    pub(super) handshakes_per_client: usize,
    /// How long a connection may send no request before it is back on probation.
    pub(super) idle_probation: Duration,
    /// How long a connection's writes may make no progress.
    pub(super) write_timeout: Duration,
    pub(super) budget: RequestBudget,
}

/// Where gRPC is served.
#[derive(Debug)]
pub enum GrpcListener {
    /// A TCP address (`GRPC_HOST:GRPC_PORT`).
    Tcp(TcpListener),
    /// A unix socket (`GRPC_UDS`).
    Unix(UnixSocket),
}

/// A bound unix socket, whose file is removed when it is dropped, unless another process has bound a
/// socket at that path since.
#[derive(Debug)]
pub struct UnixSocket {
    listener: UnixListener,
    path: PathBuf,
    /// Device and inode of the socket file this listener created.
    file: (u64, u64),
}

impl UnixSocket {
    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl GrpcListener {
    /// The TCP address bound, or `None` on a unix socket.
    pub fn tcp_addr(&self) -> Option<SocketAddr> {
        match self {
            GrpcListener::Tcp(listener) => listener.local_addr().ok(),
            GrpcListener::Unix(_) => None,
        }
    }

    /// Binds a unix socket at `path`. A socket file left there by a process that is gone is replaced; one
    /// that still accepts connections is another server's, and binding fails rather than steal it. Any
    /// other kind of file there is an error too.
    pub fn bind_unix(path: PathBuf) -> io::Result<Self> {
        use std::os::unix::fs::FileTypeExt as _;
        if let Ok(meta) = std::fs::symlink_metadata(&path)
            && meta.file_type().is_socket()
        {
            if std::os::unix::net::UnixStream::connect(&path).is_ok() {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    "another server accepts connections on this socket",
                ));
            }
            std::fs::remove_file(&path)?;
        }
        let listener = UnixListener::bind(&path)?;
        let meta = std::fs::symlink_metadata(&path)?;
        Ok(GrpcListener::Unix(UnixSocket {
            listener,
            path,
            file: (meta.dev(), meta.ino()),
        }))
    }

    async fn accept(&self) -> io::Result<Io> {
        match self {
            GrpcListener::Tcp(listener) => {
                let (stream, _) = listener.accept().await?;
                // tonic sets TCP_NODELAY only on listeners it binds itself; without it a response
                // written while an earlier one is unacknowledged waits for the client's delayed ACK
                // (40 ms on Linux), which showed as a 41 ms p99.9 whenever responses left in bursts.
                stream.set_nodelay(true)?;
                Ok(Io::Tcp(stream))
            }
            GrpcListener::Unix(socket) => Ok(Io::Unix(socket.listener.accept().await?.0)),
        }
    }
}

impl Drop for UnixSocket {
    fn drop(&mut self) {
        let ours =
            std::fs::symlink_metadata(&self.path).is_ok_and(|meta| (meta.dev(), meta.ino()) == self.file);
        if ours {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// How long connections live (`GRPC_MAX_CONNECTION_AGE` and `_GRACE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct ConnectionAge {
    /// GOAWAY after this (sent by tonic).
    pub(super) max: Duration,
    /// Calls in flight may finish for this long after the GOAWAY.
    pub(super) grace: Duration,
}

impl ConnectionAge {
    /// When a connection is closed whatever it is doing.
    fn hard_limit(&self) -> Duration {
        self.max.saturating_add(self.grace)
    }
}

/// One accepted gRPC connection.
#[derive(Debug)]
pub struct Conn {
    io: Io,
    /// Fires at the connection's hard age limit; then reads and writes fail and the connection ends.
    expires: Option<Pin<Box<Sleep>>>,
    /// Until the HTTP/2 preface has arrived: when it must have, and how many of its bytes have.
    preface: Option<Preface>,
    /// Whether writes make progress: see [`crate::write_timeout`].
    writes: WriteTimeout,
    /// Whether requests keep coming: see [`Idle`].
    idle: Idle,
    /// The connection's share of the request-bytes budget, handed to each of its requests.
    budget: ConnectionBudget,
    metrics: Arc<ServerCounters>,
    /// Held while the connection is open: one of the listener's `max_connections`, which it must close
    /// when another connection takes its place. Shared with the requests ([`ConnInfo`]), each of which
    /// (but health checks) puts the connection in use.
    slot: Arc<Slot>,
}

/// A connection waiting for its HTTP/2 preface.
#[derive(Debug)]
struct Preface {
    deadline: Pin<Box<Sleep>>,
    received: usize,
}

/// The check, every `TOLLGATE_IDLE_CONNECTION_PROBATION`, that a connection sent a request since the
/// last one; one that did not is back on probation ([`Slot::idle`]). Bytes alone do not count (HTTP/2
/// answers the server's keepalive pings by itself), nor do health checks.
#[derive(Debug)]
struct Idle {
    every: Duration,
    check: Pin<Box<Sleep>>,
    /// The connection's request count at the last check.
    seen: u64,
}

/// What tonic hands each request of a connection: the peer's addresses, the connection's budget and
/// its place in the listener's cap.
#[derive(Debug, Clone)]
pub struct ConnInfo {
    /// The TCP addresses (none on a unix socket).
    pub tcp: TcpConnectInfo,
    /// The connection's share of the request-bytes budget.
    pub budget: ConnectionBudget,
    /// The connection's place in the listener's cap, which each request but a health check puts in use.
    pub slot: Arc<Slot>,
}

/// The transport under a [`Conn`].
#[derive(Debug)]
enum Io {
    Tcp(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
    Unix(UnixStream),
    UnixTls(Box<TlsStream<UnixStream>>),
}

/// Accepts connections on `listener` (with TLS when `tls` is given) until the returned stream is
/// dropped, which tonic does when it stops serving.
pub(super) fn incoming(
    listener: GrpcListener,
    tls: Option<Arc<ServerTls>>,
    age: Option<ConnectionAge>,
    admission: Admission,
    metrics: Arc<ServerCounters>,
) -> ReceiverStream<io::Result<Conn>> {
    let (sender, receiver) = mpsc::channel(MAX_HANDSHAKES);
    tokio::spawn(accept_loop(listener, tls, age, admission, metrics, sender));
    ReceiverStream::new(receiver)
}

async fn accept_loop(
    listener: GrpcListener,
    tls: Option<Arc<ServerTls>>,
    age: Option<ConnectionAge>,
    admission: Admission,
    metrics: Arc<ServerCounters>,
    sender: mpsc::Sender<io::Result<Conn>>,
) {
    let handshakes = Arc::new(Semaphore::new(MAX_HANDSHAKES));
    let mut cap = ConnectionCap::new(
        admission.max_connections,
        "gRPC (TOLLGATE_MAX_CONNECTIONS)",
        Arc::clone(&metrics),
    );
    let per_client: Arc<std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>> =
        Arc::default();
    let mut errors = RateLimitedLog::default();
    let (conn_metrics, budget, read_timeout, idle_every, write_timeout) = (
        Arc::clone(&metrics),
        admission.budget.clone(),
        admission.budget.read_timeout(),
        admission.idle_probation,
        admission.write_timeout,
    );
    let conn = move |io, slot: Slot| Conn {
        io,
        expires: age.map(|age| Box::pin(tokio::time::sleep(age.hard_limit()))),
        preface: Some(Preface {
            deadline: Box::pin(tokio::time::sleep(read_timeout)),
            received: 0,
        }),
        writes: WriteTimeout::new(write_timeout, Arc::clone(&conn_metrics)),
        idle: Idle {
            every: idle_every,
            check: Box::pin(tokio::time::sleep(idle_every)),
            seen: 0,
        },
        budget: budget.connection(),
        metrics: Arc::clone(&conn_metrics),
        slot: Arc::new(slot),
    };
    loop {
        let accepted = tokio::select! {
            _ = sender.closed() => return,
            accepted = listener.accept() => accepted,
        };
        let io = match accepted {
            Ok(io) => io,
            Err(error) => {
                errors.warn("listener cannot accept a connection", &"gRPC", error);
                tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                continue;
            }
        };
        let client = io.peer();
        let Some(slot) = cap.admit(client) else {
            continue;
        };
        let Some(tls) = &tls else {
            if sender.send(Ok(conn(io, slot))).await.is_err() {
                return;
            }
            continue;
        };
        let Some(client_slot) = ClientHandshake::take(&per_client, client, admission.handshakes_per_client)
        else {
            metrics.tls_handshake_failures.add(1);
            tracing::debug!(
                ?client,
                "TLS handshakes from this client at their limit; connection closed"
            );
            continue;
        };
        let Ok(permit) = Arc::clone(&handshakes).try_acquire_owned() else {
            metrics.tls_handshake_failures.add(1);
            tracing::debug!("gRPC TLS handshakes at their limit; connection closed");
            continue;
        };
        let acceptor = tokio_rustls::TlsAcceptor::from(tls.config());
        let (sender, metrics, conn) = (sender.clone(), Arc::clone(&metrics), conn.clone());
        tokio::spawn(async move {
            let handshake = async {
                match io {
                    Io::Tcp(tcp) => acceptor.accept(tcp).await.map(|s| Io::Tls(Box::new(s))),
                    Io::Unix(unix) => acceptor.accept(unix).await.map(|s| Io::UnixTls(Box::new(s))),
                    already => Ok(already),
                }
            };
            let outcome = tokio::select! {
                outcome = tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake) => outcome,
                () = slot.evicted() => {
                    tracing::debug!("gRPC TLS handshake closed for a new connection at the cap");
                    return;
                }
            };
            drop((permit, client_slot));
            match outcome {
                Ok(Ok(io)) => {
                    let _ = sender.send(Ok(conn(io, slot))).await;
                }
                Ok(Err(error)) => {
                    metrics.tls_handshake_failures.add(1);
                    tracing::debug!(%error, "gRPC TLS handshake refused");
                }
                Err(_) => {
                    metrics.tls_handshake_failures.add(1);
                    tracing::debug!("gRPC TLS handshake timed out");
                }
            }
        });
    }
}

/// One of a client address's TLS handshake slots, given back when dropped.
struct ClientHandshake {
    clients: Arc<std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>>,
    client: std::net::IpAddr,
}

impl ClientHandshake {
    /// A slot for `client` if it has fewer than `limit` handshakes in progress (no address, as on a unix
    /// socket: always).
    fn take(
        clients: &Arc<std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>>,
        client: Source,
        limit: usize,
    ) -> Option<Option<Self>> {
        let Some(client) = client else {
            return Some(None);
        };
        let mut held = clients.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let count = held.entry(client).or_default();
        if *count >= limit {
            return None;
        }
        *count += 1;
        Some(Some(Self {
            clients: Arc::clone(clients),
            client,
        }))
    }
}

impl Drop for ClientHandshake {
    fn drop(&mut self) {
        let mut held = self
            .clients
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(count) = held.get_mut(&self.client) {
            *count -= 1;
            if *count == 0 {
                held.remove(&self.client);
            }
        }
    }
}

impl Io {
    /// Where the connection comes from: the peer's IP address on TCP, none on a unix socket.
    fn peer(&self) -> Source {
        match self {
            Io::Tcp(tcp) => source_of(tcp.peer_addr().ok()),
            Io::Tls(tls) => source_of(tls.get_ref().0.peer_addr().ok()),
            Io::Unix(_) | Io::UnixTls(_) => None,
        }
    }
}

impl Connected for Conn {
    type ConnectInfo = ConnInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        let tcp = match &self.io {
            Io::Tcp(tcp) => Some(tcp),
            Io::Tls(tls) => Some(tls.get_ref().0),
            Io::Unix(_) | Io::UnixTls(_) => None,
        };
        ConnInfo {
            tcp: TcpConnectInfo {
                local_addr: tcp.and_then(|t| t.local_addr().ok()),
                remote_addr: tcp.and_then(|t| t.peer_addr().ok()),
            },
            budget: self.budget.clone(),
            slot: Arc::clone(&self.slot),
        }
    }
}

impl Conn {
    /// An error once the connection is past its hard age limit (registering the timer's wake-up
    /// otherwise, so an idle connection is woken to be closed). Checked on reads only: hyper keeps a
    /// read pending on every open connection, so that is where the wake-up lands, and the failed read
    /// ends the connection; writes need no second timer poll each.
    fn expired(&mut self, cx: &mut Context<'_>) -> Option<io::Error> {
        let expires = self.expires.as_mut()?;
        expires.as_mut().poll(cx).is_ready().then(|| {
            io::Error::new(
                io::ErrorKind::TimedOut,
                "connection closed past GRPC_MAX_CONNECTION_AGE + GRPC_MAX_CONNECTION_AGE_GRACE",
            )
        })
    }
}

/// Runs `$call` on whichever stream `$io` holds.
macro_rules! each {
    ($io:expr, $stream:ident => $call:expr) => {
        match $io {
            Io::Tcp($stream) => $call,
            Io::Tls($stream) => $call,
            Io::Unix($stream) => $call,
            Io::UnixTls($stream) => $call,
        }
    };
}

impl AsyncRead for Conn {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Some(error) = this.expired(cx) {
            return Poll::Ready(Err(error));
        }
        let before = buf.filled().len();
        let read = each!(&mut this.io, s => Pin::new(s).poll_read(cx, buf));
        if !read.is_pending() {
            if let Some(preface) = &mut this.preface {
                preface.received += buf.filled().len() - before;
                // The preface alone does not put the connection in use: its first request does.
                if preface.received >= PREFACE_LEN {
                    this.preface = None;
                }
            }
            return read;
        }
        // Nothing to read: the timers and the cap's claim, each of which registers its wake-up.
        if let Some(preface) = &mut this.preface
            && preface.deadline.as_mut().poll(cx).is_ready()
        {
            this.metrics.connections_timed_out.add(1);
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "no HTTP/2 preface within the read timeout",
            )));
        }
        if this.preface.is_none() && this.idle.check.as_mut().poll(cx).is_ready() {
            let requests = this.slot.requests();
            if requests == this.idle.seen {
                this.slot.idle();
            }
            this.idle.seen = requests;
            let next = tokio::time::Instant::now() + this.idle.every;
            this.idle.check.as_mut().reset(next);
            // Registers the wake-up of the next check.
            let _ = this.idle.check.as_mut().poll(cx);
        }
        if let Some(error) = this.evicted(cx) {
            return Poll::Ready(Err(error));
        }
        read
    }
}

impl Conn {
    /// An error once another connection has taken this one's place at the cap (registering the wake-up
    /// otherwise). Checked whenever the connection waits, to read or to write.
    fn evicted(&self, cx: &mut Context<'_>) -> Option<io::Error> {
        self.slot.poll_evicted(cx).is_ready().then(|| {
            io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "closed for a new connection at the cap",
            )
        })
    }

    /// `outcome` of a write, flush or shutdown, watched for progress ([`WriteTimeout`]) and, while it
    /// waits, for the cap's claim.
    fn written<T>(&mut self, cx: &mut Context<'_>, outcome: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        let outcome = self.writes.watch(cx, outcome);
        if outcome.is_pending()
            && let Some(error) = self.evicted(cx)
        {
            return Poll::Ready(Err(error));
        }
        outcome
    }
}

impl AsyncWrite for Conn {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let outcome = each!(&mut this.io, s => Pin::new(s).poll_write(cx, buf));
        this.written(cx, outcome)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let outcome = each!(&mut this.io, s => Pin::new(s).poll_write_vectored(cx, bufs));
        this.written(cx, outcome)
    }

    fn is_write_vectored(&self) -> bool {
        each!(&self.io, s => s.is_write_vectored())
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let outcome = each!(&mut this.io, s => Pin::new(s).poll_flush(cx));
        this.written(cx, outcome)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let outcome = each!(&mut this.io, s => Pin::new(s).poll_shutdown(cx));
        this.written(cx, outcome)
    }
}
