//! Tollgate's answers, in application terms.

use std::time::Duration;

use crate::proto::v1;

/// The answer to a check or a peek.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Decision {
    /// Whether the work may go ahead.
    pub allowed: bool,
    /// When refused: how long until the same call could pass (exact).
    pub retry_after: Option<Duration>,
    /// The fewest units left among the descriptors' limits; `None` when no limit applied (or the
    /// decision failed open).
    pub remaining: Option<u64>,
    /// The headers the server hands out for this verdict (`TOLLGATE_RESPONSE_HEADERS`: `RateLimit`,
    /// `RateLimit-Policy`, `X-RateLimit-*`, `Retry-After`, ...), for the application's own response.
    pub headers: Vec<(String, String)>,
    /// When a check consumed: what [`crate::Client::refund`] needs to give the units back.
    pub refund_token: Option<RefundToken>,
    /// Tollgate could not be asked and the failure policy let the call through.
    pub failed_open: bool,
    /// One result per descriptor, in order, for what this summary does not carry.
    pub results: Vec<v1::CheckResult>,
}

impl Decision {
    pub(crate) fn from_response(response: v1::CheckResponse) -> Self {
        let remaining = response
            .results
            .iter()
            .filter(|r| r.limit.is_some())
            .map(|r| r.remaining)
            .min();
        Self {
            allowed: response.allowed,
            retry_after: duration(response.retry_after),
            remaining,
            headers: response.headers.into_iter().map(|h| (h.name, h.value)).collect(),
            refund_token: Some(response.refund_token)
                .filter(|t| !t.is_empty())
                .map(RefundToken),
            failed_open: false,
            results: response.results,
        }
    }

    /// What the failure policy answers when Tollgate cannot be asked and it is open.
    pub(crate) fn failed_open() -> Self {
        Self {
            allowed: true,
            retry_after: None,
            remaining: None,
            headers: Vec::new(),
            refund_token: None,
            failed_open: true,
            results: Vec::new(),
        }
    }

    /// `retry_after` in whole seconds for a `Retry-After` header: rounded up, so a client told to come
    /// back never comes back early, and at least 1.
    pub fn retry_after_secs(&self) -> u64 {
        whole_seconds(self.retry_after)
    }
}

/// Whole seconds, rounded up, at least 1 (also when the server gave no hint).
pub(crate) fn whole_seconds(wait: Option<Duration>) -> u64 {
    wait.map_or(1, |d| d.as_micros().div_ceil(1_000_000).max(1))
        .try_into()
        .unwrap_or(u64::MAX)
}

/// The proof of what a check consumed, bound by the server to that check's domain and descriptors;
/// it gives the units back once, and only before they stop mattering.
#[derive(Clone, PartialEq, Eq)]
pub struct RefundToken(String);

impl RefundToken {
    /// A token received some other way (for example from another process that made the check).
    pub fn new(token: impl Into<String>) -> Self {
        Self(token.into())
    }

    /// The token as the server wrote it.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for RefundToken {
    // A token grants budget back: it stays out of logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RefundToken(..)")
    }
}

/// The answer to a refund.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Refunded {
    /// The fewest units left among the descriptors' limits after the refund; `None` when no limit
    /// applies.
    pub remaining: Option<u64>,
    /// One result per descriptor, in order.
    pub results: Vec<v1::RefundResult>,
}

impl Refunded {
    pub(crate) fn from_response(response: v1::RefundResponse) -> Self {
        Self {
            remaining: response
                .results
                .iter()
                .filter(|r| r.limit.is_some())
                .map(|r| r.remaining)
                .min(),
            results: response.results,
        }
    }
}

/// A protobuf duration as a `Duration`; negative or absent is `None`.
pub(crate) fn duration(value: Option<prost_types::Duration>) -> Option<Duration> {
    value.and_then(|d| Duration::try_from(d).ok())
}
