//! A client for application servers: ask Tollgate before doing expensive work, and a tower layer that
//! does it for every request of an axum (or any tower) HTTP service.
//!
//! The layer turns a refusal into `429 Too Many Requests` with `Retry-After` (rounded up from
//! Tollgate's retry hint, so never early) and whatever rate-limit headers the server is configured to
//! hand out (`TOLLGATE_RESPONSE_HEADERS`: the IETF `RateLimit`/`RateLimit-Policy` fields, `X-RateLimit-*`,
//! …); allowed responses carry those headers too. If Tollgate cannot be reached the request goes
//! through (fail open) unless the layer is built with [`RateLimitLayer::fail_closed`], and the failure
//! is logged.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderName, HeaderValue, Request, Response, StatusCode};
use tonic::transport::Channel;

use crate::proto::descriptor::RateLimitDescriptor;
use crate::proto::rls::rate_limit_response::Code;
use crate::proto::rls::rate_limit_service_client::RateLimitServiceClient;
use crate::proto::rls::{RateLimitRequest, RateLimitResponse};

/// One descriptor: ordered `(key, value)` entries.
pub type Descriptor = Vec<(String, String)>;

/// Tollgate's answer, in application terms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// Whether the work may go ahead.
    pub allowed: bool,
    /// When refused: how long until the same request could pass (whole seconds, rounded up).
    pub retry_after: Option<Duration>,
    /// Headers the server wants the client to see (name, value).
    pub headers: Vec<(String, String)>,
}

impl Answer {
    fn from_response(response: &RateLimitResponse) -> Self {
        let allowed = response.overall_code != Code::OverLimit as i32;
        let retry_after = (!allowed)
            .then(|| {
                response
                    .statuses
                    .iter()
                    .filter(|s| s.code == Code::OverLimit as i32)
                    .filter_map(|s| s.duration_until_reset.as_ref())
                    .map(|d| u64::try_from(d.seconds).unwrap_or(0) + u64::from(d.nanos > 0))
                    .max()
                    .map(|secs| Duration::from_secs(secs.max(1)))
            })
            .flatten();
        let headers = response
            .response_headers_to_add
            .iter()
            .map(|h| (h.key.clone(), h.value.clone()))
            .collect();
        Self {
            allowed,
            retry_after,
            headers,
        }
    }
}

/// Why [`Client::connect`] failed.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The address is not a URI.
    #[error("invalid Tollgate address {0:?}: {1}")]
    Address(String, String),
    /// Nothing answered there.
    #[error("cannot connect to Tollgate: {0}")]
    Connect(#[source] tonic::transport::Error),
}

/// A connection to Tollgate for one domain. Cheap to clone: clones share the HTTP/2 connection.
#[derive(Debug, Clone)]
pub struct Client {
    inner: RateLimitServiceClient<Channel>,
    domain: String,
}

impl Client {
    /// Connects to `addr` (`http://host:8081`); every check is made in `domain`.
    pub async fn connect(addr: impl Into<String>, domain: impl Into<String>) -> Result<Self, ConnectError> {
        let addr = addr.into();
        let endpoint =
            Channel::from_shared(addr.clone()).map_err(|e| ConnectError::Address(addr, e.to_string()))?;
        let channel = endpoint.connect().await.map_err(ConnectError::Connect)?;
        Ok(Self {
            inner: RateLimitServiceClient::new(channel),
            domain: domain.into(),
        })
    }

    /// Asks whether `descriptors` may proceed, consuming `cost` (0 means 1) from each matching limit.
    pub async fn check(&mut self, descriptors: Vec<Descriptor>, cost: u32) -> Result<Answer, tonic::Status> {
        let request = RateLimitRequest {
            domain: self.domain.clone(),
            descriptors: descriptors
                .into_iter()
                .map(RateLimitDescriptor::from_entries)
                .collect(),
            hits_addend: cost,
        };
        let response = self.inner.should_rate_limit(request).await?.into_inner();
        Ok(Answer::from_response(&response))
    }
}

/// Picks the descriptors of an HTTP request; `None` lets the request through unchecked.
pub type Describe = dyn Fn(&Request<Body>) -> Option<Vec<Descriptor>> + Send + Sync;

/// A tower layer that checks every request with Tollgate first.
#[derive(Clone)]
pub struct RateLimitLayer {
    client: Client,
    describe: Arc<Describe>,
    fail_open: bool,
}

impl std::fmt::Debug for RateLimitLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("client", &self.client)
            .field("fail_open", &self.fail_open)
            .finish()
    }
}

impl RateLimitLayer {
    /// Checks each request whose descriptors `describe` returns.
    pub fn new(
        client: Client,
        describe: impl Fn(&Request<Body>) -> Option<Vec<Descriptor>> + Send + Sync + 'static,
    ) -> Self {
        Self {
            client,
            describe: Arc::new(describe),
            fail_open: true,
        }
    }

    /// Refuse requests (503) when Tollgate cannot be reached, instead of letting them through.
    pub fn fail_closed(mut self) -> Self {
        self.fail_open = false;
        self
    }
}

impl<S> tower::Layer<S> for RateLimitLayer {
    type Service = RateLimited<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimited {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service [`RateLimitLayer`] wraps around an HTTP service.
#[derive(Debug, Clone)]
pub struct RateLimited<S> {
    inner: S,
    layer: RateLimitLayer,
}

impl<S> tower::Service<Request<Body>> for RateLimited<S>
where
    S: tower::Service<Request<Body>, Response = Response<Body>> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        // The clone that was polled ready serves this call; a fresh clone takes its place.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let descriptors = (self.layer.describe)(&request);
        let mut client = self.layer.client.clone();
        let fail_open = self.layer.fail_open;
        Box::pin(async move {
            let Some(descriptors) = descriptors else {
                return inner.call(request).await;
            };
            match client.check(descriptors, 0).await {
                Ok(answer) if answer.allowed => {
                    let mut response = inner.call(request).await?;
                    add_headers(&mut response, &answer.headers);
                    Ok(response)
                }
                Ok(answer) => Ok(too_many_requests(&answer)),
                Err(status) if fail_open => {
                    tracing::warn!(%status, "Tollgate unreachable: letting the request through");
                    inner.call(request).await
                }
                Err(status) => {
                    tracing::warn!(%status, "Tollgate unreachable: refusing the request");
                    let mut response = Response::new(Body::from("rate limiter unavailable\n"));
                    *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
                    Ok(response)
                }
            }
        })
    }
}

fn too_many_requests(answer: &Answer) -> Response<Body> {
    let retry_after = answer.retry_after.map_or(1, |d| d.as_secs().max(1));
    let body = format!("{{\"error\":\"rate_limited\",\"retry_after\":{retry_after}}}");
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
    let mut headers = answer.headers.clone();
    if !headers
        .iter()
        .any(|(name, _)| name.eq_ignore_ascii_case("retry-after"))
    {
        headers.push(("Retry-After".into(), retry_after.to_string()));
    }
    headers.push(("Content-Type".into(), "application/json".into()));
    add_headers(&mut response, &headers);
    response
}

fn add_headers(response: &mut Response<Body>, headers: &[(String, String)]) {
    for (name, value) in headers {
        // A header Tollgate sends is well formed; one that is not is skipped rather than failing the
        // request.
        if let (Ok(name), Ok(value)) = (HeaderName::try_from(name.as_str()), HeaderValue::from_str(value)) {
            response.headers_mut().append(name, value);
        }
    }
}
