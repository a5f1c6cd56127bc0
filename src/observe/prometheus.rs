//! The Prometheus text exposition of what the core records (`tollgate_core::observe::metrics`), served
//! at `/metrics` on the HTTP and debug ports (and `PROMETHEUS_ADDR` with `USE_PROMETHEUS`).
//!
//! envoyproxy/ratelimit's names are kept so its dashboards carry over: per rule
//! `ratelimit_service_rate_limit_{total_hits,over_limit,near_limit,within_limit,shadow_mode}` labelled
//! `domain`, `key1`, `key2` (from the Go stat names of [`go_stats`], as the Go service's default
//! mapping labels them, see `render_rules`), and
//! `ratelimit_service_config_load_{success,error}`, `ratelimit_service_total_requests{grpc_method}`,
//! `ratelimit_service_should_rate_limit_error{err_type}`,
//! `ratelimit_service_response_time_seconds{grpc_method}` (the method a request came in through, see
//! [`Method`]). Tollgate adds `tollgate_*` series for the store, failure modes, the local cache and the
//! loaded rules.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use tollgate_core::observe::metrics::{BUCKETS, Histogram, Method, Metrics, RULE_SERIES, StoreOperation};
use tollgate_core::store::StoreCounters;

use super::go_stats;

/// The Prometheus text exposition of every series of `metrics`, with the store's own counters and the
/// process' (`process_*`).
pub fn render(metrics: &Metrics, store: StoreCounters) -> String {
    let mut out = String::with_capacity(4096);
    render_rules(metrics, &mut out);
    let counters: [(&str, &str, u64); 31] = [
        (
            "ratelimit_service_config_load_success",
            "Rule sets loaded.",
            metrics.config_load_success.get(),
        ),
        (
            "ratelimit_service_config_load_error",
            "Rule sets rejected (previous rules kept).",
            metrics.config_load_error.get(),
        ),
        (
            "tollgate_domain_not_found_total",
            "Requests for an unknown domain.",
            metrics.domain_not_found.get(),
        ),
        (
            "tollgate_failure_mode_allowed_total",
            "Descriptors allowed by failure_mode: open.",
            metrics.failure_mode_allowed.get(),
        ),
        (
            "tollgate_failure_mode_denied_total",
            "Descriptors denied by failure_mode: closed.",
            metrics.failure_mode_denied.get(),
        ),
        (
            "tollgate_failure_mode_local_total",
            "Descriptors decided in this instance by failure_mode: local.",
            metrics.failure_mode_local.get(),
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
            "tollgate_memory_refused_total",
            "Lease acquires and refunds the embedded store refused because its leases or refund markers were at their cap (a quarter of TOLLGATE_MEMORY_MAX_KEYS each).",
            store.memory_refused,
        ),
        (
            "tollgate_store_errors_total",
            "Requests failed because the store failed.",
            metrics.store_errors.get(),
        ),
        (
            "tollgate_grpc_tls_handshake_failures_total",
            "TLS handshakes refused or timed out on the gRPC listener.",
            metrics.tls_handshake_failures.get(),
        ),
        (
            "tollgate_request_bytes_over_budget_total",
            "Requests failed because unfinished requests held their connection's or the process's budget of bytes (TOLLGATE_MAX_CONNECTION_BYTES_IN_FLIGHT, TOLLGATE_MAX_REQUEST_BYTES_IN_FLIGHT).",
            metrics.request_bytes_over_budget.get(),
        ),
        (
            "tollgate_request_read_timeouts_total",
            "Requests failed because their body did not arrive whole within TOLLGATE_READ_TIMEOUT.",
            metrics.request_read_timeouts.get(),
        ),
        (
            "tollgate_connections_refused_total",
            "Connections closed at once because their listener held as many as it may (TOLLGATE_MAX_CONNECTIONS, TOLLGATE_HTTP_MAX_CONNECTIONS).",
            metrics.connections_refused.get(),
        ),
        (
            "tollgate_connections_evicted_total",
            "Connections that had sent no request yet, closed to make room for a new connection at their listener's cap.",
            metrics.connections_evicted.get(),
        ),
        (
            "tollgate_connections_timed_out_total",
            "Connections closed because they sent no request (gRPC preface, HTTP headers) within TOLLGATE_READ_TIMEOUT.",
            metrics.connections_timed_out.get(),
        ),
        (
            "tollgate_statsd_lines_dropped_total",
            "Stat lines the statsd sink could not send (USE_STATSD); their increases go with the next flush.",
            metrics.statsd_lines_dropped.get(),
        ),
        (
            "tollgate_stats_folded_total",
            "Values counted together under one series by a cardinality cap (unknown domains beyond 100).",
            metrics.stats_folded.get(),
        ),
        (
            "tollgate_service_errors_total",
            "Requests refused as malformed or with no rules.",
            metrics.service_errors.get(),
        ),
        (
            "tollgate_leases_acquired_total",
            "New concurrency leases granted (renewals not counted).",
            metrics.leases_acquired.get(),
        ),
        (
            "tollgate_leases_refused_total",
            "Lease acquires refused because a concurrency rule was full.",
            metrics.leases_refused.get(),
        ),
        (
            "tollgate_trace_export_failures_total",
            "Trace exports that failed (the first is logged at warn, then one a minute).",
            super::otlp::export_failures(),
        ),
        (
            "tollgate_leases_released_total",
            "Lease releases that freed a slot (an expired lease frees none).",
            metrics.leases_released.get(),
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
            metrics.requests(method)
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
        metrics.store_errors.get()
    );
    let _ = writeln!(
        out,
        "{name}{{err_type=\"service_error\"}} {}",
        metrics.service_errors.get()
    );
    let name = "ratelimit_service_response_time_seconds";
    let _ = writeln!(
        out,
        "# HELP {name} Time to answer a request, per API method.\n# TYPE {name} histogram"
    );
    for method in Method::ALL {
        let labels = format!("grpc_method=\"{}\",", method.name());
        render_histogram(metrics.response_time(method), &mut out, name, &labels);
    }
    let name = "tollgate_store_call_duration_seconds";
    let _ = writeln!(
        out,
        "# HELP {name} Time of one store call, per operation.\n# TYPE {name} histogram"
    );
    for operation in StoreOperation::ALL {
        let labels = format!("operation=\"{}\",", operation.name());
        render_histogram(metrics.store_time(operation), &mut out, name, &labels);
    }
    let name = "tollgate_memory_keys";
    let _ = writeln!(
        out,
        "# HELP {name} Entries in the embedded store (and the failure_mode: local fallback).\n# TYPE {name} gauge\n{name} {}",
        store.memory_keys
    );
    let name = "tollgate_store_up";
    let _ = writeln!(
        out,
        "# HELP {name} Whether the store answers (1) or not (0), per store: embedded, redis, redis_persecond.\n# TYPE {name} gauge"
    );
    for (store, up) in metrics.stores_up() {
        let _ = writeln!(out, "{name}{{store=\"{store}\"}} {}", u64::from(up));
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
    let (version, at) = metrics.loaded_version();
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

/// The Go series of rules and domains, as envoyproxy/ratelimit's default Prometheus mapping makes them
/// from the Go stat names ([`go_stats`]): a rule one level deep is `{domain, key1}`, a deeper one
/// `{domain, key1, key2}` with its levels past the second dropped, so rules that differ only there, or
/// whose values hold dots, add into one series, as they do there. What that mapping does not match keeps
/// its Go name with every character Prometheus cannot take turned to `_`
/// (`ratelimit_service_rate_limit_api_user_over_limit_with_local_cache`), and appears once it counted
/// something. (The Go mapping also adds `over_limit_with_local_cache` into `over_limit` for rules two
/// levels deep, a side effect of an unanchored expression; the hits are in `over_limit` already, so
/// Tollgate does not count them twice.)
fn render_rules(metrics: &Metrics, out: &mut String) {
    let mut mapped: BTreeMap<String, [u64; RULE_SERIES.len()]> = BTreeMap::new();
    let mut unmapped: Vec<(String, u64)> = Vec::new();
    for ((_, path), stats) in metrics.rules() {
        let key = go_stats::rule_key(&path);
        let sums = mapped.entry(default_rule_labels(&key)).or_default();
        for (sum, counter) in sums.iter_mut().zip(stats.in_order()) {
            *sum = sum.saturating_add(counter.get());
        }
        let cached = stats.over_limit_with_local_cache.get();
        if cached > 0 {
            let name = format!("{}.{key}.over_limit_with_local_cache", go_stats::RULE_SCOPE);
            unmapped.push((metric_name(&name), cached));
        }
    }
    for (at, suffix) in RULE_SERIES.iter().enumerate() {
        let name = format!("ratelimit_service_rate_limit_{suffix}");
        let _ = writeln!(
            out,
            "# HELP {name} Hits per rule ({suffix}).\n# TYPE {name} counter"
        );
        for (labels, sums) in &mapped {
            let _ = writeln!(out, "{name}{{{labels}}} {}", sums[at]);
        }
    }
    for (domain, count) in metrics.unknown_domains() {
        let name = format!(
            "{}.{}.domain_not_found",
            go_stats::RULE_SCOPE,
            go_stats::sanitize(&domain)
        );
        unmapped.push((metric_name(&name), count));
    }
    unmapped.push((
        "ratelimit_service_global_shadow_mode".into(),
        metrics.global_shadow_mode.get(),
    ));
    for (name, value) in unmapped {
        let _ = writeln!(
            out,
            "# HELP {name} envoyproxy/ratelimit's {name}.\n# TYPE {name} counter\n{name} {value}"
        );
    }
}

/// `domain`, `key1` and (two levels deep or more) `key2` from a rule's sanitized key, as the Go
/// service's default mapping takes them from the stat name's dot-separated components.
fn default_rule_labels(key: &str) -> String {
    let mut parts = key.split('.');
    let domain = parts.next().unwrap_or_default();
    let key1 = parts.next().unwrap_or_default();
    let mut labels = format!("domain=\"{}\",key1=\"{}\"", escape(domain), escape(key1));
    if let Some(key2) = parts.next() {
        let _ = write!(labels, ",key2=\"{}\"", escape(key2));
    }
    labels
}

/// A statsd name as a Prometheus metric name, as statsd_exporter names what its mapping does not
/// match: every character but ASCII letters, digits and `_` becomes `_`, and a leading digit gets a `_`
/// before it.
fn metric_name(statsd: &str) -> String {
    let mut name: String = statsd
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if name.starts_with(|c: char| c.is_ascii_digit()) {
        name.insert(0, '_');
    }
    name
}

/// One histogram's `_bucket`, `_sum` and `_count` lines; `labels` ends with a comma when not empty.
fn render_histogram(histogram: &Histogram, out: &mut String, name: &str, labels: &str) {
    let (buckets, count, sum) = histogram.read();
    for (bound, cumulative) in BUCKETS.iter().zip(buckets) {
        let _ = writeln!(out, "{name}_bucket{{{labels}le=\"{bound}\"}} {cumulative}");
    }
    let _ = writeln!(out, "{name}_bucket{{{labels}le=\"+Inf\"}} {count}");
    let labels = labels.trim_end_matches(',');
    let labels = if labels.is_empty() {
        String::new()
    } else {
        format!("{{{labels}}}")
    };
    let _ = writeln!(out, "{name}_sum{labels} {sum}");
    let _ = writeln!(out, "{name}_count{labels} {count}");
}

fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {

    use std::time::Duration;

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
        let text = render(
            &metrics,
            StoreCounters {
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
                memory_refused: 11,
                memory_keys: 12,
                lease_slots: Some(4),
            },
        );
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
        assert!(text.contains("tollgate_memory_refused_total 11"));
        assert!(text.contains("tollgate_leases_in_flight 4"));
        metrics.leases_acquired.add(2);
        metrics.store_call(StoreOperation::Refund, Duration::from_micros(30));
        assert!(
            !text.contains("tollgate_store_up{"),
            "no store state until a watcher records one"
        );
        metrics.set_store_up("redis", true);
        metrics.set_store_up("redis_persecond", false);
        metrics.set_store_up("redis", false);
        let text = render(&metrics, StoreCounters::default());
        assert!(text.contains("tollgate_store_up{store=\"redis\"} 0"), "{text}");
        assert!(
            text.contains("tollgate_store_up{store=\"redis_persecond\"} 0"),
            "{text}"
        );
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
    fn histograms_render_cumulative_buckets() {
        let h = Histogram::default();
        h.observe(Duration::from_micros(40));
        h.observe(Duration::from_millis(3));
        h.observe(Duration::from_secs(5));
        let mut out = String::new();
        render_histogram(&h, &mut out, "t", "");
        assert!(out.contains("t_bucket{le=\"0.00005\"} 1"), "{out}");
        assert!(out.contains("t_bucket{le=\"0.005\"} 2"), "{out}");
        assert!(out.contains("t_bucket{le=\"1\"} 2"), "{out}");
        assert!(out.contains("t_bucket{le=\"+Inf\"} 3"), "{out}");
        assert!(out.contains("t_count 3"), "{out}");
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(default_rule_labels("d.k_a\"b"), "domain=\"d\",key1=\"k_a\\\"b\"");
    }

    /// The labels envoyproxy/ratelimit's default mapping gives, for the shapes its users have: one
    /// level, two, three (the third is dropped, and rules that differ only there add up), an IPv4 value
    /// (one component once sanitized), and a value with other dots (which split it, as in Go).
    #[test]
    fn rules_are_labelled_and_summed_as_the_go_default_mapping_does() {
        let metrics = Metrics::new();
        metrics.rule("d", "d.a").total_hits.add(1);
        metrics.rule("d", "d.a.b").total_hits.add(2);
        metrics.rule("d", "d.a.b.c").total_hits.add(3);
        metrics.rule("d", "d.a.b.e").total_hits.add(4);
        metrics.rule("d", "d.remote_address_10.0.0.1").total_hits.add(5);
        metrics.rule("d", "d.path_/a.b").total_hits.add(6);
        metrics.rule("d", "d.k").over_limit_with_local_cache.add(7);
        metrics.unknown_domain("nope");
        let mut out = String::new();
        render_rules(&metrics, &mut out);
        for line in [
            "ratelimit_service_rate_limit_total_hits{domain=\"d\",key1=\"a\"} 1",
            "ratelimit_service_rate_limit_total_hits{domain=\"d\",key1=\"a\",key2=\"b\"} 9",
            "ratelimit_service_rate_limit_total_hits{domain=\"d\",key1=\"remote_address_10_0_0_1\"} 5",
            "ratelimit_service_rate_limit_total_hits{domain=\"d\",key1=\"path_/a\",key2=\"b\"} 6",
            "ratelimit_service_rate_limit_d_k_over_limit_with_local_cache 7",
            "ratelimit_service_rate_limit_nope_domain_not_found 1",
            "ratelimit_service_global_shadow_mode 0",
        ] {
            assert!(out.lines().any(|l| l == line), "{line} in\n{out}");
        }
        assert!(!out.contains("key2=\"b.c\""), "{out}");
    }
}
