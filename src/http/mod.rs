//! The HTTP listeners' routes, over the limiter through [`crate::api`] (never through gRPC):
//!
//! - the admin port: `/healthcheck` and `POST /json` (`envoy_json.rs`) as envoyproxy/ratelimit,
//!   `/metrics`, proxies' `/forward-auth/{domain}` (`forward_auth.rs`), and the native API's
//!   `POST /v1/*` (`native_json.rs`), unless the native API has a listener of its own
//!   (`TOLLGATE_NATIVE_HTTP_ADDR`, [`native_router`]);
//! - the debug port: `/rlconfig` (the loaded rules one per line, as envoyproxy/ratelimit), `/metrics`,
//!   `/top` and `/config`;
//! - with `USE_PROMETHEUS`, the Go service's metrics listener (`PROMETHEUS_ADDR`, `PROMETHEUS_PATH`).

mod envoy_json;
mod forward_auth;
mod native_json;
mod serve;

pub use serve::{HttpLimits, serve};

use std::sync::Arc;

use axum::Router;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use crate::api::envoy::{EnvoyApi, EnvoyOptions};
use crate::api::native::NativeApi;
use crate::observe::go_series::GoSeries;
use crate::observe::health::Health;
use crate::server_counters::ServerCounters;
use tollgate_core::limiter::Limiter;
use tollgate_core::store::AnyStore;

/// What the admin endpoints need.
#[derive(Debug)]
pub struct Admin {
    /// Readiness, for `/healthcheck`.
    pub health: Health,
    /// The decision core, for `/json`.
    pub limiter: Arc<Limiter<AnyStore>>,
    /// The server's own counters, for `/metrics` and `/forward-auth/{domain}`.
    pub counters: Arc<ServerCounters>,
    /// The same response options as the gRPC service (headers, dynamic metadata).
    pub options: EnvoyOptions,
    /// Largest request body read (`/json`, `/v1/*`); a larger one is refused with 413 unread.
    pub max_body_bytes: usize,
    /// Whether the native API's `/v1/*` is served here (not when it has a listener of its own).
    pub with_native: bool,
    /// How `/metrics` names the Go series.
    pub go: GoSeries,
}

/// The admin port's routes.
pub fn admin_router(admin: Admin) -> Router {
    let metrics = metrics_router(
        "/metrics",
        Exposition {
            limiter: Arc::clone(&admin.limiter),
            counters: Arc::clone(&admin.counters),
            go: admin.go.clone(),
        },
    );
    let native = admin
        .with_native
        .then(|| native_router(&admin.limiter, &admin.options, admin.max_body_bytes));
    let body_limit = DefaultBodyLimit::max(admin.max_body_bytes);
    let envoy = envoy_json::router(Arc::new(EnvoyApi::new(
        Arc::clone(&admin.limiter),
        admin.options.clone(),
    )));
    let forward_auth = forward_auth::router(
        Arc::clone(&admin.limiter),
        Arc::clone(&admin.counters),
        &admin.options.headers,
    );
    let router = Router::new()
        .route("/healthcheck", get(healthcheck))
        .route("/readyz", get(readyz))
        .with_state(Arc::new(admin))
        .merge(envoy)
        .merge(metrics)
        .merge(forward_auth)
        .layer(body_limit);
    match native {
        Some(native) => router.merge(native),
        None => router,
    }
}

/// The native API as JSON (`POST /v1/check`, `/v1/refund`, `/v1/acquire`, `/v1/release`), bodies up to
/// `max_body_bytes`.
pub fn native_router(
    limiter: &Arc<Limiter<AnyStore>>,
    options: &EnvoyOptions,
    max_body_bytes: usize,
) -> Router {
    native_json::router(Arc::new(NativeApi::new(
        Arc::clone(limiter),
        options.headers.clone(),
    )))
    .layer(DefaultBodyLimit::max(max_body_bytes))
}

/// The debug port's routes.
pub fn debug_router(exposition: Exposition) -> Router {
    let metrics = metrics_router("/metrics", exposition.clone());
    Router::new()
        .route("/", get(index))
        .route("/rlconfig", get(rlconfig))
        .route("/top", get(top))
        .route("/config", get(config_version))
        .with_state(exposition.limiter)
        .merge(metrics)
}

/// The Go service's Prometheus listener (`USE_PROMETHEUS`): the metrics alone, at `path`, so existing
/// scrape configs keep working.
pub fn prometheus_router(exposition: Exposition, path: &str) -> Router {
    metrics_router(path, exposition)
}

/// What `/metrics` reads: the limiter's counters, the server's, and how the Go series are named.
#[derive(Debug, Clone)]
pub struct Exposition {
    /// The limiter, whose metrics and store counters are exposed.
    pub limiter: Arc<Limiter<AnyStore>>,
    /// The counters only the server keeps (listeners, forward auth, decision log, statsd).
    pub counters: Arc<ServerCounters>,
    /// The Go series' names: the Go service's default mapping, or `PROMETHEUS_MAPPER_YAML`'s.
    pub go: GoSeries,
}

fn metrics_router(path: &str, exposition: Exposition) -> Router {
    Router::new()
        .route(path, get(metrics))
        .with_state(Arc::new(exposition))
}

/// Whether `path` is one of the health checks (`/healthcheck`, `/readyz`): requests that alone do not
/// put a connection in use ([`crate::connections`]).
pub(crate) fn is_health_check(path: &str) -> bool {
    matches!(path, "/healthcheck" | "/readyz")
}

/// envoyproxy/ratelimit's health check: 200 `OK` when ready, else 500 (see [`Health::is_ready`]).
async fn healthcheck(State(admin): State<Arc<Admin>>) -> (StatusCode, &'static str) {
    answer(admin.health.is_ready())
}

/// Readiness that also needs the store to answer now, for operators who want Kubernetes to take
/// replicas out of the Service during a store outage (see [`Health::is_ready_with_store`]).
async fn readyz(State(admin): State<Arc<Admin>>) -> (StatusCode, &'static str) {
    answer(admin.health.is_ready_with_store())
}

fn answer(ready: bool) -> (StatusCode, &'static str) {
    if ready {
        (StatusCode::OK, "OK")
    } else {
        (StatusCode::INTERNAL_SERVER_ERROR, "NOT OK")
    }
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
async fn metrics(State(exposition): State<Arc<Exposition>>) -> Response {
    let limiter = &exposition.limiter;
    let body = crate::observe::prometheus::render(
        limiter.metrics(),
        &exposition.counters,
        limiter.store_counters(),
        &exposition.go,
    );
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        body,
    )
        .into_response()
}
