//! envoyproxy/ratelimit's `POST /json`: a `RateLimitRequest` in proto3 JSON, decided as over gRPC,
//! answered as a `RateLimitResponse` in proto3 JSON.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::Admin;
use crate::api::envoy::build_response;
use crate::api::json::{request_from_json, response_to_json};
use tollgate_core::limiter::Code;

/// envoyproxy/ratelimit's `/json`: 200 when OK, 429 when over the limit, 400 for a body that is not a
/// request and for any service error (Redis included), as the Go service answers.
pub(super) async fn json(State(admin): State<Arc<Admin>>, body: Bytes) -> Response {
    let request = match request_from_json(&body) {
        Ok(request) => request,
        Err(error) => return (StatusCode::BAD_REQUEST, error.to_string()).into_response(),
    };
    let verdict = admin
        .limiter
        .should_rate_limit(&request.domain, &request.descriptors, request.hits_addend)
        .await;
    let verdict = match verdict {
        Ok(verdict) => verdict,
        Err(error) => return (StatusCode::BAD_REQUEST, error.to_string()).into_response(),
    };
    let status = if verdict.overall == Code::OverLimit {
        StatusCode::TOO_MANY_REQUESTS
    } else {
        StatusCode::OK
    };
    let response = build_response(&request, verdict, &admin.options);
    let body = response_to_json(&response).to_string();
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}
