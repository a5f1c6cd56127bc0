//! Forward auth for proxies that cannot speak Envoy's protocol: NGINX (`auth_request`), Caddy
//! (`forward_auth`), Traefik (`ForwardAuth`) and HAProxy (a Lua action), on the admin port.
//!
//! `ANY /forward-auth/{domain}`: the proxy sends the client's request headers (never its body) with
//! the request's method, URI, host and scheme in `X-Forwarded-Method`, `-Uri`, `-Host`, `-Proto`, and
//! the client's address in `X-Forwarded-For`. The domain's `proxy:` block turns them into descriptors
//! ([`tollgate_core::proxy`]), and they are decided as Envoy's `ShouldRateLimit` decides them: the same
//! rules, counters, shadow mode, all-or-nothing and failure modes. The answer:
//!
//! - allowed, or no descriptor made: 200, no body, with the `RateLimit`/`RateLimit-Policy` headers
//!   (and the styles `TOLLGATE_RESPONSE_HEADERS` or `LIMIT_RESPONSE_HEADERS_ENABLED` add) for the
//!   proxy to copy;
//! - refused: 429 with `Retry-After`, the same headers and `{"error":"rate_limited","retry_after":N}`;
//!   `?refused_status=403` (or 401) answers with that status instead, for NGINX, whose `auth_request`
//!   takes nothing else as a refusal;
//! - a request that cannot be read (no client address, a garbled cost): as the block's
//!   `failure_mode` says (200 or the refusal), else 400 naming the header;
//! - no loaded domain of that name has a `proxy:` block: 404; nothing can be decided (the store
//!   failed with no rule `failure_mode`, no rules loaded): 503, for the proxy's own failure setting.
//!
//! No header the block does not name is read; no header value reaches a log or an answer.

use std::borrow::Cow;
use std::sync::{Arc, Mutex, PoisonError};

use axum::Router;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::any;

use crate::api::headers::{HeaderOptions, headers, raw_body};
use crate::connections::RateLimitedLog;
use crate::server_counters::{ForwardAuthAnswer, ServerCounters};
use tollgate_core::limiter::{Code, ErrorKind, Limiter, Verdict};
use tollgate_core::rules::proxy::{BadRequest, BadRequestAnswer, ProxiedRequest};
use tollgate_core::store::AnyStore;

/// What the endpoint needs.
#[derive(Debug)]
struct ForwardAuth {
    limiter: Arc<Limiter<AnyStore>>,
    /// Where the answers, and the requests that came with a body, are counted.
    counters: Arc<ServerCounters>,
    /// The configured header styles, with `RateLimit`/`RateLimit-Policy` and `Retry-After` always on.
    headers: HeaderOptions,
    /// The warning that a proxy forwards request bodies, at most once a minute.
    bodies: Mutex<RateLimitedLog>,
}

/// The `/forward-auth/{domain}` route, answering with `headers`' styles (and always the IETF
/// `RateLimit` fields and `Retry-After`); answers are counted in `counters`.
pub(super) fn router(
    limiter: Arc<Limiter<AnyStore>>,
    counters: Arc<ServerCounters>,
    headers: &HeaderOptions,
) -> Router {
    let headers = HeaderOptions {
        ietf: true,
        retry_after: true,
        raw_body: true,
        ..headers.clone()
    };
    let state = ForwardAuth {
        limiter,
        counters,
        headers,
        bodies: Mutex::default(),
    };
    Router::new()
        .route("/forward-auth/{domain}", any(forward_auth))
        .with_state(Arc::new(state))
}

/// The request's headers as the `proxy:` block reads them.
struct Forwarded<'a>(&'a HeaderMap);

impl ProxiedRequest for Forwarded<'_> {
    fn values(&self, name: &str) -> impl Iterator<Item = Cow<'_, str>> {
        self.0.get_all(name).iter().map(|value| text(value.as_bytes()))
    }
}

/// A header value as text: UTF-8 when it is, else each byte its Latin-1 character (HTTP allows such
/// bytes; read this way, distinct values stay distinct).
fn text(bytes: &[u8]) -> Cow<'_, str> {
    match std::str::from_utf8(bytes) {
        Ok(text) => Cow::Borrowed(text),
        Err(_) => Cow::Owned(bytes.iter().map(|&b| char::from(b)).collect()),
    }
}

async fn forward_auth(
    State(api): State<Arc<ForwardAuth>>,
    Path(domain): Path<String>,
    request: Request,
) -> Response {
    let refused = match refused_status(request.uri().query()) {
        Ok(status) => status,
        Err(message) => return plain(StatusCode::BAD_REQUEST, message),
    };
    if carries_body(request.headers()) {
        api.counters.forward_auth_bodies.add(1);
        api.bodies.lock().unwrap_or_else(PoisonError::into_inner).warn(
            "a proxy forwards request bodies to /forward-auth (never read): turn that off",
            &domain,
            "see docs/proxies.md",
        );
    }
    let (answer, response) = api.decide(&domain, request.headers(), refused).await;
    api.counters.forward_auth(answer);
    response
}

impl ForwardAuth {
    async fn decide(
        &self,
        domain: &str,
        headers: &HeaderMap,
        refused: StatusCode,
    ) -> (ForwardAuthAnswer, Response) {
        let rules = self.limiter.rules().load_full();
        let Some(proxy) = rules
            .as_deref()
            .and_then(|r| r.domain(domain))
            .and_then(|d| d.proxy())
        else {
            let answer = if rules.is_none() {
                (ForwardAuthAnswer::Error, unavailable())
            } else {
                let message = "no loaded domain of this name has a proxy block (docs/proxies.md)";
                (
                    ForwardAuthAnswer::NoProxyBlock,
                    plain(StatusCode::NOT_FOUND, message),
                )
            };
            return answer;
        };
        let request = Forwarded(headers);
        let descriptors = match proxy.descriptors(&request) {
            Ok(descriptors) => descriptors,
            Err(bad) => return self.unreadable(&bad, proxy.failure_mode, refused),
        };
        if descriptors.is_empty() {
            return (ForwardAuthAnswer::NotLimited, allowed(Vec::new()));
        }
        match self.limiter.forward_auth(domain, &descriptors).await {
            Ok(verdict) => self.answer(&verdict, refused),
            Err(error) if error.kind() == ErrorKind::InvalidRequest => (
                ForwardAuthAnswer::Unreadable,
                plain(StatusCode::BAD_REQUEST, error.to_string()),
            ),
            // The answer may reach the client (Caddy and Traefik return it as it is): what failed
            // is the operator's to read, in the metrics and the store's own log lines.
            Err(_) => (ForwardAuthAnswer::Error, unavailable()),
        }
    }

    /// The answer to a verdict: 200, or the refusal, with the rate-limit headers.
    fn answer(&self, verdict: &Verdict, refused: StatusCode) -> (ForwardAuthAnswer, Response) {
        let fields = headers(verdict.overall, &verdict.statuses, &self.headers);
        if verdict.overall == Code::Ok {
            return (ForwardAuthAnswer::Allowed, allowed(fields));
        }
        let body = raw_body(verdict.overall, &verdict.statuses, &self.headers);
        (ForwardAuthAnswer::Refused, refusal(refused, fields, body))
    }

    /// The answer to a request that could not be read, as the domain's `proxy.failure_mode` says.
    fn unreadable(
        &self,
        bad: &BadRequest,
        failure_mode: Option<BadRequestAnswer>,
        refused: StatusCode,
    ) -> (ForwardAuthAnswer, Response) {
        match failure_mode {
            Some(BadRequestAnswer::Open) => (ForwardAuthAnswer::UnreadableAllowed, allowed(Vec::new())),
            Some(BadRequestAnswer::Closed) => {
                let body = format!(
                    "{{\"error\":\"unreadable_request\",\"reason\":\"{}\"}}",
                    bad.reason()
                );
                let response = refusal(refused, Vec::new(), body.into_bytes());
                (ForwardAuthAnswer::UnreadableRefused, response)
            }
            None => (
                ForwardAuthAnswer::Unreadable,
                plain(StatusCode::BAD_REQUEST, bad.to_string()),
            ),
        }
    }
}

/// `refused_status` from the query: 429 by default, or 401 or 403 for NGINX.
fn refused_status(query: Option<&str>) -> Result<StatusCode, String> {
    let mut status = StatusCode::TOO_MANY_REQUESTS;
    for pair in query.unwrap_or_default().split('&').filter(|p| !p.is_empty()) {
        status = match pair {
            "refused_status=429" => StatusCode::TOO_MANY_REQUESTS,
            "refused_status=403" => StatusCode::FORBIDDEN,
            "refused_status=401" => StatusCode::UNAUTHORIZED,
            _ => {
                return Err(
                    "the only query parameter is refused_status, one of 429 (the default), 403 or \
                     401; a proxy that appends the client's query string to this URL must be told not to \
                     (docs/proxies.md)"
                        .to_owned(),
                );
            }
        };
    }
    Ok(status)
}

/// Whether the request announces a body (which a proxy should not forward here).
fn carries_body(headers: &HeaderMap) -> bool {
    let length = headers
        .get(header::CONTENT_LENGTH)
        .is_some_and(|length| length.as_bytes() != b"0");
    length || headers.contains_key(header::TRANSFER_ENCODING)
}

fn allowed(fields: Vec<(String, String)>) -> Response {
    with_fields(StatusCode::OK, fields, Vec::new())
}

fn refusal(status: StatusCode, fields: Vec<(String, String)>, body: Vec<u8>) -> Response {
    let mut response = with_fields(status, fields, body);
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// A response with the rate-limit header fields, never cached by the proxy.
fn with_fields(status: StatusCode, fields: Vec<(String, String)>, body: Vec<u8>) -> Response {
    let mut response = Response::new(axum::body::Body::from(body));
    *response.status_mut() = status;
    let out = response.headers_mut();
    out.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    for (name, value) in fields {
        // The names are ours or the operator's (checked at startup) and the values are numbers and
        // policy names, so neither fails; a field that did would be left out, not the answer.
        if let (Ok(name), Ok(value)) = (HeaderName::try_from(name), HeaderValue::try_from(value)) {
            out.append(name, value);
        }
    }
    response
}

fn plain(status: StatusCode, message: impl Into<String>) -> Response {
    let mut message = format!("tollgate: {}", message.into());
    message.push('\n');
    (status, [(header::CACHE_CONTROL, "no-store")], message).into_response()
}

/// 503: nothing can be decided now (the store failed and no rule's `failure_mode` answers, or no rules
/// are loaded).
fn unavailable() -> Response {
    let mut response = plain(StatusCode::SERVICE_UNAVAILABLE, "no decision can be made now");
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    response
}
