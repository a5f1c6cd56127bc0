//! The gRPC listener: Envoy's RateLimitService, Tollgate's native `tollgate.v1.RateLimiter`,
//! `grpc.health.v1.Health` and server reflection (so `grpcurl -plaintext HOST:8081 list` works with no
//! proto file).

mod envoy_rls;
mod incoming;
mod limits;
mod native;
pub mod tls;
mod trace;

use std::future::Future;
use std::sync::Arc;

use tonic::transport::Server;
use tonic_health::pb::health_server::{Health as HealthApi, HealthServer};

use tonic::Status;

use crate::api::envoy::EnvoyOptions;
use crate::proto::native::rate_limiter_server::RateLimiterServer;
use crate::proto::rls::rate_limit_service_server::RateLimitServiceServer;
use tollgate_core::limiter::{ErrorKind, Limiter, LimiterError};
use tollgate_core::store::Store;

pub use envoy_rls::EnvoyRateLimitService;
pub use incoming::{Conn, ConnInfo, GrpcListener, UnixSocket};
pub use limits::GrpcLimits;
pub use native::NativeService;
use tls::ServerTls;
use trace::traced;

/// Serves every gRPC service on `listener` (with TLS when `tls` is given) until `shutdown` completes,
/// then finishes in-flight calls.
pub async fn serve<S: Store, H>(
    listener: GrpcListener,
    tls: Option<Arc<ServerTls>>,
    limiter: Arc<Limiter<S>>,
    options: EnvoyOptions,
    limits: GrpcLimits,
    health: HealthServer<H>,
    shutdown: impl Future<Output = ()> + Send,
) -> anyhow::Result<()>
where
    H: HealthApi,
{
    let reflection_v1 = reflection().build_v1()?;
    let reflection_v1alpha = reflection().build_v1alpha()?;
    let age = limits.max_connection_age.map(|max| incoming::ConnectionAge {
        max,
        grace: limits.max_connection_age_grace,
    });
    let admission = incoming::Admission {
        max_connections: limits.max_connections,
        handshakes_per_client: limits.handshakes_per_client,
        idle_probation: limits.idle_probation,
        write_timeout: limits.write_timeout,
        budget: limits.budget.clone(),
    };
    let connections = incoming::incoming(listener, tls, age, admission, Arc::clone(&limits.counters));
    let native = RateLimiterServer::new(NativeService::new(Arc::clone(&limiter), options.headers.clone()))
        .max_decoding_message_size(limits.max_message_bytes);
    let rls = RateLimitServiceServer::new(EnvoyRateLimitService::new(limiter, options))
        .max_decoding_message_size(limits.max_message_bytes);
    let mut server = Server::builder()
        // Envoy holds a few long-lived HTTP/2 connections; without keepalive a half-open one (a
        // vanished peer behind a NAT) would be noticed only when a request times out.
        .http2_keepalive_interval(Some(KEEPALIVE_INTERVAL))
        .max_concurrent_streams(Some(limits.max_concurrent_streams));
    if let Some(age) = limits.max_connection_age {
        // GOAWAY after the age: Envoy reconnects and so spreads over replicas added since it first
        // connected. The grace is enforced on the connection itself (see `incoming`).
        server = server.max_connection_age(age);
    }
    let budget = limits.budget.clone();
    server
        .layer(tower::layer::layer_fn(limits::ResourceExhausted))
        .layer(tower::layer::layer_fn(move |inner| limits::Budget {
            inner,
            budget: budget.clone(),
        }))
        .add_service(health)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(rls)
        .add_service(native)
        .serve_with_incoming_shutdown(connections, shutdown)
        .await?;
    Ok(())
}

/// Maps a limiter error to the gRPC status a caller of the native API sees. Store trouble and "no rules
/// yet" are UNAVAILABLE, which the clients' failure policy answers; malformed requests are
/// INVALID_ARGUMENT with envoyproxy/ratelimit's text; an all-or-nothing call Redis Cluster cannot make
/// atomic is FAILED_PRECONDITION.
pub fn status_of(error: LimiterError) -> Status {
    let message = error.to_string();
    match error.kind() {
        ErrorKind::InvalidRequest => Status::invalid_argument(message),
        ErrorKind::Unavailable | ErrorKind::NoRules => Status::unavailable(message),
        ErrorKind::NotAtomic => Status::failed_precondition(message),
        ErrorKind::NotFound => Status::not_found(message),
        ErrorKind::PermissionDenied => Status::permission_denied(message),
    }
}

/// [`status_of`] for Envoy's `ShouldRateLimit`, with envoyproxy/ratelimit's codes: "no rules yet" is
/// UNKNOWN, "no rate limit configuration loaded", as the Go service answers. Every error is an error to
/// Envoy, so its `failure_mode_deny` decides (never an `UNKNOWN` overall code in an answer, which Envoy
/// would treat as OK).
pub fn envoy_status_of(error: LimiterError) -> Status {
    match error.kind() {
        ErrorKind::NoRules => Status::unknown(error.to_string()),
        _ => status_of(error),
    }
}

/// HTTP/2 keepalive ping interval on gRPC connections.
const KEEPALIVE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(30);

fn reflection() -> tonic_reflection::server::Builder<'static> {
    tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(crate::proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
}
