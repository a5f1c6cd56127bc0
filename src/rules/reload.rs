//! Loading rules, at startup and whenever the rules directory changes.
//!
//! The directory is polled: every [`Reloader::interval`] the reloader hashes the contents of every rules
//! file; when the hash changes it re-reads and validates the whole set and swaps it in atomically. Polling
//! the contents (not watching inodes) notices every way a file can change — a Kubernetes ConfigMap's
//! `..data` symlink swap, an in-place write, a rename into place, a delete — with no platform-specific
//! watcher to lose events, at the cost of reading a few kilobytes once a second. A broken set keeps the
//! old rules running and logs the file and reason; counters are untouched either way.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::file::{self, ConfigError};
use super::{CompileOptions, RuleSet};
use crate::limiter::RulesHandle;
use crate::observe::health::Health;
use crate::observe::metrics::Metrics;

/// Loads and compiles every rules file below `dir`, each rule's counters taken from (and kept in)
/// `metrics`. The one load path: `tollgate check-config`, startup and every reload go through it.
pub fn load_rules(
    dir: &Path,
    merge_domains: bool,
    options: CompileOptions,
    metrics: &Metrics,
) -> Result<RuleSet, ConfigError> {
    let domains = file::load_dir(dir, merge_domains)?;
    RuleSet::compile_with_metrics(&domains, options, metrics)
}

/// A content hash of the rules files below `dir` (the loaded rules' version).
pub fn fingerprint(dir: &Path) -> Result<String, ConfigError> {
    let mut hasher = blake3::Hasher::new();
    for path in file::rule_files(dir)? {
        let bytes = std::fs::read(&path).map_err(|source| ConfigError::Io {
            dir: path.display().to_string(),
            source,
        })?;
        hasher.update(path.to_string_lossy().as_bytes());
        hasher.update(&(bytes.len() as u64).to_le_bytes());
        hasher.update(&bytes);
    }
    Ok(hasher.finalize().to_hex()[..16].to_owned())
}

/// Keeps the loaded rules in step with the rules directory.
#[derive(Debug, Clone)]
pub struct Reloader {
    /// The rules directory.
    pub dir: PathBuf,
    /// `MERGE_DOMAIN_CONFIG`.
    pub merge_domains: bool,
    /// How rules compile.
    pub options: CompileOptions,
    /// How often to look for changes.
    pub interval: Duration,
    /// Where rule counters live and loads are counted.
    pub metrics: Arc<Metrics>,
}

impl Reloader {
    /// Loads the rules once, publishing them on success. Returns the version loaded.
    pub fn load_into(&self, rules: &RulesHandle) -> Result<String, ConfigError> {
        let version = fingerprint(&self.dir)?;
        let set = load_rules(&self.dir, self.merge_domains, self.options, &self.metrics)?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        self.metrics.loaded(&version, now);
        tracing::info!(dir = %self.dir.display(), domains = set.len(), %version, "rules loaded");
        rules.store(Some(Arc::new(set)));
        Ok(version)
    }

    /// Polls until `stop` is cancelled, reloading on every change.
    pub async fn run(
        self,
        rules: RulesHandle,
        health: Health,
        mut version: Option<String>,
        stop: CancellationToken,
    ) {
        let mut ticker = tokio::time::interval(self.interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = ticker.tick() => {}
            }
            let current = match fingerprint(&self.dir) {
                Ok(current) => current,
                Err(error) => {
                    tracing::error!(%error, "cannot read rules directory; keeping the loaded rules");
                    continue;
                }
            };
            if version.as_deref() == Some(current.as_str()) {
                continue;
            }
            match self.load_into(&rules) {
                Ok(loaded) => {
                    version = Some(loaded);
                    health.set_rules_loaded(true).await;
                }
                Err(error) => {
                    // Remember the broken version so the error is logged once, not every second.
                    version = Some(current);
                    self.metrics.config_load_error.add(1);
                    tracing::error!(%error, "rules not reloaded; keeping the previous rules");
                }
            }
        }
    }
}
