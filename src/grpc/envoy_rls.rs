//! `envoy.service.ratelimit.v3.RateLimitService` over tonic: decode the call, ask the limiter, encode
//! the answer with [`crate::api::envoy`]. Nothing else lives here.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::envoy_status_of;
use crate::api::envoy::{EnvoyOptions, build_response};
use crate::proto::rls::rate_limit_response;
use crate::proto::rls::rate_limit_service_server::RateLimitService;
use crate::proto::rls::{RateLimitRequest, RateLimitResponse};
use tollgate_core::limiter::Limiter;
use tollgate_core::store::Store;

/// The gRPC service.
#[derive(Debug)]
pub struct EnvoyRateLimitService<S> {
    limiter: Arc<Limiter<S>>,
    options: EnvoyOptions,
}

impl<S> EnvoyRateLimitService<S> {
    /// Serves `limiter` to Envoy.
    pub fn new(limiter: Arc<Limiter<S>>, options: EnvoyOptions) -> Self {
        Self { limiter, options }
    }
}

#[tonic::async_trait]
impl<S: Store> RateLimitService for EnvoyRateLimitService<S> {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let over = |response: &Response<RateLimitResponse>| {
            if response.get_ref().overall_code == rate_limit_response::Code::OverLimit as i32 {
                "over_limit"
            } else {
                "ok"
            }
        };
        super::traced(request, SHOULD_RATE_LIMIT, over, |request| self.decide(request)).await
    }
}

/// The RPC's full method name, as spans name it.
const SHOULD_RATE_LIMIT: &str = "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

impl<S: Store> EnvoyRateLimitService<S> {
    async fn decide(&self, request: RateLimitRequest) -> Result<Response<RateLimitResponse>, Status> {
        let verdict = self
            .limiter
            .should_rate_limit(&request.domain, &request.descriptors, request.hits_addend)
            .await
            .map_err(envoy_status_of)?;
        Ok(Response::new(build_response(&request, verdict, &self.options)))
    }
}
