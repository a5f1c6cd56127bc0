//! envoyproxy/ratelimit's `POST /json`: a `RateLimitRequest` in proto3 JSON, decided by [`EnvoyApi`]
//! as over gRPC, answered as a `RateLimitResponse` in proto3 JSON.

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;

use crate::api::envoy::EnvoyApi;
use crate::api::json::{request_from_json, response_to_json};
use crate::proto::rls::rate_limit_response;
use tollgate_core::store::AnyStore;

/// The `/json` route over `api`.
pub(super) fn router(api: Arc<EnvoyApi<AnyStore>>) -> Router {
    Router::new().route("/json", post(json)).with_state(api)
}

/// envoyproxy/ratelimit's `/json`: 200 when OK, 429 when over the limit, 400 for a body that is not a
/// request and for any service error (Redis included), as the Go service answers.
async fn json(State(api): State<Arc<EnvoyApi<AnyStore>>>, body: Bytes) -> Response {
    let request = match request_from_json(&body) {
        Ok(request) => request,
        Err(error) => return (StatusCode::BAD_REQUEST, error.to_string()).into_response(),
    };
    let response = match api.should_rate_limit(&request).await {
        Ok(response) => response,
        Err(error) => return (StatusCode::BAD_REQUEST, error.to_string()).into_response(),
    };
    let status = if response.overall_code == rate_limit_response::Code::OverLimit as i32 {
        StatusCode::TOO_MANY_REQUESTS
    } else {
        StatusCode::OK
    };
    let body = response_to_json(&response).to_string();
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}
