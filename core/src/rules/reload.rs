//! Loading rules, at startup and whenever the rules directory changes.
//!
//! The directory is polled: every [`Reloader::interval`] the reloader reads every rules file once and
//! hashes the contents. A changed hash is loaded only when the next poll reads the very same contents:
//! a file caught half-written (still valid YAML, with rules missing) is never loaded, at the cost of
//! one poll of delay. Polling the contents (not watching inodes) notices every way a file can change —
//! a Kubernetes ConfigMap's `..data` symlink swap, an in-place write, a rename into place, a delete —
//! with no platform-specific watcher to lose events. A broken set keeps the old rules running and logs
//! the file and reason; counters are untouched either way.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::RulesHandle;
use super::file::{ConfigError, Snapshot};
use super::{CompileOptions, RuleSet};
use crate::observe::metrics::Metrics;

/// Loads and compiles every rules file below `dir`, each rule's counters taken from (and kept in)
/// `metrics`. `tollgate check-config` and startup go through it; a reload compiles a [`Snapshot`] it
/// has already read.
pub fn load_rules(
    dir: &Path,
    merge_domains: bool,
    options: CompileOptions,
    metrics: &Metrics,
) -> Result<RuleSet, ConfigError> {
    compile(
        Snapshot::read(dir, options.max_file_bytes)?,
        merge_domains,
        options,
        metrics,
    )
}

/// Parses and compiles `snapshot`, which is freed once parsed: the compiled rules reuse its memory.
fn compile(
    snapshot: Snapshot,
    merge_domains: bool,
    options: CompileOptions,
    metrics: &Metrics,
) -> Result<RuleSet, ConfigError> {
    let domains = snapshot.parse(merge_domains)?;
    drop(snapshot);
    RuleSet::compile_with_metrics(domains, options, metrics)
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
        let snapshot = self.read()?;
        let version = snapshot.fingerprint();
        let set = compile(snapshot, self.merge_domains, self.options, &self.metrics)?;
        self.install(set, &version, rules);
        Ok(version)
    }

    /// Reads the directory, saying which links it did not follow.
    fn read(&self) -> Result<Snapshot, ConfigError> {
        let snapshot = Snapshot::read(&self.dir, self.options.max_file_bytes)?;
        for link in snapshot.skipped() {
            tracing::warn!(
                link = %link.display(),
                "not following a link to a directory outside the rules directory"
            );
        }
        Ok(snapshot)
    }

    fn install(&self, set: RuleSet, version: &str, rules: &RulesHandle) {
        install(
            set,
            version,
            &self.dir.display().to_string(),
            &self.metrics,
            rules,
        );
    }

    /// Polls until `stop` is cancelled, reloading a change once two polls in a row read it. Reading
    /// and compiling run on a blocking thread: a large rules directory must not stall the requests the
    /// runtime's workers are answering.
    pub async fn run(self, rules: RulesHandle, mut version: Option<String>, stop: CancellationToken) {
        let mut ticker = tokio::time::interval(self.interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // A changed version seen once, waiting for the next poll to confirm it.
        let mut pending: Option<String> = None;
        let reloader = Arc::new(self);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = ticker.tick() => {}
            }
            // A poll hashes the files without holding them; only a confirmed change is read whole.
            let polling = Arc::clone(&reloader);
            let Some(current) =
                off_runtime(move || Snapshot::fingerprint_of(&polling.dir, polling.options.max_file_bytes))
                    .await
            else {
                continue;
            };
            match step(version.as_deref(), pending.as_deref(), &current) {
                Step::Unchanged => {
                    pending = None;
                    continue;
                }
                Step::Wait => {
                    pending = Some(current);
                    continue;
                }
                Step::Load => pending = None,
            }
            let reading = Arc::clone(&reloader);
            let Some(snapshot) =
                off_runtime(move || Snapshot::read(&reading.dir, reading.options.max_file_bytes)).await
            else {
                continue;
            };
            // Changed again since it was hashed: what was confirmed is gone; confirm the new one.
            let read = snapshot.fingerprint();
            if read != current {
                pending = Some(read);
                continue;
            }
            for link in snapshot.skipped() {
                tracing::warn!(
                    link = %link.display(),
                    "not following a link to a directory outside the rules directory"
                );
            }
            let compiling = Arc::clone(&reloader);
            let compiled = tokio::task::spawn_blocking(move || {
                compile(
                    snapshot,
                    compiling.merge_domains,
                    compiling.options,
                    &compiling.metrics,
                )
            })
            .await;
            match compiled {
                Ok(Ok(set)) => reloader.install(set, &current, &rules),
                Ok(Err(error)) => {
                    reloader.metrics.config_load_error.add(1);
                    tracing::error!(%error, "rules not reloaded; keeping the previous rules");
                }
                Err(_) => continue,
            }
            // A broken version is remembered too, so its error is logged once, not every poll.
            version = Some(current);
        }
    }
}

/// Reads the rules directory on a blocking thread: a large one must not stall the runtime's workers.
/// `None` when it cannot be read (logged: the loaded rules stay).
async fn off_runtime<T: Send + 'static>(
    read: impl FnOnce() -> Result<T, ConfigError> + Send + 'static,
) -> Option<T> {
    match tokio::task::spawn_blocking(read).await {
        Ok(Ok(value)) => Some(value),
        Ok(Err(error)) => {
            tracing::error!(%error, "cannot read rules directory; keeping the loaded rules");
            None
        }
        Err(_) => None,
    }
}

/// Swaps in a compiled rule set of `version` from `source` (a directory, an xDS server): counted in the
/// config-load metrics and logged the same way whichever source it came from.
pub fn install(set: RuleSet, version: &str, source: &str, metrics: &Metrics, rules: &RulesHandle) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    metrics.loaded(version, now);
    if set.is_empty() {
        // Valid (a fleet may start before its rules are written), but it limits nothing: say so.
        tracing::warn!(%source, %version, "rules loaded, but they define no domain: every request is allowed");
    } else {
        tracing::info!(%source, domains = set.len(), %version, "rules loaded");
    }
    let previous = rules.swap(Some(Arc::new(set)));
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    // Freeing a large rule set takes a while (100,000 routes are millions of allocations): not on a
    // runtime thread that answers requests. (A request still holding the old set frees it if it is
    // the last; requests hold it for one decision.)
    let freeing = previous.map(|previous| runtime.spawn_blocking(move || drop(previous)));
    if let Some(&hook) = AFTER_FREE.get() {
        runtime.spawn(async move {
            if let Some(freeing) = freeing {
                let _ = freeing.await;
            }
            hook();
        });
    }
}

/// What runs after each load, once the rules it replaced are freed; see [`after_rules_freed`].
static AFTER_FREE: OnceLock<fn()> = OnceLock::new();

/// Sets what runs after each load, once the rules it replaced (and the files parsed for it) are freed:
/// on the runtime, from a task of its own. A load frees a lot at once, and a process whose allocator
/// keeps freed memory until something nudges it can nudge it here; the core knows nothing of
/// allocators. Set once per process; a later call changes nothing. Without it, a load only frees.
pub fn after_rules_freed(hook: fn()) {
    let _ = AFTER_FREE.set(hook);
}

/// What a poll does with the version it read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// The loaded version: nothing to do.
    Unchanged,
    /// A change seen for the first time (maybe a file caught mid-write): look again next poll.
    Wait,
    /// The same change on two polls in a row: load it.
    Load,
}

fn step(loaded: Option<&str>, pending: Option<&str>, current: &str) -> Step {
    if loaded == Some(current) {
        Step::Unchanged
    } else if pending == Some(current) {
        Step::Load
    } else {
        Step::Wait
    }
}

#[cfg(test)]
mod tests {
    use super::{Step, step};

    #[test]
    fn a_change_loads_only_when_two_polls_in_a_row_read_it() {
        assert_eq!(step(Some("a"), None, "a"), Step::Unchanged);
        assert_eq!(step(Some("a"), None, "b"), Step::Wait, "first sight of b");
        assert_eq!(step(Some("a"), Some("b"), "b"), Step::Load, "b again");
        // A half-written file, then the finished one: neither loads on first sight.
        assert_eq!(step(Some("a"), Some("half"), "full"), Step::Wait);
        assert_eq!(step(Some("a"), Some("full"), "full"), Step::Load);
        // Reverted before it was confirmed: nothing to load.
        assert_eq!(step(Some("a"), Some("b"), "a"), Step::Unchanged);
        assert_eq!(step(None, None, "a"), Step::Wait);
    }
}
