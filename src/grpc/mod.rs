//! The gRPC listener: Envoy's RateLimitService, Tollgate's native `tollgate.v1.RateLimiter`,
//! `grpc.health.v1.Health` and server reflection (so `grpcurl -plaintext HOST:8081 list` works with no
//! proto file).

pub mod envoy_rls;
pub mod headers;
pub mod native;

use std::future::Future;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::Server;
use tonic_health::pb::health_server::{Health as HealthApi, HealthServer};

use crate::limiter::Limiter;
use crate::proto::native::rate_limiter_server::RateLimiterServer;
use crate::proto::rls::rate_limit_service_server::RateLimitServiceServer;
use crate::store::Store;

pub use envoy_rls::{EnvoyOptions, EnvoyRateLimitService};
pub use headers::{HeaderNames, HeaderOptions};
pub use native::NativeService;

/// Serves every gRPC service on `listener` until `shutdown` completes, then finishes in-flight calls.
pub async fn serve<S: Store, H>(
    listener: TcpListener,
    limiter: Arc<Limiter<S>>,
    options: EnvoyOptions,
    health: HealthServer<H>,
    shutdown: impl Future<Output = ()> + Send,
) -> anyhow::Result<()>
where
    H: HealthApi,
{
    let reflection_v1 = reflection().build_v1()?;
    let reflection_v1alpha = reflection().build_v1alpha()?;
    let native = RateLimiterServer::new(NativeService::new(Arc::clone(&limiter), options.headers.clone()));
    let rls = RateLimitServiceServer::new(EnvoyRateLimitService::new(limiter, options));
    Server::builder()
        // Envoy holds a few long-lived HTTP/2 connections; without keepalive a half-open one (a
        // vanished peer behind a NAT) would be noticed only when a request times out.
        .http2_keepalive_interval(Some(KEEPALIVE_INTERVAL))
        .tcp_nodelay(true)
        .add_service(health)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(rls)
        .add_service(native)
        .serve_with_incoming_shutdown(incoming(listener), shutdown)
        .await?;
    Ok(())
}

/// Accepted connections with `TCP_NODELAY`. tonic sets it only on listeners it binds itself; without
/// it a response written while an earlier one is unacknowledged waits for the client's delayed ACK
/// (40 ms on Linux), which showed as a 41 ms p99.9 whenever responses left in bursts.
fn incoming(
    listener: TcpListener,
) -> impl tokio_stream::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    use tokio_stream::StreamExt as _;
    TcpListenerStream::new(listener).map(|accepted| {
        let stream = accepted?;
        stream.set_nodelay(true)?;
        Ok(stream)
    })
}

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

/// Runs one RPC inside a server span when the call is sampled (see [`crate::telemetry::should_trace`]):
/// named after the method, a child of the caller's `traceparent`, with the gRPC semantic conventions'
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
    if !crate::telemetry::should_trace(&metadata) {
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
    // A parent we cannot attach (no trace context) just leaves this span a root.
    let _ = span.set_parent(crate::telemetry::remote_context(&metadata));
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

/// HTTP/2 keepalive ping interval on gRPC connections.
const KEEPALIVE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(30);

fn reflection() -> tonic_reflection::server::Builder<'static> {
    tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(crate::proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
}
