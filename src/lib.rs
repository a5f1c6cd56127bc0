//! Tollgate: a rate-limit decision service that speaks Envoy's external rate limit protocol
//! (`envoy.service.ratelimit.v3.RateLimitService`), loads envoyproxy/ratelimit's YAML rules unchanged
//! and answers as it does, and adds token bucket, sliding window (counter and log), GCRA and fixed window
//! per rule, several limits per key, all-or-nothing requests, value normalisation and hashing.
//!
//! # Layout
//!
//! Dependencies point downwards; nothing below `grpc` knows about tonic.
//!
//! - [`algorithm`]: the five algorithms as pure functions of (state, now, cost, limit).
//! - [`config`]: rules files (envoyproxy/ratelimit's YAML plus Tollgate's keys) → validated model.
//! - [`rules`]: validated model → lookup tree; descriptor matching and storage keys.
//! - [`store`]: where state lives; one atomic batch per request. [`store::memory`] is the embedded store,
//!   [`store::redis`] the shared one, [`store::lease`] the concurrency leases.
//! - [`clock`]: time for the embedded store.
//! - [`limiter`]: the decision core: rules + store → verdict.
//! - [`grpc`]: Envoy's RateLimitService, the native `tollgate.v1.RateLimiter` ([`grpc::native`]), health,
//!   reflection. [`http`]: admin and debug HTTP endpoints; [`json_api`]: the native API as JSON.
//! - [`json`]: proto3 JSON of the Envoy messages. [`metrics`]: Prometheus metrics. [`offenders`]: the
//!   top-offender sketches.
//! - [`health`], [`reload`], [`settings`], [`telemetry`], [`server`], [`cli`]: running the service.
//!   [`denial_log`]: sampled logs of refusals.
//! - [`loadgen`]: `tollgate bench`, the load generator. [`client`]: a client and tower layer for
//!   application servers.
//! - [`proto`]: generated protocol types.

pub mod algorithm;
pub mod cli;
pub mod client;
pub mod clock;
pub mod config;
pub mod denial_log;
pub mod grpc;
pub mod health;
pub mod http;
pub mod json;
pub mod json_api;
pub mod limiter;
pub mod loadgen;
pub mod metrics;
pub mod offenders;
pub mod proto;
pub mod reload;
pub mod rules;
pub mod server;
pub mod settings;
pub mod store;
pub mod telemetry;
