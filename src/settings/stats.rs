//! The Go service's stats sinks: statsd (`USE_STATSD`) or DogStatsD (`USE_DOG_STATSD`), fed from the Go stat names
//! (`crate::observe::go_stats`), and how `/metrics` (always served) names them
//! (`PROMETHEUS_MAPPER_YAML`, `PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS`).

use std::time::Duration;

use regex::Regex;

use super::source::{Go, Reader};
use super::{ExtraTags, Origins, SettingsError, StatsdProtocol};

/// One DogStatsD mogrifier, as the Go service reads it.
#[derive(Debug, Clone)]
pub struct Mogrifier {
    /// A regular expression tried on each stat name (unanchored unless it says otherwise).
    pub pattern: Regex,
    /// The new name; `$1`… are the pattern's groups.
    pub name: String,
    /// Tags to add, `$1`… in their values too.
    pub tags: ExtraTags,
}

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
    /// `USE_DOG_STATSD`: push the stats to a DogStatsD agent (at `STATSD_HOST:STATSD_PORT`, over UDP)
    /// with tags instead of name suffixes.
    pub use_dog_statsd: bool,
    /// `USE_DOG_STATSD_MOGRIFIERS` with each one's `DOG_STATSD_MOGRIFIER_<ID>_PATTERN`, `_NAME` and
    /// `_TAGS`: rewrites of stat names into a name and tags, the first that matches applying.
    pub dog_statsd_mogrifiers: Vec<Mogrifier>,
    /// `DD_ENTITY_ID`, `DD_ENV`, `DD_SERVICE`, `DD_VERSION`: what the Go service's DogStatsD client
    /// (datadog-go) puts first on every metric, as `dd.internal.entity_id:…`, `env:…`, `service:…`,
    /// `version:…` (those set, in that order).
    pub dog_statsd_global_tags: Vec<String>,
    /// `PROMETHEUS_MAPPER_YAML`: a statsd_exporter mapping file naming the Go series in `/metrics`
    /// (empty: the Go service's default mapping).
    pub prometheus_mapper_yaml: String,
    /// `PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS`: with the default mapping, the response-time
    /// histogram in milliseconds (its name unchanged, as in Go).
    pub prometheus_response_time_as_milliseconds: bool,
    /// `TOLLGATE_DETAILED_METRIC_MAX_VALUES`: the distinct request values a `detailed_metric` rule
    /// counts apart; beyond them values fold into the rule's own series (0: every value does).
    pub detailed_metric_max_values: usize,
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
            use_dog_statsd: r.get("use_dog_statsd", Go::Same, false)?,
            dog_statsd_mogrifiers: mogrifiers(r)?,
            dog_statsd_global_tags: datadog_tags(r)?,
            prometheus_mapper_yaml: r.get("prometheus_mapper_yaml", Go::Same, String::new())?,
            prometheus_response_time_as_milliseconds: r.get(
                "prometheus_response_time_as_milliseconds",
                Go::Same,
                false,
            )?,
            detailed_metric_max_values: r.get(
                "detailed_metric_max_values",
                Go::None,
                tollgate_core::observe::metrics::DETAILED_METRIC_MAX_VALUES,
            )?,
        })
    }

    pub(super) fn validate(&self, origins: &Origins) -> Result<(), SettingsError> {
        if self.use_statsd && self.use_dog_statsd && !self.disable_stats {
            // The Go service refuses to start with both too.
            return Err(origins.bad(
                "use_dog_statsd",
                "true",
                "USE_STATSD and USE_DOG_STATSD are both on: choose one sink",
            ));
        }
        if (self.statsd() || self.dog_statsd()) && self.stats_flush_interval.is_zero() {
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

    /// Whether stats are pushed to a DogStatsD agent.
    pub fn dog_statsd(&self) -> bool {
        self.use_dog_statsd && !self.disable_stats
    }

    /// The statsd address, `host:port`.
    pub fn statsd_addr(&self) -> String {
        format!("{}:{}", self.statsd_host, self.statsd_port)
    }
}

/// datadog-go's global tags from its `DD_*` variables, in its order.
fn datadog_tags(r: &mut Reader<'_>) -> Result<Vec<String>, SettingsError> {
    let mut tags = Vec::new();
    for (key, tag) in [
        ("dd_entity_id", "dd.internal.entity_id"),
        ("dd_env", "env"),
        ("dd_service", "service"),
        ("dd_version", "version"),
    ] {
        let value: String = r.get(key, Go::Same, String::new())?;
        if !value.is_empty() {
            tags.push(format!("{tag}:{value}"));
        }
    }
    Ok(tags)
}

/// The mogrifiers `USE_DOG_STATSD_MOGRIFIERS` lists, in its order, each read from its
/// `DOG_STATSD_MOGRIFIER_<ID>_*` variables. A pattern that does not compile or a missing name stops
/// startup, as in the Go service.
fn mogrifiers(r: &mut Reader<'_>) -> Result<Vec<Mogrifier>, SettingsError> {
    let ids: String = r.get("use_dog_statsd_mogrifiers", Go::Same, String::new())?;
    let mut mogrifiers = Vec::new();
    for id in ids.split(',').map(str::trim).filter(|id| !id.is_empty()) {
        let key = |field: &str| format!("dog_statsd_mogrifier_{}_{field}", id.to_ascii_lowercase());
        let bad = |field: &str, value: &str, reason: String| SettingsError::BadValue {
            name: key(field).to_ascii_uppercase(),
            value: value.to_owned(),
            reason,
        };
        let pattern: String = r.get(&key("pattern"), Go::Same, String::new())?;
        let name: String = r.get(&key("name"), Go::Same, String::new())?;
        let tags: ExtraTags = r.get(&key("tags"), Go::Same, ExtraTags::default())?;
        if pattern.is_empty() {
            return Err(bad(
                "pattern",
                "",
                format!("mogrifier {id} listed in USE_DOG_STATSD_MOGRIFIERS has no pattern"),
            ));
        }
        if name.is_empty() {
            return Err(bad(
                "name",
                "",
                format!("mogrifier {id} listed in USE_DOG_STATSD_MOGRIFIERS has no name"),
            ));
        }
        if let Some((key, value)) = tags.0.iter().find(|(k, v)| k.is_empty() || v.is_empty()) {
            let tags = tags.to_string();
            return Err(bad(
                "tags",
                &tags,
                format!("tag '{key}:{value}' needs a key and a value"),
            ));
        }
        let pattern = Regex::new(&pattern).map_err(|e| bad("pattern", &pattern, e.to_string()))?;
        mogrifiers.push(Mogrifier { pattern, name, tags });
    }
    Ok(mogrifiers)
}
