//! Validated, in-memory form of the rules files.
//!
//! Everything here has already passed the checks in `validate.rs`, so consumers (the matcher, the
//! limiter, the debug dump) can rely on the invariants documented on each type instead of
//! re-validating.

use std::collections::BTreeMap;

/// Largest `requests_per_unit` accepted for the `sliding_log` algorithm.
///
/// A sliding log stores one entry per admitted request for the whole window, so the limit is
/// also the per-key memory bound; larger limits should use `sliding_window` or `gcra`.
pub const MAX_SLIDING_LOG_REQUESTS_PER_UNIT: u32 = 100_000;

/// Why `requests_per_unit` is too large for a sliding log of `what` (a descriptor path, or a request's
/// override), or `None` when it fits. One text for every way an algorithm is chosen: named in a rules
/// file, taken from `TOLLGATE_DEFAULT_ALGORITHM`, or applied to a request's limit override.
pub fn sliding_log_too_large(requests_per_unit: u32, what: &str) -> Option<String> {
    (requests_per_unit > MAX_SLIDING_LOG_REQUESTS_PER_UNIT).then(|| {
        format!(
            "sliding_log keeps one entry per request: requests_per_unit {requests_per_unit} in {what} \
             exceeds MAX_SLIDING_LOG_REQUESTS_PER_UNIT ({MAX_SLIDING_LOG_REQUESTS_PER_UNIT}); \
             use sliding_window or gcra"
        )
    })
}

/// Algorithm names accepted in `algorithm:` (always stored lowercase).
pub const ALGORITHMS: [&str; 5] = [
    "fixed_window",
    "sliding_window",
    "sliding_log",
    "token_bucket",
    "gcra",
];

/// Largest `max_in_flight` of a `concurrency:` rule: a key holds one entry per lease.
pub const MAX_IN_FLIGHT: u32 = 100_000;

/// `lease_ttl` of a `concurrency:` rule that does not set one.
pub const DEFAULT_LEASE_TTL: std::time::Duration = std::time::Duration::from_secs(60);

/// Longest `lease_ttl` accepted: a lease is a guard against crashed clients, not a reservation.
pub const MAX_LEASE_TTL: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// Algorithms for which `burst:` is meaningful.
pub const BURST_ALGORITHMS: [&str; 2] = ["token_bucket", "gcra"];

/// All rules of one domain.
///
/// With `merge_domains` the domain may come from several files; the top-level descriptor lists
/// are then concatenated in file order.
#[derive(Debug, Clone, PartialEq)]
pub struct DomainConfig {
    /// The non-empty domain name requests are matched against.
    pub domain: String,
    /// Path (as found while loading, or as given to `parse_file`) of the first file that
    /// defined this domain.
    pub file: String,
    /// Tollgate extension (top-level `all_or_nothing:`): when merged from several files it is
    /// true if any file set it.
    pub all_or_nothing: bool,
    /// Top-level descriptor nodes in file order. Composite keys (`key` or `key_value`) are
    /// unique among siblings.
    pub descriptors: Vec<DescriptorConfig>,
    /// Tollgate extension (top-level `proxy:`): how a proxy's request becomes this domain's
    /// descriptors. At most one file of a merged domain has one.
    pub proxy: Option<crate::rules::proxy::ProxyRules>,
}

/// One node of the descriptor tree.
#[derive(Debug, Clone, PartialEq)]
pub struct DescriptorConfig {
    /// Entry key; never empty.
    pub key: String,
    /// `None` for a key-only (default) node. A YAML value of `""` or null is also `None`, as in
    /// Go, where an empty value means "no value".
    pub value: Option<String>,
    /// How `value` is compared with the request value; always `Exact` when `value` is `None`.
    pub value_match: ValueMatch,
    /// Limits on this node, from `rate_limit` (at most one) or `rate_limits` (one or more).
    /// Empty means the node applies no limit (whitelist or pure parent node).
    pub rate_limits: Vec<RateLimitConfig>,
    /// Tollgate extension: at most this many concurrency leases on the node at once (native API only).
    pub concurrency: Option<ConcurrencyConfig>,
    /// Count normally but always report OK.
    pub shadow_mode: bool,
    /// Quota mode: only changes how the overall code is computed.
    pub quota_mode: bool,
    /// Stats only: include the request value in the stats key for key-only matches.
    pub detailed_metric: bool,
    /// Stats only: include runtime values in stats keys at this level.
    pub value_to_metric: bool,
    /// All values matching the wildcard pattern (or CIDR) share one counter. Only set on
    /// `Wildcard` or `Cidr` nodes.
    pub share_threshold: bool,
    /// Free-form `metadata:` map, echoed in dynamic metadata; `None` when absent or null.
    pub metadata: Option<BTreeMap<String, MetaValue>>,
    /// Tollgate extension: how the request value is normalised before matching at this level.
    /// Siblings with the same `key` never declare different non-default normalisations.
    pub normalize: Normalize,
    /// Child nodes in file order; composite keys unique among them.
    pub descriptors: Vec<DescriptorConfig>,
}

/// How a node's `value` is compared with the request value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ValueMatch {
    /// Literal comparison; the value contains no `*` (or the node has no value).
    Exact,
    /// The value contains at least one `*`; each `*` matches zero or more characters of the
    /// request value.
    Wildcard,
    /// `match: cidr`: the request value is an IP address contained in this network. Stored
    /// truncated to the network address (host bits cleared); a bare IP becomes /32 or /128.
    Cidr(ipnet::IpNet),
}

/// A value inside `metadata:`; mirrors what a protobuf `Struct` can hold plus integers.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    /// YAML null / empty value.
    Null,
    /// A boolean.
    Bool(bool),
    /// An integer that fits in `i64` (larger unsigned integers become `Float`).
    Int(i64),
    /// A floating-point number (may be non-finite, e.g. `.inf`).
    Float(f64),
    /// A string.
    String(String),
    /// A sequence.
    List(Vec<MetaValue>),
    /// A mapping; scalar keys are converted to their source text.
    Map(BTreeMap<String, MetaValue>),
}

/// Tollgate extension: request-value normalisation applied before matching at a node's level.
///
/// `Default` is "no normalisation".
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Normalize {
    /// Lower-case the value.
    pub lowercase: bool,
    /// Trim surrounding whitespace.
    pub trim: bool,
    /// Mask an IP-address value to a network prefix.
    pub ip_prefix: Option<IpPrefix>,
    /// Replace the value by a hash (e.g. to bound key length for long tokens).
    pub hash: bool,
}

impl Normalize {
    /// True when the node declares no normalisation at all.
    pub fn is_none(&self) -> bool {
        *self == Normalize::default()
    }
}

/// Prefix lengths used by [`Normalize::ip_prefix`]; validated to `v4 <= 32` and `v6 <= 128`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpPrefix {
    /// Prefix length for IPv4 addresses (default 32 = unchanged).
    pub v4: u8,
    /// Prefix length for IPv6 addresses (default 128 = unchanged).
    pub v6: u8,
}

impl Default for IpPrefix {
    /// Full-length prefixes, i.e. the address is kept as is.
    fn default() -> Self {
        IpPrefix { v4: 32, v6: 128 }
    }
}

/// One limit on a descriptor node.
#[derive(Debug, Clone, PartialEq)]
pub struct RateLimitConfig {
    /// Rule name (for `replaces` and `current_limit.name`); `None` if absent or empty.
    pub name: Option<String>,
    /// Names of rules this rule removes from the same request; entries are non-empty and never
    /// equal to `name`. Names need not exist anywhere.
    pub replaces: Vec<String>,
    /// Tollgate extension: per-rule behaviour when the backend fails; `None` = service default.
    pub failure_mode: Option<FailureMode>,
    /// What the limit is.
    pub policy: LimitPolicy,
}

/// Tollgate extension `concurrency: {max_in_flight: 20, lease_ttl: 30s}`: caps work in flight, through
/// the native API's Acquire and Release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConcurrencyConfig {
    /// Most leases held at once; at most [`MAX_IN_FLIGHT`]. 0 refuses every lease.
    pub max_in_flight: u32,
    /// How long a lease lives unless renewed or released (> 0, at most [`MAX_LEASE_TTL`]); a client
    /// that dies holding a lease blocks its slot at most this long.
    pub lease_ttl: std::time::Duration,
    /// What Acquire answers when the store fails; `None` = a gRPC error.
    pub failure_mode: Option<FailureMode>,
}

/// Either "never limited" or a concrete limit.
#[derive(Debug, Clone, PartialEq)]
pub enum LimitPolicy {
    /// `unlimited: true`: always OK, no backend call, remaining reported as `u32::MAX`.
    Unlimited,
    /// A counted limit.
    Limited(LimitSpec),
}

/// A concrete limit: `requests_per_unit` per `unit_multiplier` x `unit`.
#[derive(Debug, Clone, PartialEq)]
pub struct LimitSpec {
    /// Window unit.
    pub unit: Unit,
    /// Tollgate extension: window length in units; always >= 1 (default 1).
    pub unit_multiplier: u32,
    /// Allowed requests per window; 0 (also when missing, as in Go) blocks everything.
    pub requests_per_unit: u32,
    /// Tollgate extension: lowercase algorithm name, one of [`ALGORITHMS`]; `None` = service
    /// default. `sliding_log` implies `requests_per_unit <= MAX_SLIDING_LOG_REQUESTS_PER_UNIT`.
    pub algorithm: Option<String>,
    /// Tollgate extension: burst size (>= 1); only set when `algorithm` is `None` or one of
    /// [`BURST_ALGORITHMS`].
    pub burst: Option<u32>,
}

impl LimitSpec {
    /// Window length in seconds (`unit.seconds() * unit_multiplier`); cannot overflow.
    pub fn window_seconds(&self) -> u64 {
        self.unit.seconds() * u64::from(self.unit_multiplier)
    }
}

/// Tollgate extension `failure_mode:`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureMode {
    /// Backend failure: answer OK for this rule.
    Open,
    /// Backend failure: fail the request (Go's only behaviour).
    Closed,
    /// Backend failure: count in this instance's embedded store, at the rule's limit divided by the
    /// fleet size (`TOLLGATE_FLEET_SIZE`), until the backend answers again. Rate limits only.
    Local,
}

/// Window unit; numbering is Envoy's `RateLimitResponse.RateLimit.Unit` enum (0 = UNKNOWN is not
/// representable).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum Unit {
    /// 1 second.
    Second = 1,
    /// 60 seconds.
    Minute = 2,
    /// 3600 seconds.
    Hour = 3,
    /// 86400 seconds.
    Day = 4,
    /// 30 days (Go's fixed divider, not calendar months).
    Month = 5,
    /// 365 days (not calendar years).
    Year = 6,
    /// 7 days.
    Week = 7,
}

impl Unit {
    /// Window length in seconds, as Go's `UnitToDivider` (month = 30 days, year = 365 days).
    pub fn seconds(self) -> u64 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3_600,
            Unit::Day => 86_400,
            Unit::Month => 2_592_000,
            Unit::Year => 31_536_000,
            Unit::Week => 604_800,
        }
    }

    /// Upper-case proto enum name (`"SECOND"`, ..., `"WEEK"`), as used in `/rlconfig` and stats.
    pub fn name(self) -> &'static str {
        match self {
            Unit::Second => "SECOND",
            Unit::Minute => "MINUTE",
            Unit::Hour => "HOUR",
            Unit::Day => "DAY",
            Unit::Month => "MONTH",
            Unit::Year => "YEAR",
            Unit::Week => "WEEK",
        }
    }

    /// Case-insensitive lookup of a proto enum name; `"UNKNOWN"` and anything else give `None`.
    ///
    /// Uses Unicode upper-casing, like Go's `strings.ToUpper` in the original loader.
    pub fn from_name(s: &str) -> Option<Unit> {
        match s.to_uppercase().as_str() {
            "SECOND" => Some(Unit::Second),
            "MINUTE" => Some(Unit::Minute),
            "HOUR" => Some(Unit::Hour),
            "DAY" => Some(Unit::Day),
            "MONTH" => Some(Unit::Month),
            "YEAR" => Some(Unit::Year),
            "WEEK" => Some(Unit::Week),
            _ => None,
        }
    }

    /// Proto enum number to unit; 0 (UNKNOWN) and out-of-range numbers give `None`.
    pub fn from_i32(v: i32) -> Option<Unit> {
        match v {
            1 => Some(Unit::Second),
            2 => Some(Unit::Minute),
            3 => Some(Unit::Hour),
            4 => Some(Unit::Day),
            5 => Some(Unit::Month),
            6 => Some(Unit::Year),
            7 => Some(Unit::Week),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unit_round_trips() {
        for v in 1..=7 {
            let u = Unit::from_i32(v).expect("valid unit number");
            assert_eq!(u as i32, v);
            assert_eq!(Unit::from_name(u.name()), Some(u));
            assert_eq!(Unit::from_name(&u.name().to_lowercase()), Some(u));
        }
        assert_eq!(Unit::from_i32(0), None);
        assert_eq!(Unit::from_i32(8), None);
        assert_eq!(Unit::from_name("UNKNOWN"), None);
        assert_eq!(Unit::from_name("unknown"), None);
        assert_eq!(Unit::from_name(""), None);
        assert_eq!(Unit::from_name("MiNuTe"), Some(Unit::Minute));
    }

    #[test]
    fn unit_seconds_match_go_dividers() {
        let expected = [1, 60, 3_600, 86_400, 2_592_000, 31_536_000, 604_800];
        for (v, secs) in (1..=7).zip(expected) {
            assert_eq!(Unit::from_i32(v).map(Unit::seconds), Some(secs));
        }
    }

    #[test]
    fn window_seconds_cannot_overflow() {
        let spec = LimitSpec {
            unit: Unit::Year,
            unit_multiplier: u32::MAX,
            requests_per_unit: 1,
            algorithm: None,
            burst: None,
        };
        assert_eq!(spec.window_seconds(), 31_536_000 * u64::from(u32::MAX));
    }

    #[test]
    fn defaults() {
        assert!(Normalize::default().is_none());
        assert_eq!(IpPrefix::default(), IpPrefix { v4: 32, v6: 128 });
    }
}
