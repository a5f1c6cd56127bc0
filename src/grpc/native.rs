//! `tollgate.v1.RateLimiter`, the native API for application servers: translation between its messages
//! and the [`Limiter`], nothing else. The HTTP front end (`POST /v1/*`, see [`crate::json_api`]) calls
//! the same [`NativeService`] methods, so both speak exactly the same semantics.

use std::sync::Arc;
use std::time::Duration;

use tonic::{Request, Response, Status};

use super::envoy_rls::status_of;
use super::headers::{HeaderOptions, headers};
use super::traced;
use crate::limiter::{Code, DescriptorStatus, LeaseStatus, LimitOverride, Limiter, Mode, RequestDescriptor};
use crate::proto::native::rate_limiter_server::RateLimiter;
use crate::proto::native::{
    self, AcquireRequest, AcquireResponse, CheckRequest, CheckResponse, CheckResult, Descriptor, Entry,
    Header, LeaseResult, RefundRequest, RefundResponse, RefundResult, ReleaseRequest, ReleaseResponse,
    ReleaseResult,
};
use crate::rules::DescriptorEntry;
use crate::store::Store;

/// The native service over a limiter.
#[derive(Debug)]
pub struct NativeService<S> {
    limiter: Arc<Limiter<S>>,
    headers: HeaderOptions,
}

impl<S> NativeService<S> {
    /// Serves `limiter` to application servers; Check answers carry the headers `headers` selects.
    pub fn new(limiter: Arc<Limiter<S>>, headers: HeaderOptions) -> Self {
        Self { limiter, headers }
    }
}

impl<S: Store> NativeService<S> {
    /// `Check`: decide (and by default consume) every descriptor's limits.
    pub async fn check(&self, request: CheckRequest) -> Result<CheckResponse, Status> {
        let mode = match native::Mode::try_from(request.mode) {
            Ok(native::Mode::Consume) => Mode::Consume,
            Ok(native::Mode::Peek) => Mode::Peek,
            Ok(native::Mode::AllOrNothing) => Mode::AllOrNothing,
            Err(_) => {
                return Err(Status::invalid_argument(format!(
                    "unknown mode {} (expected MODE_CONSUME, MODE_PEEK or MODE_ALL_OR_NOTHING)",
                    request.mode
                )));
            }
        };
        // A peek at cost 0 asks "what is left?"; everything else costs at least 1.
        let cost = if mode == Mode::Peek {
            request.cost
        } else {
            request.cost.max(1)
        };
        let verdict = self
            .limiter
            .evaluate(&request.domain, &request.descriptors, cost, mode)
            .await
            .map_err(status_of)?;
        let retry_after = verdict
            .statuses
            .iter()
            .filter(|s| s.code == Code::OverLimit)
            .filter_map(|s| s.retry_after)
            .max();
        let headers = headers(verdict.overall, &verdict.statuses, &self.headers)
            .into_iter()
            .map(|(name, value)| Header { name, value })
            .collect();
        Ok(CheckResponse {
            allowed: verdict.overall == Code::Ok,
            results: verdict.statuses.iter().map(check_result).collect(),
            retry_after: retry_after.map(wire_duration),
            headers,
        })
    }

    /// `Refund`: give `cost` units back to every descriptor's limits.
    pub async fn refund(&self, request: RefundRequest) -> Result<RefundResponse, Status> {
        let verdict = self
            .limiter
            .evaluate(
                &request.domain,
                &request.descriptors,
                request.cost.max(1),
                Mode::Refund,
            )
            .await
            .map_err(status_of)?;
        let results = verdict
            .statuses
            .iter()
            .map(|status| RefundResult {
                limit: wire_limit(status),
                remaining: u64::from(status.limit_remaining),
                reset_after: status.reset_after.map(wire_duration),
            })
            .collect();
        Ok(RefundResponse { results })
    }

    /// `Acquire`: take or renew one slot of every descriptor's concurrency rule, all or none.
    pub async fn acquire(&self, request: AcquireRequest) -> Result<AcquireResponse, Status> {
        let ttl = request
            .ttl
            .map(|ttl| {
                Duration::try_from(ttl).map_err(|_| Status::invalid_argument("ttl must not be negative"))
            })
            .transpose()?;
        let verdict = self
            .limiter
            .acquire(
                &request.domain,
                &request.descriptors,
                Some(&request.lease_id),
                ttl,
            )
            .await
            .map_err(status_of)?;
        let retry_after = verdict.statuses.iter().filter_map(|s| s.retry_after).max();
        Ok(AcquireResponse {
            acquired: verdict.acquired,
            lease_id: verdict.lease_id,
            ttl: Some(wire_duration(verdict.ttl)),
            results: verdict.statuses.iter().map(lease_result).collect(),
            retry_after: (!verdict.acquired)
                .then(|| retry_after.map(wire_duration))
                .flatten(),
        })
    }

    /// `Release`: free the slots the lease holds.
    pub async fn release(&self, request: ReleaseRequest) -> Result<ReleaseResponse, Status> {
        let statuses = self
            .limiter
            .release(&request.domain, &request.descriptors, &request.lease_id)
            .await
            .map_err(status_of)?;
        let results = statuses
            .iter()
            .map(|s| ReleaseResult {
                released: s.released,
                in_flight: s.in_flight,
            })
            .collect();
        Ok(ReleaseResponse { results })
    }
}

/// Every native call is traced as Envoy's are (see [`super::traced`]).
#[tonic::async_trait]
impl<S: Store> RateLimiter for NativeService<S> {
    async fn check(&self, request: Request<CheckRequest>) -> Result<Response<CheckResponse>, Status> {
        let outcome = |r: &CheckResponse| if r.allowed { "ok" } else { "over_limit" };
        let method = "tollgate.v1.RateLimiter/Check";
        let answer = traced(request, method, outcome, |r| NativeService::check(self, r)).await;
        answer.map(Response::new)
    }

    async fn refund(&self, request: Request<RefundRequest>) -> Result<Response<RefundResponse>, Status> {
        let method = "tollgate.v1.RateLimiter/Refund";
        let answer = traced(request, method, |_| "ok", |r| NativeService::refund(self, r)).await;
        answer.map(Response::new)
    }

    async fn acquire(&self, request: Request<AcquireRequest>) -> Result<Response<AcquireResponse>, Status> {
        let outcome = |r: &AcquireResponse| if r.acquired { "ok" } else { "over_limit" };
        let method = "tollgate.v1.RateLimiter/Acquire";
        let answer = traced(request, method, outcome, |r| NativeService::acquire(self, r)).await;
        answer.map(Response::new)
    }

    async fn release(&self, request: Request<ReleaseRequest>) -> Result<Response<ReleaseResponse>, Status> {
        let method = "tollgate.v1.RateLimiter/Release";
        let answer = traced(request, method, |_| "ok", |r| NativeService::release(self, r)).await;
        answer.map(Response::new)
    }
}

fn check_result(status: &DescriptorStatus) -> CheckResult {
    CheckResult {
        allowed: status.code == Code::Ok,
        limit: wire_limit(status),
        remaining: u64::from(status.limit_remaining),
        reset_after: status.reset_after.map(wire_duration),
        retry_after: status.retry_after.map(wire_duration),
        shadow: status.rule.as_ref().is_some_and(|r| r.shadow_mode),
        // Only an `unlimited: true` rule reports no limit with everything remaining.
        unlimited: status.current_limit.is_none() && status.limit_remaining == u32::MAX,
        failure_mode_applied: status.from_failure_mode,
    }
}

fn wire_limit(status: &DescriptorStatus) -> Option<native::Limit> {
    let limit = status.current_limit.as_ref()?;
    Some(native::Limit {
        rule: status.rule.as_ref().map(|r| r.path.clone()).unwrap_or_default(),
        name: limit.name.as_deref().unwrap_or_default().to_owned(),
        algorithm: limit.algorithm.as_str().to_owned(),
        requests_per_unit: limit.requests_per_unit,
        unit: limit.unit.name().to_owned(),
        window: Some(wire_duration(limit.window)),
        burst: limit.burst,
    })
}

fn lease_result(status: &LeaseStatus) -> LeaseResult {
    LeaseResult {
        acquired: status.acquired,
        rule: status.rule.as_ref().map(|r| r.path.clone()).unwrap_or_default(),
        max_in_flight: status.concurrency().map_or(0, |c| c.max_in_flight),
        in_flight: status.in_flight,
        retry_after: status.retry_after.map(wire_duration),
        failure_mode_applied: status.from_failure_mode,
    }
}

/// A duration on the wire (saturating: no limiter duration comes near the bound).
pub fn wire_duration(d: Duration) -> prost_types::Duration {
    prost_types::Duration::try_from(d).unwrap_or(prost_types::Duration {
        seconds: i64::MAX,
        nanos: 999_999_999,
    })
}

impl RequestDescriptor for Descriptor {
    type Entry = Entry;

    fn entries(&self) -> &[Entry] {
        &self.entries
    }

    fn limit_override(&self) -> Option<LimitOverride> {
        None
    }

    fn hits_addend(&self) -> Option<u64> {
        self.cost
    }
}

impl DescriptorEntry for Entry {
    fn key(&self) -> &str {
        &self.key
    }
    fn value(&self) -> &str {
        &self.value
    }
}
