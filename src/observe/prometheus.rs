//! The Prometheus text exposition of what the core records (`tollgate_core::observe::metrics`) and what
//! the server counts itself ([`crate::server_counters`]), served at `/metrics` on the HTTP and debug
//! ports (and `PROMETHEUS_ADDR` with `USE_PROMETHEUS`).
//!
//! envoyproxy/ratelimit's series come first, named as its Prometheus sink names them
//! ([`super::go_series`]: per rule `ratelimit_service_rate_limit_{total_hits,…}{domain,key1,key2}`,
//! `ratelimit_service_total_requests{grpc_method}`, `ratelimit_service_response_time_seconds` and the
//! rest), so its dashboards carry over. Tollgate adds `tollgate_*` series for the store, failure modes,
//! the local cache, the transport's bounds and the loaded rules, and the standard `process_*` ones.

use std::fmt::Write as _;

use tollgate_core::observe::metrics::{Metrics, StoreOperation};
use tollgate_core::store::StoreCounters;

use super::go_series::{self, GoSeries};
use super::text_format::render_histogram;
use crate::server_counters::{ForwardAuthAnswer, ServerCounters};

/// The Prometheus text exposition of every series of `metrics` and the server's own `counters`, with
/// the store's counters and the process' (`process_*`).
pub fn render(metrics: &Metrics, counters: &ServerCounters, store: StoreCounters, go: &GoSeries) -> String {
    let mut out = String::with_capacity(4096);
    go_series::render(metrics, &store, go, &mut out);
    let series: [(&str, &str, u64); 37] = [
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
            "tollgate_redis_stalled_connections_total",
            "Redis connections on which a call outlived its timeout: nothing more was written to them until they drained or were replaced.",
            store.redis_stalled_connections,
        ),
        (
            "tollgate_redis_impossible_states_total",
            "Items whose Redis key held a value no Tollgate could have written (NaN, an infinity, a negative count, a time far ahead): decided as no state and repaired.",
            store.redis_impossible_states,
        ),
        (
            "tollgate_hot_key_reservations_total",
            "Hot-key reservation calls to Redis (TOLLGATE_HOT_KEY_RATE): each decides a request and grants this replica a slice of the key, or gives unspent units back.",
            store.hot_keys.reservations,
        ),
        (
            "tollgate_hot_key_units_granted_total",
            "Units Redis granted to this replica's hot-key slices beyond the requests that asked.",
            store.hot_keys.units_granted,
        ),
        (
            "tollgate_hot_key_units_returned_total",
            "Unspent hot-key units offered back to Redis when a slice was renewed or its lease ended (Redis takes them only within the window that granted them).",
            store.hot_keys.units_returned,
        ),
        (
            "tollgate_hot_key_local_decisions_total",
            "Decisions admitted from a hot-key slice, without a Redis call.",
            store.hot_keys.local_decisions,
        ),
        (
            "tollgate_hot_key_table_full_total",
            "Hot-key decisions made in Redis because 4,096 keys already held slices.",
            store.hot_keys.table_full,
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
            counters.tls_handshake_failures.get(),
        ),
        (
            "tollgate_request_bytes_over_budget_total",
            "Requests failed because unfinished requests held their connection's or the process's budget of bytes (TOLLGATE_MAX_CONNECTION_BYTES_IN_FLIGHT, TOLLGATE_MAX_REQUEST_BYTES_IN_FLIGHT).",
            counters.request_bytes_over_budget.get(),
        ),
        (
            "tollgate_request_read_timeouts_total",
            "Requests failed because their body did not arrive whole within TOLLGATE_READ_TIMEOUT.",
            counters.request_read_timeouts.get(),
        ),
        (
            "tollgate_connections_refused_total",
            "Connections closed at once because their listener held as many as it may (TOLLGATE_MAX_CONNECTIONS, TOLLGATE_HTTP_MAX_CONNECTIONS).",
            counters.connections_refused.get(),
        ),
        (
            "tollgate_connections_evicted_total",
            "Connections closed to make room for a new connection at their listener's cap: one on probation of its own address, or one of the address holding the most.",
            counters.connections_evicted.get(),
        ),
        (
            "tollgate_connections_stalled_total",
            "Connections closed because a write made no progress within TOLLGATE_WRITE_TIMEOUT (a peer that does not read its answers).",
            counters.connections_stalled.get(),
        ),
        (
            "tollgate_connections_timed_out_total",
            "Connections closed because they sent no request (gRPC preface, HTTP headers) within TOLLGATE_READ_TIMEOUT.",
            counters.connections_timed_out.get(),
        ),
        (
            "tollgate_statsd_lines_dropped_total",
            "Stat lines the statsd sink could not send (USE_STATSD); their increases go with the next flush.",
            counters.statsd_lines_dropped.get(),
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
    for (name, help, value) in series {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}");
    }
    let name = "tollgate_store_call_duration_seconds";
    let _ = writeln!(
        out,
        "# HELP {name} Time of one store call, per operation.\n# TYPE {name} histogram"
    );
    for operation in StoreOperation::ALL {
        let labels = format!("operation=\"{}\",", operation.name());
        render_histogram(metrics.store_time(operation), &mut out, name, &labels, 1.0);
    }
    render_forward_auth(counters, &mut out);
    let name = "tollgate_memory_keys";
    let _ = writeln!(
        out,
        "# HELP {name} Entries in the embedded store (and the failure_mode: local fallback).\n# TYPE {name} gauge\n{name} {}",
        store.memory_keys
    );
    let hot = store.hot_keys;
    let _ = writeln!(
        out,
        "# HELP tollgate_hot_keys Keys holding a hot-key slice on this replica.\n# TYPE tollgate_hot_keys gauge\ntollgate_hot_keys {}\n# HELP tollgate_hot_key_units_held Units held in hot-key slices, not yet admitted.\n# TYPE tollgate_hot_key_units_held gauge\ntollgate_hot_key_units_held {}",
        hot.keys, hot.units_held
    );
    let name = "tollgate_store_up";
    let _ = writeln!(
        out,
        "# HELP {name} Whether the store answers (1) or not (0), per store: embedded, redis, redis_persecond.\n# TYPE {name} gauge"
    );
    for (store, up) in counters.stores_up() {
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

/// The proxies' forward-auth requests by answer, and those that came with a body; the decision log.
fn render_forward_auth(counters: &ServerCounters, out: &mut String) {
    let name = "tollgate_forward_auth_requests_total";
    let _ = writeln!(
        out,
        "# HELP {name} Forward-auth requests from proxies (/forward-auth/{{domain}}), per answer.\n# TYPE {name} counter"
    );
    for answer in ForwardAuthAnswer::ALL {
        let value = counters.forward_auth_answers(answer);
        let _ = writeln!(out, "{name}{{answer=\"{}\"}} {value}", answer.name());
    }
    for (name, help, value) in [
        (
            "tollgate_decision_log_written_total",
            "Requests written to the decision log (TOLLGATE_DECISION_LOG).",
            counters.decision_log_written.get(),
        ),
        (
            "tollgate_decision_log_dropped_total",
            "Requests the decision log dropped: its queue full, or its file unwritable.",
            counters.decision_log_dropped.get(),
        ),
    ] {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}");
    }
    let name = "tollgate_forward_auth_bodies_total";
    let _ = writeln!(
        out,
        "# HELP {name} Forward-auth requests that came with a body, which the proxy should not forward (never read).\n# TYPE {name} counter\n{name} {}",
        counters.forward_auth_bodies.get()
    );
}

#[cfg(test)]
mod tests {

    use std::time::Duration;

    use super::*;
    use tollgate_core::store::PoolCounters;

    const DEFAULT: GoSeries = GoSeries::Default {
        response_time_ms: false,
    };

    #[test]
    fn rules_render_with_go_labels_and_survive_reloads() {
        let metrics = Metrics::new();
        metrics.rule("api", "api.user").total_hits.add(3);
        let login = metrics.rule("api", "api.path_/login.remote_address");
        login.total_hits.add(1);
        login.over_limit.add(1);
        // A reload asks again for the same rule: same counters.
        metrics.rule("api", "api.user").total_hits.add(2);
        let text = render(
            &metrics,
            &ServerCounters::default(),
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
                redis_stalled_connections: 3,
                redis_impossible_states: 4,
                memory_evictions: 9,
                memory_refused: 11,
                memory_keys: 12,
                lease_slots: Some(4),
                redis_pool: Some(PoolCounters {
                    active: 4,
                    total: 6,
                    closed: 2,
                }),
                redis_per_second_pool: None,
                hot_keys: tollgate_core::store::HotKeyCounters {
                    local_decisions: 13,
                    units_held: 14,
                    ..Default::default()
                },
            },
            &DEFAULT,
        );
        assert!(
            text.contains("ratelimit_service_rate_limit_total_hits{domain=\"api\",key1=\"user\"} 5"),
            "{text}"
        );
        assert!(text.contains("ratelimit_service_rate_limit_over_limit{domain=\"api\",key1=\"path_/login\",key2=\"remote_address\"} 1"), "{text}");
        assert!(text.contains("tollgate_local_cache_hits_total 7"));
        assert!(text.contains("tollgate_hot_key_local_decisions_total 13"));
        assert!(text.contains("tollgate_hot_key_units_held 14"));
        assert!(text.contains("tollgate_redis_batches_total 40"));
        assert!(text.contains("tollgate_redis_script_calls_total 3"));
        assert!(text.contains("tollgate_redis_expires_sent_total 6"));
        assert!(text.contains("tollgate_redis_expires_skipped_total 8"));
        assert!(text.contains("tollgate_redis_ttl_repairs_total 10"));
        assert!(text.contains("tollgate_redis_pipelines_total 5"));
        assert!(text.contains("tollgate_redis_queue_full_total 2"));
        assert!(text.contains("tollgate_redis_abandoned_total 1"));
        assert!(text.contains("tollgate_redis_stalled_connections_total 3"));
        assert!(text.contains("tollgate_redis_impossible_states_total 4"));
        assert!(text.contains("tollgate_memory_evictions_total 9"));
        assert!(text.contains("tollgate_memory_keys 12"));
        assert!(text.contains("tollgate_memory_refused_total 11"));
        assert!(text.contains("tollgate_leases_in_flight 4"));
        // The Redis pool's Go stats, under their Go names (the default mapping matches none).
        assert!(
            text.contains("# TYPE ratelimit_redis_pool_cx_active gauge\nratelimit_redis_pool_cx_active 4")
        );
        assert!(text.contains("ratelimit_redis_pool_cx_total 6"));
        assert!(text.contains("ratelimit_redis_pool_cx_local_close 2"));
        assert!(!text.contains("redis_per_second_pool"));
        metrics.leases_acquired.add(2);
        metrics.store_call(StoreOperation::Refund, Duration::from_micros(30));
        assert!(
            !text.contains("tollgate_store_up{"),
            "no store state until a watcher records one"
        );
        let counters = ServerCounters::default();
        counters.set_store_up("redis", true);
        counters.set_store_up("redis_persecond", false);
        counters.set_store_up("redis", false);
        let text = render(&metrics, &counters, StoreCounters::default(), &DEFAULT);
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
}
