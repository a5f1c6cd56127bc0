//! Prometheus metrics: envoyproxy/ratelimit's series names, load counters, and bounded cardinality.

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwapOption;
use tollgate::server_counters::ServerCounters;
use tollgate_core::algorithm::Algorithm;
use tollgate_core::clock::ManualClock;
use tollgate_core::limiter::{Limiter, LimiterOptions};
use tollgate_core::observe::metrics::Metrics;
use tollgate_core::rules::file::parse_file;
use tollgate_core::rules::{CompileOptions, RuleSet, ValueHasher};
use tollgate_core::store::memory::MemoryStore;

use crate::common::{T0_US, TestServer, d, http, wire_request};

const RULES: &str = "domain: m\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 10}\n  - key: path\n    value: /login\n    descriptors:\n      - key: ip\n        shadow_mode: true\n        rate_limit: {unit: hour, requests_per_unit: 1}\n";

const GO_DEFAULT: tollgate::observe::go_series::GoSeries = tollgate::observe::go_series::GoSeries::Default {
    response_time_ms: false,
};

fn series_value(text: &str, series: &str) -> Option<u64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
}

#[tokio::test]
async fn metrics_use_envoyproxy_ratelimit_names_on_both_ports() {
    let server = TestServer::start(&[("m.yaml", RULES)], &[]).await;
    let mut client = ask_times(&server, "alice", 12).await;
    ask(&mut client, "m", &[("path", "/login"), ("ip", "10.0.0.1")], 3).await;
    let (status, text) = http(server.http, "GET", "/metrics", "").await;
    assert_eq!(status, 200);
    let user = "{domain=\"m\",key1=\"user\"}";
    assert_eq!(
        series_value(&text, &format!("ratelimit_service_rate_limit_total_hits{user}")),
        Some(12),
        "{text}"
    );
    assert_eq!(
        series_value(&text, &format!("ratelimit_service_rate_limit_within_limit{user}")),
        Some(10)
    );
    assert_eq!(
        series_value(&text, &format!("ratelimit_service_rate_limit_over_limit{user}")),
        Some(2)
    );
    // Allowed hits above 80 % of 10: the 9th and 10th.
    assert_eq!(
        series_value(&text, &format!("ratelimit_service_rate_limit_near_limit{user}")),
        Some(2)
    );
    let login = "{domain=\"m\",key1=\"path_/login\",key2=\"ip\"}";
    assert_eq!(
        series_value(&text, &format!("ratelimit_service_rate_limit_shadow_mode{login}")),
        Some(2),
        "{text}"
    );
    assert_eq!(
        series_value(
            &text,
            "ratelimit_service_total_requests{grpc_method=\"ShouldRateLimit\"} "
        ),
        Some(15)
    );
    assert_eq!(
        series_value(&text, "ratelimit_service_total_requests{grpc_method=\"Check\"} "),
        Some(0)
    );
    // The HTTP twins count under their gRPC method.
    let json = r#"{"domain":"m","descriptors":[{"entries":[{"key":"user","value":"bob"}]}]}"#;
    assert_eq!(http(server.http, "POST", "/json", json).await.0, 200);
    assert_eq!(http(server.http, "POST", "/v1/check", json).await.0, 200);
    let (_, after) = http(server.http, "GET", "/metrics", "").await;
    for (method, expected) in [("ShouldRateLimit", 16), ("Check", 1)] {
        let series = format!("ratelimit_service_total_requests{{grpc_method=\"{method}\"}} ");
        assert_eq!(series_value(&after, &series), Some(expected), "{series}");
    }
    assert!(series_value(&text, "ratelimit_service_config_load_success ").is_some_and(|n| n >= 1));
    assert!(
        text.contains(
            "ratelimit_service_response_time_seconds_bucket{grpc_method=\"ShouldRateLimit\",le=\"+Inf\"} 15"
        ),
        "{text}"
    );
    let (status, debug) = http(server.debug, "GET", "/metrics", "").await;
    assert_eq!(status, 200);
    assert!(debug.contains("ratelimit_service_rate_limit_total_hits{domain=\"m\",key1=\"user\"}"));
    server.stop().await;
}

#[tokio::test]
async fn a_broken_reload_is_counted_and_the_version_is_published() {
    let server = TestServer::start(&[("m.yaml", RULES)], &[]).await;
    let (_, before) = http(server.http, "GET", "/metrics", "").await;
    assert!(before.contains("tollgate_config_info{version=\""), "{before}");
    std::fs::write(
        server.dir.path().join("m.yaml"),
        "domain: m\ndescriptors:\n  - key: user\n    ratelimit: {}\n",
    )
    .expect("break");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let (_, text) = http(server.http, "GET", "/metrics", "").await;
        if series_value(&text, "ratelimit_service_config_load_error ").is_some_and(|n| n > 0) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "config_load_error never counted: {text}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    server.stop().await;
}

/// A limiter on the embedded store (a manual clock) over the rules file `text`, fixed windows by
/// default, recording into the registry it returns.
fn fixed_window_limiter(text: &str) -> (Limiter<MemoryStore>, Arc<Metrics>) {
    let metrics = Metrics::new();
    let domain = parse_file("rules.yaml", text).expect("rules");
    let options = CompileOptions {
        default_algorithm: Algorithm::FixedWindow,
        ..Default::default()
    };
    let rules = RuleSet::compile_with_metrics(vec![domain], options, &metrics).expect("compile");
    let limiter = Limiter::new(
        Arc::new(ArcSwapOption::from_pointee(rules)),
        MemoryStore::new(Arc::new(ManualClock::new(T0_US))),
        ValueHasher::default(),
        LimiterOptions::default(),
    )
    .with_metrics(Arc::clone(&metrics));
    (limiter, metrics)
}

#[tokio::test]
async fn a_million_distinct_values_add_no_series() {
    let (limiter, metrics) = fixed_window_limiter(RULES);
    let series = |text: &str| text.lines().filter(|l| !l.starts_with('#')).count();
    let decide = |i: u32| {
        let user = d(&[("user", &i.to_string())]);
        let limiter = &limiter;
        async move {
            limiter
                .should_rate_limit("m", std::slice::from_ref(&user), 0)
                .await
                .expect("decided");
        }
    };
    // The rule's series appear with its first hit (an idle rule has none); later values add none.
    decide(0).await;
    let counters = ServerCounters::default();
    let before = series(&tollgate::observe::prometheus::render(
        &metrics,
        &counters,
        Default::default(),
        &GO_DEFAULT,
    ));
    for i in 1..1_000_000u32 {
        decide(i).await;
    }
    let text = tollgate::observe::prometheus::render(&metrics, &counters, Default::default(), &GO_DEFAULT);
    assert_eq!(series(&text), before, "distinct values must not create series");
    assert_eq!(
        series_value(
            &text,
            "ratelimit_service_rate_limit_total_hits{domain=\"m\",key1=\"user\"}"
        ),
        Some(1_000_000)
    );
}

/// envoyproxy/ratelimit's accounting of a request of several hits (its fixed_cache_impl_test cases,
/// limits and counts as there): hits the limit still had room for count as `near_limit` above the
/// threshold (80 % of the limit, a whole number), the rest as `over_limit`; a refused request adds
/// nothing to `within_limit`.
#[tokio::test]
async fn hits_that_cross_the_limit_are_split_as_the_go_service_splits_them() {
    let rules = "domain: g\ndescriptors:\n  - {key: k, value: a, rate_limit: {unit: hour, requests_per_unit: 20}}\n  - {key: k, value: b, rate_limit: {unit: hour, requests_per_unit: 8}}\n  - {key: k, value: c, rate_limit: {unit: hour, requests_per_unit: 20}}\n  - {key: k, value: d, rate_limit: {unit: hour, requests_per_unit: 20}}\n  - {key: k, value: e, rate_limit: {unit: hour, requests_per_unit: 20}}\n  - {key: k, value: f, rate_limit: {unit: hour, requests_per_unit: 10}}\n";
    let (limiter, metrics) = fixed_window_limiter(rules);
    // (value, hits already counted, hits of the request) -> (over, near, within) of the request.
    let cases = [
        ("a", 2, 3, (0, 0, 3)),  // all under the limit and under the threshold (16)
        ("b", 5, 2, (0, 1, 2)),  // under the limit, one hit above the threshold (6)
        ("c", 16, 3, (0, 3, 3)), // all above the threshold
        ("d", 19, 3, (2, 1, 0)), // one within, two over
        ("e", 15, 7, (2, 4, 0)), // below the threshold, above it, and over the limit
        ("f", 27, 3, (3, 0, 0)), // all over
    ];
    for (value, counted, hits, want) in cases {
        let rule = metrics.rule("g", &format!("g.k_{value}"));
        let descriptor = d(&[("k", value)]);
        let ask = |hits| limiter.should_rate_limit("g", std::slice::from_ref(&descriptor), hits);
        ask(counted).await.expect("decided");
        let before = [&rule.over_limit, &rule.near_limit, &rule.within_limit].map(|c| c.get());
        ask(hits).await.expect("decided");
        let after = [&rule.over_limit, &rule.near_limit, &rule.within_limit].map(|c| c.get());
        let got = (after[0] - before[0], after[1] - before[1], after[2] - before[2]);
        assert_eq!(got, want, "k_{value}: {counted} counted, {hits} more");
    }
}

/// `detailed_metric`: a rule is counted per request value, named as the Go service names it
/// (`domain.key_value`, sanitized), at `/metrics` and in statsd; values beyond
/// `TOLLGATE_DETAILED_METRIC_MAX_VALUES` fold into the rule's own series, and the folds are counted.
#[tokio::test]
async fn detailed_metric_counts_each_value_up_to_the_cap() {
    let rules = "domain: m\ndescriptors:\n  - key: client\n    detailed_metric: true\n    rate_limit: {unit: hour, requests_per_unit: 2}\n    descriptors:\n      - key: path\n        detailed_metric: true\n        rate_limit: {unit: hour, requests_per_unit: 5}\n";
    let udp = tokio::net::UdpSocket::bind("127.0.0.1:0").await.expect("bind");
    let port = udp.local_addr().expect("addr").port().to_string();
    let env = [
        ("TOLLGATE_DETAILED_METRIC_MAX_VALUES", "2"),
        ("USE_STATSD", "true"),
        ("STATSD_HOST", "127.0.0.1"),
        ("STATSD_PORT", port.as_str()),
        ("STATSD_PROTOCOL", "udp"),
        ("STATS_FLUSH_INTERVAL", "100ms"),
    ];
    let server = TestServer::start(&[("m.yaml", rules)], &env).await;
    // A peek is not a hit: it takes no place under the cap.
    let peek = r#"{"domain":"m","descriptors":[{"entries":[{"key":"client","value":"eve"}]}],"mode":"peek"}"#;
    assert_eq!(http(server.http, "POST", "/v1/check", peek).await.0, 200);
    let mut client = server.client().await;
    for (client_id, times) in [("10.0.0.1", 3), ("bob", 1), ("carol", 2), ("dave", 1)] {
        ask(&mut client, "m", &[("client", client_id)], times).await;
    }
    ask(&mut client, "m", &[("client", "bob"), ("path", "/a")], 1).await;
    let text = server_metrics(&server).await;
    let hits = |labels: &str| {
        series_value(
            &text,
            &format!("ratelimit_service_rate_limit_total_hits{{domain=\"m\",{labels}}} "),
        )
    };
    // The first two values are counted apart (an IPv4 address sanitized as Go does); carol and dave
    // fold into the rule's own series.
    assert_eq!(hits("key1=\"client_10_0_0_1\""), Some(3), "{text}");
    assert_eq!(
        series_value(
            &text,
            "ratelimit_service_rate_limit_over_limit{domain=\"m\",key1=\"client_10_0_0_1\"} "
        ),
        Some(1)
    );
    assert_eq!(hits("key1=\"client_bob\""), Some(1));
    assert_eq!(hits("key1=\"client\""), Some(3), "folded: {text}");
    assert_eq!(hits("key1=\"client_carol\""), None);
    assert!(!text.contains("client_eve"), "{text}");
    assert_eq!(series_value(&text, "tollgate_stats_folded_total "), Some(3));
    // The nested rule has a cap of its own.
    assert_eq!(hits("key1=\"client_bob\",key2=\"path_/a\""), Some(1), "{text}");
    let (sender, mut received) = tokio::sync::mpsc::unbounded_channel();
    let listener = tokio::spawn(async move {
        let mut datagram = vec![0u8; 2048];
        while let Ok(n) = udp.recv(&mut datagram).await {
            let _ = sender.send(String::from_utf8(datagram[..n].to_vec()).expect("text"));
        }
    });
    statsd_sums(
        &[
            ("ratelimit.service.rate_limit.m.client_10_0_0_1.total_hits", 3),
            ("ratelimit.service.rate_limit.m.client.total_hits", 3),
            ("ratelimit.service.rate_limit.m.client_bob.path_/a.total_hits", 1),
        ],
        &mut received,
    )
    .await;
    listener.abort();
    server.stop().await;
}

/// `/top` as a server with `env` lists domain `t` after five refusals-or-near for an address and
/// three for an email that the rule hashes.
async fn top_offenders(env: &[(&str, &str)]) -> (Vec<serde_json::Value>, String) {
    let rules = "domain: t\ndescriptors:\n  - key: ip\n    rate_limit: {unit: hour, requests_per_unit: 1}\n  - key: email\n    hash: true\n    rate_limit: {unit: hour, requests_per_unit: 1}\n";
    let server = TestServer::start(&[("t.yaml", rules)], env).await;
    let mut client = server.client().await;
    ask(&mut client, "t", &[("ip", "203.0.113.9")], 5).await;
    ask(&mut client, "t", &[("email", "alice@example.com")], 3).await;
    let (status, text) = http(server.debug, "GET", "/top", "").await;
    assert_eq!(status, 200);
    let top: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    let list = top["t"].as_array().expect("domain t").clone();
    assert_eq!(list[0]["count"], 5);
    assert_eq!(list[1]["count"], 3);
    assert!(!text.contains("alice"), "a hashed value leaked: {text}");
    server.stop().await;
    (list, text)
}

#[tokio::test]
async fn top_offenders_are_hashed_unless_caller_values_are_asked_for() {
    let (hidden, text) = top_offenders(&[]).await;
    assert!(
        !text.contains("203.0.113.9"),
        "a caller's address is on display: {text}"
    );
    let ip = hidden[0]["key"].as_str().expect("key");
    assert!(ip.starts_with("t_ip_") && ip.len() > "t_ip_".len() + 8, "{ip}");
    let email = hidden[1]["key"].as_str().expect("key");
    assert!(email.starts_with("t_email_"), "{email}");
    let (shown, _) = top_offenders(&[("TOLLGATE_SHOW_CALLER_VALUES", "true")]).await;
    assert_eq!(shown[0]["key"], "t_ip_203.0.113.9_");
}

/// `/top` counts callers as their budget does: the addresses of one IPv6 /64 share one budget under
/// `ip_prefix: {v6: 64}`, so they are one offender, hashed or shown.
#[tokio::test]
async fn top_offenders_sharing_a_budget_are_one_entry() {
    let rules = "domain: t\ndescriptors:\n  - key: ip\n    ip_prefix: {v4: 32, v6: 64}\n    rate_limit: {unit: hour, requests_per_unit: 1}\n";
    for env in [&[][..], &[("TOLLGATE_SHOW_CALLER_VALUES", "true")][..]] {
        let server = TestServer::start(&[("t.yaml", rules)], env).await;
        let mut client = server.client().await;
        for host in 1..=4 {
            let address = format!("2001:db8:1:2::{host}");
            ask(&mut client, "t", &[("ip", &address)], 1).await;
        }
        let (_, text) = http(server.debug, "GET", "/top", "").await;
        let top: serde_json::Value = serde_json::from_str(&text).expect("JSON");
        let list = top["t"].as_array().expect("domain t");
        assert_eq!(list.len(), 1, "{env:?}: {text}");
        assert_eq!(list[0]["count"], 4, "{env:?}: {text}");
        server.stop().await;
    }
}

#[tokio::test]
async fn the_debug_port_reports_the_loaded_version_and_it_changes_on_reload() {
    let server = TestServer::start(&[("m.yaml", RULES)], &[]).await;
    let version = |text: &str| -> String {
        let value: serde_json::Value = serde_json::from_str(text).expect("JSON");
        assert_eq!(value["domains"], 1, "{value}");
        assert!(
            value["loaded_at"].as_u64().is_some_and(|t| t > 1_700_000_000),
            "{value}"
        );
        value["version"].as_str().expect("version").to_owned()
    };
    let (_, text) = http(server.debug, "GET", "/config", "").await;
    let first = version(&text);
    let (_, metrics) = http(server.http, "GET", "/metrics", "").await;
    assert!(
        metrics.contains(&format!("tollgate_config_info{{version=\"{first}\"}} 1")),
        "{metrics}"
    );
    std::fs::write(server.dir.path().join("m.yaml"), RULES.replace("10}", "11}")).expect("edit");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let (_, text) = http(server.debug, "GET", "/config", "").await;
        if version(&text) != first {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the version never changed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    server.stop().await;
}

#[tokio::test]
async fn use_prometheus_serves_the_metrics_where_the_go_service_does() {
    // A free port, released for the server to bind (`PROMETHEUS_ADDR` takes no port 0 back to us).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let addr = format!("127.0.0.1:{port}");
    let env = [
        ("USE_PROMETHEUS", "true"),
        ("PROMETHEUS_ADDR", addr.as_str()),
        ("PROMETHEUS_PATH", "/stats/prometheus"),
    ];
    let server = TestServer::start(&[("m.yaml", RULES)], &env).await;
    let mut client = server.client().await;
    ask(&mut client, "m", &[("user", "alice")], 1).await;
    let prometheus = addr.parse().expect("addr");
    let (status, text) = http(prometheus, "GET", "/stats/prometheus", "").await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(
        series_value(
            &text,
            "ratelimit_service_rate_limit_total_hits{domain=\"m\",key1=\"user\"}"
        ),
        Some(1),
        "{text}"
    );
    let (status, _) = http(prometheus, "GET", "/rlconfig", "").await;
    assert_eq!(status, 404, "only the metrics are on that listener");
    server.stop().await;
}

/// Leases are counted (acquired, refused, released) on every store, and the slots held are a gauge
/// where this instance can count them (the embedded store); store calls are timed per operation.
#[tokio::test]
async fn leases_and_store_calls_are_counted_per_operation() {
    const LEASES: &str =
        "domain: l\ndescriptors:\n  - key: job\n    concurrency: {max_in_flight: 1, lease_ttl: 1m}\n";
    let server = TestServer::start(&[("l.yaml", LEASES)], &[]).await;
    let body = r#"{"domain":"l","descriptors":[{"entries":[{"key":"job","value":"export"}]}]}"#;
    let (status, held) = http(server.http, "POST", "/v1/acquire", body).await;
    assert_eq!(status, 200, "{held}");
    assert_eq!(http(server.http, "POST", "/v1/acquire", body).await.0, 429);
    let (_, text) = http(server.http, "GET", "/metrics", "").await;
    assert_eq!(series_value(&text, "tollgate_leases_acquired_total "), Some(1));
    assert_eq!(series_value(&text, "tollgate_leases_refused_total "), Some(1));
    let embedded = !crate::common::store_under_test_is_redis();
    if embedded {
        assert_eq!(
            series_value(&text, "tollgate_leases_in_flight "),
            Some(1),
            "{text}"
        );
    }
    let held: serde_json::Value = serde_json::from_str(&held).expect("json");
    let release = format!(
        r#"{{"domain":"l","descriptors":[{{"entries":[{{"key":"job","value":"export"}}]}}],"lease_id":"{}"}}"#,
        held["lease_id"].as_str().expect("lease id")
    );
    assert_eq!(http(server.http, "POST", "/v1/release", &release).await.0, 200);
    // A second release of the same lease frees nothing and is not counted.
    assert_eq!(http(server.http, "POST", "/v1/release", &release).await.0, 200);
    let (_, text) = http(server.http, "GET", "/metrics", "").await;
    assert_eq!(series_value(&text, "tollgate_leases_released_total "), Some(1));
    if embedded {
        assert_eq!(series_value(&text, "tollgate_leases_in_flight "), Some(0));
    } else {
        assert!(
            !text.contains("tollgate_leases_in_flight"),
            "Redis leases are the fleet's"
        );
    }
    for (operation, calls) in [("acquire", 2), ("release", 2), ("decide", 0)] {
        let series = format!("tollgate_store_call_duration_seconds_count{{operation=\"{operation}\"}} ");
        assert_eq!(series_value(&text, &series), Some(calls), "{series}");
    }
    server.stop().await;
}

/// The Go series a Go user's dashboards read beyond the per-rule ones: hits the over-limit cache refused
/// (on Redis, where that cache sits), requests global shadow mode let through, and unknown domains by
/// name, each under the name the Go service's default Prometheus mapping gives it.
#[tokio::test]
async fn local_cache_refusals_global_shadow_and_unknown_domains_are_go_series() {
    crate::require_redis!();
    let redis = crate::common::redis::RedisServer::start();
    let url = redis.url();
    let env = [("REDIS_URL", url.as_str()), ("SHADOW_MODE", "true")];
    let server = TestServer::start(&[("m.yaml", RULES)], &env).await;
    let mut client = server.client().await;
    for _ in 0..12 {
        let answer = client
            .should_rate_limit(wire_request("m", &[&[("user", "alice")]]))
            .await
            .expect("answer");
        assert_eq!(answer.into_inner().overall_code, 1, "OK under global shadow mode");
    }
    ask(&mut client, "nope", &[("user", "u")], 1).await;
    let text = server_metrics(&server).await;
    let user = "{domain=\"m\",key1=\"user\"}";
    assert_eq!(
        series_value(&text, &format!("ratelimit_service_rate_limit_over_limit{user}")),
        Some(2),
        "{text}"
    );
    // The 11th hit was refused by Redis; the 12th, by the cache.
    assert_eq!(
        series_value(
            &text,
            "ratelimit_service_rate_limit_m_user_over_limit_with_local_cache "
        ),
        Some(1),
        "{text}"
    );
    assert_eq!(
        series_value(&text, "ratelimit_service_global_shadow_mode "),
        Some(2)
    );
    assert_eq!(
        series_value(&text, "ratelimit_service_rate_limit_nope_domain_not_found "),
        Some(1)
    );
    server.stop().await;
}

/// envoyproxy/ratelimit's Redis pool stats under their Go names: the pool's connections open and
/// opened; when Redis closes them (`CLIENT KILL`), the next call on each fails and counts it closed, and
/// the call after it, on the connection redis-rs made again, counts it opened again.
#[tokio::test]
async fn the_redis_pool_is_counted_as_the_go_service_counts_it() {
    crate::require_redis!();
    let redis = crate::common::redis::RedisServer::start();
    let url = redis.url();
    let env = [("REDIS_URL", url.as_str()), ("REDIS_POOL_SIZE", "2")];
    let server = TestServer::start(&[("m.yaml", RULES)], &env).await;
    let pool = |text: &str| {
        ["cx_active", "cx_total", "cx_local_close"]
            .map(|name| series_value(text, &format!("ratelimit_redis_pool_{name} ")))
    };
    let text = server_metrics(&server).await;
    assert_eq!(pool(&text), [Some(2), Some(2), Some(0)], "{text}");
    assert!(!text.contains("redis_per_second_pool"), "no per-second Redis");
    redis.cli(&["CLIENT", "KILL", "TYPE", "normal"]);
    let mut client = server.client().await;
    // Each connection fails one call, then serves again: asking until both have done both.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let _ = client
            .should_rate_limit(wire_request("m", &[&[("user", "alice")]]))
            .await;
        let text = server_metrics(&server).await;
        let [active, total, closed] = pool(&text).map(|v| v.expect("pool stats"));
        assert_eq!(active, total - closed, "open = opened - closed");
        if active == 2 && closed >= 2 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "pool stats never showed both connections closed and opened again: {:?}",
            pool(&text)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    server.stop().await;
}

async fn server_metrics(server: &TestServer) -> String {
    let (status, text) = http(server.http, "GET", "/metrics", "").await;
    assert_eq!(status, 200);
    text
}

/// Adds the counters of `text`'s lines to `sums`, each under its name followed by its DogStatsD tags
/// (`name|#tag,tag`) when it has any, failing on a counter of value 0 (gostats sends no counter that
/// did not grow) or a line of another shape. A timer line (`name:ms|ms[|@rate]`) adds the
/// observations it stands for, as statsd_exporter counts them (`int(1 / rate)`), under `name|ms`; a
/// gauge's line (`name:value|g`) sets `name|g`.
fn add_lines(text: &str, sums: &mut std::collections::HashMap<String, u64>) {
    for line in text.lines() {
        let (name, rest) = line
            .split_once(':')
            .unwrap_or_else(|| panic!("statsd line {line:?}"));
        if let Some((ms, rest)) = rest.split_once("|ms") {
            let ms: f64 = ms.parse().unwrap_or_else(|_| panic!("statsd timer {line:?}"));
            assert!(ms > 0.0, "{line}");
            let (rate, tags) = match rest.strip_prefix("|@") {
                Some(rest) => rest.split_once('|').map_or((rest, ""), |(r, t)| (r, t)),
                None => ("1", rest.trim_start_matches('|')),
            };
            let rate: f64 = rate.parse().unwrap_or_else(|_| panic!("statsd rate {line:?}"));
            let tags = if tags.is_empty() {
                String::new()
            } else {
                format!("|{tags}")
            };
            *sums.entry(format!("{name}|ms{tags}")).or_default() += (1.0 / rate) as u64;
            continue;
        }
        if let Some((value, tags)) = rest.split_once("|g") {
            // A gauge: its latest value, under `name|g`.
            let value: u64 = value.parse().unwrap_or_else(|_| panic!("statsd gauge {line:?}"));
            sums.insert(format!("{name}|g{tags}"), value);
            continue;
        }
        let (value, tags) = rest
            .split_once("|c")
            .unwrap_or_else(|| panic!("statsd counter {line:?}"));
        let value: u64 = value
            .parse()
            .unwrap_or_else(|_| panic!("statsd counter {line:?}"));
        assert!(value > 0, "a counter that did not grow was sent: {line}");
        *sums.entry(format!("{name}{tags}")).or_default() += value;
    }
}

/// Waits until the lines received add up to at least `expected` for every name given.
async fn statsd_sums(
    expected: &[(&str, u64)],
    received: &mut tokio::sync::mpsc::UnboundedReceiver<String>,
) -> std::collections::HashMap<String, u64> {
    let mut sums = std::collections::HashMap::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !expected
        .iter()
        .all(|(name, value)| sums.get(*name).copied().unwrap_or(0) >= *value)
    {
        let text = tokio::time::timeout_at(deadline, received.recv())
            .await
            .unwrap_or_else(|_| panic!("statsd never received {expected:?}; got {sums:?}"))
            .expect("the listener runs");
        add_lines(&text, &mut sums);
    }
    sums
}

/// Receives datagrams on `udp` (none over 1,432 bytes) until their counters add up to `expected`, and
/// checks that they add up to exactly that.
async fn expect_datagrams(udp: tokio::net::UdpSocket, expected: &[(&str, u64)]) {
    let (sender, mut received) = tokio::sync::mpsc::unbounded_channel();
    let listener = tokio::spawn(async move {
        let mut datagram = vec![0u8; 2048];
        while let Ok(n) = udp.recv(&mut datagram).await {
            assert!(n <= 1432, "a datagram of {n} bytes");
            let _ = sender.send(String::from_utf8(datagram[..n].to_vec()).expect("text"));
        }
    });
    let sums = statsd_sums(expected, &mut received).await;
    listener.abort();
    for (name, value) in expected {
        assert_eq!(sums.get(*name), Some(value), "{name}: {sums:?}");
    }
}

/// Asks `times` times for the descriptor `entries` of `domain`, each answered.
async fn ask(client: &mut RlsClient, domain: &str, entries: &[(&str, &str)], times: usize) {
    for _ in 0..times {
        client
            .should_rate_limit(wire_request(domain, &[entries]))
            .await
            .expect("answer");
    }
}

type RlsClient =
    tollgate::proto::rls::rate_limit_service_client::RateLimitServiceClient<tonic::transport::Channel>;

/// A client of `server` that has asked `times` times for user `user` of domain `m`.
async fn ask_times(server: &TestServer, user: &str, times: usize) -> RlsClient {
    let mut client = server.client().await;
    ask(&mut client, "m", &[("user", user)], times).await;
    client
}

/// Rules for every kind of hit the Go stats tell apart: a plain rule, an IPv4-valued one, and a shadow
/// rule three levels deep.
const EVERY_KIND: &str = "domain: s\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 10}\n  - key: remote_address\n    value: 10.0.0.1\n    rate_limit: {unit: hour, requests_per_unit: 100}\n  - key: a\n    value: x\n    descriptors:\n      - key: b\n        descriptors:\n          - key: c\n            shadow_mode: true\n            rate_limit: {unit: hour, requests_per_unit: 1}\n";

/// Within, near, over (from Redis, then from the local cache), an IPv4-valued rule, a shadow rule three
/// levels deep, an unknown domain and a reload, against `server` (on Redis, rules `EVERY_KIND` in
/// `s.yaml`). Returns the Go stats they make, name first, as [`add_lines`] sums them with `suffix`
/// after each name (and after `|ms` or `|g`).
async fn every_kind_of_hit(server: &TestServer, suffix: &str) -> Vec<(String, u64)> {
    let mut client = server.client().await;
    ask(&mut client, "s", &[("user", "alice")], 12).await;
    ask(&mut client, "s", &[("remote_address", "10.0.0.1")], 1).await;
    ask(&mut client, "s", &[("a", "x"), ("b", "y"), ("c", "z")], 2).await;
    ask(&mut client, "nope", &[("user", "u")], 1).await;
    std::fs::write(
        server.dir.path().join("s.yaml"),
        format!("{EVERY_KIND}# reloaded\n"),
    )
    .expect("rewrite");
    let rule = "ratelimit.service.rate_limit.s";
    [
        (format!("{rule}.user.total_hits{suffix}"), 12),
        (format!("{rule}.user.within_limit{suffix}"), 10),
        (format!("{rule}.user.near_limit{suffix}"), 2),
        (format!("{rule}.user.over_limit{suffix}"), 2),
        (format!("{rule}.user.over_limit_with_local_cache{suffix}"), 1),
        (format!("{rule}.remote_address_10_0_0_1.total_hits{suffix}"), 1),
        (format!("{rule}.remote_address_10_0_0_1.within_limit{suffix}"), 1),
        (format!("{rule}.a_x.b.c.total_hits{suffix}"), 2),
        (format!("{rule}.a_x.b.c.within_limit{suffix}"), 1),
        // Of a limit of 1, the one allowed hit is above the threshold (0).
        (format!("{rule}.a_x.b.c.near_limit{suffix}"), 1),
        (format!("{rule}.a_x.b.c.over_limit{suffix}"), 1),
        (format!("{rule}.a_x.b.c.shadow_mode{suffix}"), 1),
        (
            format!("ratelimit.service.rate_limit.nope.domain_not_found{suffix}"),
            1,
        ),
        (format!("ratelimit.service.config_load_success{suffix}"), 2),
        (
            format!("ratelimit_server.ShouldRateLimit.total_requests{suffix}"),
            16,
        ),
        (
            format!("ratelimit_server.ShouldRateLimit.response_time|ms{suffix}"),
            16,
        ),
        (format!("ratelimit.redis_pool.cx_active|g{suffix}"), 1),
        (format!("ratelimit.redis_pool.cx_total{suffix}"), 1),
    ]
    .into()
}

/// The Go service's exact lines for every kind of hit, to statsd (tags as name suffixes) and to
/// DogStatsD (tags as tags).
#[tokio::test]
async fn statsd_and_dog_statsd_receive_every_kind_of_hit_as_go_names_it() {
    crate::require_redis!();
    let redis = crate::common::redis::RedisServer::start();
    let url = redis.url();
    for (dialect, suffix) in [
        ("USE_STATSD", ".__env=prod_eu"),
        ("USE_DOG_STATSD", "|#env:prod_eu"),
    ] {
        redis.cli(&["FLUSHALL"]);
        let udp = tokio::net::UdpSocket::bind("127.0.0.1:0").await.expect("bind");
        let port = udp.local_addr().expect("addr").port().to_string();
        let env = [
            ("REDIS_URL", url.as_str()),
            ("REDIS_POOL_SIZE", "1"),
            (dialect, "true"),
            ("STATSD_HOST", "127.0.0.1"),
            ("STATSD_PORT", port.as_str()),
            ("STATSD_PROTOCOL", "udp"),
            ("STATS_FLUSH_INTERVAL", "100ms"),
            ("EXTRA_TAGS", "env:prod.eu"),
        ];
        let server = TestServer::start(&[("s.yaml", EVERY_KIND)], &env).await;
        let expected = every_kind_of_hit(&server, suffix).await;
        let expected: Vec<(String, u64)> = expected
            .into_iter()
            .map(|(name, value)| match suffix.strip_prefix('|') {
                Some(_) => (name, value),
                // gostats' tags are part of the name, before the type.
                None => {
                    let name = ["|ms", "|g"].iter().fold(name, |name, kind| {
                        name.replace(&format!("{kind}{suffix}"), &format!("{suffix}{kind}"))
                    });
                    (name, value)
                }
            })
            .collect();
        let expected: Vec<(&str, u64)> = expected.iter().map(|(n, v)| (n.as_str(), *v)).collect();
        expect_datagrams(udp, &expected).await;
        server.stop().await;
    }
}

/// The Go service's statsd lines, over UDP with `EXTRA_TAGS`, then over TCP (gostats' default): what a
/// statsd_exporter sidecar received from the Go service it receives from Tollgate.
#[tokio::test]
async fn statsd_receives_the_go_services_lines_over_udp_and_tcp() {
    let udp = tokio::net::UdpSocket::bind("127.0.0.1:0").await.expect("bind");
    let port = udp.local_addr().expect("addr").port().to_string();
    let env = [
        ("USE_STATSD", "true"),
        ("STATSD_HOST", "127.0.0.1"),
        ("STATSD_PORT", port.as_str()),
        ("STATSD_PROTOCOL", "udp"),
        ("STATS_FLUSH_INTERVAL", "100ms"),
        ("EXTRA_TAGS", "env:prod.eu"),
    ];
    let server = TestServer::start(&[("m.yaml", RULES)], &env).await;
    let mut client = ask_times(&server, "alice", 12).await;
    ask(&mut client, "nope", &[("user", "u")], 1).await;
    let expected = [
        ("ratelimit.service.rate_limit.m.user.total_hits.__env=prod_eu", 12),
        (
            "ratelimit.service.rate_limit.m.user.within_limit.__env=prod_eu",
            10,
        ),
        ("ratelimit.service.rate_limit.m.user.near_limit.__env=prod_eu", 2),
        ("ratelimit.service.rate_limit.m.user.over_limit.__env=prod_eu", 2),
        (
            "ratelimit.service.rate_limit.nope.domain_not_found.__env=prod_eu",
            1,
        ),
        (
            "ratelimit_server.ShouldRateLimit.total_requests.__env=prod_eu",
            13,
        ),
        // Every request's response time, in bucket lines weighted by their sample rates.
        (
            "ratelimit_server.ShouldRateLimit.response_time.__env=prod_eu|ms",
            13,
        ),
        ("ratelimit.service.config_load_success.__env=prod_eu", 1),
    ];
    expect_datagrams(udp, &expected).await;
    server.stop().await;

    let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = tcp.local_addr().expect("addr").port().to_string();
    let env = [
        ("USE_STATSD", "true"),
        ("STATSD_HOST", "127.0.0.1"),
        ("STATSD_PORT", port.as_str()),
        ("STATS_FLUSH_INTERVAL", "100ms"),
    ];
    let server = TestServer::start(&[("m.yaml", RULES)], &env).await;
    ask_times(&server, "bob", 3).await;
    let (sender, mut received) = tokio::sync::mpsc::unbounded_channel();
    let listener = tokio::spawn(async move {
        let (stream, _) = tcp.accept().await.expect("the sink connects");
        let mut lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(stream));
        while let Ok(Some(line)) = lines.next_line().await {
            let _ = sender.send(line);
        }
    });
    let expected = [("ratelimit.service.rate_limit.m.user.total_hits", 3)];
    statsd_sums(&expected, &mut received).await;
    listener.abort();
    server.stop().await;
}

/// DogStatsD as the Go service's sink sends it: `EXTRA_TAGS` as tags, then a mogrifier's (the Go
/// repository's own example: domain and descriptor out of the name into tags), and stats no mogrifier
/// matches under their Go names.
#[tokio::test]
async fn dog_statsd_receives_tags_and_mogrified_names() {
    let udp = tokio::net::UdpSocket::bind("127.0.0.1:0").await.expect("bind");
    let port = udp.local_addr().expect("addr").port().to_string();
    let env = [
        ("USE_DOG_STATSD", "true"),
        ("STATSD_HOST", "127.0.0.1"),
        ("STATSD_PORT", port.as_str()),
        ("STATS_FLUSH_INTERVAL", "100ms"),
        ("EXTRA_TAGS", "env:prod.eu"),
        ("USE_DOG_STATSD_MOGRIFIERS", "RULE"),
        (
            "DOG_STATSD_MOGRIFIER_RULE_PATTERN",
            r"^ratelimit\.service\.rate_limit\.([^.]*)\.([^.]*)\.([^.]*)$",
        ),
        (
            "DOG_STATSD_MOGRIFIER_RULE_NAME",
            "ratelimit.service.rate_limit.$3",
        ),
        ("DOG_STATSD_MOGRIFIER_RULE_TAGS", "domain:$1,descriptor:$2"),
        ("DD_SERVICE", "ratelimit"),
    ];
    let server = TestServer::start(&[("m.yaml", RULES)], &env).await;
    ask_times(&server, "alice", 12).await;
    let tags = "|#service:ratelimit,env:prod_eu,domain:m,descriptor:user";
    let expected = [
        (format!("ratelimit.service.rate_limit.total_hits{tags}"), 12),
        (format!("ratelimit.service.rate_limit.within_limit{tags}"), 10),
        (format!("ratelimit.service.rate_limit.near_limit{tags}"), 2),
        (format!("ratelimit.service.rate_limit.over_limit{tags}"), 2),
        (
            "ratelimit_server.ShouldRateLimit.total_requests|#service:ratelimit,env:prod_eu".into(),
            12,
        ),
        (
            "ratelimit_server.ShouldRateLimit.response_time|ms|#service:ratelimit,env:prod_eu".into(),
            12,
        ),
        (
            "ratelimit.service.config_load_success|#service:ratelimit,env:prod_eu".into(),
            1,
        ),
    ];
    let expected: Vec<(&str, u64)> = expected.iter().map(|(n, v)| (n.as_str(), *v)).collect();
    expect_datagrams(udp, &expected).await;
    server.stop().await;
}

/// A statsd_exporter mapping file shaped like Envoy Gateway's (globs for rules one level deep, regexes
/// for deeper ones, the service counters, the response-time histogram), written for this test from the
/// format's documentation.
const GATEWAY_MAPPING: &str = r#"
mappings:
  - match: "ratelimit.service.rate_limit.*.*.near_limit"
    name: "ratelimit_service_rate_limit_near_limit"
    timer_type: "histogram"
    labels: {domain: "$1", key1: "$2"}
  - match: "ratelimit.service.rate_limit.*.*.over_limit"
    name: "ratelimit_service_rate_limit_over_limit"
    timer_type: "histogram"
    labels: {domain: "$1", key1: "$2"}
  - match: "ratelimit.service.rate_limit.*.*.total_hits"
    name: "ratelimit_service_rate_limit_total_hits"
    timer_type: "histogram"
    labels: {domain: "$1", key1: "$2"}
  - match: "ratelimit\\.service\\.rate_limit\\.([^\\.]*)\\.([^\\.]*)\\.([^\\.]*)\\.total_hits"
    match_type: "regex"
    name: "ratelimit_service_rate_limit_total_hits"
    labels: {domain: "$1", key1: "$2", key2: "$3"}
  - match: "ratelimit\\.service\\.rate_limit\\.([^\\.]*)\\.([^\\.]*)\\.([^\\.]*)\\.over_limit"
    match_type: "regex"
    name: "ratelimit_service_rate_limit_over_limit"
    labels: {domain: "$1", key1: "$2", key2: "$3"}
  - match: "ratelimit.service.call.should_rate_limit.*"
    name: "ratelimit_service_should_rate_limit_error"
    match_metric_type: counter
    labels: {err_type: "$1"}
  - match: "ratelimit_server.*.total_requests"
    name: "ratelimit_service_total_requests"
    match_metric_type: counter
    labels: {grpc_method: "$1"}
  - match: "ratelimit_server.*.response_time"
    name: "ratelimit_service_response_time_seconds"
    timer_type: "histogram"
    scale: 0.001
    labels: {grpc_method: "$1"}
  - match: "ratelimit.service.config_load_success"
    name: "ratelimit_service_config_load_success"
    match_metric_type: counter
"#;

/// With `PROMETHEUS_MAPPER_YAML`, `/metrics` serves what the mapping names: the series Envoy Gateway's
/// dashboard queries, deeper rules with `key2`, and the response time under the mapped name. A mapping
/// that cannot be used stops startup naming the file and the reason.
#[tokio::test]
async fn a_mapping_file_names_the_go_series_as_envoy_gateway_configures_them() {
    let rules = "domain: m\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 1}\n  - key: path\n    value: /login\n    descriptors:\n      - key: ip\n        rate_limit: {unit: hour, requests_per_unit: 10}\n";
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("conf.yaml");
    std::fs::write(&file, GATEWAY_MAPPING).expect("write");
    let path = file.to_string_lossy().into_owned();
    let server = TestServer::start(&[("m.yaml", rules)], &[("PROMETHEUS_MAPPER_YAML", path.as_str())]).await;
    let mut client = server.client().await;
    ask(&mut client, "m", &[("user", "alice")], 2).await;
    ask(&mut client, "m", &[("path", "/login"), ("ip", "10.0.0.1")], 1).await;
    let text = server_metrics(&server).await;
    for (series, value) in [
        (
            "ratelimit_service_rate_limit_total_hits{domain=\"m\",key1=\"user\"} ",
            2,
        ),
        (
            "ratelimit_service_rate_limit_over_limit{domain=\"m\",key1=\"user\"} ",
            1,
        ),
        (
            "ratelimit_service_rate_limit_total_hits{domain=\"m\",key1=\"path_/login\",key2=\"ip\"} ",
            1,
        ),
        (
            "ratelimit_service_total_requests{grpc_method=\"ShouldRateLimit\"} ",
            3,
        ),
        (
            "ratelimit_service_response_time_seconds_count{grpc_method=\"ShouldRateLimit\"} ",
            3,
        ),
        ("ratelimit_service_config_load_success ", 1),
        // Unmatched: the Go name made Prometheus-safe.
        ("ratelimit_service_rate_limit_m_user_within_limit ", 1),
    ] {
        assert_eq!(series_value(&text, series), Some(value), "{series} in\n{text}");
    }
    server.stop().await;

    std::fs::write(&file, "mappings:\n  - match: \"ratelimit..x\"\n    name: x\n").expect("write");
    let settings = tollgate::settings::Settings::load_from(
        None,
        &[("PROMETHEUS_MAPPER_YAML".to_owned(), path.clone())]
            .into_iter()
            .collect(),
        &[("config_dir", dir.path().to_string_lossy().into_owned())],
    )
    .expect("settings load; the file is read at startup");
    let listeners = tollgate::server::Listeners::bind(&tollgate::settings::ListenSettings {
        grpc_addr: "127.0.0.1:0".into(),
        http_addr: "127.0.0.1:0".into(),
        debug_addr: "127.0.0.1:0".into(),
        ..settings.listen.clone()
    })
    .await
    .expect("bind");
    let clock: std::sync::Arc<dyn tollgate_core::clock::Clock> =
        std::sync::Arc::new(tollgate_core::clock::SystemClock);
    let error = tollgate::server::run(settings, listeners, clock, std::future::pending())
        .await
        .expect_err("an unusable mapping stops startup");
    let said = format!("{error:#}");
    assert!(
        said.contains("PROMETHEUS_MAPPER_YAML") && said.contains("invalid glob"),
        "{said}"
    );
}
