//! `envoy.service.ratelimit.v3.RateLimitService` over tonic: each call goes to [`EnvoyApi`], traced
//! (see [`super::traced`]), its errors mapped by [`super::envoy_status_of`]. Nothing else lives here.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::envoy_status_of;
use crate::api::envoy::{EnvoyApi, EnvoyOptions};
use crate::proto::rls::rate_limit_response;
use crate::proto::rls::rate_limit_service_server::RateLimitService;
use crate::proto::rls::{RateLimitRequest, RateLimitResponse};
use tollgate_core::limiter::Limiter;
use tollgate_core::store::Store;

/// The gRPC service.
#[derive(Debug)]
pub struct EnvoyRateLimitService<S> {
    api: EnvoyApi<S>,
}

impl<S> EnvoyRateLimitService<S> {
    /// Serves `limiter` to Envoy.
    pub fn new(limiter: Arc<Limiter<S>>, options: EnvoyOptions) -> Self {
        Self {
            api: EnvoyApi::new(limiter, options),
        }
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
        let call = |request| async move {
            let response = self.api.should_rate_limit(&request).await;
            response.map(Response::new).map_err(envoy_status_of)
        };
        super::traced(request, SHOULD_RATE_LIMIT, over, call).await
    }
}

/// The RPC's full method name, as spans name it.
const SHOULD_RATE_LIMIT: &str = "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
