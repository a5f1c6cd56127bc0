//! Settings sections turned into the options of the parts the server wires: the limiter's, the Envoy
//! API's answers, the refund keys, and the gRPC listener's TLS and bounds.

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
use crate::server_counters::ServerCounters;
use crate::settings::{
    AnswerSettings, DecisionSettings, HeaderStyle, ListenSettings, Settings, SettingsError, StatsSettings,
    TelemetrySettings,
};
use tollgate_core::limiter::{LimiterOptions, RefundKeys};
use tollgate_core::rules::CompileOptions;

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
pub(super) fn read_setting_file(name: &'static str, path: &str) -> Result<Vec<u8>, SettingsError> {
    std::fs::read(path).map_err(|e| SettingsError::BadValue {
        name: name.into(),
        value: path.into(),
        reason: e.to_string(),
    })
}
