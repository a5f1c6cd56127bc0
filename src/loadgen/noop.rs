//! `tollgate noop-serve`: an Envoy RLS server that answers OK to every request and decides nothing, on
//! the same gRPC stack (tonic, `TCP_NODELAY`, the runtime `serve` picks for this machine). It is the
//! floor a rate limit server is compared with: what serving `ShouldRateLimit` costs before any rule is
//! matched or any counter touched (`scripts/bench/bench-floor.sh` runs it beside Tollgate). With `--http-addr`
//! it answers proxies' `/forward-auth/{domain}` with 200 the same way, on the HTTP stack of `serve`'s
//! admin port (`scripts/bench/bench-proxies.sh`).

use std::collections::HashMap;
use std::net::SocketAddr;

use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status};

use crate::proto::rls::rate_limit_response::{Code, DescriptorStatus};
use crate::proto::rls::rate_limit_service_server::{RateLimitService, RateLimitServiceServer};
use crate::proto::rls::{RateLimitRequest, RateLimitResponse};

/// Answers every request OK, with one OK status per descriptor (as a real answer carries).
struct Noop;

#[tonic::async_trait]
impl RateLimitService for Noop {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let statuses = request
            .get_ref()
            .descriptors
            .iter()
            .map(|_| DescriptorStatus {
                code: Code::Ok as i32,
                ..DescriptorStatus::default()
            })
            .collect();
        Ok(Response::new(RateLimitResponse {
            overall_code: Code::Ok as i32,
            statuses,
            ..RateLimitResponse::default()
        }))
    }
}

/// Serves the no-op service on `addr`, and the always-allow forward auth on `http`, until the process is
/// stopped.
pub(crate) async fn serve(addr: SocketAddr, http: Option<SocketAddr>) -> anyhow::Result<()> {
    let incoming = TcpIncoming::bind(addr)?.with_nodelay(Some(true));
    println!("tollgate noop-serve: grpc {}", incoming.local_addr()?);
    if let Some(http) = http {
        let listener = tokio::net::TcpListener::bind(http).await?;
        println!("tollgate noop-serve: http {}", listener.local_addr()?);
        tokio::spawn(forward_auth(listener)?);
    }
    tonic::transport::Server::builder()
        .add_service(RateLimitServiceServer::new(Noop))
        .serve_with_incoming(incoming)
        .await?;
    Ok(())
}

/// Answers `/forward-auth/{domain}` with 200 and nothing else, with the admin port's default bounds.
fn forward_auth(listener: tokio::net::TcpListener) -> anyhow::Result<impl Future<Output = ()>> {
    let settings = crate::settings::Settings::load_from(None, &HashMap::new(), &[])?;
    let counters = crate::server_counters::ServerCounters::new();
    let budget = crate::server::options::request_budget(&settings.listen, std::sync::Arc::clone(&counters));
    let (_, limits) = crate::server::options::transport_limits(&settings.listen, &budget, &counters);
    let router = axum::Router::new().route(
        "/forward-auth/{domain}",
        axum::routing::any(|| async { axum::http::StatusCode::OK }),
    );
    let stop = tokio_util::sync::CancellationToken::new();
    Ok(crate::http::serve(
        listener,
        router,
        limits,
        "noop HTTP",
        counters,
        stop,
    ))
}
