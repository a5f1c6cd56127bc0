//! The gRPC listener's transport bounds: the largest request message it decodes, the streams one
//! connection may have open at once, and how long a connection lives (see [`GrpcLimits`]).
//!
//! tonic refuses a message above the limit from its 5-byte frame header, before reading or decoding
//! the body, but answers `OUT_OF_RANGE`; gRPC's own servers (grpc-go, grpc-java) answer
//! `RESOURCE_EXHAUSTED`, which is what clients and dashboards expect for "too big".
//! [`ResourceExhausted`] rewrites exactly that answer and nothing else.

use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::TryFutureExt as _;
use futures_util::future::MapOk;
use tonic::codegen::http::{HeaderValue, Request, Response};

use std::sync::Arc;

use crate::inflight::{ConnectionBudget, RequestBudget};
use crate::server_counters::ServerCounters;

/// Bounds on what one client can make the gRPC listener hold.
#[derive(Debug, Clone)]
pub struct GrpcLimits {
    /// Largest request message decoded; a larger one is `RESOURCE_EXHAUSTED`.
    pub max_message_bytes: usize,
    /// HTTP/2 streams one connection may have open at once (`SETTINGS_MAX_CONCURRENT_STREAMS`).
    pub max_concurrent_streams: u32,
    /// `GRPC_MAX_CONNECTION_AGE`: a connection older than this is sent GOAWAY (`None`: never).
    pub max_connection_age: Option<Duration>,
    /// `GRPC_MAX_CONNECTION_AGE_GRACE`: how long calls in flight may finish after the GOAWAY.
    pub max_connection_age_grace: Duration,
    /// Most connections open at once (`TOLLGATE_MAX_CONNECTIONS`).
    pub max_connections: usize,
    /// Most TLS handshakes in progress from one client address (`TOLLGATE_TLS_HANDSHAKES_PER_CLIENT`).
    pub handshakes_per_client: usize,
    /// How long a connection may send no request before it is back on probation
    /// (`TOLLGATE_IDLE_CONNECTION_PROBATION`).
    pub idle_probation: Duration,
    /// How long a connection's writes may make no progress before it is closed
    /// (`TOLLGATE_WRITE_TIMEOUT`).
    pub write_timeout: Duration,
    /// The bytes unfinished requests may hold, and how long a request may take to arrive.
    pub budget: RequestBudget,
    /// Where the connections these bounds close, and the TLS handshakes that fail, are counted.
    pub counters: Arc<ServerCounters>,
}

/// Answers tonic's "decoded message length too large" (`OUT_OF_RANGE`) as `RESOURCE_EXHAUSTED`.
#[derive(Debug, Clone)]
pub(crate) struct ResourceExhausted<S>(pub(crate) S);

impl<S, B, R> tower::Service<Request<B>> for ResourceExhausted<S>
where
    S: tower::Service<Request<B>, Response = Response<R>>,
{
    type Response = Response<R>;
    type Error = S::Error;
    type Future = MapOk<S::Future, fn(Response<R>) -> Response<R>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        self.0
            .call(request)
            .map_ok(rewrite as fn(Response<R>) -> Response<R>)
    }
}

/// gRPC status codes, as the `grpc-status` header carries them.
const OUT_OF_RANGE: &str = "11";
const RESOURCE_EXHAUSTED: &str = "8";

/// The start of tonic's message for an oversized request, percent-encoded as `grpc-message` carries it.
const TOO_LARGE: &str = "Error,%20decoded%20message%20length%20too%20large";

fn rewrite<R>(mut response: Response<R>) -> Response<R> {
    let headers = response.headers_mut();
    let oversized = headers.get("grpc-status").is_some_and(|s| s == OUT_OF_RANGE)
        && headers
            .get("grpc-message")
            .and_then(|m| m.to_str().ok())
            .is_some_and(|m| m.starts_with(TOO_LARGE));
    if oversized {
        headers.insert("grpc-status", HeaderValue::from_static(RESOURCE_EXHAUSTED));
    }
    response
}

/// The path prefix of `grpc.health.v1.Health`'s calls.
const HEALTH_PATH: &str = "/grpc.health.v1.Health/";

/// Wraps every request's body in its connection's share of the request-bytes budget
/// ([`crate::inflight`]); the connection's budget comes with the request, from [`super::incoming`].
#[derive(Debug, Clone)]
pub(crate) struct Budget<S> {
    pub(crate) inner: S,
    pub(crate) budget: RequestBudget,
}

impl<S, R> tower::Service<Request<tonic::body::Body>> for Budget<S>
where
    S: tower::Service<Request<tonic::body::Body>, Response = Response<R>>,
{
    type Response = Response<R>;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<tonic::body::Body>) -> Self::Future {
        let info = request.extensions().get::<super::ConnInfo>();
        if let Some(info) = info
            && !request.uri().path().starts_with(HEALTH_PATH)
        {
            // A request: the connection is in use, not a candidate to give way at the cap. A health
            // check alone does not make it one, or checks would hold slots for nothing.
            info.slot.request();
        }
        let connection = info.map(|info| info.budget.clone());
        // A connection not accepted by `incoming` (none today) gets a budget of its own per request.
        let connection: ConnectionBudget = connection.unwrap_or_else(|| self.budget.connection());
        let budget = self.budget.clone();
        let request = request.map(|body| tonic::body::Body::new(budget.wrap(body, &connection)));
        self.inner.call(request)
    }
}
