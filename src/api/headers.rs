//! Rate-limit headers and the 429 body that Tollgate hands Envoy to send to clients
//! (`response_headers_to_add`, `raw_body`), in the styles clients know:
//!
//! - **`ratelimit`**: envoyproxy/ratelimit's `RateLimit-Limit` / `-Remaining` / `-Reset` trio
//!   (`LIMIT_RESPONSE_HEADERS_ENABLED`, names from `LIMIT_*_HEADER`), describing one descriptor chosen
//!   as the Go service chooses it;
//! - **`x-ratelimit`**: the same trio as `X-RateLimit-Limit` / `-Remaining` / `-Reset`;
//! - **`ietf`**: the IETF draft's (draft-ietf-httpapi-ratelimit-headers, -10/-11) Structured Fields
//!   `RateLimit-Policy: "name";q=100;w=60` and `RateLimit: "name";r=42;t=30`, one list member per limited
//!   descriptor;
//! - **`retry-after`**: `Retry-After: <seconds>` on OVER_LIMIT, rounded up from the exact retry hint, so
//!   never earlier than the request could really pass;
//! - **`raw_body`**: `{"error":"rate_limited","retry_after":12}` as the 429 body, so Envoy's local
//!   reply says what happened.
//!
//! Policy names never carry request values: they are the rule's `name`, or for unnamed rules a short
//! hash of the rule's path (a path can hold configured values such as a whitelisted address).

use super::whole_seconds;
use tollgate_core::limiter::{Code, DescriptorStatus};

/// Which headers to add.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HeaderOptions {
    /// The `RateLimit-Limit/Remaining/Reset` trio with these names (`LIMIT_RESPONSE_HEADERS_ENABLED`).
    pub trio: Option<HeaderNames>,
    /// The same trio with `X-RateLimit-*` names.
    pub x_ratelimit: bool,
    /// The IETF `RateLimit` and `RateLimit-Policy` fields.
    pub ietf: bool,
    /// `Retry-After` on OVER_LIMIT.
    pub retry_after: bool,
    /// A JSON body for the 429.
    pub raw_body: bool,
}

/// The names of the trio (`LIMIT_LIMIT_HEADER`, `LIMIT_REMAINING_HEADER`, `LIMIT_RESET_HEADER`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderNames {
    /// Default `RateLimit-Limit`.
    pub limit: String,
    /// Default `RateLimit-Remaining`.
    pub remaining: String,
    /// Default `RateLimit-Reset`.
    pub reset: String,
}

impl Default for HeaderNames {
    fn default() -> Self {
        Self {
            limit: "RateLimit-Limit".into(),
            remaining: "RateLimit-Remaining".into(),
            reset: "RateLimit-Reset".into(),
        }
    }
}

impl HeaderNames {
    fn x_ratelimit() -> Self {
        Self {
            limit: "X-RateLimit-Limit".into(),
            remaining: "X-RateLimit-Remaining".into(),
            reset: "X-RateLimit-Reset".into(),
        }
    }
}

/// The headers for a verdict, as (name, value) pairs in a stable order.
pub fn headers(
    overall: Code,
    statuses: &[DescriptorStatus],
    options: &HeaderOptions,
) -> Vec<(String, String)> {
    let mut out = Vec::new();
    if let Some(names) = &options.trio {
        trio(statuses, names, &mut out);
    }
    if options.x_ratelimit {
        trio(statuses, &HeaderNames::x_ratelimit(), &mut out);
    }
    if options.ietf {
        ietf(statuses, &mut out);
    }
    if options.retry_after
        && overall == Code::OverLimit
        && let Some(seconds) = retry_after_secs(statuses)
    {
        out.push(("Retry-After".into(), seconds.to_string()));
    }
    out
}

/// The 429 body, when asked for and the request is over the limit.
pub fn raw_body(overall: Code, statuses: &[DescriptorStatus], options: &HeaderOptions) -> Vec<u8> {
    if !options.raw_body || overall != Code::OverLimit {
        return Vec::new();
    }
    let retry_after = retry_after_secs(statuses).unwrap_or(1);
    format!("{{\"error\":\"rate_limited\",\"retry_after\":{retry_after}}}").into_bytes()
}

/// envoyproxy/ratelimit's choice of the one descriptor the trio describes: the last non-quota
/// descriptor over its limit, otherwise the limited descriptor with the fewest requests left (first on
/// ties). No limited descriptor, no headers.
fn trio(statuses: &[DescriptorStatus], names: &HeaderNames, out: &mut Vec<(String, String)>) {
    let over = statuses
        .iter()
        .rev()
        .find(|s| s.code == Code::OverLimit && !s.quota_mode);
    let chosen = over.or_else(|| {
        statuses
            .iter()
            .filter(|s| s.current_limit().is_some())
            .min_by_key(|s| s.remaining)
    });
    let Some(status) = chosen else { return };
    let Some(limit) = status.current_limit() else {
        return;
    };
    let reset = status.until_reset().map_or(0, whole_seconds);
    out.push((names.limit.clone(), limit.requests_per_unit.to_string()));
    out.push((names.remaining.clone(), status.remaining.to_string()));
    out.push((names.reset.clone(), reset.to_string()));
}

fn ietf(statuses: &[DescriptorStatus], out: &mut Vec<(String, String)>) {
    let mut policies = Vec::new();
    let mut current = Vec::new();
    for status in statuses {
        let Some(limit) = status.current_limit() else {
            continue;
        };
        let name = policy_name(status);
        let window = limit.window.as_secs().max(1);
        policies.push(format!("\"{name}\";q={};w={window}", limit.requests_per_unit));
        let reset = status.until_reset().map_or(0, whole_seconds);
        current.push(format!("\"{name}\";r={};t={reset}", status.remaining));
    }
    if !policies.is_empty() {
        out.push(("RateLimit-Policy".into(), policies.join(", ")));
        out.push(("RateLimit".into(), current.join(", ")));
    }
}

/// A policy name that is safe to show a client: the rule's name (restricted to the characters an
/// sf-string allows without escaping), else a hash of the rule's path.
fn policy_name(status: &DescriptorStatus) -> String {
    let named = status.current_limit().and_then(|l| l.name.as_deref());
    if let Some(name) = named {
        return name
            .chars()
            .filter(|c| c.is_ascii_graphic() && *c != '"' && *c != '\\')
            .collect();
    }
    match &status.rule {
        Some(rule) => format!("r-{}", &blake3::hash(rule.path.as_bytes()).to_hex()[..8]),
        None => "override".into(),
    }
}

/// Seconds until the request could pass: the longest retry hint of the descriptors over their limit
/// (rounded up), ignoring shadow-mode rules and quota-mode descriptors that did not decide. A
/// descriptor refused for a cost it can never admit has no hint (waiting will not help), and gives
/// no `Retry-After`.
fn retry_after_secs(statuses: &[DescriptorStatus]) -> Option<u64> {
    statuses
        .iter()
        .filter(|s| s.code == Code::OverLimit)
        .filter_map(|s| s.retry_after)
        .map(whole_seconds)
        .max()
        .map(|secs| secs.max(1))
}
