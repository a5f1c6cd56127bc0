//! The gRPC listener's connections: TCP (`GRPC_HOST:GRPC_PORT`) or a unix socket (`GRPC_UDS`), plain
//! or TLS (`GRPC_SERVER_USE_TLS`), as one stream of [`Conn`]s for tonic.
//!
//! One accept task per listener. TLS handshakes run in their own tasks, so a client that connects and
//! says nothing holds neither the accept loop nor anyone else's handshake; each has
//! [`HANDSHAKE_TIMEOUT`], and at most [`MAX_HANDSHAKES`] run at once (beyond, accepting waits: the
//! kernel's backlog holds the rest).

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::{Semaphore, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::{Connected, TcpConnectInfo};

use super::tls::ServerTls;
use crate::observe::metrics::Metrics;

/// Longest a TLS handshake may take before the connection is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Most TLS handshakes in progress at once.
const MAX_HANDSHAKES: usize = 256;

/// Pause after an accept error (out of file descriptors, say), so the loop does not spin on it.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(50);

/// Where gRPC is served.
#[derive(Debug)]
pub enum GrpcListener {
    /// A TCP address (`GRPC_HOST:GRPC_PORT`).
    Tcp(TcpListener),
    /// A unix socket (`GRPC_UDS`), removed when the listener is dropped.
    Unix(UnixListener, PathBuf),
}

impl GrpcListener {
    /// The TCP address bound, or `None` on a unix socket.
    pub fn tcp_addr(&self) -> Option<SocketAddr> {
        match self {
            GrpcListener::Tcp(listener) => listener.local_addr().ok(),
            GrpcListener::Unix(..) => None,
        }
    }

    /// Binds a unix socket at `path`, replacing a stale socket file left by a previous run (as the Go
    /// service does); any other kind of file there is an error.
    pub fn bind_unix(path: PathBuf) -> io::Result<Self> {
        use std::os::unix::fs::FileTypeExt as _;
        if let Ok(meta) = std::fs::symlink_metadata(&path)
            && meta.file_type().is_socket()
        {
            std::fs::remove_file(&path)?;
        }
        Ok(GrpcListener::Unix(UnixListener::bind(&path)?, path))
    }

    async fn accept(&self) -> io::Result<Conn> {
        match self {
            GrpcListener::Tcp(listener) => {
                let (stream, _) = listener.accept().await?;
                // tonic sets TCP_NODELAY only on listeners it binds itself; without it a response
                // written while an earlier one is unacknowledged waits for the client's delayed ACK
                // (40 ms on Linux), which showed as a 41 ms p99.9 whenever responses left in bursts.
                stream.set_nodelay(true)?;
                Ok(Conn::Tcp(stream))
            }
            GrpcListener::Unix(listener, _) => Ok(Conn::Unix(listener.accept().await?.0)),
        }
    }
}

impl Drop for GrpcListener {
    fn drop(&mut self) {
        if let GrpcListener::Unix(_, path) = self {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// One accepted gRPC connection.
#[derive(Debug)]
pub enum Conn {
    /// Plain TCP.
    Tcp(TcpStream),
    /// TLS over TCP.
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
    /// A unix socket.
    Unix(UnixStream),
}

/// Accepts connections on `listener` (with TLS when `tls` is given) until the returned stream is
/// dropped, which tonic does when it stops serving.
pub(super) fn incoming(
    listener: GrpcListener,
    tls: Option<Arc<ServerTls>>,
    metrics: Arc<Metrics>,
) -> ReceiverStream<io::Result<Conn>> {
    let (sender, receiver) = mpsc::channel(MAX_HANDSHAKES);
    tokio::spawn(accept_loop(listener, tls, metrics, sender));
    ReceiverStream::new(receiver)
}

async fn accept_loop(
    listener: GrpcListener,
    tls: Option<Arc<ServerTls>>,
    metrics: Arc<Metrics>,
    sender: mpsc::Sender<io::Result<Conn>>,
) {
    let handshakes = Arc::new(Semaphore::new(MAX_HANDSHAKES));
    loop {
        let accepted = tokio::select! {
            _ = sender.closed() => return,
            accepted = listener.accept() => accepted,
        };
        let conn = match accepted {
            Ok(conn) => conn,
            Err(error) => {
                tracing::warn!(%error, "gRPC listener cannot accept a connection");
                tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                continue;
            }
        };
        let (tls, tcp) = match (&tls, conn) {
            (Some(tls), Conn::Tcp(tcp)) => (tls, tcp),
            (_, conn) => {
                if sender.send(Ok(conn)).await.is_err() {
                    return;
                }
                continue;
            }
        };
        let Ok(permit) = Arc::clone(&handshakes).acquire_owned().await else {
            return;
        };
        let acceptor = tokio_rustls::TlsAcceptor::from(tls.config());
        let (sender, metrics) = (sender.clone(), Arc::clone(&metrics));
        tokio::spawn(async move {
            let peer = tcp.peer_addr().ok();
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(stream)) => {
                    drop(permit);
                    let _ = sender.send(Ok(Conn::Tls(Box::new(stream)))).await;
                }
                Ok(Err(error)) => {
                    metrics.tls_handshake_failures.add(1);
                    tracing::debug!(?peer, %error, "gRPC TLS handshake refused");
                }
                Err(_) => {
                    metrics.tls_handshake_failures.add(1);
                    tracing::debug!(?peer, "gRPC TLS handshake timed out");
                }
            }
        });
    }
}

impl Connected for Conn {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        let tcp = match self {
            Conn::Tcp(tcp) => tcp,
            Conn::Tls(tls) => tls.get_ref().0,
            Conn::Unix(_) => {
                return TcpConnectInfo {
                    local_addr: None,
                    remote_addr: None,
                };
            }
        };
        TcpConnectInfo {
            local_addr: tcp.local_addr().ok(),
            remote_addr: tcp.peer_addr().ok(),
        }
    }
}

/// Runs `$call` on whichever stream `$self` holds.
macro_rules! each {
    ($self:ident, $stream:ident => $call:expr) => {
        match $self.get_mut() {
            Conn::Tcp($stream) => $call,
            Conn::Tls($stream) => $call,
            Conn::Unix($stream) => $call,
        }
    };
}

impl AsyncRead for Conn {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        each!(self, s => Pin::new(s).poll_read(cx, buf))
    }
}

impl AsyncWrite for Conn {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        each!(self, s => Pin::new(s).poll_write(cx, buf))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        each!(self, s => Pin::new(s).poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Conn::Tcp(s) => s.is_write_vectored(),
            Conn::Tls(s) => s.is_write_vectored(),
            Conn::Unix(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        each!(self, s => Pin::new(s).poll_flush(cx))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        each!(self, s => Pin::new(s).poll_shutdown(cx))
    }
}
