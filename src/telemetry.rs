//! Logs and traces.
//!
//! - Logs: `LOG_LEVEL` (envoyproxy/ratelimit's names, any case, or a full tracing filter directive) and
//!   `LOG_FORMAT` (`text` or `json`), to stderr.
//! - Traces: OpenTelemetry over OTLP/gRPC, off unless `TRACING_ENABLED=true` (envoyproxy/ratelimit's
//!   name). The exporter honours the standard variables: `OTEL_EXPORTER_OTLP_ENDPOINT` (default
//!   `http://localhost:4317`), `OTEL_EXPORTER_OTLP_HEADERS`, `OTEL_BSP_*`. Sampling is parent-based with
//!   `TRACING_SAMPLING_RATE` for new traces, and the W3C `traceparent` of incoming gRPC metadata becomes
//!   the parent (Envoy forwards it when its tracing is on). Spans follow the current gRPC semantic
//!   conventions: name and `rpc.method` are the fully qualified method, `rpc.system.name = "grpc"`,
//!   `rpc.response.status_code` is the status name; store calls are child spans with
//!   `db.system.name = "redis"`.
//!
//! When traces are off no span is created on the request path at all ([`traces_enabled`]).

use std::io::IsTerminal;
use std::sync::OnceLock;

use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer as _};

/// Whether spans are exported (set once at startup).
static TRACES: OnceLock<bool> = OnceLock::new();

/// Whether spans are being exported; the request path creates spans only then.
pub fn traces_enabled() -> bool {
    TRACES.get().copied().unwrap_or(false)
}

/// Trace export settings.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceSettings {
    /// `service.name` of the spans (`TRACING_SERVICE_NAME`).
    pub service_name: String,
    /// Fraction of new traces kept (`TRACING_SAMPLING_RATE`); parents' decisions are followed.
    pub sampling_rate: f64,
}

/// Flushes buffered spans when dropped (at shutdown).
#[derive(Debug)]
pub struct TelemetryGuard {
    provider: Option<SdkTracerProvider>,
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
pub fn init(level: &str, format: &str, traces: Option<&TraceSettings>) -> anyhow::Result<TelemetryGuard> {
    let filter = EnvFilter::try_new(level.to_ascii_lowercase()).unwrap_or_else(|_| EnvFilter::new("info"));
    let json = format.eq_ignore_ascii_case("json");
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        // Colour only on a terminal: escape codes in a log file or a collector break parsing.
        .with_ansi(std::io::stderr().is_terminal() && !json);
    let fmt = if json { fmt.json().boxed() } else { fmt.boxed() };
    let (otel, provider) = match traces {
        Some(settings) => {
            let provider = tracer_provider(settings)?;
            let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("tollgate"));
            (Some(layer), Some(provider))
        }
        None => (None, None),
    };
    let _ = TRACES.set(provider.is_some());
    // A second init (tests run several servers in one process) is harmless: the first one stays.
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(fmt)
        .with(otel)
        .try_init();
    Ok(TelemetryGuard { provider })
}

fn tracer_provider(settings: &TraceSettings) -> anyhow::Result<SdkTracerProvider> {
    let exporter = opentelemetry_otlp::SpanExporter::builder().with_tonic().build()?;
    let ratio = settings.sampling_rate.clamp(0.0, 1.0);
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name(settings.service_name.clone())
        .build();
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(ratio))))
        .with_resource(resource)
        .build())
}

/// The W3C trace context carried by incoming gRPC metadata (`traceparent`, `tracestate`).
pub fn remote_context(metadata: &tonic::metadata::MetadataMap) -> opentelemetry::Context {
    TraceContextPropagator::new().extract(&MetadataExtractor(metadata))
}

struct MetadataExtractor<'a>(&'a tonic::metadata::MetadataMap);

impl Extractor for MetadataExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|value| value.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0
            .keys()
            .filter_map(|key| match key {
                tonic::metadata::KeyRef::Ascii(key) => Some(key.as_str()),
                tonic::metadata::KeyRef::Binary(_) => None,
            })
            .collect()
    }
}
