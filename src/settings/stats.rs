//! The Go service's stats sinks: statsd (`USE_STATSD`), fed from the Go stat names
//! (`crate::observe::go_stats`), and how `/metrics` (always served) names them
//! (`PROMETHEUS_MAPPER_YAML`, `PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS`).

use std::time::Duration;

use super::source::{Go, Reader};
use super::{ExtraTags, Origins, SettingsError, StatsdProtocol};

/// Where and how the Go stats are pushed.
#[derive(Debug, Clone)]
pub struct StatsSettings {
    /// `USE_STATSD`: push the Go stats to statsd. Off by default, where the Go service's default is
    /// on: Tollgate always serves them at `/metrics`, and a sink nobody listens to would only log.
    pub use_statsd: bool,
    /// `STATSD_HOST`.
    pub statsd_host: String,
    /// `STATSD_PORT`.
    pub statsd_port: u16,
    /// `STATSD_PROTOCOL`: `tcp` (the Go service's default, through gostats) or `udp`.
    pub statsd_protocol: StatsdProtocol,
    /// `STATS_FLUSH_INTERVAL`: how often counters' increases are sent.
    pub stats_flush_interval: Duration,
    /// `EXTRA_TAGS`: `key:value,…` on every stat.
    pub extra_tags: ExtraTags,
    /// `DISABLE_STATS`: no statsd, whatever `USE_STATSD` says (`/metrics` stays).
    pub disable_stats: bool,
    /// `PROMETHEUS_MAPPER_YAML`: a statsd_exporter mapping file naming the Go series in `/metrics`
    /// (empty: the Go service's default mapping).
    pub prometheus_mapper_yaml: String,
    /// `PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS`: with the default mapping, the response-time
    /// histogram in milliseconds (its name unchanged, as in Go).
    pub prometheus_response_time_as_milliseconds: bool,
}

impl StatsSettings {
    pub(super) fn read(r: &mut Reader<'_>) -> Result<Self, SettingsError> {
        Ok(Self {
            use_statsd: r.get("use_statsd", Go::Same, false)?,
            statsd_host: r.get("statsd_host", Go::Same, "localhost".into())?,
            statsd_port: r.get("statsd_port", Go::Same, 8125)?,
            statsd_protocol: r.get("statsd_protocol", Go::Same, StatsdProtocol::Tcp)?,
            stats_flush_interval: r.get("stats_flush_interval", Go::Same, Duration::from_secs(10))?,
            extra_tags: r.get("extra_tags", Go::Same, ExtraTags::default())?,
            disable_stats: r.get("disable_stats", Go::Same, false)?,
            prometheus_mapper_yaml: r.get("prometheus_mapper_yaml", Go::Same, String::new())?,
            prometheus_response_time_as_milliseconds: r.get(
                "prometheus_response_time_as_milliseconds",
                Go::Same,
                false,
            )?,
        })
    }

    pub(super) fn validate(&self, origins: &Origins) -> Result<(), SettingsError> {
        if self.statsd() && self.stats_flush_interval.is_zero() {
            return Err(origins.bad(
                "stats_flush_interval",
                "0s",
                "stats would be flushed in a busy loop",
            ));
        }
        Ok(())
    }

    /// Settings given that change nothing, as warnings.
    pub(super) fn unused(&self, warnings: &mut Vec<String>) {
        if !self.prometheus_mapper_yaml.is_empty() && self.prometheus_response_time_as_milliseconds {
            warnings.push(
                "ignoring PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS: PROMETHEUS_MAPPER_YAML is given, and its \
                 `scale` decides the unit (as in the Go service)"
                    .into(),
            );
        }
    }

    /// Whether stats are pushed to statsd.
    pub fn statsd(&self) -> bool {
        self.use_statsd && !self.disable_stats
    }

    /// The statsd address, `host:port`.
    pub fn statsd_addr(&self) -> String {
        format!("{}:{}", self.statsd_host, self.statsd_port)
    }
}
