//! What Tollgate tells its operators: logs, trace export, and how callers are shown.

use super::source::{Go, Reader};
use super::{LogFormat, Origins, OtlpProtocol, SettingsError, TraceSampler};

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
    /// `TRACING_EXPORTER_PROTOCOL`: `http` (OTLP/HTTP, protobuf; the default, as the Go service) or
    /// `grpc`. Empty: OpenTelemetry's `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`, else
    /// `OTEL_EXPORTER_OTLP_PROTOCOL`, else `http` ([`TelemetrySettings::exporter_protocol`]).
    pub tracing_exporter_protocol: String,
    /// `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`: OpenTelemetry's name for the same choice.
    pub otel_exporter_otlp_traces_protocol: String,
    /// `OTEL_EXPORTER_OTLP_PROTOCOL`: the same, for every signal.
    pub otel_exporter_otlp_protocol: String,
    /// `/top` and the denial log show callers' raw descriptor values (IP addresses, user ids) instead of
    /// their hashes. Off by default: those are personal data.
    pub show_caller_values: bool,
    /// `TOLLGATE_DECISION_LOG`: the file each request decided as Envoy's is recorded in, for
    /// `tollgate what-if` (empty: off).
    pub decision_log: String,
    /// `TOLLGATE_DECISION_LOG_SAMPLE`: the share of requests recorded, above 0 and at most 1; a
    /// caller's requests are kept or dropped together.
    pub decision_log_sample: f64,
    /// `TOLLGATE_DECISION_LOG_MAX_BYTES`: a file's size before it is rotated.
    pub decision_log_max_bytes: u64,
    /// `TOLLGATE_DECISION_LOG_FILES`: rotated files kept besides the one written.
    pub decision_log_files: u32,
}

/// The largest `TOLLGATE_DECISION_LOG_FILES`.
const MAX_DECISION_LOG_FILES: u32 = 100;

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
            otel_traces_sampler: sampler(r)?,
            otel_traces_sampler_arg: sampler_arg(r)?,
            tracing_exporter_protocol: r.get("tracing_exporter_protocol", Go::Same, String::new())?,
            otel_exporter_otlp_traces_protocol: r.get(
                "otel_exporter_otlp_traces_protocol",
                Go::Same,
                String::new(),
            )?,
            otel_exporter_otlp_protocol: r.get("otel_exporter_otlp_protocol", Go::Same, String::new())?,
            show_caller_values: r.get("show_caller_values", Go::None, false)?,
            decision_log: r.get("decision_log", Go::None, String::new())?,
            decision_log_sample: r.get("decision_log_sample", Go::None, 1.0)?,
            decision_log_max_bytes: r.get("decision_log_max_bytes", Go::None, 100 * 1024 * 1024)?,
            decision_log_files: r.get("decision_log_files", Go::None, 4)?,
        })
    }

    pub(super) fn validate(&self, origins: &Origins) -> Result<(), SettingsError> {
        for (key, text) in self.protocols() {
            OtlpProtocol::parse(text).map_err(|reason| origins.bad(key, text, &reason))?;
        }
        let sample = self.decision_log_sample;
        if !(sample > 0.0 && sample <= 1.0) {
            let text = sample.to_string();
            return Err(origins.bad("decision_log_sample", &text, "a share above 0 and at most 1"));
        }
        if self.decision_log_max_bytes < 4096 {
            let text = self.decision_log_max_bytes.to_string();
            return Err(origins.bad("decision_log_max_bytes", &text, "at least 4096"));
        }
        if self.decision_log_files > MAX_DECISION_LOG_FILES {
            let text = self.decision_log_files.to_string();
            return Err(origins.bad("decision_log_files", &text, "at most 100"));
        }
        Ok(())
    }

    /// How spans are sent: the first protocol given of `TRACING_EXPORTER_PROTOCOL`,
    /// `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL` and `OTEL_EXPORTER_OTLP_PROTOCOL`, else OTLP/HTTP (the Go
    /// service's default).
    pub fn exporter_protocol(&self) -> OtlpProtocol {
        self.protocols()
            .into_iter()
            .find(|(_, text)| !text.trim().is_empty())
            .and_then(|(_, text)| OtlpProtocol::parse(text).ok())
            .unwrap_or(OtlpProtocol::Http)
    }

    fn protocols(&self) -> [(&'static str, &str); 3] {
        [
            ("tracing_exporter_protocol", &self.tracing_exporter_protocol),
            (
                "otel_exporter_otlp_traces_protocol",
                &self.otel_exporter_otlp_traces_protocol,
            ),
            ("otel_exporter_otlp_protocol", &self.otel_exporter_otlp_protocol),
        ]
    }
}

/// `OTEL_TRACES_SAMPLER`. The Go service does not read it, so a value Tollgate does not know
/// (`jaeger_remote`, `xray`) must not stop a Go deployment from starting: it is warned about, and the
/// default sampler (parent-based, at `TRACING_SAMPLING_RATE`) applies.
fn sampler(r: &mut Reader<'_>) -> Result<TraceSampler, SettingsError> {
    let text: String = r.get("otel_traces_sampler", Go::Same, String::new())?;
    Ok(text.parse().unwrap_or_else(|reason| {
        r.warnings.push(format!(
            "ignoring OTEL_TRACES_SAMPLER: {reason}; sampling at TRACING_SAMPLING_RATE"
        ));
        TraceSampler::Default
    }))
}

/// `OTEL_TRACES_SAMPLER_ARG`, a ratio from 0 to 1; anything else is warned about (the Go service does
/// not read it) and 1 applies, or the ratio clamped.
fn sampler_arg(r: &mut Reader<'_>) -> Result<f64, SettingsError> {
    let text: String = r.get("otel_traces_sampler_arg", Go::Same, "1".into())?;
    let arg = match text.trim().parse::<f64>() {
        Ok(arg) if (0.0..=1.0).contains(&arg) => arg,
        Ok(arg) if arg.is_finite() => {
            let clamped = arg.clamp(0.0, 1.0);
            r.warnings.push(format!(
                "OTEL_TRACES_SAMPLER_ARG={text} is not a ratio from 0 to 1: taken as {clamped}"
            ));
            clamped
        }
        _ => {
            r.warnings.push(format!(
                "ignoring OTEL_TRACES_SAMPLER_ARG={text:?}: not a ratio from 0 to 1; taken as 1"
            ));
            1.0
        }
    };
    Ok(arg)
}
