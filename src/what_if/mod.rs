//! `tollgate what-if`: recorded traffic replayed against the rules in force and against a proposed
//! set, to see whom a change would refuse before it ships.
//!
//! The log is read line by line (it is never held whole: memory follows the live counters and the
//! reordering window), each record replayed in time order on a simulated clock through both rule sets
//! exactly as the service decides (the same matching, algorithms, all-or-nothing, shadow mode,
//! `replaces`, and the settings `serve` reads from the environment), each on an embedded store of its
//! own; nothing is sent to any server. Then a summary on the terminal, and, when asked, a JSON report
//! and a self-contained HTML page with the refusals over time.
//!
//! Layout: `input/` reads the log formats into records, `order.rs` restores time order within a
//! window, `replay.rs` decides each record on both sides, `tally.rs` counts, `report.rs` and
//! `html.rs` write; `time.rs` reads and writes timestamps.

mod html;
mod input;
mod order;
mod replay;
mod report;
mod tally;
mod time;

pub(crate) use input::LogFormat;

use std::io::{BufRead, BufReader, BufWriter, Read, Write as _};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use tollgate_core::clock::ManualClock;
use tollgate_core::rules::proxy::ProxiedRequest;

use crate::settings::Settings;
use input::{LineReader, Record};
use order::Reorder;
use replay::{Decided, Replay, Side};
use tally::Tally;

/// How often progress is reported on long inputs.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// What `tollgate what-if` is asked to do.
#[derive(Debug)]
pub(crate) struct WhatIf {
    /// The rules in force (a rules directory).
    pub(crate) current: PathBuf,
    /// The proposed rules.
    pub(crate) proposed: PathBuf,
    /// The logs' format.
    pub(crate) format: LogFormat,
    /// The domain of an access log's requests.
    pub(crate) domain: Option<String>,
    /// JSON logs: `part=name` overrides of where fields are.
    pub(crate) fields: Vec<String>,
    /// How far out of time order the log may be.
    pub(crate) reorder_window: Duration,
    /// Stop at the first line that cannot be read.
    pub(crate) strict: bool,
    /// Where to write the JSON report.
    pub(crate) json: Option<PathBuf>,
    /// Where to write the HTML report.
    pub(crate) html: Option<PathBuf>,
    /// Where to write one line per request replayed: its line, time, and both sides' answers.
    pub(crate) trace: Option<PathBuf>,
    /// Most counters each side's store holds.
    pub(crate) max_keys: usize,
    /// The logs, in order (`-` is standard input).
    pub(crate) logs: Vec<PathBuf>,
}

/// The inputs, described for the reports.
#[derive(Debug)]
struct Summary {
    inputs: Vec<String>,
    format: &'static str,
    lines: u64,
    bad_lines: u64,
    /// The first line not read, and why.
    first_bad: Option<String>,
    current: String,
    proposed: String,
}

/// Runs the replay and writes the reports; the text summary goes to standard output.
pub(crate) fn run(args: WhatIf, settings: &Settings) -> anyhow::Result<()> {
    let clock = Arc::new(ManualClock::new(0));
    let merge = settings.rules.merge_domain_config;
    let compile = crate::server::options::compile_options(settings);
    let limiter = crate::server::options::limiter_options(&settings.decisions, &settings.telemetry);
    let side = |dir: &PathBuf| {
        Side::load(dir, merge, compile, limiter.clone(), &clock, args.max_keys)
            .map_err(|e| anyhow::anyhow!("{}: {e}", dir.display()))
    };
    let replay = Replay::new(
        Arc::clone(&clock),
        side(&args.current)?,
        side(&args.proposed)?,
        args.max_keys,
    );
    let domain = domain(&args, &replay)?;
    let headers: Vec<String> = [&replay.current, &replay.proposed]
        .iter()
        .filter_map(|side| side.proxy(&domain))
        .flat_map(|proxy| proxy.headers_read().map(str::to_owned).collect::<Vec<_>>())
        .collect();
    let fields =
        input::Fields::new(&args.fields, headers.iter().map(String::as_str)).map_err(anyhow::Error::msg)?;
    let mut run = Run {
        reader: LineReader::new(args.format, fields),
        order: Reorder::new(u64::try_from(args.reorder_window.as_micros()).unwrap_or(u64::MAX)),
        replay,
        domain,
        tally: Tally::default(),
        trace: args.trace.as_ref().map(create).transpose()?,
        strict: args.strict,
        summary: Summary {
            inputs: args.logs.iter().map(|p| p.display().to_string()).collect(),
            format: format_name(args.format),
            lines: 0,
            bad_lines: 0,
            first_bad: None,
            current: args.current.display().to_string(),
            proposed: args.proposed.display().to_string(),
        },
        progress: Instant::now(),
    };
    for log in &args.logs {
        let source: Box<dyn Read> = if log.as_os_str() == "-" {
            Box::new(std::io::stdin())
        } else {
            Box::new(std::fs::File::open(log).with_context(|| format!("cannot read {}", log.display()))?)
        };
        run.read(BufReader::with_capacity(1 << 20, source))
            .with_context(|| format!("{}", log.display()))?;
    }
    run.finish()?;
    for side in [&run.replay.current, &run.replay.proposed] {
        if side.evictions() > 0 {
            eprintln!(
                "tollgate what-if: warning: {} counters were evicted for want of room (--max-keys {}): the replay under-counts",
                side.evictions(),
                args.max_keys
            );
        }
    }
    print!("{}", report::text(&run.summary, &run.tally));
    if let Some(path) = &args.json {
        let json = report::json(&run.summary, &run.tally);
        std::fs::write(path, format!("{json:#}\n"))
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    if let Some(path) = &args.html {
        std::fs::write(path, html::page(&run.summary, &run.tally))
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}

/// The domain access-log requests are decided in: it must have a `proxy:` block on both sides.
fn domain(args: &WhatIf, replay: &Replay) -> anyhow::Result<String> {
    if args.format == LogFormat::Decisions {
        return Ok(args.domain.clone().unwrap_or_default());
    }
    let Some(domain) = args.domain.clone() else {
        bail!(
            "--domain is needed for an access log: its requests are decided in that domain, whose proxy: block makes their descriptors"
        );
    };
    for (side, dir) in [
        (&replay.current, &args.current),
        (&replay.proposed, &args.proposed),
    ] {
        if !side.has_domain(&domain) {
            bail!("{}: no rules for domain '{domain}'", dir.display());
        }
        if side.proxy(&domain).is_none() {
            bail!(
                "{}: domain '{domain}' has no proxy: block, which turns a logged request into descriptors (docs/proxies.md)",
                dir.display()
            );
        }
    }
    Ok(domain)
}

fn format_name(format: LogFormat) -> &'static str {
    match format {
        LogFormat::Envoy => "envoy",
        LogFormat::Nginx => "nginx",
        LogFormat::Json => "json",
        LogFormat::Decisions => "decisions",
    }
}

fn create(path: &PathBuf) -> anyhow::Result<BufWriter<std::fs::File>> {
    let file = std::fs::File::create(path).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(BufWriter::new(file))
}

/// The replay under way.
struct Run {
    reader: LineReader,
    order: Reorder,
    replay: Replay,
    domain: String,
    tally: Tally,
    trace: Option<BufWriter<std::fs::File>>,
    strict: bool,
    summary: Summary,
    progress: Instant,
}

impl Run {
    /// Reads one log to its end. A line whole in the reader's buffer is read where it is; only one
    /// that spans two fills is copied out.
    fn read(&mut self, mut source: impl BufRead) -> anyhow::Result<()> {
        let mut spanning = Vec::with_capacity(4096);
        loop {
            let available = source.fill_buf()?;
            if available.is_empty() {
                return Ok(());
            }
            if let Some(end) = memchr::memchr(b'\n', available) {
                self.line(&available[..end])?;
                source.consume(end + 1);
            } else {
                spanning.clear();
                source.read_until(b'\n', &mut spanning)?;
                self.line(&spanning)?;
            }
        }
    }

    /// Reads and replays one line (`raw`, with or without its newline).
    fn line(&mut self, raw: &[u8]) -> anyhow::Result<()> {
        self.summary.lines += 1;
        let line = match std::str::from_utf8(raw) {
            Ok(line) => std::borrow::Cow::Borrowed(line),
            Err(_) => String::from_utf8_lossy(raw),
        };
        let line = line.trim_end_matches(['\n', '\r']);
        if line.is_empty() {
            return Ok(());
        }
        let number = self.summary.lines;
        match self.reader.read(line) {
            Ok(record) => {
                if let Err(late) = self.order.push(record, number) {
                    bail!(
                        "line {}: {:.3} s earlier than a line already replayed: the log is out of time order by more than \
                         --reorder-window; sort it first, or widen the window",
                        late.line,
                        late.by_us as f64 / 1e6
                    );
                }
                self.release(false)?;
            }
            Err(error) => {
                if self.strict {
                    bail!("line {number}: {error}");
                }
                self.summary.bad_lines += 1;
                self.summary
                    .first_bad
                    .get_or_insert_with(|| format!("line {number}: {error}"));
            }
        }
        if number.is_multiple_of(65_536) && self.progress.elapsed() >= PROGRESS_EVERY {
            self.progress = Instant::now();
            eprintln!(
                "tollgate what-if: {} lines read, {} replayed",
                report::count(number),
                report::count(self.tally.requests)
            );
        }
        Ok(())
    }

    /// Replays what is still held, the logs having ended.
    fn finish(&mut self) -> anyhow::Result<()> {
        self.release(true)?;
        if let Some(trace) = &mut self.trace {
            trace.flush()?;
        }
        Ok(())
    }

    /// Replays the records whose time has come, or with `all` every record held.
    fn release(&mut self, all: bool) -> anyhow::Result<()> {
        let Self {
            order,
            replay,
            domain,
            tally,
            trace,
            ..
        } = self;
        order.release(all, |line, record| {
            step(replay, domain, tally, trace, line, record)
        })
    }
}

/// Replays one record.
fn step(
    replay: &mut Replay,
    domain: &str,
    tally: &mut Tally,
    trace: &mut Option<BufWriter<std::fs::File>>,
    line: u64,
    record: &Record,
) -> anyhow::Result<()> {
    let (before, after) = replay.decide(record, domain);
    let replay = &*replay;
    tally.add(record.time_us(), [&before, &after], || {
        who(replay, domain, record, &after)
    });
    if let Some(trace) = trace {
        let answer = |d: &Decided| if d.refused { "refused" } else { "allowed" };
        writeln!(
            trace,
            "{{\"line\":{line},\"time\":\"{}\",\"current\":\"{}\",\"proposed\":\"{}\"}}",
            time::format(record.time_us()),
            answer(&before),
            answer(&after)
        )?;
    }
    Ok(())
}

/// Who a newly refused request came from: its client's address (as the current rules' `proxy:`
/// block finds it), or the entries of its first descriptor the proposed rules refused.
fn who(replay: &Replay, domain: &str, record: &Record, after: &Decided) -> String {
    match record {
        Record::Http(request) => replay
            .current
            .proxy(domain)
            .and_then(|proxy| request.client_address(&proxy.client_address).ok())
            .map_or_else(|| "(no client address)".to_owned(), |ip| ip.to_string()),
        Record::Decision(decision) => {
            let refused = after.first_refused.and_then(|at| decision.descriptors.get(at));
            refused.map_or_else(String::new, |descriptor| {
                use tollgate_core::limiter::RequestDescriptor as _;
                use tollgate_core::rules::DescriptorEntry as _;
                let entries: Vec<String> = descriptor
                    .entries()
                    .iter()
                    .map(|e| format!("{}={}", e.key(), e.value()))
                    .collect();
                entries.join(",")
            })
        }
    }
}
