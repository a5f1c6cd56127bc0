//! An axum app that asks Tollgate before its expensive work: `/send-otp` (5 SMS an hour per phone number)
//! and `/search` (per user). Refused requests get 429, `Retry-After` and Tollgate's rate-limit headers.
//!
//! ```sh
//! TOLLGATE_RESPONSE_HEADERS=ietf,retry-after tollgate serve --config-dir examples/config &
//! cargo run --example limited_app &
//! for i in 1 2 3 4 5 6; do curl -si -X POST 'http://127.0.0.1:3000/send-otp?phone=5550100' | head -1; done
//! ```
//!
//! `TOLLGATE_ADDR` (default `http://127.0.0.1:8081`) and `APP_ADDR` (default `127.0.0.1:3000`) move them.

use axum::Router;
use axum::body::Body;
use axum::http::Request;
use axum::routing::{get, post};
use tollgate::client::{Client, Descriptor, RateLimitLayer};

/// The descriptors of a request, matching `examples/config/api.yaml`.
fn describe(request: &Request<Body>) -> Option<Vec<Descriptor>> {
    match request.uri().path() {
        "/send-otp" => {
            let phone = request
                .uri()
                .query()?
                .split('&')
                .find_map(|pair| pair.strip_prefix("phone="))?;
            Some(vec![vec![
                ("path".into(), "/auth/otp".into()),
                ("phone".into(), phone.into()),
            ]])
        }
        "/search" => {
            let user = request.headers().get("x-user-id")?.to_str().ok()?;
            Some(vec![vec![("user_id".into(), user.into())]])
        }
        _ => None,
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let tollgate = std::env::var("TOLLGATE_ADDR").unwrap_or_else(|_| "http://127.0.0.1:8081".into());
    let addr = std::env::var("APP_ADDR").unwrap_or_else(|_| "127.0.0.1:3000".into());
    let client = Client::connect(tollgate, "api").await?;
    let app = Router::new()
        .route("/send-otp", post(|| async { "code sent\n" }))
        .route("/search", get(|| async { "results\n" }))
        .layer(RateLimitLayer::new(client, describe));
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app).await?;
    Ok(())
}
