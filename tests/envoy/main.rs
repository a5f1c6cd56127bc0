//! Envoy in the loop: real Envoy processes in front of real `tollgate serve` processes, on loopback.
//! Each test starts its own Envoy (the upstream services are `direct_response` listeners of that same
//! Envoy), its own Tollgate and, where the story needs one, its own `redis-server`, and asserts what
//! the code controls: answers, headers and counts, never how long anything took.
//!
//! A pass of its own in `scripts/test.sh` (`cargo test --test envoy`), which installs the pinned Envoy
//! (`scripts/install-envoy.sh`) and sets `TOLLGATE_REQUIRE_ENVOY=1`; elsewhere, without an Envoy, every
//! test is skipped and the run says so.

// Test helpers are `pub` for the sibling modules; there is no API here to document.
#![allow(unreachable_pub, missing_docs)]

#[path = "../it/common/mod.rs"]
mod common;
mod harness;

mod descriptors;
mod envoy_gateway;
mod example;
mod failure_modes;
mod go_behaviours;
mod istio;
mod rolling_restart;
mod tls;
