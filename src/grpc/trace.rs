//! Server spans for gRPC calls: the sampling decision from the call's metadata, the caller's trace
//! context (W3C or B3, see [`crate::observe::trace_context`]) as parent, and the gRPC semantic
//! conventions' attributes (see [`crate::observe::telemetry`] for export and sampling settings).

use std::future::Future;

use opentelemetry::propagation::Extractor;

use crate::observe::{telemetry, trace_context};

/// A request message naming the rate-limit domain it is about (recorded on its span).
pub(crate) trait InDomain {
    /// The request's `domain`.
    fn domain(&self) -> &str;
}

/// Implements [`InDomain`] for messages with a `domain` field.
macro_rules! in_domain {
    ($($message:ty),*) => {
        $(impl InDomain for $message {
            fn domain(&self) -> &str {
                &self.domain
            }
        })*
    };
}

in_domain!(
    crate::proto::rls::RateLimitRequest,
    crate::proto::native::CheckRequest,
    crate::proto::native::RefundRequest,
    crate::proto::native::AcquireRequest,
    crate::proto::native::ReleaseRequest
);

/// Runs one RPC inside a server span when the call is sampled (see [`telemetry::should_trace`]):
/// named after the method, a child of the caller's span (W3C or B3), with the gRPC semantic conventions'
/// attributes, the domain, and `ratelimit.outcome` as `outcome` reads it from the answer.
pub(crate) async fn traced<R: InDomain, T, F: Future<Output = Result<T, tonic::Status>>>(
    request: tonic::Request<R>,
    method: &'static str,
    outcome: impl FnOnce(&T) -> &'static str,
    call: impl FnOnce(R) -> F,
) -> Result<T, tonic::Status> {
    use tracing::Instrument as _;
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;
    let (metadata, _, message) = request.into_parts();
    if !telemetry::traces_enabled() {
        return call(message).await;
    }
    let parent = trace_context::extract(&MetadataExtractor(&metadata));
    if !telemetry::should_trace(parent.as_ref().and_then(|p| p.sampled)) {
        return call(message).await;
    }
    let span = tracing::info_span!(
        "rpc",
        otel.name = method,
        otel.kind = "server",
        rpc.system.name = "grpc",
        rpc.method = method,
        rpc.response.status_code = tracing::field::Empty,
        error.type = tracing::field::Empty,
        ratelimit.domain = message.domain(),
        ratelimit.outcome = tracing::field::Empty,
    );
    // No trace context from the caller leaves this span a root.
    if let Some(parent) = &parent {
        let _ = span.set_parent(parent.context());
    }
    let result = call(message).instrument(span.clone()).await;
    match &result {
        Ok(answer) => {
            span.record("rpc.response.status_code", "OK");
            span.record("ratelimit.outcome", outcome(answer));
        }
        Err(status) => {
            let code = status_code_name(status.code());
            span.record("rpc.response.status_code", code.as_str());
            span.record("error.type", code.as_str());
        }
    }
    result
}

/// The status code's name as the gRPC semantic conventions spell it (`INVALID_ARGUMENT`).
fn status_code_name(code: tonic::Code) -> String {
    let mut name = String::new();
    for (at, c) in format!("{code:?}").chars().enumerate() {
        if c.is_uppercase() && at > 0 {
            name.push('_');
        }
        name.push(c.to_ascii_uppercase());
    }
    name
}

/// gRPC metadata as OpenTelemetry's header reader.
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
