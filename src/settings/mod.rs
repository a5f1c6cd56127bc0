//! Service settings, by section: how the server listens ([`ListenSettings`]), where rules come from
//! ([`RulesSettings`]), where counters live ([`StoreSettings`], whose [`RedisEndpoint`] describes both
//! the main and the per-second Redis), how requests are decided ([`DecisionSettings`]) and answered
//! ([`AnswerSettings`]), and what operators are told ([`StatsSettings`], [`TelemetrySettings`]).
//!
//! Each setting is read in one line of its section: its key (the settings file's name for it, and
//! `TOLLGATE_` + its upper case), envoyproxy/ratelimit's name for it, and its default. Layers, later
//! wins: the default, an optional YAML settings file, the Go variable, the `TOLLGATE_*` variable, the
//! command-line flag ([`source`]). Adding a setting is that line, its field, and its row in
//! docs/settings.md (a test holds the document to the code).
//!
//! Settings are a leaf: typed values, checked once when loaded (a Redis URL is parsed into the
//! store's `RedisTarget` then, so a bad one stops startup; defaults are the parts' own constants).
//! They build no part's options: `crate::server::options` turns them into the store's, the
//! limiter's, the listeners' and the others', in that one place.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

mod answers;
mod decisions;
pub mod go_env;
mod listen;
mod rules;
pub mod source;
mod stats;
mod store;
mod telemetry;
mod values;

pub use answers::AnswerSettings;
pub use decisions::DecisionSettings;
pub use listen::{
    DEFAULT_MAX_CONCURRENT_STREAMS, DEFAULT_MAX_REQUEST_BYTES, ListenSettings, RESERVED_FILES,
    default_workers,
};
pub use rules::{DEFAULT_CONFIG_DIR, RulesSettings, XdsSettings};
pub use stats::{Mogrifier, StatsSettings};
pub use store::{RedisEndpoint, StoreSettings};
pub use telemetry::TelemetrySettings;
pub use values::{
    ConfigType, ExtraTags, HeaderStyle, HeaderStyles, LogFormat, OtlpProtocol, Secret, StatsdProtocol,
    TraceSampler,
};

use source::{Entry, Reader, Sources};

/// Every setting of `tollgate serve`.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The listeners, the gRPC transport, the runtime and shutdown.
    pub listen: ListenSettings,
    /// Where the rules come from.
    pub rules: RulesSettings,
    /// Where the counters live.
    pub store: StoreSettings,
    /// How requests are decided.
    pub decisions: DecisionSettings,
    /// What answers carry.
    pub answers: AnswerSettings,
    /// Logs and traces.
    pub telemetry: TelemetrySettings,
    /// The Go stats pushed to statsd.
    pub stats: StatsSettings,
    /// What loading noticed and did not refuse (ignored variables and the like), to be logged once the
    /// logger runs: settings are read before it starts.
    pub warnings: Vec<String>,
    /// Where each given setting came from, to name it in later messages.
    pub origins: Origins,
}

/// Where each setting that was given came from, as the operator wrote it: `REDIS_URL`,
/// `TOLLGATE_REDIS_URL`, `--grpc-addr`, `settings.yaml: redis_url`.
#[derive(Debug, Clone, Default)]
pub struct Origins(BTreeMap<String, String>);

impl Origins {
    /// How the setting `key` was given (its key, when it keeps its default).
    pub fn name(&self, key: &str) -> String {
        self.0.get(key).cloned().unwrap_or_else(|| key.to_owned())
    }

    /// The error for a value of `key` that cannot be used.
    pub fn bad(&self, key: &str, value: &str, reason: &str) -> SettingsError {
        SettingsError::BadValue {
            name: self.name(key),
            value: value.to_owned(),
            reason: reason.to_owned(),
        }
    }
}

/// Why settings could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    /// A value that does not parse, or makes no sense. `name` is the setting as it was given.
    #[error("invalid setting {name}={value:?}: {reason}")]
    BadValue {
        /// The setting, as it was given (`REDIS_URL`, `settings.yaml: redis_url`...).
        name: String,
        /// The value given (`<redacted>` for secrets).
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The settings file cannot be read or is not a map of settings to values.
    #[error("settings file {file}: {reason}")]
    File {
        /// The file.
        file: String,
        /// Why.
        reason: String,
    },
    /// A key of the settings file that is no setting: the file is written on purpose, so a typo fails.
    #[error(
        "settings file {file}: unknown key '{key}'{}",
        nearest.as_ref().map_or_else(
            || " (docs/settings.md lists every setting)".to_owned(),
            |n| format!(" (did you mean '{n}'?)")
        )
    )]
    UnknownKey {
        /// The file.
        file: String,
        /// The unknown key.
        key: String,
        /// The known key it is closest to, when it looks like a typo of one.
        nearest: Option<String>,
    },
}

/// Environment variable naming the settings file (read by the command line, not a setting itself).
pub const SETTINGS_FILE_ENV: &str = "TOLLGATE_SETTINGS_FILE";

impl Settings {
    /// Reads settings from `file` (optional), the process environment and `flags` (key → value).
    pub fn load(file: Option<&Path>, flags: &[(&str, String)]) -> Result<Self, SettingsError> {
        let env: HashMap<String, String> = std::env::vars().collect();
        Self::load_from(file, &env, flags)
    }

    /// [`Settings::load`] with an explicit environment, for tests.
    pub fn load_from(
        file: Option<&Path>,
        env: &HashMap<String, String>,
        flags: &[(&str, String)],
    ) -> Result<Self, SettingsError> {
        let known = Self::catalogue();
        let sources = Sources {
            file: file
                .map(|path| {
                    Ok::<_, SettingsError>((path.display().to_string(), source::read_file(path, &known)?))
                })
                .transpose()?,
            env: env.clone(),
            flags: flags.iter().map(|(k, v)| ((*k).to_owned(), v.clone())).collect(),
        };
        let mut reader = Reader::new(&sources);
        let mut settings = Self::read(&mut reader)?;
        settings.origins = Origins(std::mem::take(&mut reader.origins));
        settings.validate()?;
        let mut warnings = reader.warnings;
        go_env::warnings(env, &known, &mut warnings);
        settings.unused(&mut warnings);
        settings.warnings = warnings;
        Ok(settings)
    }

    /// Every setting, in the order the sections read them: the list docs/settings.md must match.
    pub fn catalogue() -> Vec<Entry> {
        let sources = Sources::default();
        let mut reader = Reader::new(&sources);
        // Defaults always parse: reading them cannot fail.
        let _ = Self::read(&mut reader);
        reader.entries
    }

    fn read(r: &mut Reader<'_>) -> Result<Self, SettingsError> {
        Ok(Self {
            listen: ListenSettings::read(r)?,
            rules: RulesSettings::read(r)?,
            store: StoreSettings::read(r)?,
            decisions: DecisionSettings::read(r)?,
            answers: AnswerSettings::read(r)?,
            telemetry: TelemetrySettings::read(r)?,
            stats: StatsSettings::read(r)?,
            warnings: Vec::new(),
            origins: Origins::default(),
        })
    }

    fn validate(&self) -> Result<(), SettingsError> {
        let origins = &self.origins;
        self.listen.validate(origins)?;
        self.rules.validate(origins)?;
        self.store.validate(origins)?;
        self.decisions.validate(origins)?;
        self.telemetry.validate(origins)?;
        self.stats.validate(origins)?;
        Ok(())
    }

    /// Settings given that nothing reads in this configuration, as warnings (the Go service ignores
    /// them the same way; Tollgate says so).
    fn unused(&self, warnings: &mut Vec<String>) {
        if self.store.redis_persecond && self.decisions.stop_cache_key_increment_when_overlimit {
            warnings.push(
                "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT with REDIS_PERSECOND: each Redis settles the \
                 descriptors it holds, so a request over a limit in one Redis still increments its \
                 counters in the other (the Go service reads both first, which is not atomic either)"
                    .into(),
            );
        }
        self.listen.unused(warnings);
        self.stats.unused(warnings);
        self.rules.unused(warnings);
        self.store.unused(warnings);
    }
}

#[cfg(test)]
mod tests;
