//! Bounds on what unfinished requests can make the server hold, on the gRPC and the HTTP listeners
//! alike: the bytes of request bodies received but not yet complete, per connection and for the whole
//! process, and how long a request may take to arrive. (How many connections each listener holds is
//! [`crate::connections`].)
//!
//! A client that opens many streams and sends all but the last byte of a large message on each would
//! otherwise make the server buffer every one of them (the HTTP/2 flow-control window is handed back as
//! the body is read, so it does not bound what the decoder accumulates): measured at about 1 GiB per
//! connection. Every request body is wrapped in [`Budgeted`], which spends one unit of its connection's
//! budget and of the process's per byte received while the body is still incomplete, gives them back
//! when it completes (or is dropped), and fails the request once either budget is spent
//! (`RESOURCE_EXHAUSTED`, counted in `tollgate_request_bytes_over_budget_total`) or once the request has
//! taken longer than the read timeout to arrive (`DEADLINE_EXCEEDED`,
//! `tollgate_request_read_timeouts_total`). The budget is only ever held by requests still arriving: a
//! request whose body comes in one frame (every one Envoy sends) spends nothing, so clients holding the
//! whole budget delay no such request.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::sync::Semaphore;
use tokio::time::Sleep;
use tonic::Status;

use crate::server_counters::ServerCounters;

/// The budgets and the read timeout, shared by every connection of the process.
#[derive(Debug, Clone)]
pub struct RequestBudget {
    process: Arc<Semaphore>,
    per_connection: usize,
    read_timeout: Duration,
    metrics: Arc<ServerCounters>,
}

/// One connection's share: bytes its unfinished requests may hold at once.
#[derive(Debug, Clone)]
pub struct ConnectionBudget(Arc<Semaphore>);

impl RequestBudget {
    /// `process` bytes of unfinished requests for the whole process, `per_connection` for each
    /// connection, and `read_timeout` for a request to arrive whole; refusals are counted in `metrics`.
    pub fn new(
        process: usize,
        per_connection: usize,
        read_timeout: Duration,
        metrics: Arc<ServerCounters>,
    ) -> Self {
        Self {
            process: Arc::new(Semaphore::new(process.min(Semaphore::MAX_PERMITS))),
            per_connection,
            read_timeout,
            metrics,
        }
    }

    /// How long a request may take to arrive (also a new connection's first request).
    pub fn read_timeout(&self) -> Duration {
        self.read_timeout
    }

    /// A new connection's budget.
    pub fn connection(&self) -> ConnectionBudget {
        ConnectionBudget(Arc::new(Semaphore::new(
            self.per_connection.min(Semaphore::MAX_PERMITS),
        )))
    }

    /// `body`, spending `connection`'s budget and the process's while it arrives.
    pub fn wrap<B>(&self, body: B, connection: &ConnectionBudget) -> Budgeted<B> {
        Budgeted {
            inner: body,
            process: Arc::clone(&self.process),
            connection: Arc::clone(&connection.0),
            held: 0,
            started: tokio::time::Instant::now(),
            deadline: None,
            read_timeout: self.read_timeout,
            metrics: Arc::clone(&self.metrics),
            complete: false,
        }
    }
}

/// A request body that spends a budget while it arrives; see the module's comment.
#[derive(Debug)]
pub struct Budgeted<B> {
    inner: B,
    process: Arc<Semaphore>,
    connection: Arc<Semaphore>,
    /// Bytes received and not yet given back.
    held: u32,
    /// When the request's headers arrived: the read timeout counts from here.
    started: tokio::time::Instant,
    /// The timer, made only once the body has to be waited for: most bodies are there at the first
    /// poll, and a timer per request would be an allocation and a timer-wheel entry on the hot path.
    deadline: Option<Pin<Box<Sleep>>>,
    read_timeout: Duration,
    metrics: Arc<ServerCounters>,
    complete: bool,
}

impl<B> Budgeted<B> {
    /// Gives back what the body holds.
    fn release(&mut self) {
        let held = std::mem::take(&mut self.held) as usize;
        if held > 0 {
            self.process.add_permits(held);
            self.connection.add_permits(held);
        }
    }

    /// Spends `bytes` of both budgets, or says which one is spent.
    fn spend(&mut self, bytes: usize) -> Result<(), &'static str> {
        let Ok(bytes) = u32::try_from(bytes) else {
            return Err("a frame larger than any budget");
        };
        let connection = self
            .connection
            .try_acquire_many(bytes)
            .map_err(|_| "this connection's unfinished requests hold their budget of bytes")?;
        let process = self
            .process
            .try_acquire_many(bytes)
            .map_err(|_| "the server's unfinished requests hold its budget of bytes")?;
        connection.forget();
        process.forget();
        self.held = self.held.saturating_add(bytes);
        Ok(())
    }
}

impl<B> Drop for Budgeted<B> {
    fn drop(&mut self) {
        self.release();
    }
}

impl<B> Body for Budgeted<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = &mut *self;
        if this.complete {
            return Poll::Ready(None);
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                // A frame that completes the body is not charged: it is already here, and the request
                // is decoded next. So a request that arrives whole (Envoy's, in one frame) never waits
                // on a budget that unfinished requests hold.
                if this.inner.is_end_stream() {
                    this.complete = true;
                    this.release();
                    return Poll::Ready(Some(Ok(frame)));
                }
                let bytes = frame.data_ref().map_or(0, Bytes::len);
                if let Err(spent) = this.spend(bytes) {
                    this.metrics.request_bytes_over_budget.add(1);
                    this.release();
                    this.complete = true;
                    return Poll::Ready(Some(Err(Status::resource_exhausted(format!(
                        "request refused: {spent}"
                    )))));
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(error))) => {
                this.release();
                this.complete = true;
                Poll::Ready(Some(Err(Status::from_error(error.into()))))
            }
            Poll::Ready(None) => {
                this.complete = true;
                this.release();
                Poll::Ready(None)
            }
            Poll::Pending => {
                let (started, timeout) = (this.started, this.read_timeout);
                let deadline = this
                    .deadline
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(started + timeout)));
                if deadline.as_mut().poll(cx).is_ready() {
                    this.metrics.request_read_timeouts.add(1);
                    this.release();
                    this.complete = true;
                    return Poll::Ready(Some(Err(Status::deadline_exceeded(format!(
                        "request not received whole within {:?}",
                        this.read_timeout
                    )))));
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.complete || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt as _, StreamBody};

    /// One frame of a test body.
    type Chunk = Result<Frame<Bytes>, Status>;

    fn budget(process: usize, per_connection: usize) -> RequestBudget {
        RequestBudget::new(
            process,
            per_connection,
            Duration::from_secs(10),
            ServerCounters::new(),
        )
    }

    fn chunks(sizes: &[usize]) -> StreamBody<futures_util::stream::Iter<std::vec::IntoIter<Chunk>>> {
        let frames: Vec<_> = sizes
            .iter()
            .map(|n| Ok(Frame::data(Bytes::from(vec![0u8; *n]))))
            .collect();
        StreamBody::new(futures_util::stream::iter(frames))
    }

    #[tokio::test]
    async fn a_complete_body_gives_its_bytes_back() {
        let budget = budget(100, 60);
        let connection = budget.connection();
        let body = budget.wrap(chunks(&[30, 30]), &connection);
        let collected = body.collect().await.expect("fits").to_bytes();
        assert_eq!(collected.len(), 60);
        assert_eq!(connection.0.available_permits(), 60, "given back");
        assert_eq!(budget.process.available_permits(), 100);
    }

    #[tokio::test]
    async fn a_body_that_arrives_in_one_frame_spends_nothing_even_when_the_budget_is_spent() {
        let budget = budget(100, 60);
        let connection = budget.connection();
        let mut holding = budget.wrap(chunks(&[60, 60]), &connection);
        assert!(holding.frame().await.expect("a frame").is_ok());
        let whole = http_body_util::Full::new(Bytes::from(vec![0u8; 1000]));
        let collected = budget.wrap(whole, &connection).collect().await.expect("served");
        assert_eq!(collected.to_bytes().len(), 1000);
        assert_eq!(budget.metrics.request_bytes_over_budget.get(), 0);
    }

    #[tokio::test]
    async fn unfinished_bodies_stop_at_the_connection_budget_then_the_process_budget() {
        let budget = budget(100, 60);
        let (one, two) = (budget.connection(), budget.connection());
        // Held while unfinished: a body that is never completed keeps its bytes until dropped.
        let mut first = budget.wrap(chunks(&[50, 50]), &one);
        assert!(first.frame().await.expect("a frame").is_ok());
        let refused = budget
            .wrap(chunks(&[20]), &one)
            .collect()
            .await
            .expect_err("over 60");
        assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
        let mut other = budget.wrap(chunks(&[40, 40]), &two);
        assert!(
            other.frame().await.expect("a frame").is_ok(),
            "another connection's budget"
        );
        let refused = budget
            .wrap(chunks(&[20]), &budget.connection())
            .collect()
            .await
            .expect_err("over 100");
        assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
        assert_eq!(budget.metrics.request_bytes_over_budget.get(), 2);
        drop((first, other));
        assert_eq!(
            budget.process.available_permits(),
            100,
            "dropped bodies give back"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_does_not_arrive_in_time_fails() {
        let budget = budget(100, 100);
        let connection = budget.connection();
        let never = futures_util::stream::pending::<Result<Frame<Bytes>, Status>>();
        let body = budget.wrap(StreamBody::new(never), &connection);
        let error = body.collect().await.expect_err("too slow");
        assert_eq!(error.code(), tonic::Code::DeadlineExceeded);
        assert_eq!(budget.metrics.request_read_timeouts.get(), 1);
    }
}
