//! Tollgate: a rate-limit decision service that speaks Envoy's external rate limit protocol
//! (`envoy.service.ratelimit.v3.RateLimitService`), loads envoyproxy/ratelimit's YAML rules unchanged
//! and answers as it does, and adds token bucket, sliding window (counter and log), GCRA and fixed window
//! per rule, several limits per key, all-or-nothing requests, value normalisation and hashing.
//!
//! # Layout
//!
//! This crate is the server; the decision core is the `tollgate_core` crate (rules, algorithms,
//! stores, the limiter), which has no transport. Dependencies point downwards. Only [`grpc`] serves
//! tonic services and only [`http`] builds axum routes and serves them (with hyper). The exceptions, by
//! design: [`server`] starts the listeners and the health reporter, [`cli`] and `loadgen` call Tollgate as tonic
//! clients, `loadgen`'s stand-ins for measurements serve tonic (and, for proxies, axum) themselves,
//! [`xds`] is a tonic client of the management server, [`observe::health`] drives
//! tonic-health's reporter, and [`proto`] is tonic's generated code.
//!
//! - [`api`]: the protocols' messages ↔ the limiter, no transport: Envoy's ([`api::envoy`], with its
//!   `u32` and whole-second encoding), the native `tollgate.v1` ([`api::native`]), response headers,
//!   proto3 JSON.
//! - [`grpc`]: the gRPC listener (tonic): Envoy's RateLimitService, `tollgate.v1.RateLimiter`, health,
//!   reflection, server spans. [`http`]: the admin and debug listeners' routes (axum).
//! - [`xds`]: rules over xDS (`CONFIG_TYPE=GRPC_XDS_SOTW`), an ADS client.
//! - [`observe`]: the Prometheus exposition of the core's metrics, logs and trace export, health
//!   (which drives tonic-health's reporter for `grpc.health.v1`); [`server_counters`]: the counters
//!   only the server keeps (its listeners' bounds, forward auth, the decision log, statsd).
//! - [`inflight`]: the bounds on unfinished requests both listeners share (bytes, read timeout);
//!   [`connections`]: each listener's connection cap, where connections that sent nothing give way.
//! - [`settings`], [`server`], [`cli`]: configuring, wiring and running the service; [`pem`]: the
//!   certificate and key files TLS reads; `allocator` (private): the nudge that makes mimalloc give
//!   back what a rules load freed, installed by [`server`] as the core's hook.
//! - `loadgen` (private): what the measurements use: `tollgate bench` (the load generator),
//!   `tollgate noop-serve` (a server that decides nothing, the floor) and `tollgate xds-serve` (a
//!   management server that pushes one rules directory);
//!   [`rules_as_xds`]: rules files as the `RateLimitConfig`s a management server would push, for
//!   `tollgate xds-serve` and the test suites' rules-over-xDS pass (not used by the server itself).
//! - `what_if` (private): `tollgate what-if`, recorded traffic replayed against two rule sets.
//! - The client for application servers is a crate of its own, `tollgate-client` (`clients/rust`), with
//!   no server dependencies.
//! - [`proto`]: generated protocol types.

mod allocator;
pub mod api;
pub mod cli;
pub mod connections;
pub mod grpc;
pub mod http;
pub mod huge_pages;
pub mod inflight;
mod loadgen;
pub mod observe;
pub mod pem;
pub mod proto;
pub mod rules_as_xds;
pub mod server;
pub mod server_counters;
pub mod settings;
mod what_if;
pub mod write_timeout;
pub mod xds;
