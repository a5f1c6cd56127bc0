//! The compiled rule set: validated rules files (see [`crate::rules::file`]) turned into a lookup tree that
//! answers "which rule applies to this descriptor?" with one hash lookup per entry.
//!
//! Layout: `compile.rs` builds the tree, `matcher.rs` walks it, `normalize.rs` and `pattern.rs` handle
//! values that are not compared byte for byte; `cores.rs` splits a large load over the machine's cores;
//! `proxy/` turns a proxy's request into a domain's descriptors (the rules file's `proxy:` block).

pub mod file;
pub mod proxy;
pub mod reload;

mod compile;
mod cores;
mod ip_text;
mod matcher;
mod normalize;
mod pattern;
mod small_map;

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::algorithm::{Algorithm, Limit};
use file::{ConcurrencyConfig, FailureMode, MetaValue, Unit};

pub use compile::CompileOptions;

/// Most limits one descriptor node may carry (`rate_limits`). The limiter tracks a request's active
/// limits in a 64-bit mask, so it never copies them; no real key needs more than a handful.
pub const MAX_LIMITS_PER_RULE: usize = 64;
pub use matcher::{DescriptorEntry, Found, ValueEncoding};
pub(crate) use normalize::canonical_ip;
pub use normalize::{HASH_MARK, MAX_RAW_VALUE_IN_KEY, ValueHasher};

/// The currently loaded rules; `None` until a rule set has loaded successfully. Shared between the
/// limiter and the rules' source (the reloader, the server's xDS client), which swaps in a new set
/// atomically.
pub type RulesHandle = Arc<arc_swap::ArcSwapOption<RuleSet>>;

/// Every loaded domain, ready for matching. Immutable once built: a reload builds a new one and
/// swaps it in whole, so a request sees either the old rules or the new ones, never a mix.
#[derive(Debug, Default)]
pub struct RuleSet {
    /// By name, hashed with hashbrown's seeded foldhash rather than SipHash: every request looks its
    /// domain up, and the names come from the rules, so a caller cannot choose keys that collide.
    domains: hashbrown::HashMap<String, Domain>,
}

impl RuleSet {
    /// The domain named `name`, if any file defined it.
    pub fn domain(&self, name: &str) -> Option<&Domain> {
        self.domains.get(name)
    }

    /// Number of domains.
    pub fn len(&self) -> usize {
        self.domains.len()
    }

    /// Whether no domain is loaded.
    pub fn is_empty(&self) -> bool {
        self.domains.is_empty()
    }

    /// One line per rule in envoyproxy/ratelimit's `/rlconfig` format, sorted by rule path:
    /// `<path>: unit=<UNIT> requests_per_unit=<n>, shadow_mode: <bool>, quota_mode: <bool>`.
    pub fn dump(&self) -> String {
        let mut lines: Vec<String> = self
            .domains
            .values()
            .flat_map(|d| d.rules.iter())
            .flat_map(|rule| rule.dump_lines())
            .collect();
        lines.sort();
        lines.iter().map(|l| format!("{l}\n")).collect()
    }
}

/// One domain's rules.
#[derive(Debug)]
pub struct Domain {
    name: String,
    all_or_nothing: bool,
    /// Where a Go fleet may share the counters: some rule keeps Go's keys ([`Rule::value_encoding`]),
    /// and some has keys of Tollgate's own.
    go_keyed: bool,
    own_keyed: bool,
    /// Some rule hashes its values (`hash: true`): the debug log hashes values it cannot place.
    hashes: bool,
    root: matcher::Level,
    rules: Vec<Arc<Rule>>,
    /// The `proxy:` block: how a proxy's request becomes this domain's descriptors.
    proxy: Option<crate::rules::proxy::ProxyRules>,
}

impl Domain {
    /// The domain name from the rules file.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The `proxy:` block, if the domain's rules file has one (rules over xDS have none).
    pub fn proxy(&self) -> Option<&crate::rules::proxy::ProxyRules> {
        self.proxy.as_ref()
    }

    /// Tollgate's `all_or_nothing: true`: a request consumes nothing unless every descriptor passes.
    pub fn all_or_nothing(&self) -> bool {
        self.all_or_nothing
    }

    /// The encoding to match a descriptor in first: Go's while some rule may keep Go's key, else
    /// escaped (every key Tollgate's own), which then needs no second walk. `go_may_share`: as for
    /// [`Rule::value_encoding`].
    pub fn first_encoding(&self, go_may_share: bool) -> ValueEncoding {
        if self.go_keyed && go_may_share {
            ValueEncoding::Go
        } else {
            ValueEncoding::Escaped
        }
    }
}

/// The rate limits attached to one descriptor node, and how to report them.
#[derive(Debug)]
pub struct Rule {
    /// The node's path as envoyproxy/ratelimit names it in stats: `domain.key_value.subkey`.
    pub path: Arc<str>,
    /// One entry from `rate_limit`, or several from Tollgate's `rate_limits` (all must pass). Empty for
    /// a node with only a `concurrency` rule.
    pub limits: Vec<RuleLimit>,
    /// Tollgate's `concurrency`: the cap on leases held at once (native API's Acquire and Release).
    /// Boxed, as `metadata`: few rules have either, and a rule is a 96-byte allocation without them
    /// inline instead of 160 (100,000 routes: 6 MB).
    pub concurrency: Option<Box<ConcurrencyConfig>>,
    /// Evaluate and count, but always report OK for this rule.
    pub shadow_mode: bool,
    /// Quota mode: the request is only over the limit when every quota-mode descriptor is.
    pub quota_mode: bool,
    /// Free-form `metadata` echoed in dynamic metadata when this descriptor passes.
    pub metadata: Option<Box<BTreeMap<String, MetaValue>>>,
    /// The rule's counters (shared with the metrics registry, kept across reloads).
    pub stats: Arc<crate::observe::metrics::RuleStats>,
    /// With `detailed_metric`: the counters per request value, which replace [`Rule::stats`] for
    /// values below the cap.
    pub detailed: Option<Arc<crate::observe::metrics::DetailedValues>>,
}

impl Rule {
    /// How request values enter this rule's storage keys: as envoyproxy/ratelimit writes them where a
    /// Go replica may share the counter (one fixed-window limit, which the Redis store keys exactly as
    /// Go does), escaped everywhere else (see [`ValueEncoding`]). `go_may_share`: the store is one a Go
    /// fleet may share (Redis, not the embedded store) and the domain's keys are not kept together.
    pub fn value_encoding(&self, go_may_share: bool) -> ValueEncoding {
        match self.limits.as_slice() {
            [only]
                if go_may_share
                    && only.rate.is_some_and(|rate| {
                        rate.limit.algorithm == crate::algorithm::Algorithm::FixedWindow
                    }) =>
            {
                ValueEncoding::Go
            }
            _ => ValueEncoding::Escaped,
        }
    }

    fn dump_lines(&self) -> impl Iterator<Item = String> + '_ {
        let concurrency = self.concurrency.as_deref().map(|c| {
            format!(
                "{}: concurrency max_in_flight={} lease_ttl={}",
                self.path,
                c.max_in_flight,
                humantime::format_duration(c.lease_ttl)
            )
        });
        self.limits
            .iter()
            .map(move |limit| match &limit.rate {
                Some(rate) => format!(
                    "{}: unit={} requests_per_unit={}, shadow_mode: {}, quota_mode: {}",
                    self.path,
                    rate.unit.name(),
                    rate.requests_per_unit,
                    self.shadow_mode,
                    self.quota_mode
                ),
                None => format!(
                    "{}: unlimited, shadow_mode: {}, quota_mode: {}",
                    self.path, self.shadow_mode, self.quota_mode
                ),
            })
            .chain(concurrency)
    }
}

/// One limit of a rule.
#[derive(Debug, Clone)]
pub struct RuleLimit {
    /// `name`: returned as `current_limit.name` and the target of other rules' `replaces`.
    pub name: Option<Arc<str>>,
    /// Names of limits this one removes from the same request when it matches.
    pub replaces: Vec<String>,
    /// What to answer when the store fails; `None` means a gRPC error, as envoyproxy/ratelimit does.
    pub failure_mode: Option<FailureMode>,
    /// The rate; `None` for `unlimited: true`.
    pub rate: Option<Rate>,
}

/// A number of requests per window, as configured and as the algorithms see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    /// Requests per window, as configured (reported back in `current_limit`).
    pub requests_per_unit: u32,
    /// The configured unit (reported back in `current_limit`).
    pub unit: Unit,
    /// Tollgate's `unit_multiplier`: the window is `unit × multiplier` long.
    pub unit_multiplier: u32,
    /// The algorithm's view: algorithm, window in microseconds, burst.
    pub limit: Limit,
}

impl Rate {
    /// A rate of `requests_per_unit` per `unit × unit_multiplier`, with `burst` defaulting to the rate.
    pub fn new(
        requests_per_unit: u32,
        unit: Unit,
        unit_multiplier: u32,
        algorithm: Algorithm,
        burst: Option<u32>,
    ) -> Self {
        let multiplier = u64::from(unit_multiplier.max(1));
        let window_us = unit
            .seconds()
            .saturating_mul(multiplier)
            .saturating_mul(1_000_000);
        let limit = Limit {
            algorithm,
            requests: u64::from(requests_per_unit),
            window_us,
            burst: u64::from(burst.unwrap_or(requests_per_unit)),
        };
        Self {
            requests_per_unit,
            unit,
            unit_multiplier: unit_multiplier.max(1),
            limit,
        }
    }
}
