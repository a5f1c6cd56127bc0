//! Serves a router on an HTTP listener (HTTP/1.1, as the Go service's ports), within the bounds
//! `axum::serve` lacks: at most a set number of connections open, where one that has not sent a request
//! gives way to a new one ([`ConnectionCap`]); request headers
//! that must arrive within the read timeout, which also closes a keep-alive connection idle that long
//! (hyper starts the timer when it waits for a request's first byte); and each request body spending
//! its share of the process's budget of unfinished bytes ([`crate::inflight`]). A body refused by the
//! budget or the timeout fails to buffer, and the handler answers 400 naming the reason.

use std::sync::Arc;

use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tollgate_core::observe::metrics::Metrics;
use tower::Service as _;

use crate::connections::{ACCEPT_ERROR_PAUSE, ConnectionCap, RateLimitedLog};
use crate::inflight::RequestBudget;

/// What one HTTP listener admits.
#[derive(Debug, Clone)]
pub struct HttpLimits {
    /// Most connections open at once.
    pub max_connections: usize,
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
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) {
    let mut cap = ConnectionCap::new(limits.max_connections, what, Arc::clone(&metrics));
    let mut errors = RateLimitedLog::default();
    let mut http1 = hyper::server::conn::http1::Builder::new();
    http1
        .timer(TokioTimer::new())
        .header_read_timeout(limits.budget.read_timeout());
    let connections = TaskTracker::new();
    loop {
        let accepted = tokio::select! {
            () = stop.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        let tcp = match accepted {
            Ok((tcp, _)) => tcp,
            Err(error) => {
                errors.warn("listener cannot accept a connection", &what, error);
                tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                continue;
            }
        };
        let Some(slot) = cap.admit() else {
            continue;
        };
        // As on the gRPC port: `/json` and `/v1/*` answers must not wait for a delayed ACK.
        if let Err(error) = tcp.set_nodelay(true) {
            tracing::debug!(%error, "cannot set TCP_NODELAY on an HTTP connection");
        }
        let (budget, router, slot) = (limits.budget.clone(), router.clone(), Arc::new(slot));
        let connection_budget = budget.connection();
        let evicted = slot.evicted().clone();
        let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
            slot.prove();
            let request = request.map(|body| axum::body::Body::new(budget.wrap(body, &connection_budget)));
            // A Router is always ready, so it is called without waiting on `poll_ready`.
            router.clone().call(request)
        });
        let connection = http1.serve_connection(TokioIo::new(tcp), service);
        let (stop, metrics) = (stop.clone(), Arc::clone(&metrics));
        connections.spawn(async move {
            tokio::pin!(connection);
            let served = tokio::select! {
                served = connection.as_mut() => served,
                // Before its first request's headers only (a proven slot is never evicted).
                () = evicted.cancelled() => return,
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
