//! `tollgate.v1.RateLimiter`, the native API for application servers: its messages ↔ the [`Limiter`],
//! with no transport. The gRPC service ([`crate::grpc`]) and the JSON endpoints `POST /v1/*`
//! ([`crate::http`]) both call [`NativeApi`], so both speak exactly the same semantics; each maps a
//! [`LimiterError`] to its own status codes.

use std::sync::Arc;
use std::time::Duration;

use super::headers::{HeaderOptions, headers};
use crate::proto::native::{
    self, AcquireRequest, AcquireResponse, CheckRequest, CheckResponse, CheckResult, Descriptor, Entry,
    Header, LeaseResult, RefundRequest, RefundResponse, RefundResult, ReleaseRequest, ReleaseResponse,
    ReleaseResult,
};
use tollgate_core::limiter::{
    Code, DescriptorStatus, LeaseStatus, LimitOverride, Limiter, LimiterError, Mode, RequestDescriptor,
};
use tollgate_core::rules::DescriptorEntry;
use tollgate_core::store::Store;

/// The native API over a limiter.
#[derive(Debug)]
pub struct NativeApi<S> {
    limiter: Arc<Limiter<S>>,
    headers: HeaderOptions,
}

impl<S> NativeApi<S> {
    /// Serves `limiter` to application servers; Check answers carry the headers `headers` selects.
    pub fn new(limiter: Arc<Limiter<S>>, headers: HeaderOptions) -> Self {
        Self { limiter, headers }
    }
}

impl<S: Store> NativeApi<S> {
    /// `Check`: decide (and by default consume) every descriptor's limits.
    pub async fn check(&self, request: CheckRequest) -> Result<CheckResponse, LimiterError> {
        let mode = match native::Mode::try_from(request.mode) {
            Ok(native::Mode::Consume) => Mode::Consume,
            Ok(native::Mode::Peek) => Mode::Peek,
            Ok(native::Mode::AllOrNothing) => Mode::AllOrNothing,
            Err(_) => return Err(LimiterError::UnknownMode(request.mode)),
        };
        let verdict = self
            .limiter
            .check(&request.domain, &request.descriptors, request.cost, mode)
            .await?;
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
            refund_token: verdict.refund_token.unwrap_or_default(),
        })
    }

    /// `Refund`: give back what the Check that issued `refund_token` consumed (see [`Limiter::refund`]).
    pub async fn refund(&self, request: RefundRequest) -> Result<RefundResponse, LimiterError> {
        let verdict = self
            .limiter
            .refund(
                &request.domain,
                &request.descriptors,
                request.cost,
                &request.refund_token,
            )
            .await?;
        let results = verdict
            .statuses
            .iter()
            .map(|status| RefundResult {
                limit: wire_limit(status),
                remaining: status.remaining,
                reset_after: status.reset_after.map(wire_duration),
            })
            .collect();
        Ok(RefundResponse { results })
    }

    /// `Acquire`: take or renew one slot of every descriptor's concurrency rule, all or none.
    pub async fn acquire(&self, request: AcquireRequest) -> Result<AcquireResponse, LimiterError> {
        let ttl = request
            .ttl
            .map(|ttl| Duration::try_from(ttl).map_err(|_| LimiterError::InvalidLeaseTtl))
            .transpose()?;
        let verdict = self
            .limiter
            .acquire(
                &request.domain,
                &request.descriptors,
                Some(&request.lease_id),
                ttl,
            )
            .await?;
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
    pub async fn release(&self, request: ReleaseRequest) -> Result<ReleaseResponse, LimiterError> {
        let statuses = self
            .limiter
            .release(&request.domain, &request.descriptors, &request.lease_id)
            .await?;
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

fn check_result(status: &DescriptorStatus) -> CheckResult {
    CheckResult {
        allowed: status.code == Code::Ok,
        limit: wire_limit(status),
        remaining: status.remaining,
        reset_after: status.reset_after.map(wire_duration),
        retry_after: status.retry_after.map(wire_duration),
        shadow: status.rule.as_ref().is_some_and(|r| r.shadow_mode),
        unlimited: status.is_unlimited(),
        failure_mode_applied: status.from_failure_mode,
    }
}

fn wire_limit(status: &DescriptorStatus) -> Option<native::Limit> {
    let limit = status.current_limit()?;
    Some(native::Limit {
        rule: status
            .rule
            .as_ref()
            .map(|r| r.path.to_string())
            .unwrap_or_default(),
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
        rule: status
            .rule
            .as_ref()
            .map(|r| r.path.to_string())
            .unwrap_or_default(),
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
