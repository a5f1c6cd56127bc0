//! The decision log (`TOLLGATE_DECISION_LOG`): every request decided as Envoy's `ShouldRateLimit`,
//! recorded as one JSON line for `tollgate what-if --format decisions` to replay exactly:
//!
//! ```json
//! {"time":"2026-12-06T04:42:11.310123Z","domain":"api","descriptors":[{"entries":[{"key":"user","value":"ada"}],"hits_addend":2}]}
//! ```
//!
//! Values are written as they enter storage keys, so a `hash: true` value stays hashed. Opt-in, and
//! bounded everywhere: a share of callers (`TOLLGATE_DECISION_LOG_SAMPLE`, a caller's requests kept or
//! dropped together), a queue of `QUEUE` (65,536) requests to a thread of its own (a request never waits
//! for the disk: a full queue drops, counted in `tollgate_decision_log_dropped_total`), files of at
//! most `TOLLGATE_DECISION_LOG_MAX_BYTES`, rotated to `FILE.1` … `FILE.N` with
//! `TOLLGATE_DECISION_LOG_FILES` kept.

use std::borrow::Cow;
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::time::{Duration, UNIX_EPOCH};

use anyhow::Context as _;
use serde::{Deserialize, Serialize};
use smallvec::SmallVec;
use tollgate_core::limiter::{Recorded, Recorder};

use crate::server_counters::ServerCounters;
use crate::settings::TelemetrySettings;

/// Requests waiting for the writer at most.
const QUEUE: usize = 65_536;

/// How long the writer keeps lines buffered when no more come.
const FLUSH_AFTER: Duration = Duration::from_secs(1);

/// The recorder the limiter hands requests to.
#[derive(Debug)]
pub struct DecisionLog {
    queue: SyncSender<Recorded>,
    /// A request is recorded when its sampling key is at most this.
    threshold: u64,
    metrics: Arc<ServerCounters>,
}

impl DecisionLog {
    /// The decision log `settings` ask for, its file opened and its writer started; `None` when off.
    pub fn start(
        settings: &TelemetrySettings,
        metrics: Arc<ServerCounters>,
    ) -> anyhow::Result<Option<Arc<Self>>> {
        if settings.decision_log.is_empty() {
            return Ok(None);
        }
        let path = PathBuf::from(&settings.decision_log);
        let file = Rotating::open(path, settings.decision_log_max_bytes, settings.decision_log_files)?;
        let (queue, receiver) = std::sync::mpsc::sync_channel(QUEUE);
        let writer_metrics = Arc::clone(&metrics);
        std::thread::Builder::new()
            .name("tollgate-decision-log".into())
            .spawn(move || write(&receiver, file, &writer_metrics))
            .context("cannot start the decision log's writer")?;
        // The share of the key space kept; 1 keeps every key.
        let threshold = (settings.decision_log_sample * u64::MAX as f64) as u64;
        Ok(Some(Arc::new(Self {
            queue,
            threshold,
            metrics,
        })))
    }
}

impl Recorder for DecisionLog {
    fn wants(&self, key: u64) -> bool {
        key <= self.threshold
    }

    fn record(&self, request: Recorded) {
        if let Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) = self.queue.try_send(request) {
            self.metrics.decision_log_dropped.add(1);
        }
    }
}

/// The file written, rotated when full.
struct Rotating {
    path: PathBuf,
    max_bytes: u64,
    keep: u32,
    out: BufWriter<File>,
    written: u64,
}

impl Rotating {
    fn open(path: PathBuf, max_bytes: u64, keep: u32) -> anyhow::Result<Self> {
        let (out, written) = append(&path)?;
        Ok(Self {
            path,
            max_bytes,
            keep,
            out,
            written,
        })
    }

    /// Writes one line, rotating first if it would pass the bound.
    fn line(&mut self, line: &[u8]) -> std::io::Result<()> {
        if self.written > 0 && self.written + line.len() as u64 > self.max_bytes {
            self.rotate()?;
        }
        self.out.write_all(line)?;
        self.written += line.len() as u64;
        Ok(())
    }

    /// `FILE` becomes `FILE.1`, `FILE.1` `FILE.2`…, the oldest beyond `keep` is removed; with `keep`
    /// 0 the file starts over.
    fn rotate(&mut self) -> std::io::Result<()> {
        self.out.flush()?;
        let numbered = |n: u32| -> PathBuf {
            let mut name = self.path.clone().into_os_string();
            name.push(format!(".{n}"));
            PathBuf::from(name)
        };
        if self.keep == 0 {
            std::fs::remove_file(&self.path)?;
        } else {
            let _ = std::fs::remove_file(numbered(self.keep));
            for n in (1..self.keep).rev() {
                let _ = std::fs::rename(numbered(n), numbered(n + 1));
            }
            std::fs::rename(&self.path, numbered(1))?;
        }
        let (out, written) = append(&self.path).map_err(std::io::Error::other)?;
        self.out = out;
        self.written = written;
        Ok(())
    }
}

/// `path` opened to append, and its size.
fn append(path: &Path) -> anyhow::Result<(BufWriter<File>, u64)> {
    let file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("cannot open TOLLGATE_DECISION_LOG {}", path.display()))?;
    let written = file.metadata().map(|m| m.len()).unwrap_or(0);
    Ok((BufWriter::with_capacity(64 * 1024, file), written))
}

/// The writer thread: lines in, flushed when the queue is quiet, until every sender is gone.
fn write(receiver: &Receiver<Recorded>, mut file: Rotating, metrics: &ServerCounters) {
    let mut line = Vec::with_capacity(512);
    let mut failures = 0u64;
    loop {
        let request = match receiver.recv_timeout(FLUSH_AFTER) {
            Ok(request) => request,
            Err(RecvTimeoutError::Timeout) => {
                let _ = file.out.flush();
                continue;
            }
            Err(RecvTimeoutError::Disconnected) => break,
        };
        line.clear();
        if write_line(&request, &mut line).is_err() {
            metrics.decision_log_dropped.add(1);
            continue;
        }
        match file.line(&line) {
            Ok(()) => metrics.decision_log_written.add(1),
            Err(error) => {
                metrics.decision_log_dropped.add(1);
                // The first failure and then one in a thousand: a full disk must not flood the log.
                if failures.is_multiple_of(1000) {
                    tracing::warn!(%error, path = %file.path.display(), "cannot write the decision log");
                }
                failures += 1;
            }
        }
    }
    let _ = file.out.flush();
}

/// Writes `request` as one line of the log, its newline included, at the end of `out`.
pub(crate) fn write_line(request: &Recorded, out: &mut Vec<u8>) -> serde_json::Result<()> {
    serde_json::to_writer(&mut *out, &Line::from(request))?;
    out.push(b'\n');
    Ok(())
}

/// One line of the log: what the writer writes and `tollgate what-if` reads (its strings borrowed
/// from the line unless escaped, its lists inline: most requests have one descriptor of one entry).
#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct Line<'a> {
    /// RFC 3339, to the microsecond.
    #[serde(borrow)]
    pub(crate) time: Cow<'a, str>,
    #[serde(borrow)]
    pub(crate) domain: Cow<'a, str>,
    #[serde(borrow)]
    pub(crate) descriptors: SmallVec<[LineDescriptor<'a>; 1]>,
}

/// One descriptor of a [`Line`].
#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct LineDescriptor<'a> {
    #[serde(borrow)]
    pub(crate) entries: SmallVec<[LineEntry<'a>; 1]>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) hits_addend: Option<u64>,
}

/// One entry of a [`LineDescriptor`]; its value as it entered the storage key.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct LineEntry<'a> {
    #[serde(borrow)]
    pub(crate) key: Cow<'a, str>,
    #[serde(borrow, default)]
    pub(crate) value: Cow<'a, str>,
}

impl<'a> Line<'a> {
    fn from(request: &'a Recorded) -> Self {
        let time = UNIX_EPOCH + Duration::from_micros(request.time_us);
        Self {
            time: Cow::Owned(humantime::format_rfc3339_micros(time).to_string()),
            domain: Cow::Borrowed(&request.domain),
            descriptors: request
                .descriptors
                .iter()
                .map(|d| LineDescriptor {
                    entries: d
                        .entries
                        .iter()
                        .map(|(key, value)| LineEntry {
                            key: Cow::Borrowed(key),
                            value: Cow::Borrowed(value),
                        })
                        .collect(),
                    hits_addend: d.hits_addend,
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_file_rotates_and_only_the_kept_files_remain() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("d.jsonl");
        let mut file = Rotating::open(path.clone(), 100, 2).expect("open");
        for i in 0..10 {
            file.line(format!("{i:039}\n").as_bytes()).expect("write");
        }
        file.out.flush().expect("flush");
        let mut names: Vec<String> = std::fs::read_dir(dir.path())
            .expect("list")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["d.jsonl", "d.jsonl.1", "d.jsonl.2"]);
        // Two 40-byte lines a file: the newest two in d.jsonl, the two before in d.jsonl.1.
        let read = |name: &str| std::fs::read_to_string(dir.path().join(name)).expect("read");
        assert!(read("d.jsonl").ends_with(&format!("{:039}\n", 9)));
        assert!(read("d.jsonl.1").starts_with(&format!("{:039}\n", 6)));
        assert!(
            names
                .iter()
                .all(|n| std::fs::metadata(dir.path().join(n)).expect("meta").len() <= 100)
        );
    }
}
