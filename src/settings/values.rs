//! The typed values settings hold beyond numbers, strings and durations: where rules come from, log
//! format, trace sampler, header styles, and secrets that never print.

use std::fmt;
use std::str::FromStr;

/// `CONFIG_TYPE`: where the rules come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ConfigType {
    /// The rules directory, polled for changes.
    #[default]
    File,
    /// An xDS management server, State of the World over ADS.
    GrpcXdsSotw,
}

impl FromStr for ConfigType {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.to_ascii_uppercase().as_str() {
            "FILE" => Ok(ConfigType::File),
            "GRPC_XDS_SOTW" => Ok(ConfigType::GrpcXdsSotw),
            _ => Err(format!("config type '{text}': expected FILE or GRPC_XDS_SOTW")),
        }
    }
}

impl fmt::Display for ConfigType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ConfigType::File => "FILE",
            ConfigType::GrpcXdsSotw => "GRPC_XDS_SOTW",
        })
    }
}

/// A password, key or token. `Debug` and `Display` never show it.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// A secret holding `value`.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The secret itself, for the one place that uses it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether no secret is set.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_empty() {
            "<unset>"
        } else {
            "<redacted>"
        })
    }
}

/// `LOG_FORMAT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// Human-readable lines (colours on a terminal).
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

impl FromStr for LogFormat {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.to_ascii_lowercase().as_str() {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            _ => Err(format!("log format '{text}': expected text or json")),
        }
    }
}

impl fmt::Display for LogFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        })
    }
}

/// `OTEL_TRACES_SAMPLER`: which new traces are kept, and whether a caller's decision is followed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TraceSampler {
    /// Not set: follow the caller, keep `TRACING_SAMPLING_RATE` of new traces.
    #[default]
    Default,
    /// `always_on`: every request, whatever the caller decided.
    AlwaysOn,
    /// `always_off`: none.
    AlwaysOff,
    /// `traceidratio`: `OTEL_TRACES_SAMPLER_ARG` of all requests, whatever the caller decided.
    TraceIdRatio,
    /// `parentbased_always_on`: follow the caller, keep every new trace.
    ParentBasedAlwaysOn,
    /// `parentbased_always_off`: follow the caller, keep no new trace.
    ParentBasedAlwaysOff,
    /// `parentbased_traceidratio`: follow the caller, keep `OTEL_TRACES_SAMPLER_ARG` of new traces.
    ParentBasedTraceIdRatio,
}

impl TraceSampler {
    const NAMES: [(TraceSampler, &'static str); 7] = [
        (TraceSampler::Default, ""),
        (TraceSampler::AlwaysOn, "always_on"),
        (TraceSampler::AlwaysOff, "always_off"),
        (TraceSampler::TraceIdRatio, "traceidratio"),
        (TraceSampler::ParentBasedAlwaysOn, "parentbased_always_on"),
        (TraceSampler::ParentBasedAlwaysOff, "parentbased_always_off"),
        (TraceSampler::ParentBasedTraceIdRatio, "parentbased_traceidratio"),
    ];

    /// (fraction of traces kept, whether a caller's decision is followed), given the sampler's argument
    /// and `TRACING_SAMPLING_RATE`.
    pub fn sampling(self, arg: f64, tracing_sampling_rate: f64) -> (f64, bool) {
        match self {
            TraceSampler::Default => (tracing_sampling_rate, true),
            TraceSampler::AlwaysOn => (1.0, false),
            TraceSampler::AlwaysOff => (0.0, false),
            TraceSampler::TraceIdRatio => (arg, false),
            TraceSampler::ParentBasedAlwaysOn => (1.0, true),
            TraceSampler::ParentBasedAlwaysOff => (0.0, true),
            TraceSampler::ParentBasedTraceIdRatio => (arg, true),
        }
    }
}

impl FromStr for TraceSampler {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let lower = text.trim().to_ascii_lowercase();
        Self::NAMES
            .iter()
            .find(|(_, name)| *name == lower)
            .map(|(sampler, _)| *sampler)
            .ok_or_else(|| {
                format!(
                    "sampler '{text}': expected always_on, always_off, traceidratio, parentbased_always_on, \
                     parentbased_always_off or parentbased_traceidratio (jaeger_remote and xray are not built in)"
                )
            })
    }
}

impl fmt::Display for TraceSampler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = Self::NAMES
            .iter()
            .find(|(sampler, _)| sampler == self)
            .map_or("", |(_, name)| name);
        f.write_str(name)
    }
}

/// One style of rate-limit response headers (`TOLLGATE_RESPONSE_HEADERS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeaderStyle {
    /// `RateLimit-Limit` / `-Remaining` / `-Reset` (as `LIMIT_RESPONSE_HEADERS_ENABLED`).
    RateLimit,
    /// `X-RateLimit-Limit` / `-Remaining` / `-Reset`.
    XRateLimit,
    /// The IETF draft's `RateLimit` and `RateLimit-Policy` fields.
    Ietf,
    /// `Retry-After` on refusals.
    RetryAfter,
}

impl HeaderStyle {
    fn name(self) -> &'static str {
        match self {
            HeaderStyle::RateLimit => "ratelimit",
            HeaderStyle::XRateLimit => "x-ratelimit",
            HeaderStyle::Ietf => "ietf",
            HeaderStyle::RetryAfter => "retry-after",
        }
    }
}

/// The header styles asked for, in the order given.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HeaderStyles(pub Vec<HeaderStyle>);

impl FromStr for HeaderStyles {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let styles = [
            HeaderStyle::RateLimit,
            HeaderStyle::XRateLimit,
            HeaderStyle::Ietf,
            HeaderStyle::RetryAfter,
        ];
        text.split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|name| {
                let lower = name.to_ascii_lowercase();
                styles.into_iter().find(|s| s.name() == lower).ok_or_else(|| {
                    format!("header style '{name}': expected ratelimit, x-ratelimit, ietf or retry-after")
                })
            })
            .collect::<Result<_, _>>()
            .map(HeaderStyles)
    }
}

impl fmt::Display for HeaderStyles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.0.iter().map(|s| s.name()).collect();
        f.write_str(&names.join(","))
    }
}

/// How spans are sent (`TRACING_EXPORTER_PROTOCOL`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OtlpProtocol {
    /// OTLP/HTTP with protobuf bodies (`http`, `http/protobuf`): the Go service's default.
    Http,
    /// OTLP/gRPC (`grpc`).
    Grpc,
}

impl OtlpProtocol {
    /// The protocol a setting's text names: `http` (or empty, as the Go service reads it, or
    /// OpenTelemetry's `http/protobuf`) or `grpc`.
    pub fn parse(text: &str) -> Result<Self, String> {
        match text.trim().to_ascii_lowercase().as_str() {
            "" | "http" | "http/protobuf" => Ok(Self::Http),
            "grpc" => Ok(Self::Grpc),
            "http/json" => {
                Err("OTLP/HTTP with JSON bodies is not built in: use http (protobuf) or grpc".into())
            }
            other => Err(format!("invalid OTLP protocol {other:?}: expected http or grpc")),
        }
    }

    /// The protocol's name, for logs.
    pub fn name(self) -> &'static str {
        match self {
            Self::Http => "http/protobuf",
            Self::Grpc => "grpc",
        }
    }
}

/// `STATSD_PROTOCOL`: how stats reach statsd (gostats reads it; the Go service's default is TCP).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatsdProtocol {
    /// One stream, lines batched up to 64 KiB per write.
    Tcp,
    /// Datagrams of at most 1,432 bytes (one Ethernet frame's payload).
    Udp,
}

impl FromStr for StatsdProtocol {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.to_ascii_lowercase().as_str() {
            "tcp" | "tcp4" | "tcp6" => Ok(StatsdProtocol::Tcp),
            "udp" | "udp4" | "udp6" => Ok(StatsdProtocol::Udp),
            _ => Err(format!("statsd protocol '{text}': expected tcp or udp")),
        }
    }
}

impl fmt::Display for StatsdProtocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            StatsdProtocol::Tcp => "tcp",
            StatsdProtocol::Udp => "udp",
        })
    }
}

/// `EXTRA_TAGS`: tags on every stat, written `key:value,key:value` as the Go service reads them (each
/// pair exactly one `:`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExtraTags(pub Vec<(String, String)>);

impl FromStr for ExtraTags {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if text.is_empty() {
            return Ok(Self::default());
        }
        text.split(',')
            .map(|pair| match pair.split(':').collect::<Vec<_>>()[..] {
                [key, value] => Ok((key.to_owned(), value.to_owned())),
                _ => Err(format!("tag '{pair}': expected key:value")),
            })
            .collect::<Result<_, _>>()
            .map(Self)
    }
}

impl fmt::Display for ExtraTags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let pairs: Vec<String> = self.0.iter().map(|(k, v)| format!("{k}:{v}")).collect();
        f.write_str(&pairs.join(","))
    }
}
