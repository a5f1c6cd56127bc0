//! The HTTP listeners: the admin port (`/healthcheck`, as envoyproxy/ratelimit) and the debug port
//! (`/rlconfig`, the loaded rules one per line, as envoyproxy/ratelimit).

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;

use crate::health::Health;
use crate::limiter::RulesHandle;

/// The admin port's routes.
pub fn admin_router(health: Health) -> Router {
    Router::new()
        .route("/healthcheck", get(healthcheck))
        .with_state(health)
}

/// The debug port's routes.
pub fn debug_router(rules: RulesHandle) -> Router {
    Router::new()
        .route("/", get(index))
        .route("/rlconfig", get(rlconfig))
        .with_state(rules)
}

async fn healthcheck(State(health): State<Health>) -> (StatusCode, &'static str) {
    if health.is_ready() {
        (StatusCode::OK, "OK")
    } else {
        (StatusCode::INTERNAL_SERVER_ERROR, "NOT OK")
    }
}

async fn index() -> &'static str {
    "/rlconfig: print out the currently loaded configuration for debugging\n"
}

async fn rlconfig(State(rules): State<RulesHandle>) -> String {
    rules.load().as_ref().map(|set| set.dump()).unwrap_or_default()
}
