//! The statsd sink (`USE_STATSD`, or `USE_DOG_STATSD`): every `STATS_FLUSH_INTERVAL`, the Go stats
//! ([`super::go_stats`]) are sent to `STATSD_HOST:STATSD_PORT` as gostats sends them, or as the Go
//! service's DogStatsD sink does ([`super::dogstatsd`]: tags instead of name suffixes, always over
//! UDP), so a statsd_exporter sidecar, a statsd server or a Datadog agent keeps the series it had from
//! the Go service.
//!
//! The wire format is gostats': one `name:value|c` line per counter that grew since the last flush
//! (its increase; counters that did not grow are not sent), `name:value|g` for gauges,
//! `name:ms|ms|@rate` per response-time bucket that gained observations ([`go_stats`]), each line
//! ended by `\n`. `EXTRA_TAGS` are part of the name, as gostats writes them: `.__key=value` per tag, sorted by
//! key, with `.`, `:` and `|` in values turned to `_`. Lines are batched, never split, into writes of at
//! most 64 KiB over TCP (the default, as gostats' `STATSD_PROTOCOL`) or datagrams of at most 1,432 bytes
//! over UDP.
//!
//! The sink runs in a task of its own and reads the counters the limiter already keeps: no decision
//! waits on it. A batch that cannot be sent (statsd down, a write that does not finish within
//! [`WRITE_TIMEOUT`]) is dropped with the rest of its flush, counted in
//! `tollgate_statsd_lines_dropped_total` and logged at most once a minute, and its counters' increases
//! are sent again with the next flush (gostats loses them):
//! what statsd receives adds up to the counters however long it was away. The last value sent of each
//! counter is kept, and each name's wire form, one entry per Go stat name the last flush saw: bounded by
//! the rules and the capped unknown domains.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncWriteExt as _;
use tokio::net::{TcpStream, UdpSocket};
use tokio_util::sync::CancellationToken;
use tollgate_core::observe::metrics::Metrics;
use tollgate_core::store::StoreCounters;

use super::dogstatsd::Namer;
use super::go_stats::{self, GoStat, Kind};
use crate::connections::RateLimitedLog;
use crate::server_counters::ServerCounters;
use crate::settings::{ExtraTags, Mogrifier, StatsdProtocol};

/// Largest write over TCP, as gostats buffers it.
const TCP_BATCH: usize = 64 * 1024;

/// Largest datagram over UDP: an Ethernet frame's payload less IP and UDP headers, as gostats sends.
const UDP_BATCH: usize = 1432;

/// Longest a connect or a write to statsd may take before the batch is dropped.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(1);

/// Where and how often to send.
#[derive(Debug, Clone)]
pub struct StatsdOptions {
    /// `host:port`, resolved at every connect (so a statsd that moves is followed).
    pub addr: String,
    /// TCP or UDP (DogStatsD: UDP whatever this says).
    pub protocol: StatsdProtocol,
    /// Time between flushes.
    pub interval: Duration,
    /// Tags on every stat.
    pub tags: ExtraTags,
    /// Which statsd the lines are written for.
    pub dialect: Dialect,
}

/// The two statsd dialects the Go service speaks.
#[derive(Debug, Clone)]
pub enum Dialect {
    /// gostats' plain statsd: tags as name suffixes.
    Statsd,
    /// DogStatsD.
    DogStatsd {
        /// The mogrifiers to apply, in order.
        mogrifiers: Vec<Mogrifier>,
        /// `tag:value`s before all others on every metric (datadog-go's, from `DD_*`).
        global_tags: Vec<String>,
    },
}

/// How a Go stat name becomes the start and end of its line.
enum Naming {
    /// gostats: the name and the tag suffix, nothing after the type.
    Statsd { suffix: String },
    /// DogStatsD: a name and tags of its own.
    Dog(Namer),
}

impl Naming {
    fn new(options: &StatsdOptions) -> Self {
        match &options.dialect {
            Dialect::Statsd => Self::Statsd {
                suffix: tag_suffix(&options.tags),
            },
            Dialect::DogStatsd {
                mogrifiers,
                global_tags,
            } => Self::Dog(Namer::new(global_tags, &options.tags, mogrifiers.clone())),
        }
    }

    /// `(before the value, after the type)` for the Go stat `name`.
    fn parts(&self, name: &str) -> (String, String) {
        match self {
            Self::Statsd { suffix } => (format!("{name}{suffix}"), String::new()),
            Self::Dog(namer) => namer.name(name),
        }
    }
}

/// Reads the store's counters (the Redis pools' stats) at each flush.
pub type StoreReader = Box<dyn Fn() -> StoreCounters + Send + Sync>;

/// Sends the Go stats of `metrics` and the store `store` reads until `stop`, then once more (so the
/// last increases are not lost); lines it cannot send are counted in `counters`.
pub async fn run(
    options: StatsdOptions,
    metrics: Arc<Metrics>,
    counters: Arc<ServerCounters>,
    store: StoreReader,
    stop: CancellationToken,
) {
    let mut sink = Sink::new(options, metrics, counters, store);
    match sink.naming {
        Naming::Statsd { .. } => {
            tracing::info!(addr = %sink.options.addr, protocol = %sink.options.protocol, "sending stats to statsd");
        }
        Naming::Dog(_) => tracing::info!(addr = %sink.options.addr, "sending stats to DogStatsD over UDP"),
    }
    let mut ticker = tokio::time::interval(sink.options.interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await;
    loop {
        let stopping = tokio::select! {
            () = stop.cancelled() => true,
            _ = ticker.tick() => false,
        };
        sink.flush().await;
        if stopping {
            return;
        }
    }
}

/// The sink's state between flushes.
struct Sink {
    options: StatsdOptions,
    metrics: Arc<Metrics>,
    counters: Arc<ServerCounters>,
    store: StoreReader,
    naming: Naming,
    /// Each Go stat name's [`Naming::parts`], as the last flush used them.
    parts: HashMap<String, (String, String)>,
    /// Each counter's (and timer bucket's) total as last sent.
    sent: HashMap<(String, Kind), u64>,
    tcp: Option<TcpStream>,
    udp: Option<UdpSocket>,
    failures: RateLimitedLog,
}

/// A batch's lines and, per counter (or timer bucket) it carries, the total it brings statsd to.
#[derive(Default)]
struct Batch {
    text: String,
    totals: Vec<((String, Kind), u64)>,
}

impl Sink {
    fn new(
        mut options: StatsdOptions,
        metrics: Arc<Metrics>,
        counters: Arc<ServerCounters>,
        store: StoreReader,
    ) -> Self {
        if matches!(options.dialect, Dialect::DogStatsd { .. }) {
            options.protocol = StatsdProtocol::Udp;
        }
        Self {
            naming: Naming::new(&options),
            options,
            metrics,
            counters,
            store,
            parts: HashMap::new(),
            sent: HashMap::new(),
            tcp: None,
            udp: None,
            failures: RateLimitedLog::default(),
        }
    }

    /// Sends what changed since the last flush.
    async fn flush(&mut self) {
        let limit = match self.options.protocol {
            StatsdProtocol::Tcp => TCP_BATCH,
            StatsdProtocol::Udp => UDP_BATCH,
        };
        let stats = go_stats::collect(&self.metrics, &(self.store)());
        let mut batches = self.batches(stats, limit).into_iter();
        while let Some(batch) = batches.next() {
            if let Err(error) = self.send(batch.text.as_bytes()).await {
                // The rest of this flush would fail the same way: it waits for the next one.
                let lines =
                    batch.text.lines().count() + batches.map(|b| b.text.lines().count()).sum::<usize>();
                self.counters.statsd_lines_dropped.add(lines as u64);
                let addr = self.options.addr.clone();
                self.failures.warn("cannot send stats to statsd", &addr, error);
                return;
            }
            self.sent.extend(batch.totals);
        }
    }

    /// Keeps what is remembered per name only for the names of `stats`: the rest went with a rule
    /// reload.
    fn forget_all_but(&mut self, stats: &[GoStat]) {
        let mut parts = HashMap::with_capacity(stats.len());
        for stat in stats {
            let known = self.parts.remove(&stat.name);
            parts.insert(
                stat.name.clone(),
                known.unwrap_or_else(|| self.naming.parts(&stat.name)),
            );
        }
        self.parts = parts;
        let parts = &self.parts;
        self.sent.retain(|(name, _), _| parts.contains_key(name));
    }

    /// The lines of `stats` that statsd needs, in batches of at most `limit` bytes (a longer line
    /// alone).
    fn batches(&mut self, stats: Vec<GoStat>, limit: usize) -> Vec<Batch> {
        self.forget_all_but(&stats);
        let mut batches = vec![Batch::default()];
        for stat in stats {
            let key = (stat.name, stat.kind);
            let increase = || {
                let before = self.sent.get(&key).copied().unwrap_or(0);
                // A counter never goes back; if one did (a restart of the registry), send it whole.
                stat.value.checked_sub(before).unwrap_or(stat.value)
            };
            let (head, tail) = &self.parts[&key.0];
            let mut line = String::with_capacity(head.len() + tail.len() + 40);
            let _ = match stat.kind {
                Kind::Gauge => writeln!(line, "{head}:{}|g{tail}", stat.value),
                Kind::Counter => match increase() {
                    0 => continue,
                    grew => writeln!(line, "{head}:{grew}|c{tail}"),
                },
                Kind::Timer { bucket } => match increase() {
                    0 => continue,
                    grew => {
                        let ms = Kind::timer_ms(bucket);
                        match sample_rate(grew) {
                            Some(rate) => writeln!(line, "{head}:{ms}|ms|@{rate}{tail}"),
                            None => writeln!(line, "{head}:{ms}|ms{tail}"),
                        }
                    }
                },
            };
            let last = batches.last_mut().expect("one batch at least");
            if !last.text.is_empty() && last.text.len() + line.len() > limit {
                batches.push(Batch::default());
            }
            let last = batches.last_mut().expect("one batch at least");
            last.text.push_str(&line);
            if stat.kind != Kind::Gauge {
                last.totals.push((key, stat.value));
            }
        }
        batches.retain(|b| !b.text.is_empty());
        batches
    }

    /// One write (TCP) or datagram (UDP), within [`WRITE_TIMEOUT`].
    async fn send(&mut self, bytes: &[u8]) -> io::Result<()> {
        let sent = tokio::time::timeout(WRITE_TIMEOUT, async {
            match self.options.protocol {
                StatsdProtocol::Tcp => {
                    if self.tcp.is_none() {
                        let stream = TcpStream::connect(&self.options.addr).await?;
                        stream.set_nodelay(true)?;
                        self.tcp = Some(stream);
                    }
                    let stream = self.tcp.as_mut().expect("connected above");
                    stream.write_all(bytes).await
                }
                StatsdProtocol::Udp => {
                    if self.udp.is_none() {
                        let target = tokio::net::lookup_host(&self.options.addr)
                            .await?
                            .next()
                            .ok_or_else(|| io::Error::other("the statsd host has no address"))?;
                        let local = if target.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" };
                        let socket = UdpSocket::bind(local).await?;
                        socket.connect(target).await?;
                        self.udp = Some(socket);
                    }
                    let socket = self.udp.as_ref().expect("bound above");
                    socket.send(bytes).await.map(|_| ())
                }
            }
        })
        .await
        .unwrap_or_else(|_| {
            Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "statsd did not take the batch in time",
            ))
        });
        if sent.is_err() {
            // Start afresh next time: a new connection, or a new lookup of the host.
            self.tcp = None;
            self.udp = None;
        }
        sent
    }
}

/// The sample rate that makes one timer line stand for `observations`: `None` for one; otherwise
/// close to its inverse, chosen so that statsd_exporter's `int(1 / rate)` (in double precision, from
/// the shortest decimal that reads back as `rate`, which is what `{}` writes) gives `observations`
/// exactly.
fn sample_rate(observations: u64) -> Option<f64> {
    if observations <= 1 {
        return None;
    }
    let wanted = observations as f64;
    let mut rate = 1.0 / wanted;
    while (1.0 / rate).trunc() < wanted {
        rate = rate.next_down();
    }
    Some(rate)
}

/// gostats' tag suffix: `.__key=value` per tag of [`go_stats::clean_tags`].
fn tag_suffix(tags: &ExtraTags) -> String {
    let mut suffix = String::new();
    for (key, value) in go_stats::clean_tags(tags) {
        let _ = write!(suffix, ".__{key}={value}");
    }
    suffix
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sink(tags: &[(&str, &str)]) -> Sink {
        let tags = ExtraTags(tags.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect());
        let options = StatsdOptions {
            addr: "127.0.0.1:1".into(),
            protocol: StatsdProtocol::Udp,
            interval: Duration::from_secs(10),
            tags,
            dialect: Dialect::Statsd,
        };
        Sink::new(
            options,
            Metrics::new(),
            ServerCounters::new(),
            Box::new(StoreCounters::default),
        )
    }

    fn counter(name: &str, value: u64) -> GoStat {
        GoStat {
            name: name.into(),
            kind: Kind::Counter,
            value,
        }
    }

    #[test]
    fn tags_are_sorted_and_cleaned_as_gostats_writes_them() {
        let tags = [("region", "eu.west:1"), ("env", "prod"), ("empty", "")];
        let tags = ExtraTags(tags.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect());
        assert_eq!(tag_suffix(&tags), ".__env=prod.__region=eu_west_1");
    }

    #[test]
    fn counters_send_their_increase_and_nothing_when_it_is_zero() {
        let mut sink = sink(&[("env", "prod")]);
        let batches = sink.batches(
            vec![counter("a.total_hits", 5), counter("a.over_limit", 0)],
            UDP_BATCH,
        );
        assert_eq!(batches.len(), 1);
        assert_eq!(batches[0].text, "a.total_hits.__env=prod:5|c\n");
        sink.sent.extend(batches.into_iter().flat_map(|b| b.totals));
        let batches = sink.batches(
            vec![counter("a.total_hits", 8), counter("a.over_limit", 0)],
            UDP_BATCH,
        );
        assert_eq!(batches[0].text, "a.total_hits.__env=prod:3|c\n");
        // That batch was never sent (not recorded): the next flush carries its increase too.
        let batches = sink.batches(vec![counter("a.total_hits", 9)], UDP_BATCH);
        assert_eq!(batches[0].text, "a.total_hits.__env=prod:4|c\n");
        assert!(
            sink.batches(vec![counter("a.total_hits", 5)], UDP_BATCH)
                .is_empty()
        );
    }

    #[test]
    fn timers_send_one_weighted_line_per_bucket_that_grew() {
        let mut sink = sink(&[("env", "prod")]);
        let timer = |bucket, value| GoStat {
            name: "ratelimit_server.ShouldRateLimit.response_time".into(),
            kind: Kind::Timer { bucket },
            value,
        };
        let batches = sink.batches(vec![timer(0, 1), timer(13, 4)], UDP_BATCH);
        assert_eq!(
            batches[0].text,
            "ratelimit_server.ShouldRateLimit.response_time.__env=prod:0.05|ms\n\
             ratelimit_server.ShouldRateLimit.response_time.__env=prod:1000|ms|@0.25\n"
        );
        sink.sent.extend(batches.into_iter().flat_map(|b| b.totals));
        let batches = sink.batches(vec![timer(0, 1), timer(13, 7)], UDP_BATCH);
        assert_eq!(
            batches[0].text,
            "ratelimit_server.ShouldRateLimit.response_time.__env=prod:1000|ms|@0.3333333333333333\n"
        );
    }

    /// statsd_exporter observes a timer line `int(1 / rate)` times.
    #[test]
    fn a_sample_rate_stands_for_exactly_its_observations() {
        for observations in (2..200_000u64).chain([1 << 40, 1 << 52]) {
            let rate = sample_rate(observations).expect("a rate");
            let read: f64 = rate.to_string().parse().expect("a number");
            assert_eq!((1.0 / read) as u64, observations, "{rate}");
        }
        assert_eq!(sample_rate(1), None);
    }

    #[test]
    fn batches_never_split_a_line_nor_pass_the_limit() {
        let mut sink = sink(&[]);
        let stats: Vec<GoStat> = (0..200)
            .map(|i| counter(&format!("ratelimit.service.rate_limit.d.k_{i}.total_hits"), 1))
            .collect();
        let batches = sink.batches(stats, UDP_BATCH);
        assert!(batches.len() > 1);
        let mut lines = 0;
        for batch in &batches {
            assert!(batch.text.len() <= UDP_BATCH, "{}", batch.text.len());
            assert!(batch.text.ends_with('\n'));
            lines += batch.text.lines().count();
        }
        assert_eq!(lines, 200);
    }
}
