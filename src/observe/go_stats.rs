//! envoyproxy/ratelimit's stats, named exactly as the Go service names them: the one source the statsd
//! sink and the Prometheus exposition of the Go series both read, so what a Go user's dashboards and
//! alerts query arrives under the same names wherever they collect it.
//!
//! Names are gostats' dotted statsd names (`ratelimit.service.rate_limit.<domain>.<rule path>.total_hits`).
//! A rule's part is sanitized as the Go service sanitizes it ([`sanitize`]): `:` and `|` become `_`,
//! and so do the dots inside anything shaped like an IPv4 address, so `remote_address_10.0.0.1` is one
//! name component, not four.
//!
//! The response time (`ratelimit_server.<Method>.response_time`, a gostats timer in milliseconds, sent
//! by Go once per request) is sent once per histogram bucket that gained observations, as the
//! bucket's bound with a sample rate of one over their number: what statsd_exporter and DogStatsD
//! count as that many observations, in a bounded number of lines however busy the server.
//!
//! The Redis pool's `cx_active`, `cx_total` and `cx_local_close` (`ratelimit.redis_pool.*`, and
//! `ratelimit.redis_per_second_pool.*`) count Tollgate's connections to a single Redis or a Sentinel's
//! master as calls show them ([`StoreCounters::redis_pool`]); a Redis Cluster has none.
//!
//! Not emitted: the local cache's and the Go runtime's gauges.

use crate::settings::ExtraTags;
use tollgate_core::observe::metrics::{BUCKETS, Method, Metrics};
use tollgate_core::store::{PoolCounters, StoreCounters};

/// A statsd stat's kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// Monotonic; statsd is sent the increase since the last flush.
    Counter,
    /// A level; statsd is sent its value at every flush.
    Gauge,
    /// The observations of a timer that fell in one bucket of [`BUCKETS`] (`bucket` one past the last:
    /// above them all), counted like a counter; statsd is sent the bucket's bound in milliseconds
    /// once per flush, with the sample rate that stands for the observations it gained.
    Timer {
        /// The bucket's index in [`BUCKETS`].
        bucket: usize,
    },
}

impl Kind {
    /// A timer bucket's value as statsd is sent it: the bucket's upper bound in milliseconds (for
    /// observations above every bucket, the last bound: they took at least that).
    pub fn timer_ms(bucket: usize) -> f64 {
        let seconds = BUCKETS.get(bucket).or(BUCKETS.last()).copied().unwrap_or(1.0);
        // Microseconds are whole: 0.00005 s is 0.05 ms, not 0.05000000000000001.
        (seconds * 1e6).round() / 1e3
    }
}

/// One stat as the Go service names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GoStat {
    /// The dotted name.
    pub name: String,
    /// Counter or gauge.
    pub kind: Kind,
    /// The counter's total, or the gauge's value.
    pub value: u64,
}

/// The per-rule counters' suffixes, in gostats' order.
pub const RULE_STATS: [&str; 6] = [
    "total_hits",
    "over_limit",
    "near_limit",
    "over_limit_with_local_cache",
    "within_limit",
    "shadow_mode",
];

/// The scope every per-rule and per-domain stat lives under.
pub const RULE_SCOPE: &str = "ratelimit.service.rate_limit";

/// The Go service's stat-name sanitizer: `:` and `|` become `_`, then in every run shaped like an IPv4
/// address (`[0-9]{1,3}` four times, joined by dots, leftmost first, not overlapping) the dots become
/// `_`. Other dots stay: they separate the name's components.
pub fn sanitize(name: &str) -> String {
    let mut out: Vec<u8> = name
        .bytes()
        .map(|b| if b == b':' || b == b'|' { b'_' } else { b })
        .collect();
    let mut at = 0;
    while at < out.len() {
        match dotted_quad_at(&out, at) {
            Some(end) => {
                for byte in &mut out[at..end] {
                    if *byte == b'.' {
                        *byte = b'_';
                    }
                }
                at = end;
            }
            None => at += 1,
        }
    }
    // Only ASCII bytes were changed, and only into ASCII: still UTF-8.
    String::from_utf8(out).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// The end of the longest match of `[0-9]{1,3}(\.[0-9]{1,3}){3}` starting at `at`, as a regex engine's
/// leftmost-first match takes it: each run of digits as long as it may be, up to three.
fn dotted_quad_at(bytes: &[u8], at: usize) -> Option<usize> {
    let mut end = at;
    for part in 0..4 {
        if part > 0 {
            if bytes.get(end) != Some(&b'.') {
                return None;
            }
            end += 1;
        }
        let digits = bytes[end..]
            .iter()
            .take(3)
            .take_while(|b| b.is_ascii_digit())
            .count();
        if digits == 0 {
            return None;
        }
        end += digits;
    }
    Some(end)
}

/// A rule's key in stat names: its path (`domain.key_value.key`), sanitized.
pub fn rule_key(path: &str) -> String {
    sanitize(path)
}

/// The tags as gostats writes them: sorted by key, pairs with an empty key or value left out, and
/// `.`, `:`, `|` in values turned to `_`.
pub(super) fn clean_tags(tags: &ExtraTags) -> Vec<(&str, String)> {
    let mut pairs: Vec<(&str, String)> = tags
        .0
        .iter()
        .filter(|(k, v)| !k.is_empty() && !v.is_empty())
        .map(|(key, value)| {
            let value = value
                .chars()
                .map(|c| if matches!(c, '.' | ':' | '|') { '_' } else { c })
                .collect();
            (key.as_str(), value)
        })
        .collect();
    pairs.sort();
    pairs
}

/// Every Go stat of `metrics` and `store`, counters at their totals; rules no request reached yet are
/// left out.
pub fn collect(metrics: &Metrics, store: &StoreCounters) -> Vec<GoStat> {
    let counter = |name: String, value: u64| GoStat {
        name,
        kind: Kind::Counter,
        value,
    };
    let mut stats = Vec::new();
    for ((_, path), rule) in metrics.rules() {
        // Every hit counts in total_hits: a rule without any has nothing to say yet.
        if rule.total_hits.get() == 0 {
            continue;
        }
        let key = rule_key(&path);
        let values = [
            rule.total_hits.get(),
            rule.over_limit.get(),
            rule.near_limit.get(),
            rule.over_limit_with_local_cache.get(),
            rule.within_limit.get(),
            rule.shadow_mode.get(),
        ];
        for (suffix, value) in RULE_STATS.iter().zip(values) {
            stats.push(counter(format!("{RULE_SCOPE}.{key}.{suffix}"), value));
        }
    }
    for (domain, count) in metrics.unknown_domains() {
        let domain = sanitize(&domain);
        stats.push(counter(format!("{RULE_SCOPE}.{domain}.domain_not_found"), count));
    }
    let service = [
        ("config_load_success", metrics.config_load_success.get()),
        ("config_load_error", metrics.config_load_error.get()),
        ("global_shadow_mode", metrics.global_shadow_mode.get()),
        ("call.should_rate_limit.redis_error", metrics.store_errors.get()),
        (
            "call.should_rate_limit.service_error",
            metrics.service_errors.get(),
        ),
    ];
    for (name, value) in service {
        stats.push(counter(format!("ratelimit.service.{name}"), value));
    }
    stats.extend(pools(store));
    for method in Method::ALL {
        let name = format!("ratelimit_server.{}.total_requests", method.name());
        stats.push(counter(name, metrics.requests(method)));
        let observed = metrics.response_time(method).per_bucket();
        for (bucket, value) in observed.into_iter().enumerate().filter(|(_, n)| *n > 0) {
            stats.push(GoStat {
                name: format!("ratelimit_server.{}.response_time", method.name()),
                kind: Kind::Timer { bucket },
                value,
            });
        }
    }
    stats
}

/// The Redis pools' stats (`ratelimit.redis_pool.cx_active`…), for the pools `store` counts.
pub fn pools(store: &StoreCounters) -> impl Iterator<Item = GoStat> {
    let pools = [
        ("redis_pool", store.redis_pool),
        ("redis_per_second_pool", store.redis_per_second_pool),
    ];
    pools
        .into_iter()
        .flat_map(|(scope, pool)| {
            let PoolCounters {
                active,
                total,
                closed,
            } = pool?;
            let stat = |name: &str, kind, value| GoStat {
                name: format!("ratelimit.{scope}.{name}"),
                kind,
                value,
            };
            Some([
                stat("cx_active", Kind::Gauge, active),
                stat("cx_total", Kind::Counter, total),
                stat("cx_local_close", Kind::Counter, closed),
            ])
        })
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_sanitized_as_the_go_service_does() {
        for (given, sanitized) in [
            ("api.remote_address_10.0.0.1", "api.remote_address_10_0_0_1"),
            ("path_/foo:*:bar", "path_/foo_*_bar"),
            ("foo|bar", "foo_bar"),
            ("1.2.3.4.5", "1_2_3_4.5"),
            ("1.2.3.4.5.6.7.8", "1_2_3_4.5_6_7_8"),
            ("1234.5.6.7", "1234_5_6_7"),
            ("10.0.0.1:8080", "10_0_0_1_8080"),
            ("2001:db8::1", "2001_db8__1"),
            ("1.2.3", "1.2.3"),
            ("api.path_/a.b", "api.path_/a.b"),
            ("api.k_٣.٣.٣.٣", "api.k_٣.٣.٣.٣"),
        ] {
            assert_eq!(sanitize(given), sanitized, "{given}");
        }
    }

    #[test]
    fn rules_domains_and_the_service_are_named_as_in_go() {
        let metrics = Metrics::new();
        metrics
            .rule("api", "api.remote_address_10.0.0.1")
            .total_hits
            .add(3);
        let cached = metrics.rule("api", "api.a.b.c");
        cached.total_hits.add(2);
        cached.over_limit_with_local_cache.add(2);
        metrics.rule("api", "api.idle");
        metrics.unknown_domain("ap:i");
        metrics.global_shadow_mode.add(1);
        metrics.request(Method::ShouldRateLimit, std::time::Duration::from_millis(1));
        let store = StoreCounters {
            redis_pool: Some(PoolCounters {
                active: 2,
                total: 3,
                closed: 1,
            }),
            ..StoreCounters::default()
        };
        let stats = collect(&metrics, &store);
        let value = |name: &str| {
            stats
                .iter()
                .find(|s| s.name == name)
                .unwrap_or_else(|| panic!("{name} in {stats:?}"))
                .value
        };
        assert_eq!(
            value("ratelimit.service.rate_limit.api.remote_address_10_0_0_1.total_hits"),
            3
        );
        assert_eq!(
            value("ratelimit.service.rate_limit.api.a.b.c.over_limit_with_local_cache"),
            2
        );
        assert_eq!(value("ratelimit.service.rate_limit.ap_i.domain_not_found"), 1);
        assert_eq!(value("ratelimit.service.global_shadow_mode"), 1);
        assert_eq!(value("ratelimit_server.ShouldRateLimit.total_requests"), 1);
        let timer = stats
            .iter()
            .find(|s| s.name == "ratelimit_server.ShouldRateLimit.response_time")
            .expect("one timer bucket");
        assert_eq!((timer.kind, timer.value), (Kind::Timer { bucket: 4 }, 1), "1 ms");
        assert_eq!(Kind::timer_ms(0), 0.05);
        assert_eq!(Kind::timer_ms(BUCKETS.len()), 1000.0);
        assert_eq!(value("ratelimit.service.config_load_success"), 0);
        assert_eq!(value("ratelimit.redis_pool.cx_active"), 2);
        assert_eq!(value("ratelimit.redis_pool.cx_total"), 3);
        assert_eq!(value("ratelimit.redis_pool.cx_local_close"), 1);
        assert!(
            !stats.iter().any(|s| s.name.contains("per_second")),
            "no per-second Redis, no stats of its pool"
        );
        assert!(
            !stats.iter().any(|s| s.name.contains("idle")),
            "an idle rule has no stats"
        );
    }
}
