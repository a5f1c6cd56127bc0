//! A client for application servers over Tollgate's native API (`tollgate.v1.RateLimiter`): check (with
//! a cost, or peek), refund, and concurrency leases; and a tower layer that checks every request of an
//! axum (or any tower) HTTP service.
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

use crate::proto::native::rate_limiter_client::RateLimiterClient;
use crate::proto::native::{
    self, AcquireRequest, CheckRequest, CheckResponse, RefundRequest, RefundResponse, ReleaseRequest,
};

/// One descriptor: ordered `(key, value)` entries.
pub type Descriptor = Vec<(String, String)>;

/// Tollgate's answer to a check, in application terms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// Whether the work may go ahead.
    pub allowed: bool,
    /// When refused: how long until the same request could pass (exact).
    pub retry_after: Option<Duration>,
    /// The smallest number of units left among the descriptors' limits; `None` when no limit applied.
    pub remaining: Option<u64>,
    /// Headers the server wants the client to see (name, value).
    pub headers: Vec<(String, String)>,
    /// When a check consumed: the token [`Client::refund`] needs to give the units back.
    pub refund_token: Option<String>,
}

impl Answer {
    /// A lease was taken: go ahead.
    fn lease_taken() -> Self {
        Self {
            allowed: true,
            retry_after: None,
            remaining: None,
            headers: Vec::new(),
            refund_token: None,
        }
    }

    /// Every slot is taken; `wait` is the time until the oldest lease expires.
    fn lease_refused(wait: Option<Duration>) -> Self {
        Self {
            allowed: false,
            retry_after: wait,
            remaining: Some(0),
            headers: Vec::new(),
            refund_token: None,
        }
    }

    fn from_response(response: CheckResponse) -> Self {
        let remaining = response
            .results
            .iter()
            .filter(|r| r.limit.is_some())
            .map(|r| r.remaining)
            .min();
        Self {
            allowed: response.allowed,
            retry_after: response.retry_after.and_then(|d| Duration::try_from(d).ok()),
            remaining,
            headers: response.headers.into_iter().map(|h| (h.name, h.value)).collect(),
            refund_token: Some(response.refund_token).filter(|t| !t.is_empty()),
        }
    }
}

/// A concurrency lease held by this client (see [`Client::acquire`]). Release it with
/// [`Client::release`]; a lease that is never released (the process died) expires after its TTL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The server's id for the lease.
    pub id: String,
    /// The descriptors it holds slots of.
    pub descriptors: Vec<Descriptor>,
    /// How long it lives unless renewed (acquire again with the same id) or released.
    pub ttl: Duration,
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

/// A connection to Tollgate's native API (`tollgate.v1.RateLimiter`) for one domain. Cheap to clone:
/// clones share the HTTP/2 connection.
#[derive(Debug, Clone)]
pub struct Client {
    inner: RateLimiterClient<Channel>,
    domain: String,
}

impl Client {
    /// Connects to `addr` (`http://host:8081`); every call is made in `domain`.
    pub async fn connect(addr: impl Into<String>, domain: impl Into<String>) -> Result<Self, ConnectError> {
        let addr = addr.into();
        let endpoint =
            Channel::from_shared(addr.clone()).map_err(|e| ConnectError::Address(addr, e.to_string()))?;
        let channel = endpoint.connect().await.map_err(ConnectError::Connect)?;
        Ok(Self {
            inner: RateLimiterClient::new(channel),
            domain: domain.into(),
        })
    }

    /// Asks whether `descriptors` may proceed, consuming `cost` (0 means 1) from each matching limit.
    pub async fn check(&mut self, descriptors: Vec<Descriptor>, cost: u64) -> Result<Answer, tonic::Status> {
        self.check_in(descriptors, cost, native::Mode::Consume).await
    }

    /// Asks whether `cost` units would pass now, and what would be left after them, without consuming
    /// anything. With `cost` 0: how many units are left now.
    pub async fn peek(&mut self, descriptors: Vec<Descriptor>, cost: u64) -> Result<Answer, tonic::Status> {
        self.check_in(descriptors, cost, native::Mode::Peek).await
    }

    /// Like [`Client::check`], but a refused request consumes nothing anywhere.
    pub async fn check_all_or_nothing(
        &mut self,
        descriptors: Vec<Descriptor>,
        cost: u64,
    ) -> Result<Answer, tonic::Status> {
        self.check_in(descriptors, cost, native::Mode::AllOrNothing).await
    }

    async fn check_in(
        &mut self,
        descriptors: Vec<Descriptor>,
        cost: u64,
        mode: native::Mode,
    ) -> Result<Answer, tonic::Status> {
        let request = CheckRequest {
            domain: self.domain.clone(),
            descriptors: wire_descriptors(descriptors),
            cost,
            mode: mode as i32,
        };
        let response = self.inner.check(request).await?.into_inner();
        Ok(Answer::from_response(response))
    }

    /// Gives back what the check that returned `refund_token` consumed (the work it paid for did not
    /// happen): `cost` units per descriptor, at most what each consumed (0: all of it), once.
    /// `descriptors` must be that check's.
    pub async fn refund(
        &mut self,
        refund_token: &str,
        descriptors: Vec<Descriptor>,
        cost: u64,
    ) -> Result<RefundResponse, tonic::Status> {
        let request = RefundRequest {
            domain: self.domain.clone(),
            descriptors: wire_descriptors(descriptors),
            cost,
            refund_token: refund_token.to_owned(),
        };
        Ok(self.inner.refund(request).await?.into_inner())
    }

    /// Takes one in-flight slot of every descriptor's concurrency rule, all or none. `Ok(Err(wait))` when
    /// a rule is at its `max_in_flight`: `wait` is the time until its oldest lease expires.
    pub async fn acquire(
        &mut self,
        descriptors: Vec<Descriptor>,
    ) -> Result<Result<Lease, Option<Duration>>, tonic::Status> {
        let request = AcquireRequest {
            domain: self.domain.clone(),
            descriptors: wire_descriptors(descriptors.clone()),
            lease_id: String::new(),
            ttl: None,
        };
        let response = self.inner.acquire(request).await?.into_inner();
        if !response.acquired {
            return Ok(Err(response.retry_after.and_then(|d| Duration::try_from(d).ok())));
        }
        Ok(Ok(Lease {
            id: response.lease_id,
            descriptors,
            ttl: response
                .ttl
                .and_then(|d| Duration::try_from(d).ok())
                .unwrap_or_default(),
        }))
    }

    /// Frees the slots `lease` holds. Returns whether every slot was still held (false: it had expired).
    pub async fn release(&mut self, lease: &Lease) -> Result<bool, tonic::Status> {
        let request = ReleaseRequest {
            domain: self.domain.clone(),
            descriptors: wire_descriptors(lease.descriptors.clone()),
            lease_id: lease.id.clone(),
        };
        let response = self.inner.release(request).await?.into_inner();
        Ok(response.results.iter().all(|r| r.released))
    }
}

fn wire_descriptors(descriptors: Vec<Descriptor>) -> Vec<native::Descriptor> {
    descriptors
        .into_iter()
        .map(native::Descriptor::from_entries)
        .collect()
}

/// Picks the descriptors of an HTTP request; `None` lets the request through unchecked.
pub type Describe = dyn Fn(&Request<Body>) -> Option<Vec<Descriptor>> + Send + Sync;

/// What the layer asks Tollgate before the handler runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Guard {
    /// A Check that consumes one unit.
    Check,
    /// A concurrency lease held while the handler runs and released when it returns.
    Lease,
}

/// A tower layer that asks Tollgate before every request: a rate-limit check ([`RateLimitLayer::new`])
/// or a concurrency lease held while the handler runs ([`RateLimitLayer::concurrency`]).
#[derive(Clone)]
pub struct RateLimitLayer {
    client: Client,
    describe: Arc<Describe>,
    fail_open: bool,
    guard: Guard,
}

impl std::fmt::Debug for RateLimitLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("client", &self.client)
            .field("fail_open", &self.fail_open)
            .field("guard", &self.guard)
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
            guard: Guard::Check,
        }
    }

    /// Caps requests in flight instead: each request whose descriptors `describe` returns takes a lease
    /// of their `concurrency` rules before the handler runs (429 with `Retry-After` when they are all
    /// taken) and releases it when the handler returns. A lease whose release is lost (the process
    /// died) expires after the rule's `lease_ttl`.
    pub fn concurrency(
        client: Client,
        describe: impl Fn(&Request<Body>) -> Option<Vec<Descriptor>> + Send + Sync + 'static,
    ) -> Self {
        Self {
            guard: Guard::Lease,
            ..Self::new(client, describe)
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
        let guard = self.layer.guard;
        Box::pin(async move {
            let Some(descriptors) = descriptors else {
                return inner.call(request).await;
            };
            let asked = match guard {
                Guard::Check => client.check(descriptors, 0).await.map(|answer| (answer, None)),
                Guard::Lease => client.acquire(descriptors).await.map(|acquired| match acquired {
                    Ok(lease) => (Answer::lease_taken(), Some(lease)),
                    Err(wait) => (Answer::lease_refused(wait), None),
                }),
            };
            match asked {
                Ok((answer, lease)) if answer.allowed => {
                    let result = inner.call(request).await;
                    if let Some(lease) = lease {
                        // Released in the background: the response need not wait for it, and a lost
                        // release only holds the slot until the lease expires.
                        tokio::spawn(async move {
                            if let Err(status) = client.release(&lease).await {
                                tracing::warn!(%status, "cannot release a Tollgate lease; it will expire");
                            }
                        });
                    }
                    let mut response = result?;
                    add_headers(&mut response, &answer.headers);
                    Ok(response)
                }
                Ok((answer, _)) => Ok(too_many_requests(&answer)),
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
    // Whole seconds, rounded up: a client told to come back must not come back early.
    let retry_after = answer
        .retry_after
        .map_or(1, |d| d.as_micros().div_ceil(1_000_000).max(1));
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
