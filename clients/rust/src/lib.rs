//! A client for Tollgate's native rate-limit API (`tollgate.v1.RateLimiter`), for application servers:
//! checks with a cost, peeks, refunds and concurrency leases, plus tower layers that guard HTTP and gRPC
//! services with them.
//!
//! Two promises an application can build on:
//!
//! - **A slow or absent Tollgate never slows the application down.** Every call has a deadline
//!   ([`DEFAULT_DEADLINE`], 25 ms), and the connection is made lazily, so the application starts while
//!   Tollgate is down.
//! - **One failure policy** ([`FailurePolicy`], open by default) decides alike for a missed deadline,
//!   `UNAVAILABLE` and a connection error; decisions that failed open are counted
//!   ([`Client::failed_open`]). Errors Tollgate itself returns (an unknown domain, a forged refund
//!   token) are never hidden by the policy.
//!
//! ```no_run
//! use tollgate_client::{Acquired, Client, Descriptor};
//!
//! # async fn export(user: &str) -> Result<(), Box<dyn std::error::Error>> {
//! let client = Client::connect_lazy("http://127.0.0.1:8081", "api")?;
//! let descriptors = [Descriptor::from([("export_user", user)])];
//!
//! let budget = client.check(&descriptors, 1).await?;
//! if !budget.allowed {
//!     println!("no exports left; retry in {}s", budget.retry_after_secs());
//!     return Ok(());
//! }
//! let Acquired::Held(lease) = client.acquire(&descriptors).await? else {
//!     // Not started after all: give today's export back.
//!     if let Some(token) = &budget.refund_token {
//!         client.refund(token, &descriptors, 0).await?;
//!     }
//!     return Ok(());
//! };
//! // ... the export runs while the lease holds a slot ...
//! lease.release().await?;
//! # Ok(())
//! # }
//! ```
//!
//! The crate depends on tonic, prost, tower and http only (and tokio and tracing, which tonic brings).

mod client;
mod decision;
mod descriptor;
mod error;
mod layer;
mod lease;
pub mod proto;

pub use client::{Client, DEFAULT_DEADLINE, FailurePolicy};
pub use decision::{Decision, RefundToken, Refunded};
pub use descriptor::Descriptor;
pub use error::{ConnectError, Error};
pub use layer::{RateLimitLayer, RateLimited};
pub use lease::{Acquired, Lease};

/// The README's examples, compiled as doctests so they cannot drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
