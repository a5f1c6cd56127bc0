//! A TCP proxy that puts network faults between Tollgate and a real `redis-server`: replies made
//! slower, a blackhole, connections reset or refused, replies cut off mid-way.
//!
//! It runs on its own thread and runtime, so the faults it makes are not slowed by the load the test
//! puts on the runtime under test. A blackhole holds bytes rather than dropping them, as TCP does
//! when packets are lost: they arrive once the path heals (and a Redis command sent into it then
//! runs), unless the connection is reset first.

use std::net::TcpListener as StdListener;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// The faults in force. Connections compare the epochs with the ones they were born with.
#[derive(Debug, Clone, Copy, Default)]
struct Faults {
    /// Added to every reply chunk (requests go through at once).
    delay: Duration,
    /// Nothing moves either way; bytes are held until the path heals.
    blackhole: bool,
    /// New connections are reset as soon as they are accepted.
    refuse: bool,
    /// Bumped to reset every connection open at the time.
    reset_epoch: u64,
    /// Bumped to cut the next reply of every connection open at the time half-way, then reset it.
    cut_epoch: u64,
}

/// A fault proxy in front of `127.0.0.1:upstream`. Stopped on drop.
pub struct FaultProxy {
    pub port: u16,
    faults: watch::Sender<Faults>,
    stop: CancellationToken,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FaultProxy {
    /// Starts relaying a free loopback port to `upstream`.
    pub fn start(upstream: u16) -> Self {
        let listener = StdListener::bind("127.0.0.1:0").expect("bind the proxy");
        listener.set_nonblocking(true).expect("non-blocking listener");
        let port = listener.local_addr().expect("proxy address").port();
        let (faults, watching) = watch::channel(Faults::default());
        let stop = CancellationToken::new();
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("proxy runtime");
            runtime.block_on(async move {
                let listener = TcpListener::from_std(listener).expect("tokio listener");
                loop {
                    let client = tokio::select! {
                        _ = stopped.cancelled() => return,
                        accepted = listener.accept() => match accepted {
                            Ok((client, _)) => client,
                            Err(_) => continue,
                        },
                    };
                    tokio::spawn(relay(client, upstream, watching.clone(), stopped.child_token()));
                }
            });
        });
        Self {
            port,
            faults,
            stop,
            thread: Some(thread),
        }
    }

    /// `redis://` URL of the proxy.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Every reply reaches the client `by` later than Redis sent it (0 heals).
    pub fn delay_replies(&self, by: Duration) {
        self.faults.send_modify(|f| f.delay = by);
    }

    /// Nothing passes either way until [`FaultProxy::heal`].
    pub fn blackhole(&self) {
        self.faults.send_modify(|f| f.blackhole = true);
    }

    /// Resets every open connection and every new one until [`FaultProxy::heal`].
    pub fn reset_and_refuse(&self) {
        self.faults.send_modify(|f| {
            f.refuse = true;
            f.reset_epoch += 1;
        });
    }

    /// Every open connection gets half of its next reply, then a reset.
    pub fn cut_replies(&self) {
        self.faults.send_modify(|f| f.cut_epoch += 1);
    }

    /// No delay, no blackhole, new connections accepted (held bytes flow again).
    pub fn heal(&self) {
        self.faults.send_modify(|f| {
            f.delay = Duration::ZERO;
            f.blackhole = false;
            f.refuse = false;
        });
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.stop.cancel();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Relays one client connection until either side closes, a fault ends it, or the proxy stops.
async fn relay(client: TcpStream, upstream: u16, faults: watch::Receiver<Faults>, done: CancellationToken) {
    // Linger 0: every close below is a reset, as a crashed peer or a middlebox would send.
    let _ = client.set_zero_linger();
    let born = *faults.borrow();
    if born.refuse {
        return;
    }
    let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await else {
        return;
    };
    let _ = server.set_zero_linger();
    let _ = (client.set_nodelay(true), server.set_nodelay(true));
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let mut reset = faults.clone();
    let reset = async move {
        while reset.borrow_and_update().reset_epoch == born.reset_epoch {
            if reset.changed().await.is_err() {
                return;
            }
        }
    };
    tokio::select! {
        _ = async {
            tokio::join!(
                pipe(client_read, server_write, faults.clone(), born, false, done.clone()),
                pipe(server_read, client_write, faults, born, true, done.clone()),
            )
        } => {}
        _ = done.cancelled() => {}
        _ = reset => {}
    }
    done.cancel();
}

/// Moves bytes one way: read at once, written when due (the reply delay) and the path is open.
async fn pipe(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    faults: watch::Receiver<Faults>,
    born: Faults,
    replies: bool,
    done: CancellationToken,
) {
    let (due, mut queued) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let reading = faults.clone();
    let reader = async move {
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n @ 1..) = from.read(&mut buf).await {
            let delay = if replies {
                reading.borrow().delay
            } else {
                Duration::ZERO
            };
            if due.send((Instant::now() + delay, buf[..n].to_vec())).is_err() {
                return;
            }
        }
    };
    let mut writing = faults;
    let writer = async move {
        while let Some((at, chunk)) = queued.recv().await {
            tokio::time::sleep_until(at).await;
            while writing.borrow_and_update().blackhole {
                if writing.changed().await.is_err() {
                    return;
                }
            }
            if replies && writing.borrow().cut_epoch != born.cut_epoch {
                let _ = to.write_all(&chunk[..chunk.len() / 2]).await;
                return;
            }
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
    };
    // The writer ends the connection when a fault or an error stops it; a clean EOF drains first.
    tokio::join!(reader, async {
        writer.await;
        done.cancel();
    });
}
