//! The counters the limiter keeps for its operators: per rule (envoyproxy/ratelimit's
//! `total_hits`, `over_limit`, `near_limit`, `within_limit`, `shadow_mode`), per API method (requests
//! and response time), per store operation, rule loads, failure modes and leases. The server renders
//! them (Prometheus text at `/metrics`).
//!
//! The registry is an explicit value, not a process-wide recorder: two servers in one test process do
//! not share counters. Recording is a handful of relaxed atomic additions on handles the compiled rules
//! already hold, with no lock and no allocation. Cardinality is bounded by construction: rules are
//! keyed by the rules files (domain and rule path), never by request values, so a million distinct
//! callers add no series; the one exception, `detailed_metric`, is capped per rule
//! ([`DetailedValues`]).

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use arc_swap::ArcSwap;

/// A monotonically increasing count that saturates at `u64::MAX` instead of wrapping: a wrap would read
/// as a counter reset to Prometheus, and hit counts add request costs, which a caller chooses.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    /// Adds `n`, saturating.
    pub fn add(&self, n: u64) {
        // Adding nothing is common (a rule's `near_limit` on most hits) and skipped: an atomic add
        // is a full barrier on x86, a share of a decision's cost.
        if n == 0 {
            return;
        }
        // One atomic add on the hot path; only an addition that overflowed pays for the fix-up. A
        // reader racing that fix-up may see the wrapped value once; every later add keeps it at MAX.
        let before = self.0.fetch_add(n, Ordering::Relaxed);
        if before.checked_add(n).is_none() {
            self.0.store(u64::MAX, Ordering::Relaxed);
        }
    }

    /// The current value.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A rule's name in the registry: its domain and its path (`domain.key_value.subkey`).
pub type RuleName = (Arc<str>, Arc<str>);

/// Upper bounds (seconds) of the latency buckets: from 50 µs (an embedded-store decision) to 1 s,
/// dense around Envoy's default 20 ms rate-limit timeout.
pub const BUCKETS: [f64; 14] = [
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.05, 0.1, 0.25, 1.0,
];

/// A latency histogram with fixed buckets (aggregatable across replicas, unlike summaries).
#[derive(Debug, Default)]
pub struct Histogram {
    /// Observations per bucket of [`BUCKETS`], then those above them all.
    buckets: [AtomicU64; BUCKETS.len() + 1],
    count: AtomicU64,
    sum_ns: AtomicU64,
}

impl Histogram {
    /// Records one observation.
    pub fn observe(&self, elapsed: Duration) {
        let seconds = elapsed.as_secs_f64();
        let at = BUCKETS
            .iter()
            .position(|bound| seconds <= *bound)
            .unwrap_or(BUCKETS.len());
        self.buckets[at].fetch_add(1, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
        let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        self.sum_ns.fetch_add(nanos, Ordering::Relaxed);
    }

    /// The cumulative count of each bucket of [`BUCKETS`], the count of all observations and their sum
    /// in seconds.
    pub fn read(&self) -> ([u64; BUCKETS.len()], u64, f64) {
        let mut cumulative = 0;
        let buckets = std::array::from_fn(|at| {
            cumulative += self.buckets[at].load(Ordering::Relaxed);
            cumulative
        });
        let count = self.count.load(Ordering::Relaxed);
        let sum = self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9;
        (buckets, count, sum)
    }

    /// The observations in each bucket of [`BUCKETS`] (not cumulative), then those above them all.
    pub fn per_bucket(&self) -> [u64; BUCKETS.len() + 1] {
        std::array::from_fn(|at| self.buckets[at].load(Ordering::Relaxed))
    }
}

/// The counters of one rule (envoyproxy/ratelimit's per-rule stats). Hits, not requests: a request with
/// `hits_addend: 5` counts 5.
#[derive(Debug, Default)]
pub struct RuleStats {
    /// Every hit against the rule.
    pub total_hits: Counter,
    /// Hits refused (or that would have been, for shadow rules).
    pub over_limit: Counter,
    /// Allowed hits above `NEAR_LIMIT_RATIO` of the limit.
    pub near_limit: Counter,
    /// Allowed hits.
    pub within_limit: Counter,
    /// Hits over the limit on a shadow-mode rule (reported OK).
    pub shadow_mode: Counter,
    /// Hits refused by the over-limit cache in front of the store, without reaching it (also counted
    /// in `over_limit`).
    pub over_limit_with_local_cache: Counter,
}

/// The per-rule series' names, in the order of [`RuleStats::in_order`].
pub const RULE_SERIES: [&str; 5] = [
    "total_hits",
    "over_limit",
    "near_limit",
    "within_limit",
    "shadow_mode",
];

impl RuleStats {
    /// The counters in the order of [`RULE_SERIES`].
    pub fn in_order(&self) -> [&Counter; 5] {
        [
            &self.total_hits,
            &self.over_limit,
            &self.near_limit,
            &self.within_limit,
            &self.shadow_mode,
        ]
    }
}

/// The distinct values a `detailed_metric` rule counts apart by default.
pub const DETAILED_METRIC_MAX_VALUES: usize = 1_000;

/// envoyproxy/ratelimit's `detailed_metric`: a rule that asks for it is counted per request value
/// (`domain.key_value.subkey_subvalue`, the descriptor as the request sent it) instead of per rule, up
/// to a cap on the distinct values counted apart (`TOLLGATE_DETAILED_METRIC_MAX_VALUES`, by default
/// [`DETAILED_METRIC_MAX_VALUES`]). Values beyond the cap fold into the rule's own series, and each
/// fold is counted in [`Metrics::stats_folded`]: any caller can send any value, so without the cap a
/// rule's series would grow with the callers.
///
/// Counting stays lock-free: a decision reads the values' map through an [`ArcSwap`] and adds to the
/// counters it finds. Only a value seen for the first time, below the cap, takes the lock, copies the
/// map with the value added (at most the cap's worth of entries, at most the cap's number of times per
/// rule) and registers its counters in [`Metrics`], where the exports find them.
///
/// One per rule, kept across reloads by the registry (so the cap holds for the process, however often
/// the rules change).
#[derive(Debug)]
pub struct DetailedValues {
    /// The rule's domain, which the registry files the values' counters under.
    domain: Arc<str>,
    /// Each detailed path counted apart, and its counters (also in the registry).
    by_path: ArcSwap<HashMap<Box<str>, Arc<RuleStats>>>,
    /// Taken to add a path: one writer at a time, readers never wait.
    adding: Mutex<()>,
    /// The most paths counted apart.
    max: usize,
}

impl DetailedValues {
    /// No value of a rule of `domain` counted yet; at most `max` will be.
    pub fn new(domain: Arc<str>, max: usize) -> Self {
        Self {
            domain,
            by_path: ArcSwap::from_pointee(HashMap::new()),
            adding: Mutex::new(()),
            max,
        }
    }

    /// The counters of `path` (registered in `metrics` the first time), or `None` when the cap is
    /// reached and `path` is not among the values counted apart: the caller counts it in the rule's
    /// own series, and the fold is counted.
    pub fn stats(&self, path: &str, metrics: &Metrics) -> Option<Arc<RuleStats>> {
        if let Some(answer) = self.known(path, metrics) {
            return answer;
        }
        let _adding = self.adding.lock().unwrap_or_else(PoisonError::into_inner);
        // Another decision may have added it, or filled the map, while this one waited.
        if let Some(answer) = self.known(path, metrics) {
            return answer;
        }
        let known = self.by_path.load();
        let (_, stats) = metrics.rule_and_path(&self.domain, path);
        let mut grown = HashMap::with_capacity(known.len() + 1);
        grown.extend(known.iter().map(|(p, s)| (p.clone(), Arc::clone(s))));
        grown.insert(path.into(), Arc::clone(&stats));
        self.by_path.store(Arc::new(grown));
        Some(stats)
    }

    /// What the map answers for `path` without adding to it: its counters, or a fold (counted) at the
    /// cap; `None` when `path` is to be added.
    fn known(&self, path: &str, metrics: &Metrics) -> Option<Option<Arc<RuleStats>>> {
        let known = self.by_path.load();
        if let Some(stats) = known.get(path) {
            return Some(Some(Arc::clone(stats)));
        }
        if known.len() >= self.max {
            metrics.stats_folded.add(1);
            return Some(None);
        }
        None
    }

    /// How many values are counted apart.
    pub fn len(&self) -> usize {
        self.by_path.load().len()
    }

    /// Whether no value is counted apart yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The API method a request came in through: the `grpc_method` label of the request metrics, as the Go
/// service labels them. The HTTP twins count as their method: `/json` as `ShouldRateLimit`, `/v1/check`
/// as `Check`, and so on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// Envoy's `ShouldRateLimit`.
    ShouldRateLimit,
    /// `tollgate.v1.RateLimiter/Check`.
    Check,
    /// `tollgate.v1.RateLimiter/Refund`.
    Refund,
    /// `tollgate.v1.RateLimiter/Acquire`.
    Acquire,
    /// `tollgate.v1.RateLimiter/Release`.
    Release,
    /// A proxy's forward-auth request (`/forward-auth/{domain}` on the HTTP port), decided as Envoy's
    /// `ShouldRateLimit`.
    ForwardAuth,
}

impl Method {
    /// Every method, in the order the series are written.
    pub const ALL: [Method; 6] = [
        Method::ShouldRateLimit,
        Method::Check,
        Method::Refund,
        Method::Acquire,
        Method::Release,
        Method::ForwardAuth,
    ];

    /// The label value: the gRPC method's name.
    pub fn name(self) -> &'static str {
        match self {
            Method::ShouldRateLimit => "ShouldRateLimit",
            Method::Check => "Check",
            Method::Refund => "Refund",
            Method::Acquire => "Acquire",
            Method::Release => "Release",
            Method::ForwardAuth => "ForwardAuth",
        }
    }
}

/// What a store call was for: the `operation` label of `tollgate_store_call_duration_seconds`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreOperation {
    /// Checks and peeks (Envoy's `ShouldRateLimit`, the native `Check`).
    Decide,
    /// A native `Refund`.
    Refund,
    /// A lease taken or renewed.
    Acquire,
    /// A lease given back.
    Release,
}

impl StoreOperation {
    /// Every operation, in the order the series are written.
    pub const ALL: [StoreOperation; 4] = [
        StoreOperation::Decide,
        StoreOperation::Refund,
        StoreOperation::Acquire,
        StoreOperation::Release,
    ];

    /// The label value.
    pub fn name(self) -> &'static str {
        match self {
            StoreOperation::Decide => "decide",
            StoreOperation::Refund => "refund",
            StoreOperation::Acquire => "acquire",
            StoreOperation::Release => "release",
        }
    }
}

/// Most unknown domains counted by name: any caller can name any domain, so beyond these they count
/// together under [`OTHER_DOMAINS`] (and in [`Metrics::stats_folded`]).
pub const MAX_UNKNOWN_DOMAINS: usize = 100;

/// The name unknown domains beyond [`MAX_UNKNOWN_DOMAINS`] are counted under.
pub const OTHER_DOMAINS: &str = "_other_domains";

/// Every metric of one server.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Keyed by (domain, path), shared with the compiled rules (a path is held once however many
    /// times it is named).
    rules: Mutex<BTreeMap<RuleName, Arc<RuleStats>>>,
    /// Successful rule loads.
    pub config_load_success: Counter,
    /// Rejected rule loads (the previous rules stayed in force).
    pub config_load_error: Counter,
    /// Requests, per [`Method`] (gRPC and their HTTP twins).
    total_requests: [Counter; Method::ALL.len()],
    /// Requests refused as malformed or with no rules loaded.
    pub service_errors: Counter,
    /// Requests failed because the store failed (no `failure_mode` to answer with).
    pub store_errors: Counter,
    /// Requests for a domain no rules file defines (all of them; per domain in [`Metrics::unknown_domains`]).
    pub domain_not_found: Counter,
    /// Unknown domains counted one by one, at most [`MAX_UNKNOWN_DOMAINS`] of them.
    unknown_domains: Mutex<BTreeMap<String, u64>>,
    /// The per-value counters of each `detailed_metric` rule, kept across reloads.
    detailed: Mutex<BTreeMap<RuleName, Arc<DetailedValues>>>,
    /// Requests answered OK only because of global shadow mode (`SHADOW_MODE`): every rule counted,
    /// some said OVER_LIMIT.
    pub global_shadow_mode: Counter,
    /// Values folded into another series by a cardinality cap (unknown domains beyond
    /// [`MAX_UNKNOWN_DOMAINS`], `detailed_metric` values beyond their rule's cap).
    pub stats_folded: Counter,
    /// Descriptors allowed because the store failed and the rule says `failure_mode: open`.
    pub failure_mode_allowed: Counter,
    /// Descriptors refused because the store failed and the rule says `failure_mode: closed`.
    pub failure_mode_denied: Counter,
    /// Descriptors decided in this instance because the store failed and the rule says
    /// `failure_mode: local`.
    pub failure_mode_local: Counter,
    /// Time to answer a request, store included, per [`Method`].
    response_time: [Histogram; Method::ALL.len()],
    /// Time of the store call alone, per [`StoreOperation`].
    store_time: [Histogram; StoreOperation::ALL.len()],
    /// New leases granted (renewals are not counted).
    pub leases_acquired: Counter,
    /// Acquires refused because a concurrency rule was full.
    pub leases_refused: Counter,
    /// Releases that freed at least one slot (a release of an expired lease frees none).
    pub leases_released: Counter,
    loaded: Mutex<(String, u64)>,
}

impl Metrics {
    /// An empty registry.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// The counters of the rule at `path` (`domain.key_value.subkey`), created on first use and kept
    /// across reloads so Prometheus counters never go backwards.
    pub fn rule(&self, domain: &str, path: &str) -> Arc<RuleStats> {
        self.rule_and_path(&domain.into(), path).1
    }

    /// [`Metrics::rule`], with the registry's copy of `path` for the caller to keep instead of one of
    /// its own (rules compiled again on a reload share the first load's).
    pub fn rule_and_path(&self, domain: &Arc<str>, path: &str) -> (Arc<str>, Arc<RuleStats>) {
        let mut rules = self.rules.lock().unwrap_or_else(PoisonError::into_inner);
        match rules.entry((Arc::clone(domain), path.into())) {
            Entry::Occupied(known) => (Arc::clone(&known.key().1), Arc::clone(known.get())),
            Entry::Vacant(new) => {
                let path = Arc::clone(&new.key().1);
                (path, Arc::clone(new.insert(Arc::default())))
            }
        }
    }

    /// The per-value counters of the `detailed_metric` rule at `path`, created on first use with a cap
    /// of `max_values` and kept across reloads (a later cap does not change it).
    pub fn detailed(&self, domain: &Arc<str>, path: &Arc<str>, max_values: usize) -> Arc<DetailedValues> {
        let mut detailed = self.detailed.lock().unwrap_or_else(PoisonError::into_inner);
        let values = detailed
            .entry((Arc::clone(domain), Arc::clone(path)))
            .or_insert_with(|| Arc::new(DetailedValues::new(Arc::clone(domain), max_values)));
        Arc::clone(values)
    }

    /// Records a request for `domain`, which no rules define.
    pub fn unknown_domain(&self, domain: &str) {
        self.domain_not_found.add(1);
        let mut domains = self
            .unknown_domains
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = domains.get_mut(domain) {
            *count = count.saturating_add(1);
            return;
        }
        let name = if domains.len() < MAX_UNKNOWN_DOMAINS {
            domain
        } else {
            self.stats_folded.add(1);
            OTHER_DOMAINS
        };
        let count = domains.entry(name.to_owned()).or_default();
        *count = count.saturating_add(1);
    }

    /// Requests per unknown domain, by name (see [`Metrics::unknown_domain`]).
    pub fn unknown_domains(&self) -> Vec<(String, u64)> {
        let domains = self
            .unknown_domains
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        domains
            .iter()
            .map(|(name, count)| (name.clone(), *count))
            .collect()
    }

    /// Records one request of `method`, answered or failed, and the time it took.
    pub fn request(&self, method: Method, elapsed: Duration) {
        self.total_requests[method as usize].add(1);
        self.response_time[method as usize].observe(elapsed);
    }

    /// Records the time of one store call made for `operation`.
    pub fn store_call(&self, operation: StoreOperation, elapsed: Duration) {
        self.store_time[operation as usize].observe(elapsed);
    }

    /// Requests of `method` so far.
    pub fn requests(&self, method: Method) -> u64 {
        self.total_requests[method as usize].get()
    }

    /// Records a successful load of rules with content hash `version` at `unix_seconds`.
    pub fn loaded(&self, version: &str, unix_seconds: u64) {
        self.config_load_success.add(1);
        *self.loaded.lock().unwrap_or_else(PoisonError::into_inner) = (version.to_owned(), unix_seconds);
    }

    /// The loaded rules' content hash and load time (Unix seconds).
    pub fn loaded_version(&self) -> (String, u64) {
        self.loaded.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Time to answer requests of `method`.
    pub fn response_time(&self, method: Method) -> &Histogram {
        &self.response_time[method as usize]
    }

    /// Time of store calls made for `operation`.
    pub fn store_time(&self, operation: StoreOperation) -> &Histogram {
        &self.store_time[operation as usize]
    }

    /// Every rule's counters, by (domain, rule path), in order.
    pub fn rules(&self) -> Vec<(RuleName, Arc<RuleStats>)> {
        let rules = self.rules.lock().unwrap_or_else(PoisonError::into_inner);
        rules
            .iter()
            .map(|(at, stats)| (at.clone(), Arc::clone(stats)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_saturate_instead_of_wrapping() {
        let counter = Counter::default();
        counter.add(u64::MAX - 1);
        counter.add(5);
        assert_eq!(counter.get(), u64::MAX);
        counter.add(1);
        assert_eq!(counter.get(), u64::MAX, "stays saturated");
    }

    #[test]
    fn histograms_are_cumulative() {
        let h = Histogram::default();
        h.observe(Duration::from_micros(40));
        h.observe(Duration::from_millis(3));
        h.observe(Duration::from_secs(5));
        let (buckets, count, sum) = h.read();
        assert_eq!(buckets[0], 1, "0.00005");
        assert_eq!(buckets[6], 2, "0.005");
        assert_eq!(buckets[BUCKETS.len() - 1], 2, "1");
        assert_eq!(count, 3, "+Inf");
        assert!((sum - 5.00304).abs() < 1e-9, "{sum}");
    }

    #[test]
    fn unknown_domains_are_counted_by_name_up_to_a_cap() {
        let metrics = Metrics::new();
        metrics.unknown_domain("typo");
        metrics.unknown_domain("typo");
        for i in 0..MAX_UNKNOWN_DOMAINS + 5 {
            metrics.unknown_domain(&format!("random-{i}"));
        }
        let domains = metrics.unknown_domains();
        assert_eq!(domains.len(), MAX_UNKNOWN_DOMAINS + 1, "the cap, and the fold");
        assert!(domains.contains(&("typo".to_owned(), 2)));
        assert!(domains.contains(&(OTHER_DOMAINS.to_owned(), 6)));
        assert_eq!(metrics.stats_folded.get(), 6);
        assert_eq!(metrics.domain_not_found.get(), MAX_UNKNOWN_DOMAINS as u64 + 7);
    }

    #[test]
    fn a_rule_keeps_its_counters_across_reloads() {
        let metrics = Metrics::new();
        metrics.rule("api", "api.user").total_hits.add(3);
        metrics.rule("api", "api.user").total_hits.add(2);
        let rules = metrics.rules();
        assert_eq!(rules.len(), 1);
        assert_eq!(rules[0].1.total_hits.get(), 5);
    }

    #[test]
    fn values_beyond_the_cap_fold_and_are_counted() {
        let metrics = Metrics::new();
        let values = DetailedValues::new("d".into(), 2);
        let a = values.stats("d.k_a", &metrics).expect("below the cap");
        a.total_hits.add(1);
        assert!(values.stats("d.k_b", &metrics).is_some());
        assert!(values.stats("d.k_c", &metrics).is_none(), "folded");
        assert_eq!(metrics.stats_folded.get(), 1);
        // A value counted apart stays so, and its counters are the registry's.
        let again = values.stats("d.k_a", &metrics).expect("known");
        assert!(Arc::ptr_eq(&a, &again));
        assert_eq!(metrics.rule("d", "d.k_a").total_hits.get(), 1);
        assert_eq!(values.len(), 2);
    }
}
