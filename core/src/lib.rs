//! Tollgate's decision core: envoyproxy/ratelimit's rules files (and Tollgate's extensions), five
//! rate-limit algorithms, the embedded and Redis stores, and the limiter that decides a request with
//! them. No transport: the `tollgate` server crate puts gRPC, HTTP and xDS in front of it, and an
//! application can decide in-process with the same rules and the same Redis counters as a fleet of
//! Tollgate servers.
//!
//! # Layout
//!
//! Dependencies point downwards; the crate boundary keeps every transport out.
//!
//! - [`algorithm`]: the five algorithms as pure functions of (state, now, cost, limit).
//! - [`clock`]: the wall and monotonic time the limiter and its stores read.
//! - [`observe`]: what the limiter records for operators (metrics, top offenders, the denial log);
//!   exporting it is the server's job.
//! - [`rules`]: validated rules → lookup tree; descriptor matching and storage keys. [`rules::file`] is
//!   the rules-file format; [`rules::reload`] loads and hot-reloads a rules directory;
//!   [`rules::proxy`] turns a proxy's request (NGINX, Caddy, Traefik, HAProxy) into descriptors.
//! - [`store`]: where state lives; one atomic batch per request. [`store::memory`] is the embedded
//!   store (in this process's memory), `store::redis` the shared one (the default `redis` feature).
//! - [`limiter`]: the decision core: rules + store → a neutral verdict (exact counts and durations).
//! - [`embedded`]: the in-process limiter, which an application builds for itself from the rules files
//!   and the Redis of a Tollgate fleet (or, without Redis, over the embedded store). Not to be confused
//!   with the embedded store: the limiter is embedded in an application, the store in a process.

pub mod algorithm;
pub mod clock;
pub mod embedded;
pub mod limiter;
pub mod observe;
pub mod rules;
pub mod store;
