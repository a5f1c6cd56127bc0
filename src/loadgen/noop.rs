//! `tollgate noop-serve`: an Envoy RLS server that answers OK to every request and decides nothing, on
//! the same gRPC stack (tonic, `TCP_NODELAY`, the runtime `serve` picks for this machine). It is the
//! floor a rate limit server is compared with: what serving `ShouldRateLimit` costs before any rule is
//! matched or any counter touched (`scripts/bench-floor.sh` runs it beside Tollgate).

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

/// Serves the no-op service on `addr` until the process is stopped.
pub(crate) async fn serve(addr: SocketAddr) -> anyhow::Result<()> {
    let incoming = TcpIncoming::bind(addr)?.with_nodelay(Some(true));
    println!("tollgate noop-serve: grpc {}", incoming.local_addr()?);
    tonic::transport::Server::builder()
        .add_service(RateLimitServiceServer::new(Noop))
        .serve_with_incoming(incoming)
        .await?;
    Ok(())
}
