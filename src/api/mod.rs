//! The two protocols' messages ↔ the limiter, with no transport. The gRPC listener ([`crate::grpc`])
//! and the HTTP listeners ([`crate::http`]) both answer through these modules, so a call means the same
//! on either port.
//!
//! - [`envoy`]: Envoy's `RateLimitRequest`/`RateLimitResponse`, encoded exactly as envoyproxy/ratelimit
//!   does (`u32` counts, whole seconds, dynamic metadata).
//! - [`native`]: `tollgate.v1.RateLimiter`'s messages (exact `u64` counts and durations).
//! - [`headers`]: the rate-limit response headers and 429 body both protocols hand out.
//! - [`json`]: the proto3 JSON form of Envoy's messages, for `POST /json`.

pub mod envoy;
pub mod headers;
pub mod json;
pub mod native;

use std::time::Duration;

/// A duration in whole seconds, rounded up: a client told to wait `n` seconds is never early.
pub fn whole_seconds(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}
