//! Tower layers that ask Tollgate before every request of a service: HTTP services (axum, hyper, ...)
//! get `429 Too Many Requests` with `Retry-After`, gRPC services (tonic) get `RESOURCE_EXHAUSTED` with
//! a `google.rpc.RetryInfo` detail. Generic over the bodies, so any `http` based stack fits.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{HeaderName, HeaderValue, Request, Response, StatusCode};
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

use crate::client::Client;
use crate::decision::whole_seconds;
use crate::descriptor::Descriptor;
use crate::error::Error;
use crate::lease::Acquired;

/// How the wrapped service speaks, hence how a refusal is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Protocol {
    Http,
    Grpc,
}

/// What the layer asks before the service runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Guard {
    /// A check that consumes one unit.
    Check,
    /// A concurrency lease held while the service handles the request.
    Lease,
}

/// A tower layer that asks Tollgate before each request whose descriptors `describe` returns (`None`
/// lets a request through unchecked).
///
/// - Allowed: the request runs, and its response carries the server's rate-limit headers.
/// - Refused: HTTP `429` with `Retry-After` (whole seconds, rounded up) and the server's headers, or
///   with [`RateLimitLayer::grpc`] the gRPC status `RESOURCE_EXHAUSTED` with a `RetryInfo` detail.
/// - Tollgate cannot be asked: the client's [`FailurePolicy`](crate::FailurePolicy) decides; closed
///   answers HTTP `503` / gRPC `UNAVAILABLE`.
/// - Tollgate rejects the check (an unknown domain, malformed descriptors): HTTP `500` / gRPC
///   `INTERNAL`, logged, since that is a configuration to fix.
///
/// ```no_run
/// use axum::{Router, routing::post};
/// use tollgate_client::{Client, Descriptor, RateLimitLayer};
///
/// # fn app() -> Result<Router, tollgate_client::ConnectError> {
/// let client = Client::connect_lazy("http://127.0.0.1:8081", "api")?;
/// let layer = RateLimitLayer::new(client, |request: &axum::http::Request<axum::body::Body>| {
///     let user = request.headers().get("x-user-id")?.to_str().ok()?;
///     Some(vec![Descriptor::from([("user_id", user)])])
/// });
/// Ok(Router::new().route("/search", post(|| async { "results" })).layer(layer))
/// # }
/// ```
pub struct RateLimitLayer<F> {
    client: Client,
    describe: Arc<F>,
    protocol: Protocol,
    guard: Guard,
}

impl<F> RateLimitLayer<F> {
    /// Checks (one unit) each request `describe` gives descriptors for, answering refusals as HTTP.
    pub fn new(client: Client, describe: F) -> Self {
        Self {
            client,
            describe: Arc::new(describe),
            protocol: Protocol::Http,
            guard: Guard::Check,
        }
    }

    /// Answers as a gRPC service: for tonic's `Server::builder().layer(..)` or a single service.
    pub fn grpc(mut self) -> Self {
        self.protocol = Protocol::Grpc;
        self
    }

    /// Caps requests in flight instead of their rate: each request takes a lease of its descriptors'
    /// `concurrency` rules before it runs and gives it back (in the background) once its response is
    /// ready. A lease whose release is lost expires after the rule's `lease_ttl`.
    pub fn concurrency(mut self) -> Self {
        self.guard = Guard::Lease;
        self
    }
}

impl<F> Clone for RateLimitLayer<F> {
    fn clone(&self) -> Self {
        Self {
            client: self.client.clone(),
            describe: Arc::clone(&self.describe),
            protocol: self.protocol,
            guard: self.guard,
        }
    }
}

impl<F> std::fmt::Debug for RateLimitLayer<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("client", &self.client)
            .field("protocol", &self.protocol)
            .field("guard", &self.guard)
            .finish_non_exhaustive()
    }
}

impl<S, F> tower::Layer<S> for RateLimitLayer<F> {
    type Service = RateLimited<S, F>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimited {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service [`RateLimitLayer`] wraps around another.
#[derive(Debug, Clone)]
pub struct RateLimited<S, F> {
    inner: S,
    layer: RateLimitLayer<F>,
}

impl<S, F, ReqBody, ResBody> tower::Service<Request<ReqBody>> for RateLimited<S, F>
where
    S: tower::Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    F: Fn(&Request<ReqBody>) -> Option<Vec<Descriptor>> + Send + Sync + 'static,
    ReqBody: Send + 'static,
    ResBody: Default + Send + 'static,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<ResBody>, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        // The clone that was polled ready serves this call; a fresh clone takes its place.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let descriptors = (self.layer.describe)(&request);
        let client = self.layer.client.clone();
        let (protocol, guard) = (self.layer.protocol, self.layer.guard);
        Box::pin(async move {
            let Some(descriptors) = descriptors else {
                return inner.call(request).await;
            };
            match guard {
                Guard::Check => match client.check(&descriptors, 0).await {
                    Ok(decision) if decision.allowed => {
                        let mut response = inner.call(request).await?;
                        add_headers(&mut response, &decision.headers);
                        Ok(response)
                    }
                    Ok(decision) => Ok(refused(protocol, decision.retry_after, &decision.headers)),
                    Err(error) => Ok(failed(protocol, &error)),
                },
                Guard::Lease => match client.acquire(&descriptors).await {
                    // The lease lives until the response is ready, then goes back in the background.
                    Ok(Acquired::Held(_lease)) => inner.call(request).await,
                    Ok(Acquired::Refused { retry_after }) => Ok(refused(protocol, retry_after, &[])),
                    Err(error) => Ok(failed(protocol, &error)),
                },
            }
        })
    }
}

/// The answer to a refused request: `wait` is Tollgate's retry hint, `headers` the rate-limit headers
/// it handed out with the refusal.
fn refused<B: Default>(
    protocol: Protocol,
    wait: Option<Duration>,
    headers: &[(String, String)],
) -> Response<B> {
    let mut response = match protocol {
        Protocol::Http => {
            let mut response = Response::new(B::default());
            *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
            if !headers
                .iter()
                .any(|(name, _)| name.eq_ignore_ascii_case("retry-after"))
            {
                response
                    .headers_mut()
                    .insert(http::header::RETRY_AFTER, HeaderValue::from(whole_seconds(wait)));
            }
            response
        }
        Protocol::Grpc => {
            // RetryInfo carries the exact wait, which gRPC clients and retry policies read; the
            // message says it in seconds for people.
            let wait = wait.unwrap_or(Duration::from_secs(1));
            Status::with_error_details(
                Code::ResourceExhausted,
                format!("rate limited; retry in {}s", whole_seconds(Some(wait))),
                ErrorDetails::with_retry_info(Some(wait)),
            )
            .into_http()
        }
    };
    add_headers(&mut response, headers);
    response
}

/// The answer when Tollgate gave none: closed policy, or a check it rejected.
fn failed<B: Default>(protocol: Protocol, error: &Error) -> Response<B> {
    let unavailable = error.is_unavailable();
    if !unavailable {
        tracing::error!(%error, "Tollgate rejected the layer's check: fix the domain or the descriptors");
    }
    match (protocol, unavailable) {
        (Protocol::Http, true) => status_only(StatusCode::SERVICE_UNAVAILABLE),
        (Protocol::Http, false) => status_only(StatusCode::INTERNAL_SERVER_ERROR),
        (Protocol::Grpc, true) => Status::unavailable("rate limiter unavailable").into_http(),
        (Protocol::Grpc, false) => Status::internal("rate limiter rejected the check").into_http(),
    }
}

fn status_only<B: Default>(status: StatusCode) -> Response<B> {
    let mut response = Response::new(B::default());
    *response.status_mut() = status;
    response
}

fn add_headers<B>(response: &mut Response<B>, headers: &[(String, String)]) {
    for (name, value) in headers {
        // The server sends well-formed headers; one that is not is skipped rather than failing the
        // request.
        if let (Ok(name), Ok(value)) = (HeaderName::try_from(name.as_str()), HeaderValue::from_str(value)) {
            response.headers_mut().append(name, value);
        }
    }
}
