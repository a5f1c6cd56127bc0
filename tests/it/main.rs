//! Tollgate's integration tests, in one binary so they link once. Each module is one area.

// Test helpers are `pub` for the sibling modules; there is no API here to document.
#![allow(unreachable_pub, missing_docs)]

mod common;

mod cli;
mod client;
mod compat;
mod connection_shares;
mod decision_log;
mod docs;
mod embedded;
mod envoy_gateway;
mod extensions;
mod faults;
mod forward_auth;
mod grpc;
mod headers;
mod hostile_input;
mod hot_keys;
mod json_endpoint;
mod limiter;
mod metrics;
mod native;
mod proxies;
mod redis_fixture;
mod redis_link;
mod redis_parity;
mod redis_state;
mod redis_store;
mod reload;
mod rules_file;
mod spelled_keys;
mod store_contract;
mod tls;
mod transport_bounds;
mod what_if;
mod xds;
