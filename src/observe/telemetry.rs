//! Logs and traces.
//!
//! - Logs: `LOG_LEVEL` (envoyproxy/ratelimit's names, any case, or a full tracing filter directive;
//!   `WARN` by default, as the Go service) and `LOG_FORMAT` (`text`, or `json` in the Go service's shape:
//!   see [`super::go_json`]), to stderr. At `debug` each decision is a line of its own
//!   (target `tollgate::decision`); the transport crates ([`TRANSPORT`]: HTTP/2 frames,
//!   connections, TLS) stay at `info` unless a directive names them (`LOG_LEVEL=debug,h2=debug`), so
//!   their frames do not bury the decisions.
//! - Traces: OpenTelemetry over OTLP/gRPC, off unless `TRACING_ENABLED=true` (envoyproxy/ratelimit's
//!   name). The exporter honours the standard variables: `OTEL_EXPORTER_OTLP_ENDPOINT` (default
//!   `http://localhost:4317`), `OTEL_EXPORTER_OTLP_HEADERS`, `OTEL_BSP_*`. Sampling is parent-based with
//!   `TRACING_SAMPLING_RATE` for new traces, and the caller's trace context in incoming gRPC metadata
//!   becomes the parent: W3C `traceparent`, or B3 (`b3`, `x-b3-*`) as Envoy sends with Zipkin tracing
//!   ([`super::trace_context`]). Spans follow the current gRPC semantic
//!   conventions: name and `rpc.method` are the fully qualified method, `rpc.system.name = "grpc"`,
//!   `rpc.response.status_code` is the status name; store calls are child spans with
//!   `db.system.name = "redis"`.
//!
//! When traces are off no span is created on the request path at all ([`traces_enabled`]). When they
//! are on, the sampling decision is made before the span exists ([`should_trace`]): a request
//! carrying a trace context follows its sampled flag, others keep one trace in `1 / rate`. So unsampled
//! requests cost a few header lookups (and parsing the caller's context when it sent one), not a span. Sampling inside the SDK came only after the span was
//! built, and cost 0.57 CPU-seconds per 100k decisions at a 1 % rate.

use std::io::IsTerminal;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
use tracing_subscriber::layer::SubscriberExt;

use crate::settings::{LogFormat, OtlpProtocol, TelemetrySettings};
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer as _};

/// Whether spans are exported, and how they are sampled (set once at startup).
static TRACES: OnceLock<Option<Sampling>> = OnceLock::new();

/// The sampling decision's settings.
#[derive(Debug, Clone, Copy)]
struct Sampling {
    /// One trace in how many is kept (0: none).
    every: u64,
    /// Whether a caller's decision is followed.
    follow_parent: bool,
}

/// Requests seen without a trace context, for one-in-N sampling of new traces.
static UNPARENTED: AtomicU64 = AtomicU64::new(0);

/// Whether spans are being exported at all; the request path creates spans only then.
pub fn traces_enabled() -> bool {
    matches!(TRACES.get(), Some(Some(_)))
}

/// Whether a request gets spans: the caller's sampling decision when it made one (`parent_sampled`,
/// from W3C `traceparent` or B3, see [`super::trace_context`]) and the sampler follows callers (the
/// default and the `parentbased_*` samplers of `OTEL_TRACES_SAMPLER`), otherwise one request in
/// `1 / rate`. Never when traces are off.
pub fn should_trace(parent_sampled: Option<bool>) -> bool {
    let Some(Some(sampling)) = TRACES.get() else {
        return false;
    };
    if let Some(sampled) = parent_sampled.filter(|_| sampling.follow_parent) {
        return sampled;
    }
    sampling.every != 0
        && UNPARENTED
            .fetch_add(1, Ordering::Relaxed)
            .is_multiple_of(sampling.every)
}

/// Trace export settings.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceSettings {
    /// How spans are sent (`TRACING_EXPORTER_PROTOCOL`).
    pub protocol: OtlpProtocol,
    /// Where (see [`super::otlp::endpoint`]).
    pub endpoint: String,
    /// `service.name` of the spans (`TRACING_SERVICE_NAME`).
    pub service_name: String,
    /// `service.namespace` of the spans (`TRACING_SERVICE_NAMESPACE`), when not empty.
    pub service_namespace: String,
    /// `service.instance.id` of the spans (`TRACING_SERVICE_INSTANCE_ID`, Envoy Gateway gives the pod
    /// name), when not empty.
    pub service_instance_id: String,
    /// Fraction of traces kept (`TRACING_SAMPLING_RATE`, or `OTEL_TRACES_SAMPLER_ARG` with a ratio
    /// sampler): new ones, or all of them when callers' decisions are not followed.
    pub sampling_rate: f64,
    /// Whether a caller's sampling decision is followed (the parent-based samplers, and the default).
    pub follow_parent: bool,
}

impl TraceSettings {
    /// What `settings` ask of trace export, or `None` when `TRACING_ENABLED` is off; the endpoint
    /// comes from OpenTelemetry's variables, and the error says why it cannot be used.
    pub fn from_settings(settings: &TelemetrySettings) -> anyhow::Result<Option<Self>> {
        if !settings.tracing_enabled {
            return Ok(None);
        }
        let protocol = settings.exporter_protocol();
        let endpoint = super::otlp::endpoint(protocol, |name| std::env::var(name).ok())
            .map_err(|reason| anyhow::anyhow!("cannot export traces: {reason}"))?;
        Ok(Some({
            let (sampling_rate, follow_parent) = settings
                .otel_traces_sampler
                .sampling(settings.otel_traces_sampler_arg, settings.tracing_sampling_rate);
            Self {
                protocol,
                endpoint,
                service_name: settings.tracing_service_name.clone(),
                service_namespace: settings.tracing_service_namespace.clone(),
                service_instance_id: settings.tracing_service_instance_id.clone(),
                sampling_rate,
                follow_parent,
            }
        }))
    }
}

/// Flushes buffered spans when dropped (at shutdown).
#[derive(Debug)]
pub struct TelemetryGuard {
    provider: Option<SdkTracerProvider>,
}

impl TelemetryGuard {
    /// Flushes buffered spans from a blocking thread while the runtime keeps running: the exporter's
    /// gRPC channel needs the runtime to send them, and on a current-thread runtime a flush that blocks
    /// the runtime's only thread (as dropping the guard outside it does) would wait for itself.
    pub async fn shutdown(mut self) {
        if let Some(provider) = self.provider.take() {
            let flushed = tokio::task::spawn_blocking(move || provider.shutdown()).await;
            if let Ok(Err(error)) = flushed {
                eprintln!("tollgate: flushing traces failed: {error}");
            }
        }
    }
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take()
            && let Err(error) = provider.shutdown()
        {
            eprintln!("tollgate: flushing traces failed: {error}");
        }
    }
}

/// Installs logging (and trace export when `traces` is given). Must run inside the Tokio runtime: the
/// OTLP exporter's gRPC channel lives on it. Logs go to stderr so `tollgate query` output stays clean.
pub fn init(
    level: &str,
    format: LogFormat,
    traces: Option<&TraceSettings>,
) -> anyhow::Result<TelemetryGuard> {
    let (filter, unreadable) = match EnvFilter::try_new(directives(level)) {
        Ok(filter) => (filter, None),
        Err(error) => (EnvFilter::new("warn"), Some(error)),
    };
    let json = format == LogFormat::Json;
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        // Colour only on a terminal: escape codes in a log file or a collector break parsing.
        .with_ansi(std::io::stderr().is_terminal() && !json);
    let fmt = if json {
        fmt.event_format(super::go_json::GoJson {
            traces: traces.is_some(),
        })
        .boxed()
    } else {
        fmt.boxed()
    };
    // `LOG_LEVEL` filters the log alone: spans are INFO, and at the default WARN a global filter would
    // stop them from reaching the trace exporter.
    let fmt = fmt.with_filter(filter);
    let (otel, provider) = match traces {
        Some(settings) => {
            let provider = tracer_provider(settings)?;
            let layer = tracing_opentelemetry::layer()
                .with_tracer(provider.tracer("tollgate"))
                .with_filter(LevelFilter::INFO);
            (Some(layer), Some(provider))
        }
        None => (None, None),
    };
    let sampling = traces.map(|t| Sampling {
        every: if t.sampling_rate <= 0.0 {
            0
        } else {
            (1.0 / t.sampling_rate.min(1.0)).round() as u64
        },
        follow_parent: t.follow_parent,
    });
    let _ = TRACES.set(provider.as_ref().and(sampling));
    // A second init (tests run several servers in one process) is harmless: the first one stays.
    let _ = tracing_subscriber::registry().with(fmt).with(otel).try_init();
    if let Some(error) = unreadable {
        tracing::warn!(%error, LOG_LEVEL = level, "LOG_LEVEL is not a level or filter directive: logging at warn");
    }
    Ok(TelemetryGuard { provider })
}

/// The crates whose `debug` and `trace` events are their protocol's frames, connections and
/// handshakes, not decisions: HTTP/2, HTTP, gRPC, the service layers, TLS, the Redis client.
pub const TRANSPORT: [&str; 8] = [
    "h2",
    "hyper",
    "hyper_util",
    "tonic",
    "tower",
    "rustls",
    "tokio_rustls",
    "redis",
];

/// `LOG_LEVEL` as tracing filter directives: logrus' level names mapped (see [`go_level`]), and, when
/// the default level is `debug` or `trace`, each of the [`TRANSPORT`] crates held at `info` unless a
/// directive of its own names it (`LOG_LEVEL=debug,h2=trace` shows h2's frames, not hyper's).
fn directives(level: &str) -> String {
    let level = level.to_ascii_lowercase();
    let mut parts: Vec<String> = level
        .split(',')
        .map(str::trim)
        .filter(|part| !part.is_empty())
        .map(|part| go_level(part).to_owned())
        .collect();
    let default = parts
        .iter()
        .filter(|part| !part.contains('='))
        .filter_map(|part| part.parse::<LevelFilter>().ok())
        .next_back();
    if default.is_some_and(|default| default > LevelFilter::INFO) {
        let named = |krate: &str| {
            parts.iter().any(|part| {
                let Some((target, _)) = part.rsplit_once('=') else {
                    return false;
                };
                let target = target.split('[').next().unwrap_or_default();
                target == krate
                    || target
                        .strip_prefix(krate)
                        .is_some_and(|rest| rest.starts_with("::"))
            })
        };
        let capped: Vec<String> = TRANSPORT
            .iter()
            .filter(|krate| !named(krate))
            .map(|krate| format!("{krate}=info"))
            .collect();
        parts.extend(capped);
    }
    parts.join(",")
}

/// logrus' level names that tracing does not know, as their tracing level: `warning` is `warn`, and
/// `fatal` and `panic` (which logrus logs before exiting) are `error`. Anything else passes through
/// (tracing's own names and filter directives).
fn go_level(level: &str) -> &str {
    match level {
        "warning" => "warn",
        "fatal" | "panic" => "error",
        other => other,
    }
}

fn tracer_provider(settings: &TraceSettings) -> anyhow::Result<SdkTracerProvider> {
    let exporter = super::otlp::exporter(settings.protocol, &settings.endpoint)?;
    tracing::info!(endpoint = %settings.endpoint, protocol = settings.protocol.name(), "exporting traces");
    let mut resource =
        opentelemetry_sdk::Resource::builder().with_service_name(settings.service_name.clone());
    for (key, value) in [
        ("service.namespace", &settings.service_namespace),
        ("service.instance.id", &settings.service_instance_id),
    ] {
        if !value.is_empty() {
            resource = resource.with_attribute(opentelemetry::KeyValue::new(key, value.clone()));
        }
    }
    let resource = resource.build();
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        // The decision was already made by `should_trace`: keep what reaches the SDK.
        .with_sampler(Sampler::AlwaysOn)
        .with_resource(resource)
        .build())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transport_crates_stay_at_info_unless_named() {
        // The default and the quieter levels are left as they are: nothing to hold back.
        assert_eq!(directives("WARN"), "warn");
        assert_eq!(directives("info"), "info");
        assert_eq!(directives("warning"), "warn");
        let capped = TRANSPORT.map(|krate| format!("{krate}=info")).join(",");
        assert_eq!(directives("debug"), format!("debug,{capped}"));
        assert_eq!(directives("TRACE"), format!("trace,{capped}"));
        // A crate named by a directive of its own keeps what it asked for.
        let asked = directives("debug,h2=trace,tonic::transport=debug,hyper[conn]=debug");
        assert!(
            asked.starts_with("debug,h2=trace,tonic::transport=debug,hyper[conn]=debug,"),
            "{asked}"
        );
        for kept in ["h2=info", "tonic=info", "hyper=info"] {
            assert!(!asked.split(',').any(|d| d == kept), "{asked}");
        }
        assert!(
            asked.split(',').any(|d| d == "hyper_util=info"),
            "hyper_util is not hyper: {asked}"
        );
        // Only decisions: nothing to hold back either.
        assert_eq!(
            directives("warn,tollgate::decision=debug"),
            "warn,tollgate::decision=debug"
        );
        for directives in [directives("debug"), directives("debug,h2=trace")] {
            EnvFilter::try_new(&directives).expect("valid directives");
        }
    }

    #[test]
    fn logrus_level_names_map_to_tracing_levels() {
        assert_eq!(go_level("warning"), "warn");
        assert_eq!(go_level("fatal"), "error");
        assert_eq!(go_level("panic"), "error");
        assert_eq!(go_level("debug"), "debug");
        assert_eq!(go_level("tollgate=trace"), "tollgate=trace");
    }
}
