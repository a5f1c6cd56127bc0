//! What Tollgate tells its operators beyond what the core records (`tollgate_core::observe`: metrics,
//! offenders, the denial log): the Prometheus exposition ([`prometheus`]), with the Go service's stats
//! named as it names them ([`go_stats`]), exposed as its default mapping or a statsd_exporter mapping
//! file makes them ([`go_series`], [`mapping`]) and pushed to statsd or DogStatsD ([`statsd`], [`dogstatsd`]); logs and trace
//! export ([`telemetry`], with the Go service's JSON lines in [`go_json`]); [`health`] as load balancers
//! and Kubernetes see it; the standard `process_*` series (`process`); and the [`decision_log`] that
//! `tollgate what-if` replays. None of it decides anything; the limiter and the listeners report into
//! it.

pub mod decision_log;
pub mod dogstatsd;
pub mod go_json;
pub mod go_series;
pub mod go_stats;
pub mod health;
pub mod mapping;
pub mod otlp;
mod process;
pub mod prometheus;
pub mod statsd;

pub use process::open_file_limit;
pub mod telemetry;
mod text_format;
pub mod trace_context;
