//! The HTTP listeners: the admin port (`/healthcheck` and `POST /json`, as envoyproxy/ratelimit,
//! `/metrics`, and the native API's `POST /v1/*`, see [`crate::json_api`]) and the debug port (`/rlconfig`, the loaded rules one per line, as envoyproxy/ratelimit,
//! and `/metrics`).

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};

use crate::grpc::envoy_rls::build_response;
use crate::grpc::{EnvoyOptions, NativeService};
use crate::health::Health;
use crate::json::{request_from_json, response_to_json};
use crate::limiter::{Code, Limiter};
use crate::store::AnyStore;

/// What the admin endpoints need.
#[derive(Debug)]
pub struct Admin {
    /// Readiness, for `/healthcheck`.
    pub health: Health,
    /// The decision core, for `/json`.
    pub limiter: Arc<Limiter<AnyStore>>,
    /// The same response options as the gRPC service (headers, dynamic metadata).
    pub options: EnvoyOptions,
}

/// The admin port's routes.
pub fn admin_router(admin: Admin) -> Router {
    let metrics = Router::new()
        .route("/metrics", get(metrics))
        .with_state(Arc::clone(&admin.limiter));
    let native = crate::json_api::router(Arc::new(NativeService::new(
        Arc::clone(&admin.limiter),
        admin.options.headers.clone(),
    )));
    Router::new()
        .route("/healthcheck", get(healthcheck))
        .route("/json", post(json))
        .with_state(Arc::new(admin))
        .merge(metrics)
        .merge(native)
}

/// The debug port's routes.
pub fn debug_router(limiter: Arc<Limiter<AnyStore>>) -> Router {
    Router::new()
        .route("/", get(index))
        .route("/rlconfig", get(rlconfig))
        .route("/metrics", get(metrics))
        .route("/top", get(top))
        .route("/config", get(config_version))
        .with_state(limiter)
}

async fn healthcheck(State(admin): State<Arc<Admin>>) -> (StatusCode, &'static str) {
    if admin.health.is_ready() {
        (StatusCode::OK, "OK")
    } else {
        (StatusCode::INTERNAL_SERVER_ERROR, "NOT OK")
    }
}

/// envoyproxy/ratelimit's `/json`: 200 when OK, 429 when over the limit, 400 for a body that is not a
/// request and for any service error (Redis included), as the Go service answers.
async fn json(State(admin): State<Arc<Admin>>, body: Bytes) -> Response {
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

async fn index() -> &'static str {
    "/rlconfig: print out the currently loaded configuration for debugging\n/metrics: Prometheus metrics\n/top: callers most often refused or near their limit, per domain (JSON)\n/config: the loaded rules' version and load time (JSON)\n"
}

async fn rlconfig(State(limiter): State<Arc<Limiter<AnyStore>>>) -> String {
    limiter
        .rules()
        .load()
        .as_ref()
        .map(|set| set.dump())
        .unwrap_or_default()
}

/// The loaded rules: `{"version": "<content hash>", "loaded_at": <unix seconds>, "domains": N}`.
async fn config_version(State(limiter): State<Arc<Limiter<AnyStore>>>) -> Response {
    let (version, loaded_at) = limiter.metrics().loaded_version();
    let domains = limiter.rules().load().as_ref().map_or(0, |set| set.len());
    let body = serde_json::json!({ "version": version, "loaded_at": loaded_at, "domains": domains });
    ([(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
}

/// Callers listed per domain by `/top`.
const TOP_LISTED: usize = 20;

/// The top offenders as JSON: `{"domain": [{"key": ..., "count": ..., "error": ...}, ...]}`.
async fn top(State(limiter): State<Arc<Limiter<AnyStore>>>) -> Response {
    let body = serde_json::to_string(&limiter.offenders().top(TOP_LISTED)).unwrap_or_else(|_| "{}".into());
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// Prometheus text exposition format 0.0.4.
async fn metrics(State(limiter): State<Arc<Limiter<AnyStore>>>) -> Response {
    let body = limiter.metrics().render(limiter.store().counters());
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        body,
    )
        .into_response()
}
