//! The settings' unit tests.

use std::path::PathBuf;
use std::time::Duration;

use tollgate_core::algorithm::Algorithm;

use super::*;

fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn defaults_match_envoyproxy_ratelimit_ports() {
    let s = Settings::load_from(None, &env(&[]), &[]).expect("defaults load");
    assert_eq!(s.listen.grpc_addr, "0.0.0.0:8081");
    assert_eq!(s.listen.http_addr, "0.0.0.0:8080");
    assert_eq!(s.listen.debug_addr, "0.0.0.0:6070");
    assert_eq!(
        s.rules.config_dir,
        PathBuf::from("/srv/runtime_data/current/config")
    );
    assert_eq!(s.answers.limit_remaining_header, "RateLimit-Remaining");
}

#[test]
fn go_names_are_honoured() {
    let s = Settings::load_from(
        None,
        &env(&[
            ("GRPC_PORT", "9000"),
            ("HOST", "127.0.0.1"),
            ("RUNTIME_ROOT", "/data"),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("SHADOW_MODE", "T"),
            ("CACHE_KEY_PREFIX", "pre:"),
            ("LIMIT_RESPONSE_HEADERS_ENABLED", "1"),
            ("REDIS_SENTINEL_AUTH", "sentinel-secret"),
        ]),
        &[],
    )
    .expect("loads");
    assert_eq!(s.store.redis.sentinel_auth.expose(), "sentinel-secret");
    assert!(
        !format!("{s:?}").contains("sentinel-secret"),
        "secrets are redacted"
    );
    assert_eq!(s.listen.grpc_addr, "0.0.0.0:9000");
    assert_eq!(s.listen.http_addr, "127.0.0.1:8080");
    assert_eq!(s.rules.config_dir, PathBuf::from("/data/ratelimit/config"));
    assert!(s.decisions.shadow_mode);
    assert!(s.answers.limit_response_headers_enabled);
    assert_eq!(s.decisions.cache_key_prefix, "pre:");
}

#[test]
fn native_names_beat_go_names_and_flags_beat_both() {
    let e = env(&[
        ("GRPC_PORT", "9000"),
        ("TOLLGATE_GRPC_ADDR", "127.0.0.1:9001"),
        ("TOLLGATE_SHADOW_MODE", "true"),
    ]);
    let s = Settings::load_from(None, &e, &[]).expect("loads");
    assert_eq!(s.listen.grpc_addr, "127.0.0.1:9001");
    assert!(s.decisions.shadow_mode);
    let s = Settings::load_from(None, &e, &[("grpc_addr", "127.0.0.1:0".into())]).expect("loads");
    assert_eq!(s.listen.grpc_addr, "127.0.0.1:0");
}

#[test]
fn kubernetes_service_link_variables_do_not_stop_startup() {
    let e = env(&[
        ("TOLLGATE_PORT", "tcp://10.0.0.7:8081"),
        ("TOLLGATE_SERVICE_HOST", "10.0.0.7"),
        ("TOLLGATE_PORT_8081_TCP_ADDR", "10.0.0.7"),
        ("GRPC_PORT", "tcp://10.0.0.8:8081"),
        ("TOLLGATE_SHADOW_MODE", "true"),
    ]);
    let s = Settings::load_from(None, &e, &[]).expect("service links are ignored");
    assert_eq!(
        s.listen.grpc_addr, "0.0.0.0:8081",
        "a tcp:// GRPC_PORT is not a port"
    );
    assert!(s.decisions.shadow_mode, "real settings still apply");
}

#[test]
fn bad_values_are_named() {
    let err = Settings::load_from(None, &env(&[("SHADOW_MODE", "maybe")]), &[]).expect_err("rejects");
    assert!(err.to_string().contains("SHADOW_MODE"), "{err}");
    let err = Settings::load_from(None, &env(&[("TOLLGATE_DEFAULT_ALGORITHM", "leaky")]), &[])
        .expect_err("rejects");
    assert!(err.to_string().contains("leaky"), "{err}");
}

#[test]
fn settings_file_layers_under_the_environment() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("settings.yaml");
    std::fs::write(
        &file,
        "grpc_addr: 127.0.0.1:7000\ndefault_algorithm: token_bucket\n",
    )
    .expect("write");
    let s = Settings::load_from(Some(&file), &env(&[]), &[]).expect("loads");
    assert_eq!(s.listen.grpc_addr, "127.0.0.1:7000");
    assert_eq!(s.decisions.default_algorithm, Algorithm::TokenBucket);
    let s = Settings::load_from(Some(&file), &env(&[("GRPC_PORT", "7001")]), &[]).expect("loads");
    assert_eq!(s.listen.grpc_addr, "0.0.0.0:7001");
}

#[test]
fn secrets_never_print() {
    let s = Settings::load_from(
        None,
        &env(&[
            (
                "REDIS_URL",
                "redis://admin:hunter2@redis:6379,user:pw2@other:6379",
            ),
            ("REDIS_TYPE", "cluster"),
            ("REDIS_AUTH", "hunter3"),
            ("TOLLGATE_HASH_KEY", "hunter4"),
        ]),
        &[],
    )
    .expect("loads");
    let shown = format!("{s:?} {} {}", s.store.redis.auth, s.decisions.hash_key);
    for secret in ["hunter2", "pw2", "hunter3", "hunter4"] {
        assert!(!shown.contains(secret), "{secret} in {shown}");
    }
    assert!(shown.contains("redis://***@redis:6379,***@other:6379"), "{shown}");
    assert_eq!(s.decisions.hash_key.expose(), "hunter4");
}

#[test]
fn typed_values_are_read_once_and_refused_by_name() {
    let s = Settings::load_from(
        None,
        &env(&[
            ("LOG_FORMAT", "JSON"),
            ("TOLLGATE_RESPONSE_HEADERS", "ietf, Retry-After"),
        ]),
        &[],
    )
    .expect("loads");
    assert_eq!(s.telemetry.log_format, LogFormat::Json);
    assert_eq!(
        s.answers.response_headers,
        HeaderStyles(vec![HeaderStyle::Ietf, HeaderStyle::RetryAfter])
    );
    let err = Settings::load_from(None, &env(&[("TOLLGATE_RESPONSE_HEADERS", "x-custom")]), &[])
        .expect_err("unknown style");
    assert!(err.to_string().contains("x-custom"), "{err}");
    let err = Settings::load_from(None, &env(&[("LOG_FORMAT", "xml")]), &[]).expect_err("bad format");
    assert!(err.to_string().contains("xml"), "{err}");
}

#[test]
fn zero_durations_of_tollgates_own_settings_are_refused_by_name() {
    for name in [
        "TOLLGATE_RELOAD_INTERVAL",
        "TOLLGATE_REDIS_DEADLINE",
        "TOLLGATE_READ_TIMEOUT",
        "TOLLGATE_WRITE_TIMEOUT",
        "TOLLGATE_IDLE_CONNECTION_PROBATION",
    ] {
        let err = Settings::load_from(None, &env(&[(name, "0s")]), &[]).expect_err(name);
        assert!(err.to_string().contains(&format!("{name}=")), "{name}: {err}");
    }
    let err = Settings::load_from(None, &env(&[("TOLLGATE_RELOAD_INTERVAL", "-1s")]), &[]);
    assert!(err.is_err(), "negative durations do not parse");
    let ok = Settings::load_from(None, &env(&[("TOLLGATE_DRAIN_PERIOD", "0s")]), &[]);
    assert!(ok.is_ok(), "no drain is a choice");
}

#[test]
fn transport_bounds_default_from_the_request_size_and_the_open_file_limit() {
    let listen = Settings::load_from(None, &env(&[("TOLLGATE_MAX_REQUEST_BYTES", "1000")]), &[])
        .expect("loads")
        .listen;
    assert_eq!(listen.bytes_in_flight(), (64_000, 4_000));
    assert_eq!(listen.connection_caps(Some(1024)), (480, 120));
    assert_eq!(
        listen.connection_caps(None),
        (480, 120),
        "unknown: the common limit"
    );
    assert_eq!(listen.connection_caps(Some(10)), (8, 2), "never zero");
    let set = env(&[
        ("TOLLGATE_MAX_CONNECTIONS", "7"),
        ("TOLLGATE_HTTP_MAX_CONNECTIONS", "5"),
    ]);
    let listen = Settings::load_from(None, &set, &[]).expect("loads").listen;
    assert_eq!(listen.connection_caps(Some(1024)), (7, 5));
    // A budget below one whole request would refuse the largest request allowed.
    for name in [
        "TOLLGATE_MAX_REQUEST_BYTES_IN_FLIGHT",
        "TOLLGATE_MAX_CONNECTION_BYTES_IN_FLIGHT",
    ] {
        let err = Settings::load_from(None, &env(&[(name, "1000")]), &[]).expect_err(name);
        assert!(err.to_string().contains(name), "{err}");
    }
    for name in [
        "TOLLGATE_TLS_HANDSHAKES_PER_CLIENT",
        "TOLLGATE_HTTP_MAX_HEADER_BYTES",
    ] {
        let err = Settings::load_from(None, &env(&[(name, "0")]), &[]).expect_err(name);
        assert!(err.to_string().contains(name), "{err}");
    }
}

#[test]
fn unimplemented_go_settings_are_refused_or_warned_never_silent() {
    // Each refusal names the setting as it was given (or its key, when it was left at its default);
    // the Go service refuses these values too (or cannot run them: memcache is not built in).
    for (pairs, name) in [
        (&[("GRPC_SERVER_USE_TLS", "true")][..], "grpc_server_tls_cert="),
        (&[("CONFIG_TYPE", "GRPC_XDS_DELTA")][..], "GRPC_XDS_DELTA"),
        (&[("BACKEND_TYPE", "memcache")][..], "BACKEND_TYPE="),
        (
            &[("REDIS_TYPE", "ring"), ("REDIS_URL", "r:6379")][..],
            "REDIS_URL=",
        ),
        (
            &[("TRACING_EXPORTER_PROTOCOL", "zipkin")][..],
            "TRACING_EXPORTER_PROTOCOL=",
        ),
    ] {
        let err = Settings::load_from(None, &env(pairs), &[]).expect_err(name);
        assert!(err.to_string().contains(name), "{err}");
    }
    let s = Settings::load_from(
        None,
        &env(&[
            ("RUNTIME_WATCH_ROOT", "false"),
            ("REDIS_PERSECOND_URL", "r2:6379"),
            ("TOLLGATE_NOT_A_SETTING", "x"),
            ("GRPC_PORT", "tcp://10.0.0.1:8081"),
            ("GRPC_SERVER_TLS_CA_CERT", "/certs/ca.crt"),
            ("GRPC_SERVER_TLS_CERT", "/certs/tls.crt"),
            ("MEMCACHE_HOST_PORT", "mc:11211"),
        ]),
        &[],
    )
    .expect("loads");
    for expected in [
        "RUNTIME_WATCH_ROOT",
        "REDIS_PERSECOND_URL",
        "TOLLGATE_NOT_A_SETTING",
        "GRPC_PORT",
        "GRPC_SERVER_TLS_CA_CERT: envoyproxy/ratelimit does not read it",
        "GRPC_SERVER_TLS_CERT: GRPC_SERVER_USE_TLS is false",
        "MEMCACHE_HOST_PORT",
    ] {
        assert!(
            s.warnings.iter().any(|w| w.contains(expected)),
            "{expected} not in {:?}",
            s.warnings
        );
    }
}

#[test]
fn statsd_settings_read_as_the_go_service_and_gostats_read_them() {
    let s = Settings::load_from(None, &env(&[]), &[]).expect("defaults").stats;
    assert!(!s.statsd(), "off unless asked for");
    assert_eq!(
        (s.statsd_addr(), s.statsd_protocol),
        ("localhost:8125".into(), StatsdProtocol::Tcp)
    );
    let given = env(&[
        ("USE_STATSD", "true"),
        ("STATSD_HOST", "statsd.monitoring"),
        ("STATSD_PORT", "9125"),
        ("STATSD_PROTOCOL", "udp"),
        ("STATS_FLUSH_INTERVAL", "1s"),
        ("EXTRA_TAGS", "env:prod,team:edge"),
    ]);
    let s = Settings::load_from(None, &given, &[]).expect("loads").stats;
    assert!(s.statsd());
    assert_eq!(s.statsd_addr(), "statsd.monitoring:9125");
    assert_eq!(s.statsd_protocol, StatsdProtocol::Udp);
    assert_eq!(s.stats_flush_interval, Duration::from_secs(1));
    assert_eq!(
        s.extra_tags.0,
        vec![("env".into(), "prod".into()), ("team".into(), "edge".into())]
    );
    let disabled = env(&[("USE_STATSD", "true"), ("DISABLE_STATS", "true")]);
    assert!(
        !Settings::load_from(None, &disabled, &[])
            .expect("loads")
            .stats
            .statsd()
    );
    for (name, value) in [
        ("EXTRA_TAGS", "env"),
        ("EXTRA_TAGS", "a:b:c"),
        ("STATSD_PROTOCOL", "sctp"),
    ] {
        let err = Settings::load_from(None, &env(&[(name, value)]), &[]).expect_err(value);
        assert!(err.to_string().contains(name), "{err}");
    }
}

#[test]
fn dog_statsd_and_its_mogrifiers_read_as_the_go_service_reads_them() {
    let given = env(&[
        ("USE_DOG_STATSD", "true"),
        ("USE_DOG_STATSD_MOGRIFIERS", "TAG,other"),
        (
            "DOG_STATSD_MOGRIFIER_TAG_PATTERN",
            r"^ratelimit\.service\.rate_limit\.(.*)\.(.*)\.(.*)$",
        ),
        ("DOG_STATSD_MOGRIFIER_TAG_NAME", "ratelimit.service.rate_limit.$3"),
        ("DOG_STATSD_MOGRIFIER_TAG_TAGS", "domain:$1,descriptor:$2"),
        ("DOG_STATSD_MOGRIFIER_OTHER_PATTERN", "^x$"),
        ("DOG_STATSD_MOGRIFIER_OTHER_NAME", "y"),
        ("DD_VERSION", "1.2.3"),
        ("DD_ENV", "prod"),
    ]);
    let s = Settings::load_from(None, &given, &[]).expect("loads");
    assert!(s.stats.dog_statsd() && !s.stats.statsd());
    let names: Vec<&str> = s
        .stats
        .dog_statsd_mogrifiers
        .iter()
        .map(|m| m.name.as_str())
        .collect();
    assert_eq!(
        names,
        ["ratelimit.service.rate_limit.$3", "y"],
        "in the listed order"
    );
    assert_eq!(
        s.stats.dog_statsd_mogrifiers[0].tags.to_string(),
        "domain:$1,descriptor:$2"
    );
    assert!(s.warnings.is_empty(), "{:?}", s.warnings);
    assert_eq!(
        s.stats.dog_statsd_global_tags,
        ["env:prod", "version:1.2.3"],
        "datadog-go's order"
    );
    let with = |extra: &[(&'static str, &'static str)]| {
        let mut pairs = vec![("USE_DOG_STATSD", "true"), ("USE_DOG_STATSD_MOGRIFIERS", "m")];
        pairs.extend_from_slice(extra);
        Settings::load_from(None, &env(&pairs), &[])
    };
    // The Go service refuses each of these at startup too.
    for (extra, named) in [
        (
            &[("DOG_STATSD_MOGRIFIER_M_NAME", "n")][..],
            "DOG_STATSD_MOGRIFIER_M_PATTERN",
        ),
        (
            &[("DOG_STATSD_MOGRIFIER_M_PATTERN", "a")][..],
            "DOG_STATSD_MOGRIFIER_M_NAME",
        ),
        (
            &[
                ("DOG_STATSD_MOGRIFIER_M_PATTERN", "(a"),
                ("DOG_STATSD_MOGRIFIER_M_NAME", "n"),
            ][..],
            "DOG_STATSD_MOGRIFIER_M_PATTERN",
        ),
        (
            &[
                ("DOG_STATSD_MOGRIFIER_M_PATTERN", "a"),
                ("DOG_STATSD_MOGRIFIER_M_NAME", "n"),
                ("DOG_STATSD_MOGRIFIER_M_TAGS", "k:"),
            ][..],
            "DOG_STATSD_MOGRIFIER_M_TAGS",
        ),
        (&[("USE_STATSD", "true")][..], "USE_DOG_STATSD"),
    ] {
        let err = with(extra).expect_err(named);
        assert!(err.to_string().contains(named), "{named}: {err}");
    }
}

#[test]
fn go_pipeline_window_and_limit_are_honoured_and_a_window_must_fit_the_deadline() {
    let s = Settings::load_from(
        None,
        &env(&[
            ("REDIS_PIPELINE_WINDOW", "150us"),
            ("REDIS_PIPELINE_LIMIT", "8"),
            ("REDIS_PERSECOND_PIPELINE_LIMIT", "4"),
        ]),
        &[],
    )
    .expect("loads");
    assert_eq!(s.store.redis.pipeline_window, Duration::from_micros(150));
    assert_eq!(s.store.redis.pipeline_limit, 8);
    assert_eq!(s.store.per_second.pipeline_window, Duration::ZERO);
    assert_eq!(s.store.per_second.pipeline_limit, 4);
    assert!(
        !s.warnings.iter().any(|w| w.contains("PIPELINE")),
        "{:?}",
        s.warnings
    );
    let main = |s: &Settings| s.store.redis.pipeline_window;
    let per_second = |s: &Settings| s.store.per_second.pipeline_window;
    type Window<'a> = &'a dyn Fn(&Settings) -> Duration;
    let windows: [(&str, Window<'_>); 2] = [
        ("REDIS_PIPELINE_WINDOW", &main),
        ("REDIS_PERSECOND_PIPELINE_WINDOW", &per_second),
    ];
    for (name, window) in windows {
        // The deadline is 20 ms by default; the Go service has none, so its window starts, capped.
        let s = Settings::load_from(None, &env(&[(name, "20ms")]), &[]).expect(name);
        assert_eq!(window(&s), Duration::from_millis(10));
        assert!(
            s.warnings
                .iter()
                .any(|w| w.contains("not shorter than REDIS_DEADLINE")),
            "{:?}",
            s.warnings
        );
    }
}

#[test]
fn the_per_second_redis_is_read_and_refused_where_it_cannot_be_exact() {
    let base = [
        ("REDIS_URL", "main:6379"),
        ("REDIS_PERSECOND", "true"),
        ("REDIS_PERSECOND_URL", "persecond:6379"),
        ("REDIS_PERSECOND_TYPE", "cluster"),
        ("REDIS_PERSECOND_AUTH", "second-secret"),
        ("REDIS_PERSECOND_POOL_SIZE", "4"),
        ("REDIS_PERSECOND_PIPELINE_WINDOW", "150us"),
    ];
    let s = Settings::load_from(None, &env(&base), &[]).expect("loads");
    assert!(s.store.redis_persecond);
    assert_eq!(s.store.per_second.kind, "cluster");
    assert_eq!(s.store.per_second.pool_size, 4);
    assert_eq!(s.store.per_second.auth.expose(), "second-secret");
    assert!(!format!("{s:?}").contains("second-secret"));
    assert_eq!(s.store.per_second.pipeline_window, Duration::from_micros(150));
    let err = Settings::load_from(None, &env(&base[1..2]), &[]).expect_err("no URLs");
    assert!(err.to_string().contains("REDIS_PERSECOND_URL"), "{err}");
    let mut stop = base.to_vec();
    stop.push(("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "true"));
    // The Go service runs it: so does Tollgate, saying how it differs.
    let s = Settings::load_from(None, &env(&stop), &[]).expect("starts, as the Go service");
    assert!(
        s.warnings
            .iter()
            .any(|w| w.contains("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT with REDIS_PERSECOND")),
        "{:?}",
        s.warnings
    );
}

#[test]
fn opentelemetry_samplers_are_read_and_refused_by_name() {
    let s = Settings::load_from(
        None,
        &env(&[
            ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
            ("OTEL_TRACES_SAMPLER_ARG", "0.25"),
        ]),
        &[],
    )
    .expect("loads");
    assert_eq!(
        s.telemetry.otel_traces_sampler,
        TraceSampler::ParentBasedTraceIdRatio
    );
    assert_eq!(
        s.telemetry
            .otel_traces_sampler
            .sampling(s.telemetry.otel_traces_sampler_arg, 0.5),
        (0.25, true)
    );
    assert_eq!(TraceSampler::AlwaysOff.sampling(0.25, 0.5), (0.0, false));
    assert_eq!(
        TraceSampler::Default.sampling(0.25, 0.5),
        (0.5, true),
        "TRACING_SAMPLING_RATE"
    );
    // The Go service does not read these: values Tollgate cannot use are warned about, not refused.
    let s =
        Settings::load_from(None, &env(&[("OTEL_TRACES_SAMPLER", "jaeger_remote")]), &[]).expect("starts");
    assert_eq!(s.telemetry.otel_traces_sampler, TraceSampler::Default);
    assert!(
        s.warnings.iter().any(|w| w.contains("jaeger_remote")),
        "{:?}",
        s.warnings
    );
    let s = Settings::load_from(None, &env(&[("OTEL_TRACES_SAMPLER_ARG", "2")]), &[]).expect("starts");
    assert_eq!(s.telemetry.otel_traces_sampler_arg, 1.0);
    assert!(
        s.warnings.iter().any(|w| w.contains("OTEL_TRACES_SAMPLER_ARG=2")),
        "{:?}",
        s.warnings
    );
}

#[test]
fn envoy_gateway_transport_settings_are_honoured() {
    let s = Settings::load_from(
        None,
        &env(&[
            ("GRPC_SERVER_USE_TLS", "true"),
            ("GRPC_SERVER_TLS_CERT", "/certs/tls.crt"),
            ("GRPC_SERVER_TLS_KEY", "/certs/tls.key"),
            ("GRPC_CLIENT_TLS_CACERT", "/certs/ca.crt"),
            ("GRPC_MAX_CONNECTION_AGE", "2h"),
            ("GRPC_UDS", "/tmp/rl.sock"),
            ("CONFIG_TYPE", "grpc_xds_sotw"),
            ("CONFIG_GRPC_XDS_SERVER_URL", "envoy-gateway:18001"),
            ("XDS_CLIENT_BACKOFF_JITTER", "false"),
            ("USE_PROMETHEUS", "true"),
            ("PROMETHEUS_ADDR", ":19001"),
        ]),
        &[],
    )
    .expect("loads");
    assert!(s.listen.grpc_server_use_tls);
    assert_eq!(s.listen.grpc_client_tls_cacert, "/certs/ca.crt");
    assert_eq!(s.listen.grpc_max_connection_age, Duration::from_secs(7200));
    assert_eq!(s.listen.grpc_max_connection_age_grace, Duration::from_secs(3600));
    assert_eq!(s.listen.grpc_uds, "/tmp/rl.sock");
    assert_eq!(s.rules.config_type, ConfigType::GrpcXdsSotw);
    assert_eq!(s.rules.xds.server_url, "envoy-gateway:18001");
    assert!(!s.rules.xds.backoff_jitter);
    assert!(s.listen.use_prometheus);
    assert_eq!(s.listen.prometheus_addr, ":19001");
}

#[test]
fn a_settings_file_names_itself_and_the_one_key_it_does_not_know() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("tollgate.yaml");
    std::fs::write(&file, "grpc_addr: 127.0.0.1:7000\nredis_deadlin: 5ms\n").expect("write");
    let err = Settings::load_from(Some(&file), &env(&[]), &[]).expect_err("unknown key");
    let text = err.to_string();
    assert!(text.contains(&file.display().to_string()), "{text}");
    assert!(
        text.contains("unknown key 'redis_deadlin' (did you mean 'redis_deadline'?)"),
        "{text}"
    );
    assert!(text.len() < 200, "one key, not every field: {text}");
    std::fs::write(&file, "redis_pool_size: many\n").expect("write");
    let err = Settings::load_from(Some(&file), &env(&[]), &[]).expect_err("not a number");
    assert!(
        err.to_string()
            .contains("tollgate.yaml: redis_pool_size=\"many\""),
        "{err}"
    );
    std::fs::write(&file, "response_headers: [ietf]\n").expect("write");
    let err = Settings::load_from(Some(&file), &env(&[]), &[]).expect_err("a list");
    assert!(err.to_string().contains("a single value"), "{err}");
    let err =
        Settings::load_from(Some(&dir.path().join("missing.yaml")), &env(&[]), &[]).expect_err("no file");
    assert!(err.to_string().contains("missing.yaml"), "{err}");
}

#[test]
fn every_setting_is_read_once_with_a_default_that_loads() {
    let catalogue = Settings::catalogue();
    let mut keys: Vec<&str> = catalogue.iter().map(|e| e.key.as_str()).collect();
    let count = keys.len();
    keys.sort_unstable();
    keys.dedup();
    assert_eq!(keys.len(), count, "a key read twice");
    // Every default, given back as the setting's value, reads as itself.
    let given: HashMap<String, String> = catalogue
        .iter()
        .filter(|e| !e.default.is_empty())
        .map(|e| {
            (
                format!("TOLLGATE_{}", e.key.to_ascii_uppercase()),
                e.default.clone(),
            )
        })
        .collect();
    let s = Settings::load_from(None, &given, &[]).expect("defaults given back load");
    assert!(s.warnings.is_empty(), "{:?}", s.warnings);
    assert_eq!(Settings::catalogue(), catalogue);
}

/// Every value the Go service starts with starts Tollgate, with the Go service's behaviour or a warning
/// that names the difference (walked from docs/settings.md's former refusals).
#[test]
fn every_value_the_go_service_starts_with_starts_tollgate() {
    for (pairs, warned) in [
        (
            &[("GRPC_CLIENT_TLS_CACERT", "/ca.pem")][..],
            "ignoring GRPC_CLIENT_TLS_CACERT: GRPC_SERVER_USE_TLS is false",
        ),
        (
            &[("GRPC_CLIENT_TLS_SAN", "envoy")][..],
            "ignoring GRPC_CLIENT_TLS_SAN: GRPC_SERVER_USE_TLS is false",
        ),
        (
            &[("USE_PROMETHEUS", "true"), ("PROMETHEUS_PATH", "metrics")][..],
            "serving the metrics at /metrics",
        ),
        (
            &[
                ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
                ("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "1s"),
            ][..],
            "every pause is the maximum",
        ),
        (
            &[
                ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
                ("XDS_CLIENT_BACKOFF_RANDOM_FACTOR", "2"),
            ][..],
            "taken as 1",
        ),
        (
            &[
                ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
                ("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "0s"),
            ][..],
            "would retry in a busy loop",
        ),
        (&[("REDIS_TIMEOUT", "0s")][..], "REDIS_TIMEOUT=0s"),
        (
            &[("REDIS_PERSECOND_TIMEOUT", "0s")][..],
            "REDIS_PERSECOND_TIMEOUT=0s",
        ),
        (
            &[("REDIS_PIPELINE_WINDOW", "50ms")][..],
            "REDIS_PIPELINE_WINDOW=50ms",
        ),
        (
            &[("OTEL_TRACES_SAMPLER", "xray")][..],
            "ignoring OTEL_TRACES_SAMPLER",
        ),
        (
            &[
                ("REDIS_URL", "main:6379"),
                ("REDIS_PERSECOND", "true"),
                ("REDIS_PERSECOND_URL", "second:6379"),
                ("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "true"),
            ][..],
            "each Redis settles the descriptors it holds",
        ),
    ] {
        let s = Settings::load_from(None, &env(pairs), &[]).unwrap_or_else(|e| panic!("{pairs:?}: {e}"));
        assert!(
            s.warnings.iter().any(|w| w.contains(warned)),
            "{pairs:?}: {warned:?} not in {:?}",
            s.warnings
        );
    }
    for pairs in [
        &[("TRACING_EXPORTER_PROTOCOL", "http")][..],
        &[("TRACING_EXPORTER_PROTOCOL", "")][..],
        &[("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "true")][..],
        &[("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", "true")][..],
    ] {
        let s = Settings::load_from(None, &env(pairs), &[]).unwrap_or_else(|e| panic!("{pairs:?}: {e}"));
        assert!(s.warnings.is_empty(), "{pairs:?} is honoured: {:?}", s.warnings);
    }
}

#[test]
fn the_otlp_protocol_reads_as_the_go_service_and_opentelemetry_name_it() {
    for (text, protocol) in [
        ("", OtlpProtocol::Http),
        ("http", OtlpProtocol::Http),
        ("HTTP/protobuf", OtlpProtocol::Http),
        ("grpc", OtlpProtocol::Grpc),
    ] {
        assert_eq!(OtlpProtocol::parse(text), Ok(protocol), "{text:?}");
    }
    assert!(OtlpProtocol::parse("http/json").is_err());
    let s = Settings::load_from(None, &env(&[]), &[]).expect("loads");
    assert_eq!(
        s.telemetry.exporter_protocol(),
        OtlpProtocol::Http,
        "the Go default"
    );
    let s = Settings::load_from(None, &env(&[("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")]), &[]).expect("loads");
    assert_eq!(
        s.telemetry.exporter_protocol(),
        OtlpProtocol::Grpc,
        "OpenTelemetry's variable"
    );
    let both = env(&[
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ("TRACING_EXPORTER_PROTOCOL", "http"),
    ]);
    let s = Settings::load_from(None, &both, &[]).expect("loads");
    assert_eq!(
        s.telemetry.exporter_protocol(),
        OtlpProtocol::Http,
        "the Go name wins"
    );
    let err = Settings::load_from(None, &env(&[("TRACING_EXPORTER_PROTOCOL", "thrift")]), &[])
        .expect_err("refused, as the Go service refuses it");
    assert!(err.to_string().contains("TRACING_EXPORTER_PROTOCOL="), "{err}");
}
