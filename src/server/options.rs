//! Settings sections turned into the options of the parts the server wires, in this one file: the
//! store's (with the files of TLS to Redis), the limiter's, the rules compiler's, the Envoy API's
//! answers, the refund keys, statsd's, and the listeners' TLS and bounds. The settings module reads
//! and checks values; the parts take their own options types; only this file knows both.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context as _;

use crate::api::envoy::EnvoyOptions;
use crate::api::headers::{HeaderNames, HeaderOptions};
use crate::grpc::GrpcLimits;
use crate::grpc::tls::{ServerTls, TlsFiles};
use crate::http::HttpLimits;
use crate::inflight::RequestBudget;
use crate::observe::go_series::GoSeries;
use crate::observe::mapping::Mapping;
use crate::observe::statsd::{Dialect, StatsdOptions};
use crate::server_counters::ServerCounters;
use crate::settings::{
    AnswerSettings, DecisionSettings, HeaderStyle, ListenSettings, Origins, RedisEndpoint, Settings,
    SettingsError, StatsSettings, StoreSettings, TelemetrySettings,
};
use tollgate_core::limiter::{LimiterOptions, RefundKeys};
use tollgate_core::rules::CompileOptions;
use tollgate_core::store::StoreOptions;
use tollgate_core::store::hot_keys::HotKeyOptions;
use tollgate_core::store::redis::RedisOptions;

/// The gRPC listener's TLS (`GRPC_SERVER_USE_TLS`), read from its files; `None` for plaintext.
pub(super) fn server_tls(settings: &ListenSettings) -> anyhow::Result<Option<Arc<ServerTls>>> {
    if !settings.grpc_server_use_tls {
        return Ok(None);
    }
    let optional = |value: &str| Some(value.to_owned()).filter(|v| !v.is_empty());
    let files = TlsFiles {
        cert: PathBuf::from(&settings.grpc_server_tls_cert),
        key: PathBuf::from(&settings.grpc_server_tls_key),
        client_ca: optional(&settings.grpc_client_tls_cacert).map(PathBuf::from),
        client_san: optional(&settings.grpc_client_tls_san),
    };
    let tls = ServerTls::load(files).context("cannot start TLS on the gRPC listener")?;
    tracing::info!(
        client_certificates = !settings.grpc_client_tls_cacert.is_empty(),
        "gRPC listener serves TLS"
    );
    Ok(Some(Arc::new(tls)))
}

/// Shortest refund key accepted: 128 bits as hex (`openssl rand -hex 16`) or more.
const MIN_REFUND_KEY_LEN: usize = 32;

/// The fleet's refund-token keys (`TOLLGATE_REFUND_KEY`, else `TOLLGATE_REFUND_KEY_FILE`), or `None`:
/// then the limiter signs with a random key of this process, and says so.
pub(super) fn refund_keys(settings: &DecisionSettings) -> anyhow::Result<Option<RefundKeys>> {
    let text = if !settings.refund_key.is_empty() {
        settings.refund_key.expose().to_owned()
    } else if !settings.refund_key_file.is_empty() {
        std::fs::read_to_string(&settings.refund_key_file).map_err(|e| SettingsError::BadValue {
            name: "refund_key_file".into(),
            value: settings.refund_key_file.clone(),
            reason: e.to_string(),
        })?
    } else {
        tracing::warn!(
            "no TOLLGATE_REFUND_KEY or TOLLGATE_REFUND_KEY_FILE: refund tokens are signed with a random key \
             of this process, so a refund only works on the instance that issued its token"
        );
        return Ok(None);
    };
    let secrets: Vec<&str> = text
        .split([',', '\n'])
        .map(str::trim)
        .filter(|k| !k.is_empty())
        .collect();
    let Some((current, previous)) = secrets.split_first() else {
        return Err(SettingsError::BadValue {
            name: "refund_key".into(),
            value: "<redacted>".into(),
            reason: "holds no key".into(),
        }
        .into());
    };
    if let Some(short) = secrets.iter().position(|k| k.len() < MIN_REFUND_KEY_LEN) {
        // A short key can be found offline from any one token: it would let callers forge refunds.
        return Err(SettingsError::BadValue {
            name: "refund_key".into(),
            value: "<redacted>".into(),
            reason: format!("key {} is shorter than {MIN_REFUND_KEY_LEN} bytes", short + 1),
        }
        .into());
    }
    let previous: Vec<&[u8]> = previous.iter().map(|k| k.as_bytes()).collect();
    let keys = RefundKeys::new(current.as_bytes(), &previous)
        .context("the operating system gave no randomness for refund token ids")?;
    tracing::info!(keys = secrets.len(), "refund tokens signed with the fleet's key");
    Ok(Some(keys))
}

/// How `/metrics` names the Go series: the mapping file of `PROMETHEUS_MAPPER_YAML` (its fields that
/// change nothing warned about), else the Go service's default mapping.
pub(super) fn go_series(settings: &StatsSettings) -> anyhow::Result<GoSeries> {
    if settings.prometheus_mapper_yaml.is_empty() {
        return Ok(GoSeries::Default {
            response_time_ms: settings.prometheus_response_time_as_milliseconds,
        });
    }
    let (mapping, unused) = Mapping::load(Path::new(&settings.prometheus_mapper_yaml))?;
    if !unused.is_empty() {
        tracing::warn!(
            file = %settings.prometheus_mapper_yaml,
            fields = %unused.join("; "),
            "PROMETHEUS_MAPPER_YAML: these fields change nothing here (Tollgate's histograms have fixed buckets)"
        );
    }
    Ok(GoSeries::Mapped(Arc::new(mapping)))
}

/// The store's options: the embedded store, or each Redis with its endpoint's connections, timeouts
/// and gathering window, the `REDIS_TLS_*` files (read now, so a missing one stops startup) and
/// `traces` (whether spans are exported).
pub(super) fn store_options(
    settings: &StoreSettings,
    origins: &Origins,
    traces: bool,
) -> Result<StoreOptions, SettingsError> {
    let tls = redis_tls_certificates(settings)?;
    let redis = |target, endpoint: &RedisEndpoint| RedisOptions {
        connections: endpoint.pool_size,
        deadline: settings.redis_deadline,
        connect_timeout: endpoint.connect_timeout,
        expiration_jitter_max_secs: settings.expiration_jitter_max_seconds,
        tls: tls.clone(),
        pipeline_fixed_windows: settings.redis_pipeline_fixed_windows,
        pipeline_window: endpoint.pipeline_window,
        pipeline_limit: endpoint.pipeline_limit,
        traces,
        ..RedisOptions::new(target)
    };
    Ok(StoreOptions {
        memory_max_keys: settings.memory_max_keys,
        local_cache_bytes: settings.local_cache_size_in_bytes,
        redis: settings
            .redis_target(origins)?
            .map(|target| redis(target, &settings.redis)),
        per_second: settings
            .per_second_target(origins)?
            .map(|target| redis(target, &settings.per_second)),
        hot_keys: HotKeyOptions {
            rate: settings.hot_key_rate,
            lease: settings.hot_key_lease,
        },
    })
}

/// The certificates for TLS to Redis, read from the configured files (none configured: `None`, and the
/// system's roots verify the server).
fn redis_tls_certificates(settings: &StoreSettings) -> Result<Option<redis::TlsCertificates>, SettingsError> {
    let root_cert = match settings.redis_tls_cacert.as_str() {
        "" => None,
        path => Some(read_setting_file("redis_tls_cacert", path)?),
    };
    let client_tls = match (
        settings.redis_tls_client_cert.as_str(),
        settings.redis_tls_client_key.as_str(),
    ) {
        ("", "") => None,
        (cert, key) if !cert.is_empty() && !key.is_empty() => Some(redis::ClientTlsConfig {
            client_cert: read_setting_file("redis_tls_client_cert", cert)?,
            client_key: read_setting_file("redis_tls_client_key", key)?,
        }),
        _ => {
            return Err(SettingsError::BadValue {
                name: "redis_tls_client_cert".into(),
                value: settings.redis_tls_client_cert.clone(),
                reason: "a client certificate and its key go together".into(),
            });
        }
    };
    Ok(
        (root_cert.is_some() || client_tls.is_some()).then_some(redis::TlsCertificates {
            client_tls,
            root_cert,
        }),
    )
}

/// The limiter's options; `keep_domains_together` is the store's to decide (see `super::build_limiter`).
pub(crate) fn limiter_options(settings: &DecisionSettings, telemetry: &TelemetrySettings) -> LimiterOptions {
    LimiterOptions {
        cache_key_prefix: settings.cache_key_prefix.clone(),
        stop_increment_when_over_limit: settings.stop_cache_key_increment_when_overlimit,
        keep_domains_together: false,
        global_shadow_mode: settings.shadow_mode,
        global_quota_mode: settings.quota_mode,
        default_algorithm: settings.default_algorithm,
        max_descriptors: settings.max_descriptors,
        near_limit_ratio: settings.near_limit_ratio,
        show_caller_values: telemetry.show_caller_values,
        fleet_size: settings.fleet_size,
    }
}

pub(super) fn envoy_options(settings: &AnswerSettings) -> EnvoyOptions {
    EnvoyOptions {
        headers: header_options(settings),
        dynamic_metadata: settings.response_dynamic_metadata,
    }
}

/// How rules files are compiled, for the server, `check-config` and `what-if` alike.
pub(crate) fn compile_options(settings: &Settings) -> CompileOptions {
    CompileOptions {
        default_algorithm: settings.decisions.default_algorithm,
        split_per_second: settings.store.redis_persecond,
        max_file_bytes: settings.rules.rules_max_file_bytes,
        detailed_metric_max_values: settings.stats.detailed_metric_max_values,
    }
}

/// Where and how statsd (`USE_STATSD`) or DogStatsD (`USE_DOG_STATSD`) is sent.
pub(super) fn statsd_options(stats: &StatsSettings) -> StatsdOptions {
    StatsdOptions {
        addr: stats.statsd_addr(),
        protocol: stats.statsd_protocol,
        interval: stats.stats_flush_interval,
        tags: stats.extra_tags.clone(),
        dialect: if stats.dog_statsd() {
            Dialect::DogStatsd {
                mogrifiers: stats.dog_statsd_mogrifiers.clone(),
                global_tags: stats.dog_statsd_global_tags.clone(),
            }
        } else {
            Dialect::Statsd
        },
    }
}

/// The process's request-bytes budget and read timeout, one for every listener.
pub(crate) fn request_budget(settings: &ListenSettings, counters: Arc<ServerCounters>) -> RequestBudget {
    let (process, per_connection) = settings.bytes_in_flight();
    RequestBudget::new(process, per_connection, settings.read_timeout, counters)
}

/// The gRPC transport's bounds, and each HTTP listener's: connections capped at the settings or at
/// shares of the open-file limit (see [`ListenSettings::connection_caps`]); what they refuse is counted
/// in `counters`.
pub(crate) fn transport_limits(
    settings: &ListenSettings,
    budget: &RequestBudget,
    counters: &Arc<ServerCounters>,
) -> (GrpcLimits, HttpLimits) {
    let open_files = crate::observe::open_file_limit();
    let (grpc, http) = settings.connection_caps(open_files);
    tracing::info!(
        open_files,
        grpc_connections = grpc,
        http_connections = http,
        "connection caps"
    );
    let http = HttpLimits {
        max_connections: http,
        max_header_bytes: settings.http_max_header_bytes,
        write_timeout: settings.write_timeout,
        budget: budget.clone(),
    };
    (grpc_limits(settings, grpc, budget, counters), http)
}

fn grpc_limits(
    settings: &ListenSettings,
    max_connections: usize,
    budget: &RequestBudget,
    counters: &Arc<ServerCounters>,
) -> GrpcLimits {
    GrpcLimits {
        max_message_bytes: settings.max_request_bytes,
        max_concurrent_streams: settings.grpc_max_concurrent_streams,
        // Zero is never, as in grpc-go.
        max_connection_age: Some(settings.grpc_max_connection_age).filter(|age| !age.is_zero()),
        max_connection_age_grace: settings.grpc_max_connection_age_grace,
        max_connections,
        handshakes_per_client: settings.tls_handshakes_per_client,
        idle_probation: settings.idle_connection_probation,
        write_timeout: settings.write_timeout,
        budget: budget.clone(),
        counters: Arc::clone(counters),
    }
}

/// The header styles and body to add to answers.
pub(super) fn header_options(settings: &AnswerSettings) -> HeaderOptions {
    let trio = || HeaderNames {
        limit: settings.limit_limit_header.clone(),
        remaining: settings.limit_remaining_header.clone(),
        reset: settings.limit_reset_header.clone(),
    };
    let mut options = HeaderOptions {
        trio: settings.limit_response_headers_enabled.then(trio),
        raw_body: settings.raw_body,
        ..HeaderOptions::default()
    };
    for style in &settings.response_headers.0 {
        match style {
            HeaderStyle::RateLimit => options.trio = Some(trio()),
            HeaderStyle::XRateLimit => options.x_ratelimit = true,
            HeaderStyle::Ietf => options.ietf = true,
            HeaderStyle::RetryAfter => options.retry_after = true,
        }
    }
    options
}

/// The contents of the file a setting names; the error names the setting and the path.
fn read_setting_file(name: &'static str, path: &str) -> Result<Vec<u8>, SettingsError> {
    std::fs::read(path).map_err(|e| SettingsError::BadValue {
        name: name.into(),
        value: path.into(),
        reason: e.to_string(),
    })
}
