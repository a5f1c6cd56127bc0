//! envoyproxy/ratelimit's series in the Prometheus exposition, as its Prometheus sink makes them from
//! the Go stat names ([`go_stats`]): through its default mapping (written out here, for speed: no
//! pattern is matched per scrape), or through a statsd_exporter mapping file (`PROMETHEUS_MAPPER_YAML`,
//! [`Mapping`]).
//!
//! Response times are Tollgate's histograms (fixed buckets from 50 µs to 1 s) under the name and labels
//! the mapping gives `ratelimit_server.<Method>.response_time`: in seconds, or in milliseconds with
//! `PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS` or a mapping without `scale: 0.001` (the name stays, as in
//! Go). A mapping's `buckets` and `timer_type: summary` do not change them.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;

use tollgate_core::observe::metrics::{Method, Metrics, RULE_SERIES};
use tollgate_core::store::StoreCounters;

use super::go_stats;
use super::mapping::{self, Mapped, Mapping, StatKind};
use super::text_format::{escape, render_histogram};

/// How the Go series are named.
#[derive(Debug, Clone)]
pub enum GoSeries {
    /// The Go service's default mapping; response times in milliseconds when `response_time_ms`
    /// (`PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS`).
    Default {
        /// Response-time buckets and sum in milliseconds.
        response_time_ms: bool,
    },
    /// A statsd_exporter mapping file's names.
    Mapped(Arc<Mapping>),
}

/// Appends the Go series of `metrics` and `store`, named as `go` says.
pub fn render(metrics: &Metrics, store: &StoreCounters, go: &GoSeries, out: &mut String) {
    match go {
        GoSeries::Default { response_time_ms } => render_default(metrics, store, *response_time_ms, out),
        GoSeries::Mapped(mapping) => render_mapped(metrics, store, mapping, out),
    }
}

fn render_default(metrics: &Metrics, store: &StoreCounters, response_time_ms: bool, out: &mut String) {
    render_rules(metrics, out);
    render_pools(store, out);
    for (name, help, value) in [
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
    ] {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}");
    }
    let unit = if response_time_ms { 1000.0 } else { 1.0 };
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
        render_histogram(metrics.response_time(method), out, name, &labels, unit);
    }
}

/// The Redis pools' Go stats, which the default mapping does not match: their Go names made
/// Prometheus-safe (`ratelimit_redis_pool_cx_active`), for the pools there are.
fn render_pools(store: &StoreCounters, out: &mut String) {
    for stat in go_stats::pools(store) {
        let name = stat.name.replace('.', "_");
        let kind = if stat.kind == go_stats::Kind::Gauge {
            "gauge"
        } else {
            "counter"
        };
        let _ = writeln!(
            out,
            "# HELP {name} Redis connections (envoyproxy/ratelimit's pool stats).\n# TYPE {name} {kind}\n{name} {}",
            stat.value
        );
    }
}

/// The Go series of rules and domains, as envoyproxy/ratelimit's default Prometheus mapping makes them
/// from the Go stat names ([`go_stats`]): a rule one level deep is `{domain, key1}`, a deeper one
/// `{domain, key1, key2}` with its levels past the second dropped, so rules that differ only there, or
/// whose values hold dots, add into one series, as they do there. What that mapping does not match keeps
/// its Go name with every character Prometheus cannot take turned to `_`
/// (`ratelimit_service_rate_limit_api_user_over_limit_with_local_cache`), and appears once it counted
/// something. A rule no request has reached yet has no series: 100,000 idle rules cost a scrape nothing,
/// as with the Go service, whose stats reach Prometheus only once they are sent. (The Go mapping also adds `over_limit_with_local_cache` into `over_limit` for rules two
/// levels deep, a side effect of an unanchored expression; the hits are in `over_limit` already, so
/// Tollgate does not count them twice.)
fn render_rules(metrics: &Metrics, out: &mut String) {
    let mut mapped: BTreeMap<String, [u64; RULE_SERIES.len()]> = BTreeMap::new();
    let mut unmapped: Vec<(String, u64)> = Vec::new();
    for ((_, path), stats) in metrics.rules() {
        if stats.total_hits.get() == 0 {
            continue;
        }
        let key = go_stats::rule_key(&path);
        let sums = mapped.entry(default_rule_labels(&key)).or_default();
        for (sum, counter) in sums.iter_mut().zip(stats.in_order()) {
            *sum = sum.saturating_add(counter.get());
        }
        let cached = stats.over_limit_with_local_cache.get();
        if cached > 0 {
            let name = format!("{}.{key}.over_limit_with_local_cache", go_stats::RULE_SCOPE);
            unmapped.push((mapping::metric_name(&name), cached));
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
        unmapped.push((mapping::metric_name(&name), count));
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

/// The Go series through a mapping file: every Go counter mapped, summed per name and labels; what no
/// rule matches under its Prometheus-safe Go name; the response times as histograms where the mapping
/// puts `ratelimit_server.<Method>.response_time`.
fn render_mapped(metrics: &Metrics, store: &StoreCounters, mapping: &Mapping, out: &mut String) {
    // Per kind, name and labels; the response-time timers are the histograms below.
    let mut counters: BTreeMap<String, BTreeMap<String, f64>> = BTreeMap::new();
    let mut gauges: BTreeMap<String, BTreeMap<String, f64>> = BTreeMap::new();
    for stat in go_stats::collect(metrics, store) {
        let (kind, series) = match stat.kind {
            go_stats::Kind::Counter => (StatKind::Counter, &mut counters),
            go_stats::Kind::Gauge => (StatKind::Gauge, &mut gauges),
            go_stats::Kind::Timer { .. } => continue,
        };
        let (name, labels, scale) = match mapping.map(&stat.name, kind) {
            Mapped::To {
                name, labels, scale, ..
            } => (name, labels, scale),
            Mapped::Unmatched(name) => (name, Vec::new(), 1.0),
            Mapped::Dropped => continue,
        };
        let labels: Vec<String> = labels
            .iter()
            .map(|(label, value)| format!("{}=\"{}\"", mapping::metric_name(label), escape(value)))
            .collect();
        *series
            .entry(name)
            .or_default()
            .entry(labels.join(","))
            .or_default() += stat.value as f64 * scale;
    }
    let mut histograms: BTreeMap<String, Vec<(String, Method, f64)>> = BTreeMap::new();
    for method in Method::ALL {
        let statsd = format!("ratelimit_server.{}.response_time", method.name());
        let (name, labels, scale) = match mapping.map(&statsd, StatKind::Observer) {
            Mapped::To {
                name, labels, scale, ..
            } => (name, labels, scale),
            Mapped::Unmatched(name) => (name, Vec::new(), 1.0),
            Mapped::Dropped => continue,
        };
        if counters.contains_key(&name) || gauges.contains_key(&name) {
            // statsd_exporter refuses one name for two kinds of metric; so does this.
            continue;
        }
        let labels: String = labels
            .iter()
            .map(|(label, value)| format!("{}=\"{}\",", mapping::metric_name(label), escape(value)))
            .collect();
        // Go observes milliseconds, times `scale`; the histogram holds seconds.
        histograms
            .entry(name)
            .or_default()
            .push((labels, method, 1000.0 * scale));
    }
    let typed = (counters
        .into_iter()
        .map(|(name, series)| (name, series, "counter")))
    .chain(gauges.into_iter().map(|(name, series)| (name, series, "gauge")));
    for (name, series, kind) in typed {
        let _ = writeln!(
            out,
            "# HELP {name} Metric autogenerated by statsd_exporter.\n# TYPE {name} {kind}"
        );
        for (labels, value) in series {
            let labels = if labels.is_empty() {
                labels
            } else {
                format!("{{{labels}}}")
            };
            let _ = writeln!(out, "{name}{labels} {value}");
        }
    }
    for (name, series) in histograms {
        let _ = writeln!(
            out,
            "# HELP {name} Metric autogenerated by statsd_exporter.\n# TYPE {name} histogram"
        );
        for (labels, method, unit) in series {
            render_histogram(metrics.response_time(method), out, &name, &labels, unit);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let cached = metrics.rule("d", "d.k");
        cached.total_hits.add(7);
        cached.over_limit_with_local_cache.add(7);
        metrics.rule("d", "d.idle");
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
        assert!(
            !out.contains("idle"),
            "a rule no request reached has no series:\n{out}"
        );
    }

    #[test]
    fn a_mapping_file_names_every_go_series() {
        let (mapping, _) = Mapping::parse(
            "mappings:\n\
             - match: \"ratelimit.service.rate_limit.*.*.total_hits\"\n  name: hits\n  labels: {domain: \"$1\", rule: \"$2\"}\n\
             - match: \"ratelimit_server.*.response_time\"\n  name: rt_seconds\n  scale: 0.001\n  labels: {method: \"$1\"}\n\
             - match: \"ratelimit.service.rate_limit.*.*.*\"\n  action: drop\n",
        )
        .expect("parses");
        let metrics = Metrics::new();
        metrics.rule("d", "d.a").total_hits.add(2);
        metrics.rule("d", "d.a").over_limit.add(1);
        metrics.request(Method::Check, std::time::Duration::from_millis(3));
        let mut out = String::new();
        render(
            &metrics,
            &StoreCounters::default(),
            &GoSeries::Mapped(Arc::new(mapping)),
            &mut out,
        );
        for line in [
            "hits{domain=\"d\",rule=\"a\"} 2",
            "ratelimit_service_config_load_success 0",
            "rt_seconds_bucket{method=\"Check\",le=\"0.005\"} 1",
            "rt_seconds_count{method=\"Check\"} 1",
        ] {
            assert!(out.lines().any(|l| l == line), "{line} in\n{out}");
        }
        assert!(!out.contains("over_limit"), "dropped: {out}");
    }

    #[test]
    fn response_times_can_be_in_milliseconds_as_in_go() {
        let metrics = Metrics::new();
        metrics.request(Method::ShouldRateLimit, std::time::Duration::from_millis(3));
        let mut out = String::new();
        render(
            &metrics,
            &StoreCounters::default(),
            &GoSeries::Default {
                response_time_ms: true,
            },
            &mut out,
        );
        let line =
            "ratelimit_service_response_time_seconds_bucket{grpc_method=\"ShouldRateLimit\",le=\"5\"} 1";
        assert!(out.lines().any(|l| l == line), "{out}");
    }
}
