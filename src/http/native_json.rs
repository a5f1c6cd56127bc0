//! The native API as JSON over HTTP, for languages without gRPC: `POST /v1/check`, `/v1/refund`,
//! `/v1/acquire`, `/v1/release` on the admin port. Each body is the gRPC request message in JSON
//! (field names as in `proto/tollgate/v1/ratelimiter.proto`; `mode` as `"consume"`, `"peek"` or
//! `"all_or_nothing"`; `ttl` as a duration string such as `"30s"`), and each answer the response
//! message, durations as strings such as `"1.5s"`. The calls run through the same
//! [`NativeApi`] as gRPC.
//!
//! Status codes: 200; 429 when a consuming Check or an Acquire is refused (a peek is always 200), with `Retry-After` (and on a Check, the
//! rate-limit headers the server hands out, `TOLLGATE_RESPONSE_HEADERS`, as on every Check); 400 for a
//! malformed body or request; 503 when the store is down and no failure mode answers, or no rules are
//! loaded; 412 for an all-or-nothing check that Redis Cluster cannot decide atomically.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::api::json::duration_text;
use crate::api::native::{NativeApi, wire_duration};
use crate::api::whole_seconds;
use crate::proto::native::{self, Descriptor};
use tollgate_core::limiter::{ErrorKind, LimiterError};
use tollgate_core::store::AnyStore;

/// The `/v1/*` routes.
pub(super) fn router(service: Arc<NativeApi<AnyStore>>) -> Router {
    Router::new()
        .route("/v1/check", post(check))
        .route("/v1/refund", post(refund))
        .route("/v1/acquire", post(acquire))
        .route("/v1/release", post(release))
        .with_state(service)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonEntry {
    key: String,
    #[serde(default)]
    value: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonDescriptor {
    entries: Vec<JsonEntry>,
    cost: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonCall {
    domain: String,
    descriptors: Vec<JsonDescriptor>,
    #[serde(default)]
    cost: u64,
    mode: Option<String>,
    #[serde(default)]
    lease_id: String,
    #[serde(default, with = "humantime_serde")]
    ttl: Option<Duration>,
    #[serde(default)]
    refund_token: String,
}

impl JsonCall {
    fn descriptors(self) -> Vec<Descriptor> {
        self.descriptors
            .into_iter()
            .map(|d| Descriptor {
                cost: d.cost,
                ..Descriptor::from_entries(d.entries.into_iter().map(|e| (e.key, e.value)))
            })
            .collect()
    }
}

/// Why a call failed, answered as `{"error": "..."}`.
enum ApiError {
    /// The body is not a request: 400.
    BadRequest(String),
    /// The limiter refused or failed.
    Limiter(LimiterError),
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, message) = match self {
            ApiError::BadRequest(message) => (StatusCode::BAD_REQUEST, message),
            ApiError::Limiter(error) => (status_code(&error), error.to_string()),
        };
        (status, Json(json!({ "error": message }))).into_response()
    }
}

impl From<LimiterError> for ApiError {
    fn from(error: LimiterError) -> Self {
        ApiError::Limiter(error)
    }
}

/// The HTTP status of a limiter error: 400 for a malformed request, 412 for an all-or-nothing call
/// Redis Cluster cannot make atomic, 503 when the store is down or no rules are loaded.
fn status_code(error: &LimiterError) -> StatusCode {
    match error.kind() {
        ErrorKind::InvalidRequest => StatusCode::BAD_REQUEST,
        ErrorKind::Unavailable | ErrorKind::NoRules => StatusCode::SERVICE_UNAVAILABLE,
        ErrorKind::NotAtomic => StatusCode::PRECONDITION_FAILED,
        ErrorKind::NotFound => StatusCode::NOT_FOUND,
        ErrorKind::PermissionDenied => StatusCode::FORBIDDEN,
    }
}

/// A body that is not the expected JSON: 400 with serde's explanation.
fn parse<T: DeserializeOwned>(body: &Bytes) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| ApiError::BadRequest(format!("invalid request body: {e}")))
}

fn mode(name: Option<&str>) -> Result<native::Mode, ApiError> {
    match name.map(str::to_ascii_lowercase).as_deref() {
        None | Some("consume") | Some("mode_consume") => Ok(native::Mode::Consume),
        Some("peek") | Some("mode_peek") => Ok(native::Mode::Peek),
        Some("all_or_nothing") | Some("mode_all_or_nothing") => Ok(native::Mode::AllOrNothing),
        Some(other) => Err(ApiError::BadRequest(format!(
            "unknown mode '{other}' (expected consume, peek or all_or_nothing)"
        ))),
    }
}

async fn check(State(service): State<Arc<NativeApi<AnyStore>>>, body: Bytes) -> Result<Response, ApiError> {
    let call: JsonCall = parse(&body)?;
    let mode = mode(call.mode.as_deref())?;
    // A peek asked a question and got its answer: 200 even when the cost would not pass now.
    let peek = mode == native::Mode::Peek;
    let request = native::CheckRequest {
        domain: call.domain.clone(),
        cost: call.cost,
        mode: mode as i32,
        descriptors: call.descriptors(),
    };
    let response = service.check(request).await?;
    let body = json!({
        "allowed": response.allowed,
        "results": response.results.iter().map(check_result).collect::<Vec<_>>(),
        "retry_after": response.retry_after.as_ref().map(duration_text),
        "refund_token": Some(&response.refund_token).filter(|t| !t.is_empty()),
    });
    let mut headers: Vec<(String, String)> =
        response.headers.into_iter().map(|h| (h.name, h.value)).collect();
    if response.allowed || peek {
        return Ok(with_headers(StatusCode::OK, &headers, body));
    }
    // No retry hint (a cost no limit can ever admit): no Retry-After, since waiting will not help.
    if response.retry_after.is_some()
        && !headers
            .iter()
            .any(|(name, _)| name.eq_ignore_ascii_case("retry-after"))
    {
        headers.push((
            "Retry-After".into(),
            retry_after_secs(response.retry_after.as_ref()),
        ));
    }
    Ok(with_headers(StatusCode::TOO_MANY_REQUESTS, &headers, body))
}

async fn refund(State(service): State<Arc<NativeApi<AnyStore>>>, body: Bytes) -> Result<Response, ApiError> {
    let call: JsonCall = parse(&body)?;
    let request = native::RefundRequest {
        domain: call.domain.clone(),
        cost: call.cost,
        refund_token: call.refund_token.clone(),
        descriptors: call.descriptors(),
    };
    let response = service.refund(request).await?;
    let results: Vec<Value> = response
        .results
        .iter()
        .map(|r| {
            json!({
                "limit": r.limit.as_ref().map(limit),
                "remaining": r.remaining,
                "reset_after": r.reset_after.as_ref().map(duration_text),
            })
        })
        .collect();
    Ok(Json(json!({ "results": results })).into_response())
}

async fn acquire(State(service): State<Arc<NativeApi<AnyStore>>>, body: Bytes) -> Result<Response, ApiError> {
    let call: JsonCall = parse(&body)?;
    let request = native::AcquireRequest {
        domain: call.domain.clone(),
        lease_id: call.lease_id.clone(),
        ttl: call.ttl.map(wire_duration),
        descriptors: call.descriptors(),
    };
    let response = service.acquire(request).await?;
    let results: Vec<Value> = response
        .results
        .iter()
        .map(|r| {
            json!({
                "acquired": r.acquired,
                "rule": r.rule,
                "max_in_flight": r.max_in_flight,
                "in_flight": r.in_flight,
                "retry_after": r.retry_after.as_ref().map(duration_text),
                "failure_mode_applied": r.failure_mode_applied,
            })
        })
        .collect();
    let retry = response.retry_after.as_ref();
    let body = json!({
        "acquired": response.acquired,
        "lease_id": response.lease_id,
        "ttl": response.ttl.as_ref().map(duration_text),
        "results": results,
        "retry_after": retry.map(duration_text),
    });
    if response.acquired {
        return Ok(Json(body).into_response());
    }
    let retry_after = ("Retry-After".to_owned(), retry_after_secs(retry));
    Ok(with_headers(StatusCode::TOO_MANY_REQUESTS, &[retry_after], body))
}

async fn release(State(service): State<Arc<NativeApi<AnyStore>>>, body: Bytes) -> Result<Response, ApiError> {
    let call: JsonCall = parse(&body)?;
    let request = native::ReleaseRequest {
        domain: call.domain.clone(),
        lease_id: call.lease_id.clone(),
        descriptors: call.descriptors(),
    };
    let response = service.release(request).await?;
    let results: Vec<Value> = response
        .results
        .iter()
        .map(|r| json!({ "released": r.released, "in_flight": r.in_flight }))
        .collect();
    Ok(Json(json!({ "results": results })).into_response())
}

/// `Retry-After` in whole seconds, rounded up so a client never retries early; at least 1.
fn retry_after_secs(retry: Option<&prost_types::Duration>) -> String {
    let wait = retry.and_then(|d| Duration::try_from(*d).ok());
    wait.map_or(1, whole_seconds).max(1).to_string()
}

fn with_headers(status: StatusCode, headers: &[(String, String)], body: Value) -> Response {
    let mut response = (status, Json(body)).into_response();
    for (name, value) in headers {
        if let (Ok(name), Ok(value)) = (HeaderName::try_from(name.as_str()), HeaderValue::try_from(value)) {
            response.headers_mut().append(name, value);
        }
    }
    response
}

fn limit(l: &native::Limit) -> Value {
    json!({
        "rule": l.rule,
        "name": l.name,
        "algorithm": l.algorithm,
        "requests_per_unit": l.requests_per_unit,
        "unit": l.unit,
        "window": l.window.as_ref().map(duration_text),
        "burst": l.burst,
    })
}

fn check_result(r: &native::CheckResult) -> Value {
    json!({
        "allowed": r.allowed,
        "limit": r.limit.as_ref().map(limit),
        "remaining": r.remaining,
        "reset_after": r.reset_after.as_ref().map(duration_text),
        "retry_after": r.retry_after.as_ref().map(duration_text),
        "shadow": r.shadow,
        "unlimited": r.unlimited,
        "failure_mode_applied": r.failure_mode_applied,
    })
}
