//! What Tollgate tells its operators: Prometheus [`metrics`], the [`offenders`] most often limited, a
//! sampled [`denial_log`], logs and trace export ([`telemetry`], with the Go service's JSON lines in
//! [`go_json`]), and [`health`] as load balancers and
//! Kubernetes see it, and the standard `process_*` series (`process`). None of it decides anything; the limiter and the listeners report into it.

pub mod denial_log;
pub mod go_json;
pub mod health;
pub mod metrics;
pub mod offenders;
mod process;
pub mod telemetry;
pub mod trace_context;
