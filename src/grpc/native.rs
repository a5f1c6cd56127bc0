//! `tollgate.v1.RateLimiter` over tonic: each call goes to [`NativeApi`], traced as Envoy's calls are
//! (see [`super::traced`]), its errors mapped by [`super::status_of`].

use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::{status_of, traced};
use crate::api::headers::HeaderOptions;
use crate::api::native::NativeApi;
use crate::proto::native::rate_limiter_server::RateLimiter;
use crate::proto::native::{
    AcquireRequest, AcquireResponse, CheckRequest, CheckResponse, RefundRequest, RefundResponse,
    ReleaseRequest, ReleaseResponse,
};
use tollgate_core::limiter::Limiter;
use tollgate_core::store::Store;

/// The gRPC service.
#[derive(Debug)]
pub struct NativeService<S> {
    api: NativeApi<S>,
}

impl<S> NativeService<S> {
    /// Serves `limiter` to application servers; Check answers carry the headers `headers` selects.
    pub fn new(limiter: Arc<Limiter<S>>, headers: HeaderOptions) -> Self {
        Self {
            api: NativeApi::new(limiter, headers),
        }
    }
}

#[tonic::async_trait]
impl<S: Store> RateLimiter for NativeService<S> {
    async fn check(&self, request: Request<CheckRequest>) -> Result<Response<CheckResponse>, Status> {
        let outcome = |r: &CheckResponse| if r.allowed { "ok" } else { "over_limit" };
        let method = "tollgate.v1.RateLimiter/Check";
        let call = |r| async { self.api.check(r).await.map_err(status_of) };
        traced(request, method, outcome, call).await.map(Response::new)
    }

    async fn refund(&self, request: Request<RefundRequest>) -> Result<Response<RefundResponse>, Status> {
        let method = "tollgate.v1.RateLimiter/Refund";
        let call = |r| async { self.api.refund(r).await.map_err(status_of) };
        traced(request, method, |_| "ok", call).await.map(Response::new)
    }

    async fn acquire(&self, request: Request<AcquireRequest>) -> Result<Response<AcquireResponse>, Status> {
        let outcome = |r: &AcquireResponse| if r.acquired { "ok" } else { "over_limit" };
        let method = "tollgate.v1.RateLimiter/Acquire";
        let call = |r| async { self.api.acquire(r).await.map_err(status_of) };
        traced(request, method, outcome, call).await.map(Response::new)
    }

    async fn release(&self, request: Request<ReleaseRequest>) -> Result<Response<ReleaseResponse>, Status> {
        let method = "tollgate.v1.RateLimiter/Release";
        let call = |r| async { self.api.release(r).await.map_err(status_of) };
        traced(request, method, |_| "ok", call).await.map(Response::new)
    }
}
