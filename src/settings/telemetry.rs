//! What Tollgate tells its operators: logs, trace export, and how callers are shown.

use super::source::{Go, Reader};
use super::{LogFormat, Origins, SettingsError, TraceSampler};

/// Logs and traces.
#[derive(Debug, Clone)]
pub struct TelemetrySettings {
    /// `LOG_LEVEL`: error, warn (the default, as the Go service), info, debug, trace (any case), or a
    /// tracing filter directive.
    pub log_level: String,
    /// `LOG_FORMAT`: `text` or `json`.
    pub log_format: LogFormat,
    /// `TRACING_ENABLED`: export OpenTelemetry spans.
    pub tracing_enabled: bool,
    /// `TRACING_SERVICE_NAME`.
    pub tracing_service_name: String,
    /// `TRACING_SERVICE_NAMESPACE`: `service.namespace` on spans (empty: not set).
    pub tracing_service_namespace: String,
    /// `TRACING_SERVICE_INSTANCE_ID`: `service.instance.id` on spans (empty: not set).
    pub tracing_service_instance_id: String,
    /// `TRACING_SAMPLING_RATE`: fraction of new traces kept (a sampled parent is always followed).
    pub tracing_sampling_rate: f64,
    /// `OTEL_TRACES_SAMPLER`: OpenTelemetry's sampler names; when set it replaces the default
    /// (parent-based, at `TRACING_SAMPLING_RATE`).
    pub otel_traces_sampler: TraceSampler,
    /// `OTEL_TRACES_SAMPLER_ARG`: the ratio of the `*traceidratio` samplers, 0 to 1.
    pub otel_traces_sampler_arg: f64,
    /// `TRACING_EXPORTER_PROTOCOL`: only `grpc` is built in.
    pub tracing_exporter_protocol: String,
    /// `/top` and the denial log show callers' raw descriptor values (IP addresses, user ids) instead of
    /// their hashes. Off by default: those are personal data.
    pub show_caller_values: bool,
}

impl TelemetrySettings {
    pub(super) fn read(r: &mut Reader<'_>) -> Result<Self, SettingsError> {
        Ok(Self {
            log_level: r.get("log_level", Go::Same, "warn".into())?,
            log_format: r.get("log_format", Go::Same, LogFormat::Text)?,
            tracing_enabled: r.get("tracing_enabled", Go::Same, false)?,
            tracing_service_name: r.get("tracing_service_name", Go::Same, "tollgate".into())?,
            tracing_service_namespace: r.get("tracing_service_namespace", Go::Same, String::new())?,
            tracing_service_instance_id: r.get("tracing_service_instance_id", Go::Same, String::new())?,
            tracing_sampling_rate: r.get("tracing_sampling_rate", Go::Same, 1.0)?,
            otel_traces_sampler: r.get("otel_traces_sampler", Go::Same, TraceSampler::Default)?,
            otel_traces_sampler_arg: r.get("otel_traces_sampler_arg", Go::Same, 1.0)?,
            tracing_exporter_protocol: r.get("tracing_exporter_protocol", Go::Same, "grpc".into())?,
            show_caller_values: r.get("show_caller_values", Go::None, false)?,
        })
    }

    pub(super) fn validate(&self, origins: &Origins) -> Result<(), SettingsError> {
        // `TRACING_SAMPLING_RATE` is not checked: the Go service takes any number (at most all, at
        // least none), and so does Tollgate.
        if !(0.0..=1.0).contains(&self.otel_traces_sampler_arg) {
            return Err(origins.bad(
                "otel_traces_sampler_arg",
                &self.otel_traces_sampler_arg.to_string(),
                "a ratio between 0 and 1",
            ));
        }
        if !self.tracing_exporter_protocol.eq_ignore_ascii_case("grpc") {
            return Err(origins.bad(
                "tracing_exporter_protocol",
                &self.tracing_exporter_protocol,
                "only grpc (OTLP/gRPC) is built in",
            ));
        }
        Ok(())
    }
}
