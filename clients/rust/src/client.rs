//! The client: one domain of Tollgate's native API, with a deadline on every call and one failure
//! policy.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Request, Response, Status};

use crate::decision::{Decision, RefundToken, Refunded};
use crate::descriptor::{Descriptor, to_wire};
use crate::error::{ConnectError, Error};
use crate::proto::v1::{self, rate_limiter_client::RateLimiterClient};

/// How long a call waits for Tollgate by default. Tollgate answers in about a millisecond; 25 ms
/// leaves room for a Redis round trip under load while keeping an outage invisible to users.
pub const DEFAULT_DEADLINE: Duration = Duration::from_millis(25);

/// What a check, peek or acquire answers when Tollgate cannot be asked: no answer within the
/// deadline, `UNAVAILABLE`, or a connection error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FailurePolicy {
    /// Let the work through (a [`Decision`] marked `failed_open`, a lease that holds nothing), and
    /// count it ([`Client::failed_open`]). Right when an outage of the limiter must not become an
    /// outage of the application.
    #[default]
    Open,
    /// Return [`Error::Unavailable`]. Right when the work is expensive or abusable enough that it
    /// must not run unlimited.
    Closed,
}

/// A client of Tollgate's native API (`tollgate.v1.RateLimiter`) for one domain. Cheap to clone:
/// clones share the connection and the fail-open count.
#[derive(Debug, Clone)]
pub struct Client {
    inner: RateLimiterClient<Channel>,
    /// Shared by clones (a layer clones the client per request).
    domain: Arc<str>,
    deadline: Duration,
    policy: FailurePolicy,
    health: Arc<Health>,
}

/// What the clones of a client share about Tollgate's reachability.
#[derive(Debug, Default)]
struct Health {
    failed_open: AtomicU64,
    /// The last call found Tollgate unreachable: logged once per outage, not once per call.
    down: AtomicBool,
}

impl Client {
    /// A client of the Tollgate at `addr` (`http://host:8081`) for `domain`. Nothing is connected
    /// until the first call, so an application starts while Tollgate is down; a lost connection is
    /// re-established by a later call.
    ///
    /// For TLS, load balancing or interceptors, configure a channel and use [`Client::from_channel`].
    ///
    /// Call it within a tokio runtime: the connection runs as a task of it.
    pub fn connect_lazy(addr: &str, domain: impl Into<String>) -> Result<Self, ConnectError> {
        let endpoint = Endpoint::from_shared(addr.to_owned())
            .map_err(|e| ConnectError::new(addr, e))?
            .tcp_nodelay(true)
            // A dropped SYN would otherwise hold a connection attempt for minutes; calls give up at
            // their deadline either way.
            .connect_timeout(Duration::from_secs(1))
            // Finds a connection whose peer vanished without a reset, instead of every call waiting
            // out its deadline on it until TCP gives up.
            .http2_keep_alive_interval(Duration::from_secs(10))
            .keep_alive_timeout(Duration::from_secs(5))
            .keep_alive_while_idle(true);
        // tonic would panic without a runtime; an error says what is wrong instead.
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(ConnectError::new(
                addr,
                "no tokio runtime to run the connection on",
            ));
        }
        Ok(Self::from_channel(endpoint.connect_lazy(), domain))
    }

    /// A client over a channel configured elsewhere (TLS, balancing, interceptors), for `domain`.
    pub fn from_channel(channel: Channel, domain: impl Into<String>) -> Self {
        Self {
            inner: RateLimiterClient::new(channel),
            domain: Arc::from(domain.into()),
            deadline: DEFAULT_DEADLINE,
            policy: FailurePolicy::default(),
            health: Arc::default(),
        }
    }

    /// Waits at most `deadline` for each call (default [`DEFAULT_DEADLINE`]).
    pub fn with_deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// Answers with `policy` when Tollgate cannot be asked (default [`FailurePolicy::Open`]).
    pub fn with_failure_policy(mut self, policy: FailurePolicy) -> Self {
        self.policy = policy;
        self
    }

    /// The domain every call is made in.
    pub fn domain(&self) -> &str {
        &self.domain
    }

    /// How long each call waits for Tollgate.
    pub fn deadline(&self) -> Duration {
        self.deadline
    }

    /// What a check, peek or acquire answers when Tollgate cannot be asked.
    pub fn failure_policy(&self) -> FailurePolicy {
        self.policy
    }

    /// How many checks, peeks and acquires this client and its clones let through because Tollgate
    /// could not be asked (export it as a counter).
    pub fn failed_open(&self) -> u64 {
        self.health.failed_open.load(Ordering::Relaxed)
    }

    /// Asks whether the work described by `descriptors` may go ahead, consuming `cost` units of each
    /// matching limit when it may (a cost of 0 counts as 1). Descriptors are independent unless the domain sets
    /// `all_or_nothing: true`.
    pub async fn check(&self, descriptors: &[Descriptor], cost: u64) -> Result<Decision, Error> {
        self.decide(descriptors, cost, v1::Mode::Consume).await
    }

    /// Asks whether `cost` units would pass now, and what would be left after them, consuming
    /// nothing. With `cost` 0: how many units are left now ([`Decision::remaining`]).
    pub async fn peek(&self, descriptors: &[Descriptor], cost: u64) -> Result<Decision, Error> {
        self.decide(descriptors, cost, v1::Mode::Peek).await
    }

    /// Like [`Client::check`], but a refused call consumes nothing anywhere.
    pub async fn check_all_or_nothing(
        &self,
        descriptors: &[Descriptor],
        cost: u64,
    ) -> Result<Decision, Error> {
        self.decide(descriptors, cost, v1::Mode::AllOrNothing).await
    }

    async fn decide(&self, descriptors: &[Descriptor], cost: u64, mode: v1::Mode) -> Result<Decision, Error> {
        let request = v1::CheckRequest {
            domain: self.domain.to_string(),
            descriptors: to_wire(descriptors),
            cost,
            mode: mode as i32,
        };
        match self
            .ask(
                |mut grpc, request| async move { grpc.check(request).await },
                request,
            )
            .await
        {
            Ok(response) => Ok(Decision::from_response(response)),
            Err(error) => self.apply_policy(error).map(|()| Decision::failed_open()),
        }
    }

    /// Gives back what the check that returned `token` consumed, because the work it paid for did not
    /// happen: `cost` units per descriptor (0: all of it), never more than the check consumed, once.
    /// `descriptors` must be that check's.
    pub async fn refund(
        &self,
        token: &RefundToken,
        descriptors: &[Descriptor],
        cost: u64,
    ) -> Result<Refunded, Error> {
        let request = v1::RefundRequest {
            domain: self.domain.to_string(),
            descriptors: to_wire(descriptors),
            cost,
            refund_token: token.as_str().to_owned(),
        };
        let response = self
            .ask(
                |mut grpc, request| async move { grpc.refund(request).await },
                request,
            )
            .await?;
        Ok(Refunded::from_response(response))
    }

    /// One Acquire: a new lease (`lease_id` empty) or the renewal of `lease_id`.
    pub(crate) async fn acquire_raw(
        &self,
        descriptors: &[Descriptor],
        lease_id: &str,
    ) -> Result<v1::AcquireResponse, Error> {
        let request = v1::AcquireRequest {
            domain: self.domain.to_string(),
            descriptors: to_wire(descriptors),
            lease_id: lease_id.to_owned(),
            ttl: None,
        };
        self.ask(
            |mut grpc, request| async move { grpc.acquire(request).await },
            request,
        )
        .await
    }

    pub(crate) async fn release_raw(
        &self,
        lease_id: &str,
        descriptors: &[Descriptor],
    ) -> Result<bool, Error> {
        let request = v1::ReleaseRequest {
            domain: self.domain.to_string(),
            descriptors: to_wire(descriptors),
            lease_id: lease_id.to_owned(),
        };
        let response = self
            .ask(
                |mut grpc, request| async move { grpc.release(request).await },
                request,
            )
            .await?;
        Ok(response.results.iter().all(|r| r.released))
    }

    /// Makes one call within the deadline, and sorts a failure into an outage or a rejection.
    async fn ask<M, T, F>(
        &self,
        call: impl FnOnce(RateLimiterClient<Channel>, Request<M>) -> F,
        message: M,
    ) -> Result<T, Error>
    where
        F: Future<Output = Result<Response<T>, Status>>,
    {
        let mut request = Request::new(message);
        // The server sees the deadline too (`grpc-timeout`) and stops working for a caller that left.
        // tonic's channel enforces that header as well, answering CANCELLED: whichever timer fires
        // first, the caller sees one DEADLINE_EXCEEDED.
        request.set_timeout(self.deadline);
        let started = tokio::time::Instant::now();
        let answer = match tokio::time::timeout(self.deadline, call(self.inner.clone(), request)).await {
            Ok(Ok(response)) => Ok(response.into_inner()),
            Ok(Err(status)) if status.code() == Code::Cancelled && started.elapsed() >= self.deadline => {
                Err(self.deadline_exceeded())
            }
            Ok(Err(status)) => Err(Error::from_status(status)),
            Err(_elapsed) => Err(self.deadline_exceeded()),
        };
        self.note_reachability(&answer);
        answer
    }

    fn deadline_exceeded(&self) -> Error {
        Error::Unavailable(Status::deadline_exceeded(format!(
            "no answer from Tollgate within {:?}",
            self.deadline
        )))
    }

    /// Logs the start and the end of an outage once each, not once per call.
    fn note_reachability<T>(&self, answer: &Result<T, Error>) {
        match answer {
            Err(Error::Unavailable(status)) => {
                if !self.health.down.swap(true, Ordering::Relaxed) {
                    tracing::warn!(%status, policy = ?self.policy, "Tollgate unreachable");
                }
            }
            // Read first: the shared flag is written when an outage ends, not on every call.
            _ => {
                if self.health.down.load(Ordering::Relaxed) && self.health.down.swap(false, Ordering::Relaxed)
                {
                    tracing::info!("Tollgate reachable again");
                }
            }
        }
    }

    /// `Ok(())` when the failure policy lets the work through (and counts it), else the error.
    pub(crate) fn apply_policy(&self, error: Error) -> Result<(), Error> {
        match (&error, self.policy) {
            (Error::Unavailable(_), FailurePolicy::Open) => {
                self.health.failed_open.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            _ => Err(error),
        }
    }
}
