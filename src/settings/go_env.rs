//! envoyproxy/ratelimit's environment variables: the names Tollgate honours (translated to its own
//! settings, with Go's boolean syntax and `HOST`/`PORT` and `RUNTIME_*` composition), and the ones it
//! accepts without acting on them, each a warning that says what happens instead. Which setting each Go
//! name ends up in, and why, is tabled in `docs/settings.md`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use config::{Map, Source, Value, ValueKind};

use super::SettingsError;

/// envoyproxy/ratelimit's environment variables, translated to Tollgate settings.
#[derive(Debug, Clone)]
pub(super) struct GoEnvironment {
    values: Map<String, Value>,
}

/// Go settings that map one-to-one onto a Tollgate setting of the same meaning.
const GO_DIRECT: &[(&str, &str)] = &[
    ("SHADOW_MODE", "shadow_mode"),
    ("QUOTA_MODE", "quota_mode"),
    ("RESPONSE_DYNAMIC_METADATA", "response_dynamic_metadata"),
    ("LIMIT_RESPONSE_HEADERS_ENABLED", "limit_response_headers_enabled"),
    ("LIMIT_LIMIT_HEADER", "limit_limit_header"),
    ("LIMIT_REMAINING_HEADER", "limit_remaining_header"),
    ("LIMIT_RESET_HEADER", "limit_reset_header"),
    ("MERGE_DOMAIN_CONFIG", "merge_domain_config"),
    (
        "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT",
        "stop_cache_key_increment_when_overlimit",
    ),
    ("CACHE_KEY_PREFIX", "cache_key_prefix"),
    ("LOG_LEVEL", "log_level"),
    ("LOG_FORMAT", "log_format"),
    ("BACKEND_TYPE", "backend_type"),
    ("REDIS_URL", "redis_url"),
    ("REDIS_TYPE", "redis_type"),
    ("REDIS_SOCKET_TYPE", "redis_socket_type"),
    ("REDIS_AUTH", "redis_auth"),
    ("REDIS_SENTINEL_AUTH", "redis_sentinel_auth"),
    ("REDIS_TLS", "redis_tls"),
    ("REDIS_TLS_CACERT", "redis_tls_cacert"),
    ("REDIS_TLS_CLIENT_CERT", "redis_tls_client_cert"),
    ("REDIS_TLS_CLIENT_KEY", "redis_tls_client_key"),
    (
        "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION",
        "redis_tls_skip_hostname_verification",
    ),
    ("REDIS_POOL_SIZE", "redis_pool_size"),
    ("REDIS_TIMEOUT", "redis_connect_timeout"),
    ("REDIS_PERSECOND", "redis_persecond"),
    ("REDIS_PERSECOND_URL", "redis_persecond_url"),
    ("REDIS_PERSECOND_TYPE", "redis_persecond_type"),
    ("REDIS_PERSECOND_SOCKET_TYPE", "redis_persecond_socket_type"),
    ("REDIS_PERSECOND_AUTH", "redis_persecond_auth"),
    ("REDIS_PERSECOND_SENTINEL_AUTH", "redis_persecond_sentinel_auth"),
    ("REDIS_PERSECOND_TLS", "redis_persecond_tls"),
    ("REDIS_PERSECOND_POOL_SIZE", "redis_persecond_pool_size"),
    ("REDIS_PERSECOND_TIMEOUT", "redis_persecond_connect_timeout"),
    ("REDIS_PIPELINE_WINDOW", "redis_pipeline_window"),
    ("REDIS_PIPELINE_LIMIT", "redis_pipeline_limit"),
    (
        "REDIS_PERSECOND_PIPELINE_WINDOW",
        "redis_persecond_pipeline_window",
    ),
    ("REDIS_PERSECOND_PIPELINE_LIMIT", "redis_persecond_pipeline_limit"),
    ("EXPIRATION_JITTER_MAX_SECONDS", "expiration_jitter_max_seconds"),
    ("LOCAL_CACHE_SIZE_IN_BYTES", "local_cache_size_in_bytes"),
    ("NEAR_LIMIT_RATIO", "near_limit_ratio"),
    ("TRACING_ENABLED", "tracing_enabled"),
    ("TRACING_SERVICE_NAME", "tracing_service_name"),
    ("TRACING_SERVICE_NAMESPACE", "tracing_service_namespace"),
    ("TRACING_SERVICE_INSTANCE_ID", "tracing_service_instance_id"),
    ("TRACING_SAMPLING_RATE", "tracing_sampling_rate"),
    ("TRACING_EXPORTER_PROTOCOL", "tracing_exporter_protocol"),
    ("GRPC_UDS", "grpc_uds"),
    ("GRPC_MAX_CONNECTION_AGE", "grpc_max_connection_age"),
    ("GRPC_MAX_CONNECTION_AGE_GRACE", "grpc_max_connection_age_grace"),
    ("GRPC_SERVER_USE_TLS", "grpc_server_use_tls"),
    ("GRPC_SERVER_TLS_CERT", "grpc_server_tls_cert"),
    ("GRPC_SERVER_TLS_KEY", "grpc_server_tls_key"),
    ("GRPC_CLIENT_TLS_CACERT", "grpc_client_tls_cacert"),
    ("GRPC_CLIENT_TLS_SAN", "grpc_client_tls_san"),
    ("CONFIG_TYPE", "config_type"),
    (
        "FORCE_START_WITHOUT_INITIAL_CONFIG",
        "force_start_without_initial_config",
    ),
    ("CONFIG_GRPC_XDS_SERVER_URL", "config_grpc_xds_server_url"),
    ("CONFIG_GRPC_XDS_NODE_ID", "config_grpc_xds_node_id"),
    ("CONFIG_GRPC_XDS_NODE_METADATA", "config_grpc_xds_node_metadata"),
    (
        "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL",
        "config_grpc_xds_server_connect_retry_interval",
    ),
    (
        "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
        "config_grpc_xds_client_additional_headers",
    ),
    ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "config_grpc_xds_server_use_tls"),
    (
        "CONFIG_GRPC_XDS_CLIENT_TLS_CERT",
        "config_grpc_xds_client_tls_cert",
    ),
    ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "config_grpc_xds_client_tls_key"),
    (
        "CONFIG_GRPC_XDS_SERVER_TLS_CACERT",
        "config_grpc_xds_server_tls_cacert",
    ),
    ("CONFIG_GRPC_XDS_SERVER_TLS_SAN", "config_grpc_xds_server_tls_san"),
    (
        "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL",
        "xds_client_backoff_initial_interval",
    ),
    (
        "XDS_CLIENT_BACKOFF_MAX_INTERVAL",
        "xds_client_backoff_max_interval",
    ),
    (
        "XDS_CLIENT_BACKOFF_RANDOM_FACTOR",
        "xds_client_backoff_random_factor",
    ),
    ("XDS_CLIENT_BACKOFF_JITTER", "xds_client_backoff_jitter"),
    (
        "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES",
        "xds_client_max_msg_size_in_bytes",
    ),
    ("USE_PROMETHEUS", "use_prometheus"),
    ("PROMETHEUS_ADDR", "prometheus_addr"),
    ("PROMETHEUS_PATH", "prometheus_path"),
];

/// OpenTelemetry's standard variables Tollgate reads into settings (the OTLP exporter reads its own
/// `OTEL_EXPORTER_OTLP_*` itself).
const OTEL_DIRECT: &[(&str, &str)] = &[
    ("OTEL_TRACES_SAMPLER", "otel_traces_sampler"),
    ("OTEL_TRACES_SAMPLER_ARG", "otel_traces_sampler_arg"),
];

/// Go settings that are booleans, parsed with Go's `strconv.ParseBool` rules.
const GO_BOOLS: &[&str] = &[
    "SHADOW_MODE",
    "QUOTA_MODE",
    "RESPONSE_DYNAMIC_METADATA",
    "LIMIT_RESPONSE_HEADERS_ENABLED",
    "MERGE_DOMAIN_CONFIG",
    "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT",
    "REDIS_TLS",
    "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION",
    "REDIS_PERSECOND",
    "REDIS_PERSECOND_TLS",
    "TRACING_ENABLED",
    "GRPC_SERVER_USE_TLS",
    "FORCE_START_WITHOUT_INITIAL_CONFIG",
    "CONFIG_GRPC_XDS_SERVER_USE_TLS",
    "XDS_CLIENT_BACKOFF_JITTER",
    "USE_PROMETHEUS",
];

impl GoEnvironment {
    pub(super) fn from(
        env: &HashMap<String, String>,
        warnings: &mut Vec<String>,
    ) -> Result<Self, SettingsError> {
        let origin = "environment".to_owned();
        let mut values = Map::new();
        let mut put = |key: &str, kind: ValueKind| {
            values.insert(key.to_owned(), Value::new(Some(&origin), kind));
        };
        for (go, ours) in GO_DIRECT.iter().chain(OTEL_DIRECT) {
            let Some(value) = env.get(*go) else { continue };
            if GO_BOOLS.contains(go) {
                put(ours, ValueKind::Boolean(parse_go_bool(go, value)?));
            } else {
                put(ours, ValueKind::String(value.clone()));
            }
        }
        for (host, port, ours, default_host) in [
            ("GRPC_HOST", "GRPC_PORT", "grpc_addr", "0.0.0.0"),
            ("HOST", "PORT", "http_addr", "0.0.0.0"),
            ("DEBUG_HOST", "DEBUG_PORT", "debug_addr", "0.0.0.0"),
        ] {
            if let Some(addr) = host_port(env, host, port, default_host, warnings) {
                put(ours, ValueKind::String(addr));
            }
        }
        if let Some(dir) = runtime_dir(env) {
            put(
                "config_dir",
                ValueKind::String(dir.to_string_lossy().into_owned()),
            );
        }
        Ok(Self { values })
    }
}

impl Source for GoEnvironment {
    fn clone_into_box(&self) -> Box<dyn Source + Send + Sync> {
        Box::new(self.clone())
    }

    fn collect(&self) -> Result<Map<String, Value>, config::ConfigError> {
        Ok(self.values.clone())
    }
}

/// envoyproxy/ratelimit settings (or prefixes of families) Tollgate accepts and ignores, with what
/// happens instead; each present one is a warning at startup.
const GO_IGNORED: &[(&str, &str)] = &[
    (
        "GRPC_SERVER_TLS_CA_CERT",
        "envoyproxy/ratelimit does not read it either (Envoy Gateway sets it); set GRPC_CLIENT_TLS_CACERT to require client certificates",
    ),
    (
        "USE_STATSD",
        "no statsd: metrics are Prometheus text at /metrics on the HTTP and debug ports",
    ),
    ("STATSD_", "no statsd: metrics are at /metrics"),
    ("USE_DOG_STATSD", "no statsd: metrics are at /metrics"),
    ("EXTRA_TAGS", "no statsd: metrics are at /metrics"),
    ("STATS_FLUSH_INTERVAL", "metrics are read when scraped"),
    ("DISABLE_STATS", "metrics are always served at /metrics"),
    (
        "PROMETHEUS_MAPPER_YAML",
        "series have fixed Prometheus names (envoyproxy/ratelimit's default mapping), no statsd mapping applies",
    ),
    (
        "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS",
        "the response time histogram is in seconds (ratelimit_service_response_time_seconds)",
    ),
    (
        "RUNTIME_WATCH_ROOT",
        "every change to the rules directory reloads",
    ),
    ("RUNTIME_IGNOREDOTFILES", "dot-files are always ignored"),
    (
        "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED",
        "Tollgate is healthy once a rule set is loaded, even an empty one",
    ),
    (
        "REDIS_CLUSTER_PIPELINE_PARALLELISM",
        "one script call per slot, all in parallel",
    ),
    (
        "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION",
        "readiness pings Redis every 500 ms",
    ),
    (
        "REDIS_POOL_ON_EMPTY_BEHAVIOR",
        "connections are multiplexed: no pool runs empty",
    ),
    (
        "REDIS_STARTUP_",
        "Tollgate starts at once and connects to Redis in the background",
    ),
    (
        "REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM",
        "one script call per slot, all in parallel",
    ),
    (
        "REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR",
        "connections are multiplexed: no pool runs empty",
    ),
    ("MEMCACHE_", "there is no memcache backend"),
];

/// Notes the envoyproxy/ratelimit settings Tollgate accepts without acting on them as warnings, saying
/// what happens instead. Nothing is ignored in silence; a value Tollgate cannot honour where ignoring it
/// would weaken limits or security is refused where it is read (`BACKEND_TYPE=memcache`, Sentinel over
/// TLS).
pub(super) fn go_warnings(env: &HashMap<String, String>, warnings: &mut Vec<String>) {
    let mut names: Vec<&String> = env.keys().collect();
    names.sort();
    for name in names {
        if let Some((_, instead)) = GO_IGNORED.iter().find(|(known, _)| name.starts_with(known)) {
            warnings.push(format!("ignoring {name}: {instead}"));
        }
    }
}

/// `HOST` and `PORT` style pairs: either one alone overrides only its half of the default address.
fn host_port(
    env: &HashMap<String, String>,
    host: &str,
    port: &str,
    default_host: &str,
    warnings: &mut Vec<String>,
) -> Option<String> {
    // Kubernetes service links set `<SERVICE>_PORT=tcp://10.0.0.1:8081` for a Service named `grpc` (or
    // the like); that is not a port number, and envoyproxy/ratelimit's meaning must not be read into it.
    let p = env.get(port).filter(|p| {
        let numeric = p.parse::<u16>().is_ok();
        if !numeric {
            warnings.push(format!("ignoring {port}={p:?}: not a port number"));
        }
        numeric
    });
    let h = env.get(host);
    if h.is_none() && p.is_none() {
        return None;
    }
    let default_port = match port {
        "GRPC_PORT" => "8081",
        "PORT" => "8080",
        _ => "6070",
    };
    let h = h.map_or(default_host, String::as_str);
    let p = p.map_or(default_port, String::as_str);
    // An IPv6 literal needs brackets in `host:port` form.
    Some(if h.contains(':') {
        format!("[{h}]:{p}")
    } else {
        format!("{h}:{p}")
    })
}

/// `RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY`, when any of them is set.
fn runtime_dir(env: &HashMap<String, String>) -> Option<PathBuf> {
    let keys = ["RUNTIME_ROOT", "RUNTIME_SUBDIRECTORY", "RUNTIME_APPDIRECTORY"];
    if keys.iter().all(|k| !env.contains_key(*k)) {
        return None;
    }
    let root = env
        .get(keys[0])
        .map_or("/srv/runtime_data/current", String::as_str);
    let sub = env.get(keys[1]).map_or("", String::as_str);
    let app = env.get(keys[2]).map_or("config", String::as_str);
    Some(Path::new(root).join(sub).join(app))
}

/// Go's `strconv.ParseBool`.
fn parse_go_bool(name: &'static str, value: &str) -> Result<bool, SettingsError> {
    match value {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        _ => Err(SettingsError::BadValue {
            name,
            value: value.into(),
            reason: "expected a boolean".into(),
        }),
    }
}
