//! What the limiter answers: per descriptor a [`DescriptorStatus`] (the code, the limit that decided,
//! exact counts and durations), for the request a [`Verdict`], and the rules that fold them together
//! (which of a descriptor's limits is reported, the overall code).

use std::sync::Arc;
use std::time::Duration;

use crate::algorithm::{Algorithm, Decision};
use crate::rules::file::Unit;
use crate::rules::{Rate, Rule};

/// What a request does to the counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// Consume the cost where allowed (Envoy's only mode). Descriptors are independent unless the
    /// domain is `all_or_nothing` or `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT` is set.
    #[default]
    Consume,
    /// Consume only if every descriptor is allowed.
    AllOrNothing,
    /// Decide as `Consume` would, consume nothing.
    Peek,
}

/// The answer for one descriptor or for the whole request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    /// Allowed.
    Ok,
    /// Over the limit.
    OverLimit,
}

/// The limit reported back to the client (`current_limit`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CurrentLimit {
    /// Requests per unit.
    pub requests_per_unit: u32,
    /// The unit.
    pub unit: Unit,
    /// The rule's `name`; `None` for overrides and unnamed rules.
    pub name: Option<Arc<str>>,
    /// The window length (unit × `unit_multiplier`).
    pub window: Duration,
    /// The algorithm that decided.
    pub algorithm: Algorithm,
    /// Bucket capacity (token bucket, GCRA); the rate for the window algorithms.
    pub burst: u64,
}

/// Which limit a descriptor was measured against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AppliedLimit {
    /// Nothing limits the descriptor: no rule matched, or every limit of its rule was replaced.
    None,
    /// The matched rule is `unlimited: true`.
    Unlimited,
    /// This limit decided (the one refused with the longest wait, else the one closest to its limit).
    Limited(CurrentLimit),
}

/// The verdict for one descriptor, in exact units: how a protocol encodes it (Envoy's `u32` counts
/// and whole seconds, the native API's `u64` and exact durations) is decided at the protocol's edge,
/// in the server's `api` module.
#[derive(Debug, Clone)]
pub struct DescriptorStatus {
    /// OK or OVER_LIMIT, after per-rule shadow mode.
    pub code: Code,
    /// The limit that decided, if any.
    pub limit: AppliedLimit,
    /// Units left after this call: 0 when refused or when no limit applies, `u64::MAX` when unlimited.
    pub remaining: u64,
    /// When the limit refused the cost: the exact earliest time the same cost would pass.
    pub retry_after: Option<Duration>,
    /// Present exactly when a limit applied: the exact time until the limit is fully replenished
    /// (fixed window: until the window ends).
    pub reset_after: Option<Duration>,
    /// Whether this descriptor counts as quota mode for the overall code.
    pub quota_mode: bool,
    /// The matched rule (for metadata, metrics and logs); `None` for overrides and no match.
    pub rule: Option<Arc<Rule>>,
    /// Whether the store failed and the rule's failure mode produced this status.
    pub from_failure_mode: bool,
}

impl DescriptorStatus {
    pub(super) fn no_limit(limit: AppliedLimit) -> Self {
        let remaining = if limit == AppliedLimit::Unlimited {
            u64::MAX
        } else {
            0
        };
        Self {
            code: Code::Ok,
            limit,
            remaining,
            retry_after: None,
            reset_after: None,
            quota_mode: false,
            rule: None,
            from_failure_mode: false,
        }
    }

    /// The limit that decided, when one applied.
    pub fn current_limit(&self) -> Option<&CurrentLimit> {
        match &self.limit {
            AppliedLimit::Limited(limit) => Some(limit),
            AppliedLimit::None | AppliedLimit::Unlimited => None,
        }
    }

    /// Whether the matched rule is `unlimited: true`.
    pub fn is_unlimited(&self) -> bool {
        self.limit == AppliedLimit::Unlimited
    }

    /// envoyproxy/ratelimit's `duration_until_reset`, exact (Envoy's encoding rounds it up to whole
    /// seconds): present exactly when a limit applied. A fixed window, and any limit that allowed,
    /// reports the time until it is fully replenished; another algorithm that refused reports the
    /// earliest time the same request would be allowed.
    pub fn until_reset(&self) -> Option<Duration> {
        let limit = self.current_limit()?;
        match self.retry_after {
            Some(retry) if limit.algorithm != Algorithm::FixedWindow => Some(retry),
            _ => self.reset_after,
        }
    }
}

/// The verdict for a request.
#[derive(Debug, Clone)]
pub struct Verdict {
    /// The overall code, after quota mode and global shadow mode.
    pub overall: Code,
    /// One status per request descriptor, in request order.
    pub statuses: Vec<DescriptorStatus>,
    /// A native consuming Check that consumed: the token a Refund needs to give those units back.
    pub refund_token: Option<String>,
}

pub(super) fn current_limit(rate: &Rate, name: &Option<Arc<str>>) -> CurrentLimit {
    CurrentLimit {
        requests_per_unit: rate.requests_per_unit,
        unit: rate.unit,
        name: name.clone(),
        window: Duration::from_micros(rate.limit.window_us),
        algorithm: rate.limit.algorithm,
        burst: rate.limit.burst,
    }
}

/// Which of a descriptor's decisions to report: the denied one with the longest wait, else the one
/// closest to its limit (first on ties).
pub(super) fn reported(decisions: &[Decision]) -> Option<usize> {
    let denied = decisions
        .iter()
        .enumerate()
        .filter(|(_, d)| !d.allowed)
        .max_by_key(|(i, d)| (d.retry_after_us, std::cmp::Reverse(*i)));
    if let Some((at, _)) = denied {
        return Some(at);
    }
    decisions
        .iter()
        .enumerate()
        .min_by_key(|(i, d)| (d.remaining, *i))
        .map(|(at, _)| at)
}

/// envoyproxy/ratelimit's overall code: OVER_LIMIT if any non-quota descriptor is over, or if there is
/// at least one quota-mode descriptor and all of them are over.
pub(super) fn overall_code(statuses: &[DescriptorStatus]) -> Code {
    let over = |s: &&DescriptorStatus| s.code == Code::OverLimit;
    let non_quota_over = statuses.iter().filter(|s| !s.quota_mode).any(|s| over(&s));
    let mut quota = statuses.iter().filter(|s| s.quota_mode).peekable();
    let all_quota_over = quota.peek().is_some() && quota.all(|s| over(&s));
    if non_quota_over || all_quota_over {
        Code::OverLimit
    } else {
        Code::Ok
    }
}
