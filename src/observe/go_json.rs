//! `LOG_FORMAT=json` in envoyproxy/ratelimit's shape, so log pipelines built for the Go service parse
//! Tollgate's lines unchanged: one object per line with `@timestamp` (RFC 3339, nanoseconds, UTC),
//! `level` (logrus' names: `error`, `warning`, `info`, `debug`, `trace`) and `@message`, the event's
//! fields beside them, and `trace_id` when the line is written inside a traced span.

use std::fmt;

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// The Go service's JSON log line format.
#[derive(Debug, Clone, Copy, Default)]
pub struct GoJson {
    /// Spans are exported: a line written inside one carries its trace id.
    pub traces: bool,
}

impl<S, N> FormatEvent<S, N> for GoJson
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut line = Map::new();
        line.insert(
            "@timestamp".into(),
            humantime::format_rfc3339_nanos(std::time::SystemTime::now())
                .to_string()
                .into(),
        );
        line.insert("level".into(), level_name(*event.metadata().level()).into());
        let mut fields = Fields(Map::new());
        event.record(&mut fields);
        let message = fields.0.remove("message").unwrap_or(Value::String(String::new()));
        line.insert("@message".into(), message);
        for (name, value) in fields.0 {
            // A field named like one of the line's own keys is kept as `fields.NAME`, as logrus does.
            let name = if RESERVED.contains(&name.as_str()) {
                format!("fields.{name}")
            } else {
                name
            };
            line.insert(name, value);
        }
        if let Some(trace_id) = trace_id(ctx, self.traces) {
            line.insert("trace_id".into(), trace_id.into());
        }
        writeln!(writer, "{}", Value::Object(line))
    }
}

/// The keys of the line itself.
const RESERVED: [&str; 4] = ["@timestamp", "level", "@message", "trace_id"];

/// logrus' level names (`warning`, not `warn`).
fn level_name(level: Level) -> &'static str {
    match level {
        Level::ERROR => "error",
        Level::WARN => "warning",
        Level::INFO => "info",
        Level::DEBUG => "debug",
        Level::TRACE => "trace",
    }
}

/// The OpenTelemetry trace id of the current span, when traces are exported and a span is open.
fn trace_id<S, N>(ctx: &FmtContext<'_, S, N>, traces: bool) -> Option<String>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    use opentelemetry::trace::TraceContextExt as _;
    if !traces {
        return None;
    }
    let span = ctx.lookup_current()?;
    let context = tracing::dispatcher::get_default(|dispatch| {
        tracing_opentelemetry::get_otel_context(&span.id(), dispatch)
    })?;
    let id = context.span().span_context().trace_id();
    (id != opentelemetry::trace::TraceId::INVALID).then(|| id.to_string())
}

/// An event's fields as JSON values.
struct Fields(Map<String, Value>);

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().into(), value.into());
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().into(), value.into());
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().into(), value.into());
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().into(), value.into());
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().into(), value.into());
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.0.insert(field.name().into(), value.to_string().into());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0.insert(field.name().into(), format!("{value:?}").into());
    }
}
