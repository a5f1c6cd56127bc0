//! The debug line of each decision: at `debug`, on a target of its own ([`TARGET`]), one line per descriptor decided,
//! with what an operator debugging a limit asks for: the domain, the descriptor (values as they enter
//! storage keys, so a hashed value stays hashed), the storage key, the rule that matched, its limit,
//! the request's hits, the count before and after, the verdict and the store that decided.
//!
//! Off (the default `warn`), it costs one level check per request ([`enabled`]): nothing is gathered or
//! formatted for it.

use std::fmt;

use super::{AppliedLimit, Code, CurrentLimit, DescriptorStatus};

/// The log's target. `LOG_LEVEL=debug` includes it; `LOG_LEVEL=warn,tollgate::decision=debug` shows
/// these lines alone.
pub(super) const TARGET: &str = "tollgate::decision";

/// Whether decision lines are wanted now.
#[inline]
pub(super) fn enabled() -> bool {
    tracing::enabled!(target: TARGET, tracing::Level::DEBUG)
}

/// One descriptor's decision, as the log line tells it.
#[derive(Debug)]
pub(super) struct Decided<'a> {
    /// The request's domain.
    pub(super) domain: &'a str,
    /// The descriptor, `key=value, ...`, hashed values hashed (`Domain::shown_descriptor`).
    ///
    /// [`Domain::shown_descriptor`]: crate::rules::Domain::shown_descriptor
    pub(super) descriptor: &'a str,
    /// The storage key counted under (empty when no limit applied).
    pub(super) key: &'a str,
    /// Units the request asked of each limit.
    pub(super) hits: u64,
    /// What was decided.
    pub(super) status: &'a DescriptorStatus,
    /// What decided: a store's name, `local cache`, `hot-key slice`, `local fallback`; `None` when
    /// nothing was counted (no limit applied, or a failure mode answered).
    pub(super) store: Option<&'static str>,
}

/// Writes the line of one decision.
pub(super) fn log(decided: &Decided<'_>) {
    let status = decided.status;
    // As u64: a u128 field is written as text.
    let retry_after_ms = status
        .retry_after
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    tracing::debug!(
        target: TARGET,
        domain = decided.domain,
        descriptor = decided.descriptor,
        key = decided.key,
        rule = status.rule.as_ref().map_or("-", |r| &*r.path),
        limit = %Limit(status.current_limit()),
        hits = decided.hits,
        count = %Count { status, hits: decided.hits, counted: decided.store.is_some() },
        verdict = verdict(status),
        store = decided.store.unwrap_or(if status.from_failure_mode { "none (failure mode)" } else { "-" }),
        retry_after_ms,
        "decision"
    );
}

/// The line of a request to a domain no rules define: Envoy's answer is OK, with no limit, for each of
/// its descriptors.
pub(super) fn unknown_domain(domain: &str, descriptors: usize) {
    tracing::debug!(target: TARGET, domain, descriptors, verdict = "no_limit", "decision: no rules for this domain");
}

/// The verdict on one descriptor: `ok`, `over_limit`, `over_limit_shadow` (refused by a shadow rule,
/// answered OK), `no_limit` (nothing matched, or every limit was replaced), `unlimited`.
fn verdict(status: &DescriptorStatus) -> &'static str {
    match (&status.limit, status.code) {
        (AppliedLimit::None, _) => "no_limit",
        (AppliedLimit::Unlimited, _) => "unlimited",
        (AppliedLimit::Limited(_), Code::OverLimit) => "over_limit",
        (AppliedLimit::Limited(_), Code::Ok) if status.retry_after.is_some() => "over_limit_shadow",
        (AppliedLimit::Limited(_), Code::Ok) => "ok",
    }
}

/// A limit as the line names it: `10 per 60s (sliding_log, login-per-ip)`, with the burst of the bucket
/// algorithms when it differs.
struct Limit<'a>(Option<&'a CurrentLimit>);

impl fmt::Display for Limit<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Some(limit) = self.0 else {
            return f.write_str("-");
        };
        write!(f, "{} per {}s", limit.requests_per_unit, limit.window.as_secs())?;
        if limit.burst != u64::from(limit.requests_per_unit) {
            write!(f, ", burst {}", limit.burst)?;
        }
        write!(f, " ({}", limit.algorithm)?;
        if let Some(name) = &limit.name {
            write!(f, ", {name}")?;
        }
        f.write_str(")")
    }
}

/// The units used of the limit before and after this request, out of its capacity: `6->7/10`. A
/// refusal consumed nothing the limit could use: `10->10/10`. `-` when nothing was counted.
struct Count<'a> {
    status: &'a DescriptorStatus,
    hits: u64,
    counted: bool,
}

impl fmt::Display for Count<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Some(limit) = self.status.current_limit().filter(|_| self.counted) else {
            return f.write_str("-");
        };
        let capacity = limit.burst;
        let after = capacity.saturating_sub(self.status.remaining);
        let before = match self.status.retry_after {
            Some(_) => after,
            None => after.saturating_sub(self.hits),
        };
        write!(f, "{before}->{after}/{capacity}")
    }
}
