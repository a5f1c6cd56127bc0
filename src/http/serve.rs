//! Serves a router on an HTTP listener (HTTP/1.1, as the Go service's ports), within the bounds
//! `axum::serve` lacks: at most a set number of connections open, shared by source address, where one
//! that has sent nothing but health checks gives way first ([`ConnectionCap`]); request heads of at
//! most `TOLLGATE_HTTP_MAX_HEADER_BYTES` and [`MAX_HEADERS`] headers (431 beyond), which must arrive
//! within the read timeout, which also closes a keep-alive connection idle that long (hyper starts the
//! timer when it waits for a request's first byte); answers that must make progress within the write
//! timeout ([`crate::write_timeout`]); and each request body spending its share of the process's budget
//! of unfinished bytes ([`crate::inflight`]). A body refused by the budget or the timeout fails to
//! buffer, and the handler answers 400 naming the reason.
//!
//! Pipelined requests are served one at a time, and what a connection sends ahead is read into a
//! buffer no larger than the head bound; hyper takes a next request only while the answers waiting to
//! be written hold less than that bound too. So however many requests a client pipelines, the server
//! holds at most about twice the bound for it (plus one answer larger than that, a `/metrics`), and
//! answers nobody reads end the connection at the write timeout.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::Service as _;

use crate::connections::{ACCEPT_ERROR_PAUSE, ConnectionCap, RateLimitedLog, source_of};
use crate::inflight::RequestBudget;
use crate::server_counters::ServerCounters;
use crate::write_timeout::{Watched, WriteTimeout};

/// Most headers in a request; more is answered 431. hyper's own default, set here so that it is a
/// stated bound: it parses up to this many on the stack, and more would cost an allocation per request.
/// Envoy's default is the same.
const MAX_HEADERS: usize = 100;

/// The least hyper accepts as its buffer bound.
const MIN_BUFFER_BYTES: usize = 8 << 10;

/// What one HTTP listener admits.
#[derive(Debug, Clone)]
pub struct HttpLimits {
    /// Most connections open at once.
    pub max_connections: usize,
    /// Largest request head, in bytes (`TOLLGATE_HTTP_MAX_HEADER_BYTES`).
    pub max_header_bytes: usize,
    /// How long an answer may make no progress (`TOLLGATE_WRITE_TIMEOUT`).
    pub write_timeout: Duration,
    /// The request-bytes budget and read timeout, shared with the other listeners.
    pub budget: RequestBudget,
}

/// Serves `router` on `listener` until `stop` is cancelled, then lets requests in progress finish
/// (closing idle connections at once) and returns. `what` names the listener in logs.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: HttpLimits,
    what: &'static str,
    metrics: Arc<ServerCounters>,
    stop: CancellationToken,
) {
    let mut cap = ConnectionCap::new(limits.max_connections, what, Arc::clone(&metrics));
    let mut errors = RateLimitedLog::default();
    let mut http1 = hyper::server::conn::http1::Builder::new();
    http1
        .timer(TokioTimer::new())
        .header_read_timeout(limits.budget.read_timeout())
        .max_header_size(limits.max_header_bytes)
        // The read buffer, which also holds what a client pipelines ahead.
        .max_buf_size(limits.max_header_bytes.max(MIN_BUFFER_BYTES))
        .max_headers(MAX_HEADERS);
    let connections = TaskTracker::new();
    loop {
        let accepted = tokio::select! {
            () = stop.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        let (tcp, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                errors.warn("listener cannot accept a connection", &what, error);
                tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                continue;
            }
        };
        let Some(slot) = cap.admit(source_of(Some(peer))) else {
            continue;
        };
        // As on the gRPC port: `/json` and `/v1/*` answers must not wait for a delayed ACK.
        if let Err(error) = tcp.set_nodelay(true) {
            tracing::debug!(%error, "cannot set TCP_NODELAY on an HTTP connection");
        }
        let (budget, router, slot) = (limits.budget.clone(), router.clone(), Arc::new(slot));
        let connection_budget = budget.connection();
        let held = Arc::clone(&slot);
        let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
            if !slot.in_use() && !super::is_health_check(request.uri().path()) {
                // In use: not the one to give way to its own address's next connection.
                slot.request();
            }
            let request = request.map(|body| axum::body::Body::new(budget.wrap(body, &connection_budget)));
            // A Router is always ready, so it is called without waiting on `poll_ready`.
            router.clone().call(request)
        });
        let writes = WriteTimeout::new(limits.write_timeout, Arc::clone(&metrics));
        let connection = http1.serve_connection(TokioIo::new(Watched::new(tcp, writes)), service);
        let (stop, metrics) = (stop.clone(), Arc::clone(&metrics));
        connections.spawn(async move {
            tokio::pin!(connection);
            let served = tokio::select! {
                served = connection.as_mut() => served,
                // Another connection took this one's place at the cap: closed at once.
                () = held.evicted() => return,
                () = stop.cancelled() => {
                    connection.as_mut().graceful_shutdown();
                    connection.await
                }
            };
            if let Err(error) = served {
                if error.is_timeout() {
                    metrics.connections_timed_out.add(1);
                }
                tracing::debug!(%error, listener = what, "HTTP connection ended");
            }
        });
    }
    connections.close();
    connections.wait().await;
}
