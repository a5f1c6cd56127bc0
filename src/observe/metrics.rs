//! Prometheus metrics, rendered in the text exposition format at `/metrics` (HTTP and debug ports).
//!
//! envoyproxy/ratelimit's names are kept so its dashboards carry over: per rule
//! `ratelimit_service_rate_limit_{total_hits,over_limit,near_limit,within_limit,shadow_mode}` labelled
//! `domain`, `key1`, `key2` (the rule's path, as the Go service's default statsd mapping labels it), and
//! `ratelimit_service_config_load_{success,error}`, `ratelimit_service_total_requests{grpc_method}`,
//! `ratelimit_service_should_rate_limit_error{err_type}`,
//! `ratelimit_service_response_time_seconds{grpc_method}` (the method a request came in through, see
//! [`Method`]).
//! Tollgate adds `tollgate_*` series for the store, failure modes, the local cache and the loaded rules.
//!
//! The registry is an explicit value, not a process-wide recorder: two servers in one test process do
//! not share counters. Recording is a handful of relaxed atomic additions on handles the compiled rules
//! already hold, with no lock and no allocation. Cardinality is bounded by construction: labels come from
//! the rules files (domain and rule path), never from request values, so a million distinct callers add
//! no series.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::store::StoreCounters;

/// A monotonically increasing count that saturates at `u64::MAX` instead of wrapping: a wrap would read
/// as a counter reset to Prometheus, and hit counts add request costs, which a caller chooses.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    /// Adds `n`, saturating.
    pub fn add(&self, n: u64) {
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

/// Upper bounds (seconds) of the latency buckets: from 50 µs (an embedded-store decision) to 1 s,
/// dense around Envoy's default 20 ms rate-limit timeout.
const BUCKETS: [f64; 14] = [
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.05, 0.1, 0.25, 1.0,
];

/// A latency histogram with fixed buckets (aggregatable across replicas, unlike summaries).
#[derive(Debug, Default)]
pub struct Histogram {
    buckets: [AtomicU64; BUCKETS.len()],
    count: AtomicU64,
    sum_ns: AtomicU64,
}

impl Histogram {
    /// Records one observation.
    pub fn observe(&self, elapsed: Duration) {
        let seconds = elapsed.as_secs_f64();
        if let Some(at) = BUCKETS.iter().position(|bound| seconds <= *bound) {
            self.buckets[at].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        self.sum_ns.fetch_add(nanos, Ordering::Relaxed);
    }

    fn render(&self, out: &mut String, name: &str, labels: &str) {
        let mut cumulative = 0;
        for (bound, bucket) in BUCKETS.iter().zip(&self.buckets) {
            cumulative += bucket.load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{{labels}le=\"{bound}\"}} {cumulative}");
        }
        let count = self.count.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{{labels}le=\"+Inf\"}} {count}");
        let sum = self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9;
        let labels = labels.trim_end_matches(',');
        let labels = if labels.is_empty() {
            String::new()
        } else {
            format!("{{{labels}}}")
        };
        let _ = writeln!(out, "{name}_sum{labels} {sum}");
        let _ = writeln!(out, "{name}_count{labels} {count}");
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
}

/// The per-rule series, in the order of [`RuleStats::in_order`].
const RULE_SERIES: [&str; 5] = [
    "total_hits",
    "over_limit",
    "near_limit",
    "within_limit",
    "shadow_mode",
];

impl RuleStats {
    fn in_order(&self) -> [&Counter; 5] {
        [
            &self.total_hits,
            &self.over_limit,
            &self.near_limit,
            &self.within_limit,
            &self.shadow_mode,
        ]
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
}

impl Method {
    /// Every method, in the order the series are written.
    pub const ALL: [Method; 5] = [
        Method::ShouldRateLimit,
        Method::Check,
        Method::Refund,
        Method::Acquire,
        Method::Release,
    ];

    /// The label value: the gRPC method's name.
    pub fn name(self) -> &'static str {
        match self {
            Method::ShouldRateLimit => "ShouldRateLimit",
            Method::Check => "Check",
            Method::Refund => "Refund",
            Method::Acquire => "Acquire",
            Method::Release => "Release",
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

/// Every metric of one server.
#[derive(Debug, Default)]
pub struct Metrics {
    rules: Mutex<BTreeMap<(String, String), Arc<RuleStats>>>,
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
    /// Requests for a domain no rules file defines.
    pub domain_not_found: Counter,
    /// Descriptors allowed because the store failed and the rule says `failure_mode: open`.
    pub failure_mode_allowed: Counter,
    /// Descriptors refused because the store failed and the rule says `failure_mode: closed`.
    pub failure_mode_denied: Counter,
    /// Descriptors decided in this instance because the store failed and the rule says
    /// `failure_mode: local`.
    pub failure_mode_local: Counter,
    /// TLS handshakes on the gRPC listener that failed or timed out (a plaintext client, an unknown
    /// client certificate, a wrong SAN).
    pub tls_handshake_failures: Counter,
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
    /// The store does not answer (readiness' view of Redis; never set on the embedded store).
    store_down: std::sync::atomic::AtomicBool,
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
        let mut rules = self.rules.lock().unwrap_or_else(PoisonError::into_inner);
        Arc::clone(rules.entry((domain.to_owned(), path.to_owned())).or_default())
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

    /// Records whether the store answers (`tollgate_store_up`).
    pub fn set_store_up(&self, up: bool) {
        self.store_down.store(!up, Ordering::Relaxed);
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

    /// The Prometheus text exposition of every series, with the store's own counters.
    pub fn render(&self, store: StoreCounters) -> String {
        let mut out = String::with_capacity(4096);
        self.render_rules(&mut out);
        let counters: [(&str, &str, u64); 22] = [
            (
                "ratelimit_service_config_load_success",
                "Rule sets loaded.",
                self.config_load_success.get(),
            ),
            (
                "ratelimit_service_config_load_error",
                "Rule sets rejected (previous rules kept).",
                self.config_load_error.get(),
            ),
            (
                "tollgate_domain_not_found_total",
                "Requests for an unknown domain.",
                self.domain_not_found.get(),
            ),
            (
                "tollgate_failure_mode_allowed_total",
                "Descriptors allowed by failure_mode: open.",
                self.failure_mode_allowed.get(),
            ),
            (
                "tollgate_failure_mode_denied_total",
                "Descriptors denied by failure_mode: closed.",
                self.failure_mode_denied.get(),
            ),
            (
                "tollgate_failure_mode_local_total",
                "Descriptors decided in this instance by failure_mode: local.",
                self.failure_mode_local.get(),
            ),
            (
                "tollgate_local_cache_hits_total",
                "Limits answered by the local over-limit cache.",
                store.local_cache_hits,
            ),
            (
                "tollgate_redis_batches_total",
                "Requests' batches sent to Redis.",
                store.redis_batches,
            ),
            (
                "tollgate_redis_script_calls_total",
                "Script calls made to Redis (fewer than batches when concurrent requests share calls).",
                store.redis_script_calls,
            ),
            (
                "tollgate_redis_pipelines_total",
                "Pipelines sent to Redis: of fixed-window counters (INCRBY + EXPIRE) instead of script calls, and in a Redis Cluster of a coalesced group's script calls to one master.",
                store.redis_pipelines,
            ),
            (
                "tollgate_redis_expires_sent_total",
                "EXPIREs those pipelines sent with an INCRBY.",
                store.redis_expires_sent,
            ),
            (
                "tollgate_redis_expires_skipped_total",
                "EXPIREs left out of those pipelines because the counter was known to carry a TTL.",
                store.redis_expires_skipped,
            ),
            (
                "tollgate_redis_ttl_repairs_total",
                "Counters found created without a TTL (deleted since this instance saw them) and given one.",
                store.redis_ttl_repairs,
            ),
            (
                "tollgate_redis_queue_full_total",
                "Requests answered by their failure mode at once because too many already waited for Redis.",
                store.redis_queue_full,
            ),
            (
                "tollgate_redis_abandoned_total",
                "Requests never sent to Redis because their caller had stopped waiting.",
                store.redis_abandoned,
            ),
            (
                "tollgate_memory_evictions_total",
                "Entries the embedded store evicted to stay within TOLLGATE_MEMORY_MAX_KEYS.",
                store.memory_evictions,
            ),
            (
                "tollgate_store_errors_total",
                "Requests failed because the store failed.",
                self.store_errors.get(),
            ),
            (
                "tollgate_grpc_tls_handshake_failures_total",
                "TLS handshakes refused or timed out on the gRPC listener.",
                self.tls_handshake_failures.get(),
            ),
            (
                "tollgate_service_errors_total",
                "Requests refused as malformed or with no rules.",
                self.service_errors.get(),
            ),
            (
                "tollgate_leases_acquired_total",
                "New concurrency leases granted (renewals not counted).",
                self.leases_acquired.get(),
            ),
            (
                "tollgate_leases_refused_total",
                "Lease acquires refused because a concurrency rule was full.",
                self.leases_refused.get(),
            ),
            (
                "tollgate_leases_released_total",
                "Lease releases that freed a slot (an expired lease frees none).",
                self.leases_released.get(),
            ),
        ];
        for (name, help, value) in counters {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}");
        }
        let name = "ratelimit_service_total_requests";
        let _ = writeln!(
            out,
            "# HELP {name} Requests, per API method.\n# TYPE {name} counter"
        );
        for method in Method::ALL {
            let _ = writeln!(
                out,
                "{name}{{grpc_method=\"{}\"}} {}",
                method.name(),
                self.requests(method)
            );
        }
        let name = "ratelimit_service_should_rate_limit_error";
        let _ = writeln!(
            out,
            "# HELP {name} Failed requests by cause.\n# TYPE {name} counter"
        );
        let _ = writeln!(
            out,
            "{name}{{err_type=\"redis_error\"}} {}",
            self.store_errors.get()
        );
        let _ = writeln!(
            out,
            "{name}{{err_type=\"service_error\"}} {}",
            self.service_errors.get()
        );
        let name = "ratelimit_service_response_time_seconds";
        let _ = writeln!(
            out,
            "# HELP {name} Time to answer a request, per API method.\n# TYPE {name} histogram"
        );
        for method in Method::ALL {
            let labels = format!("grpc_method=\"{}\",", method.name());
            self.response_time[method as usize].render(&mut out, name, &labels);
        }
        let name = "tollgate_store_call_duration_seconds";
        let _ = writeln!(
            out,
            "# HELP {name} Time of one store call, per operation.\n# TYPE {name} histogram"
        );
        for operation in StoreOperation::ALL {
            let labels = format!("operation=\"{}\",", operation.name());
            self.store_time[operation as usize].render(&mut out, name, &labels);
        }
        let gauges: [(&str, &str, u64); 2] = [
            (
                "tollgate_store_up",
                "Whether the store answers (1) or not (0).",
                u64::from(!self.store_down.load(Ordering::Relaxed)),
            ),
            (
                "tollgate_memory_keys",
                "Entries in the embedded store (and the failure_mode: local fallback).",
                store.memory_keys,
            ),
        ];
        for (name, help, value) in gauges {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}");
        }
        if let Some(slots) = store.lease_slots {
            let _ = writeln!(
                out,
                "# HELP tollgate_leases_in_flight Concurrency slots held by live leases (embedded store).\n# TYPE tollgate_leases_in_flight gauge\ntollgate_leases_in_flight {slots}"
            );
        }
        let _ = writeln!(
            out,
            "# HELP tollgate_build_info The running build.\n# TYPE tollgate_build_info gauge\ntollgate_build_info{{version=\"{}\"}} 1",
            env!("CARGO_PKG_VERSION")
        );
        super::process::render(&mut out);
        let (version, at) = self.loaded.lock().unwrap_or_else(PoisonError::into_inner).clone();
        let _ = writeln!(
            out,
            "# HELP tollgate_config_info The loaded rules' content hash.\n# TYPE tollgate_config_info gauge"
        );
        let _ = writeln!(out, "tollgate_config_info{{version=\"{version}\"}} 1");
        let _ = writeln!(
            out,
            "# HELP tollgate_config_load_timestamp_seconds When the rules were loaded.\n# TYPE tollgate_config_load_timestamp_seconds gauge"
        );
        let _ = writeln!(out, "tollgate_config_load_timestamp_seconds {at}");
        out
    }

    fn render_rules(&self, out: &mut String) {
        let rules = self.rules.lock().unwrap_or_else(PoisonError::into_inner);
        for (at, suffix) in RULE_SERIES.iter().enumerate() {
            let name = format!("ratelimit_service_rate_limit_{suffix}");
            let _ = writeln!(
                out,
                "# HELP {name} Hits per rule ({suffix}).\n# TYPE {name} counter"
            );
            for ((domain, path), stats) in rules.iter() {
                let _ = writeln!(
                    out,
                    "{name}{{{}}} {}",
                    rule_labels(domain, path),
                    stats.in_order()[at].get()
                );
            }
        }
    }
}

/// `domain`, `key1` and `key2` from a rule path, as envoyproxy/ratelimit's statsd mapping splits it
/// (deeper levels stay in `key2`, joined by `.`).
fn rule_labels(domain: &str, path: &str) -> String {
    let keys = path
        .strip_prefix(domain)
        .and_then(|rest| rest.strip_prefix('.'))
        .unwrap_or(path);
    let (key1, key2) = keys.split_once('.').unwrap_or((keys, ""));
    let mut labels = format!("domain=\"{}\",key1=\"{}\"", escape(domain), escape(key1));
    if !key2.is_empty() {
        let _ = write!(labels, ",key2=\"{}\"", escape(key2));
    }
    labels
}

fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {

    #[test]
    fn counters_saturate_instead_of_wrapping() {
        let counter = Counter::default();
        counter.add(u64::MAX - 1);
        counter.add(5);
        assert_eq!(counter.get(), u64::MAX);
        counter.add(1);
        assert_eq!(counter.get(), u64::MAX, "stays saturated");
    }

    use super::*;

    #[test]
    fn rules_render_with_go_labels_and_survive_reloads() {
        let metrics = Metrics::new();
        metrics.rule("api", "api.user").total_hits.add(3);
        metrics
            .rule("api", "api.path_/login.remote_address")
            .over_limit
            .add(1);
        // A reload asks again for the same rule: same counters.
        metrics.rule("api", "api.user").total_hits.add(2);
        let text = metrics.render(StoreCounters {
            local_cache_hits: 7,
            redis_batches: 40,
            redis_script_calls: 3,
            redis_pipelines: 5,
            redis_expires_sent: 6,
            redis_expires_skipped: 8,
            redis_ttl_repairs: 10,
            redis_queue_full: 2,
            redis_abandoned: 1,
            memory_evictions: 9,
            memory_keys: 12,
            lease_slots: Some(4),
        });
        assert!(
            text.contains("ratelimit_service_rate_limit_total_hits{domain=\"api\",key1=\"user\"} 5"),
            "{text}"
        );
        assert!(text.contains("ratelimit_service_rate_limit_over_limit{domain=\"api\",key1=\"path_/login\",key2=\"remote_address\"} 1"), "{text}");
        assert!(text.contains("tollgate_local_cache_hits_total 7"));
        assert!(text.contains("tollgate_redis_batches_total 40"));
        assert!(text.contains("tollgate_redis_script_calls_total 3"));
        assert!(text.contains("tollgate_redis_expires_sent_total 6"));
        assert!(text.contains("tollgate_redis_expires_skipped_total 8"));
        assert!(text.contains("tollgate_redis_ttl_repairs_total 10"));
        assert!(text.contains("tollgate_redis_pipelines_total 5"));
        assert!(text.contains("tollgate_redis_queue_full_total 2"));
        assert!(text.contains("tollgate_redis_abandoned_total 1"));
        assert!(text.contains("tollgate_memory_evictions_total 9"));
        assert!(text.contains("tollgate_memory_keys 12"));
        assert!(text.contains("tollgate_leases_in_flight 4"));
        metrics.leases_acquired.add(2);
        metrics.store_call(StoreOperation::Refund, Duration::from_micros(30));
        assert!(
            text.contains("tollgate_store_up 1"),
            "up unless a watcher says otherwise"
        );
        metrics.set_store_up(false);
        let text = metrics.render(StoreCounters::default());
        assert!(text.contains("tollgate_store_up 0"));
        assert!(text.contains("tollgate_leases_acquired_total 2"));
        assert!(
            !text.contains("tollgate_leases_in_flight"),
            "no gauge where the store cannot count"
        );
        assert!(
            text.contains(
                "tollgate_store_call_duration_seconds_bucket{operation=\"refund\",le=\"0.00005\"} 1"
            ),
            "{text}"
        );
        assert!(text.contains("tollgate_store_call_duration_seconds_count{operation=\"decide\"} 0"));
        assert!(text.contains(&format!(
            "tollgate_build_info{{version=\"{}\"}} 1",
            env!("CARGO_PKG_VERSION")
        )));
        #[cfg(target_os = "linux")]
        for series in [
            "process_cpu_seconds_total ",
            "process_resident_memory_bytes ",
            "process_start_time_seconds ",
        ] {
            assert!(text.contains(series), "{series} in {text}");
        }
    }

    #[test]
    fn histograms_are_cumulative() {
        let h = Histogram::default();
        h.observe(Duration::from_micros(40));
        h.observe(Duration::from_millis(3));
        h.observe(Duration::from_secs(5));
        let mut out = String::new();
        h.render(&mut out, "t", "");
        assert!(out.contains("t_bucket{le=\"0.00005\"} 1"), "{out}");
        assert!(out.contains("t_bucket{le=\"0.005\"} 2"), "{out}");
        assert!(out.contains("t_bucket{le=\"1\"} 2"), "{out}");
        assert!(out.contains("t_bucket{le=\"+Inf\"} 3"), "{out}");
        assert!(out.contains("t_count 3"), "{out}");
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(rule_labels("d", "d.k_a\"b"), "domain=\"d\",key1=\"k_a\\\"b\"");
    }
}
