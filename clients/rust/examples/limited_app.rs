//! An axum app that asks Tollgate before its expensive work, through the native API:
//!
//! - `/send-otp` (5 SMS an hour per phone number) and `/search` (per user) go through the tower layer:
//!   a refused request gets 429, `Retry-After` and Tollgate's rate-limit headers;
//! - `/export` spends one of the user's 3 exports a day and holds one of 2 concurrent export slots
//!   while it runs; an export that fails gets its daily budget back (refund);
//! - `/exports-left` peeks at the budget without spending it.
//!
//! ```sh
//! TOLLGATE_RESPONSE_HEADERS=ietf,retry-after tollgate serve --config-dir examples/config &
//! cargo run -p tollgate-client --example limited_app &
//! for i in 1 2 3 4 5 6; do curl -si -X POST 'http://127.0.0.1:3000/send-otp?phone=5550100' | head -1; done
//! curl -s -X POST -H 'x-user-id: ada' 'http://127.0.0.1:3000/export?fail=1'   # refunded
//! curl -s -H 'x-user-id: ada' http://127.0.0.1:3000/exports-left              # still 3
//! ```
//!
//! `TOLLGATE_ADDR` (default `http://127.0.0.1:8081`) and `APP_ADDR` (default `127.0.0.1:3000`) move them;
//! `TOLLGATE_DEADLINE_MS` sets each call's deadline (default the client's, 25 ms).

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, Request, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use tollgate_client::{Acquired, Client, Descriptor, FailurePolicy, RateLimitLayer};

/// The descriptors of a request, matching `examples/config/api.yaml`.
fn describe(request: &Request<Body>) -> Option<Vec<Descriptor>> {
    match request.uri().path() {
        "/send-otp" => {
            let phone = request
                .uri()
                .query()?
                .split('&')
                .find_map(|pair| pair.strip_prefix("phone="))?;
            Some(vec![Descriptor::from([("path", "/auth/otp"), ("phone", phone)])])
        }
        "/search" => {
            let user = request.headers().get("x-user-id")?.to_str().ok()?;
            Some(vec![Descriptor::from([("user_id", user)])])
        }
        _ => None,
    }
}

fn export_descriptor(headers: &HeaderMap) -> Option<[Descriptor; 1]> {
    let user = headers.get("x-user-id")?.to_str().ok()?;
    Some([Descriptor::from([("export_user", user)])])
}

fn refused(wait: Option<Duration>, message: &str) -> Response {
    // Whole seconds, rounded up: a client told to come back must not come back early.
    let seconds = wait.map_or(1, |d| d.as_micros().div_ceil(1_000_000).max(1));
    let headers = [(header::RETRY_AFTER, seconds.to_string())];
    (StatusCode::TOO_MANY_REQUESTS, headers, format!("{message}\n")).into_response()
}

/// Spends one of today's exports, holds an export slot while working, and refunds the export if the
/// work fails.
async fn export(State(client): State<Client>, uri: Uri, headers: HeaderMap) -> Response {
    // `?fail=1` simulates an export that fails after it started.
    let fail = uri
        .query()
        .is_some_and(|q| q.split('&').any(|pair| pair == "fail=1"));
    let Some(descriptors) = export_descriptor(&headers) else {
        return (StatusCode::BAD_REQUEST, "x-user-id required\n").into_response();
    };
    let result: Result<Response, tollgate_client::Error> = async {
        let budget = client.check(&descriptors, 1).await?;
        if !budget.allowed {
            return Ok(refused(budget.retry_after, "no exports left today"));
        }
        let lease = match client.acquire(&descriptors).await? {
            Acquired::Held(lease) => lease,
            Acquired::Refused { retry_after } => {
                // Not started after all: give the day's export back. The check's token is the
                // proof of what it consumed, the only way to give it back.
                if let Some(token) = &budget.refund_token {
                    client.refund(token, &descriptors, 0).await?;
                }
                return Ok(refused(retry_after, "two exports are already running"));
            }
        };
        // The expensive work, while the lease holds a slot.
        tokio::time::sleep(Duration::from_millis(200)).await;
        lease.release().await?;
        if fail {
            if let Some(token) = &budget.refund_token {
                client.refund(token, &descriptors, 0).await?;
            }
            return Ok((StatusCode::BAD_GATEWAY, "export failed; it did not count\n").into_response());
        }
        Ok("export ready\n".into_response())
    }
    .await;
    result.unwrap_or_else(|error| (StatusCode::SERVICE_UNAVAILABLE, format!("{error}\n")).into_response())
}

/// How many exports the user has left today, without spending one.
async fn exports_left(State(client): State<Client>, headers: HeaderMap) -> Response {
    let Some(descriptors) = export_descriptor(&headers) else {
        return (StatusCode::BAD_REQUEST, "x-user-id required\n").into_response();
    };
    match client.peek(&descriptors, 0).await {
        Ok(answer) => format!("{}\n", answer.remaining.unwrap_or(0)).into_response(),
        Err(error) => (StatusCode::SERVICE_UNAVAILABLE, format!("{error}\n")).into_response(),
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let tollgate = std::env::var("TOLLGATE_ADDR").unwrap_or_else(|_| "http://127.0.0.1:8081".into());
    let addr = std::env::var("APP_ADDR").unwrap_or_else(|_| "127.0.0.1:3000".into());
    // Exports are expensive: refuse them while Tollgate cannot be asked. A code or a search is cheap
    // next to a locked-out user: the layer's checks fail open (clones share the connection).
    let mut client = Client::connect_lazy(&tollgate, "api")?.with_failure_policy(FailurePolicy::Closed);
    if let Ok(millis) = std::env::var("TOLLGATE_DEADLINE_MS") {
        let millis = millis
            .parse()
            .map_err(|e| format!("TOLLGATE_DEADLINE_MS={millis:?}: not a number of milliseconds: {e}"))?;
        client = client.with_deadline(Duration::from_millis(millis));
    }
    let checks = client.clone().with_failure_policy(FailurePolicy::Open);
    let limited = Router::new()
        .route("/send-otp", post(|| async { "code sent\n" }))
        .route("/search", get(|| async { "results\n" }))
        .layer(RateLimitLayer::new(checks, describe));
    let app = Router::new()
        .route("/export", post(export))
        .route("/exports-left", get(exports_left))
        .with_state(client)
        .merge(limited);
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app).await?;
    Ok(())
}
