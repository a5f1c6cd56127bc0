//! What the limiter records for its operators: per-rule and per-method [`metrics`] (per request value
//! for `detailed_metric` rules, up to a cap), the callers most often limited ([`offenders`]) and a
//! sampled [`denial_log`]. Recording only: the server renders and exports them. (The debug log of
//! every decision is the limiter's own, `limiter/debug_line.rs`: it reads the limiter's answers.)

pub mod denial_log;
pub mod metrics;
pub mod offenders;
