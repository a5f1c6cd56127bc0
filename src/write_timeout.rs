//! How long a connection's writes may make no progress, on every listener ([`WriteTimeout`], and
//! [`Watched`] for a stream that has nothing else around it).
//!
//! A client that stops reading its answers (its receive buffer shrunk, thousands of requests pipelined)
//! leaves the server blocked writing to it. Nothing else would ever end that: the read timeout does not
//! start, since the server reads nothing more until the answer is written, and the connection, having
//! sent requests, is in use. So a write, flush or shutdown that has waited `TOLLGATE_WRITE_TIMEOUT`
//! since the connection's last progress fails (`TimedOut`), the connection closes, and
//! `tollgate_connections_stalled_total` counts it. A client that reads slowly keeps its connection, one
//! answer at a time: progress is any byte written.
//!
//! A write accepted at once (nearly every one) costs a branch; the timer is made at a connection's
//! first stall and reset at the later ones, never per write.

use std::future::Future as _;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

use crate::server_counters::ServerCounters;

/// One connection's watch on its writes; see the module's comment.
#[derive(Debug)]
pub struct WriteTimeout {
    after: Duration,
    /// Made at the first stall, reset at each later one.
    timer: Option<Pin<Box<Sleep>>>,
    /// Whether the connection is waiting to write (since the timer's start).
    waiting: bool,
    /// Whether the timeout fired (counted once; every later write fails too).
    stalled: bool,
    metrics: Arc<ServerCounters>,
}

impl WriteTimeout {
    /// Writes may wait `after` for progress; a connection closed for it is counted in `metrics`.
    pub fn new(after: Duration, metrics: Arc<ServerCounters>) -> Self {
        Self {
            after,
            timer: None,
            waiting: false,
            stalled: false,
            metrics,
        }
    }

    /// `outcome` of a write, flush or shutdown, unless the connection has been waiting to write for
    /// the timeout: then an error. On `Pending`, the timer's wake-up is registered with `cx`.
    pub fn watch<T>(&mut self, cx: &mut Context<'_>, outcome: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        if self.stalled {
            return Poll::Ready(Err(stalled()));
        }
        if outcome.is_ready() {
            self.waiting = false;
            return outcome;
        }
        if !self.waiting {
            self.waiting = true;
            let deadline = Instant::now() + self.after;
            match &mut self.timer {
                Some(timer) => timer.as_mut().reset(deadline),
                None => self.timer = Some(Box::pin(tokio::time::sleep_until(deadline))),
            }
        }
        let fired = self
            .timer
            .as_mut()
            .is_some_and(|timer| timer.as_mut().poll(cx).is_ready());
        if !fired {
            return Poll::Pending;
        }
        self.stalled = true;
        self.metrics.connections_stalled.add(1);
        Poll::Ready(Err(stalled()))
    }
}

fn stalled() -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        "no progress writing to the connection within the write timeout (TOLLGATE_WRITE_TIMEOUT)",
    )
}

/// A stream whose writes are watched by a [`WriteTimeout`]; reads pass through.
#[derive(Debug)]
pub struct Watched<S> {
    stream: S,
    writes: WriteTimeout,
}

impl<S> Watched<S> {
    /// `stream`, its writes watched by `writes`.
    pub fn new(stream: S, writes: WriteTimeout) -> Self {
        Self { stream, writes }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let outcome = Pin::new(&mut this.stream).poll_write(cx, buf);
        this.writes.watch(cx, outcome)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let outcome = Pin::new(&mut this.stream).poll_write_vectored(cx, bufs);
        this.writes.watch(cx, outcome)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let outcome = Pin::new(&mut this.stream).poll_flush(cx);
        this.writes.watch(cx, outcome)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let outcome = Pin::new(&mut this.stream).poll_shutdown(cx);
        this.writes.watch(cx, outcome)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt as _;

    #[tokio::test(start_paused = true)]
    async fn a_write_that_waits_past_the_timeout_fails_once_counted() {
        let metrics = ServerCounters::new();
        // A pipe of 64 bytes nobody reads.
        let (near, _far) = tokio::io::duplex(64);
        let mut watched = Watched::new(
            near,
            WriteTimeout::new(Duration::from_secs(3), Arc::clone(&metrics)),
        );
        let started = Instant::now();
        let error = watched.write_all(&[0u8; 1024]).await.expect_err("nobody reads");
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
        assert_eq!(
            started.elapsed(),
            Duration::from_secs(3),
            "at the timeout, not before"
        );
        assert!(watched.write_all(b"more").await.is_err(), "and after it");
        assert_eq!(metrics.connections_stalled.get(), 1, "counted once");
    }

    #[tokio::test(start_paused = true)]
    async fn progress_restarts_the_timeout() {
        let metrics = ServerCounters::new();
        let (near, mut far) = tokio::io::duplex(64);
        let mut watched = Watched::new(
            near,
            WriteTimeout::new(Duration::from_secs(3), Arc::clone(&metrics)),
        );
        // The reader takes 64 bytes every 2 s: each wait is shorter than the timeout.
        let reader = tokio::spawn(async move {
            let mut buffer = [0u8; 64];
            let mut total = 0;
            while total < 1024 {
                tokio::time::sleep(Duration::from_secs(2)).await;
                total += tokio::io::AsyncReadExt::read(&mut far, &mut buffer)
                    .await
                    .expect("read");
            }
        });
        watched
            .write_all(&[0u8; 1024])
            .await
            .expect("slow, never stalled");
        reader.await.expect("reader");
        assert_eq!(metrics.connections_stalled.get(), 0);
    }
}
