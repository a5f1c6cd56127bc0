//! What Tollgate tells its operators beyond what the core records (`tollgate_core::observe`: metrics,
//! offenders, the denial log): logs and trace export ([`telemetry`], with the Go service's JSON lines in
//! [`go_json`]), [`health`] as load balancers and Kubernetes see it, and the standard `process_*` series
//! (`process`). None of it decides anything; the limiter and the listeners report into it.

pub mod go_json;
pub mod go_stats;
pub mod health;
pub mod otlp;
mod process;
pub mod prometheus;
pub mod statsd;

pub use process::open_file_limit;
pub mod telemetry;
pub mod trace_context;
