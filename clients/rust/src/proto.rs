//! The generated `tollgate.v1` messages and client, for what [`crate::Client`] does not wrap (for example
//! a lease with its own TTL). Generated at build time from the server's `proto/tollgate/v1/ratelimiter.proto`.

#![allow(missing_docs, unreachable_pub, clippy::all)]

/// `tollgate.v1`: the native API (Check, Refund, Acquire, Release).
pub mod v1 {
    include!(concat!(env!("OUT_DIR"), "/tollgate.v1.rs"));
}
