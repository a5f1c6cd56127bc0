//! The replay: every record decided by both rule sets, each with a limiter over an embedded store of
//! its own, on one simulated clock set to the record's time. A request from an access log is decided
//! as `/forward-auth/{domain}` decides it (the domain's `proxy:` block, then Envoy's counting); a
//! decision from Tollgate's decision log as Envoy's `ShouldRateLimit`. Nothing is sent anywhere.

use std::sync::Arc;

use tollgate_core::clock::{Clock, ManualClock};
use tollgate_core::limiter::{
    AppliedLimit, Code, CurrentLimit, DescriptorStatus, Limiter, LimiterError, LimiterOptions, Verdict,
};
use tollgate_core::observe::metrics::Metrics;
use tollgate_core::rules::proxy::{BadRequestAnswer, Descriptor, ProxyRules};
use tollgate_core::rules::reload::load_rules;
use tollgate_core::rules::{CompileOptions, Rule, RuleSet, ValueHasher};
use tollgate_core::store::memory::MemoryStore;

use super::input::{HttpRequest, Record};

/// How often at most, in simulated time, state that can no longer change a decision is swept from
/// the stores, so that memory follows the live counters, not the log. A sweep also waits for as many
/// records as the stores kept at the last one, so that it costs a record at most one entry's visit:
/// the stores hold at most about twice their live counters, or those and five seconds' new ones. It
/// waits for at most a quarter of `--max-keys` records, so that a store near its cap is swept before
/// expired entries crowd it (evicting one would be reported as the replay under-counting).
const SWEEP_EVERY_US: u64 = 5_000_000;

/// One rule set's limiter.
pub(super) struct Side {
    rules: Arc<RuleSet>,
    limiter: Limiter<MemoryStore>,
}

/// A logged request as a `proxy:` block reads it: the descriptors it makes, or the answer it gets
/// without any (it cannot be read, or it makes none).
enum Made<'a> {
    /// The descriptors to decide.
    Descriptors(Vec<Descriptor<'a>>),
    /// Nothing to decide: the answer is already known.
    Answered(Decided),
}

/// What one side made of one record.
#[derive(Debug, Clone)]
pub(super) struct Decided {
    /// Whether the request was refused.
    pub(super) refused: bool,
    /// How it came to be decided.
    pub(super) how: How,
    /// The verdict's statuses, one per descriptor, kept as the limiter made them ([`Decided::limits`]
    /// reads them): taking each limit apart into a list of its own cost more than the tally.
    statuses: Vec<DescriptorStatus>,
    /// The first descriptor refused, by its place in the request.
    pub(super) first_refused: Option<usize>,
}

/// How a record was decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum How {
    /// By the rules.
    Rules,
    /// The request made no descriptor: no limit applied.
    NotLimited,
    /// The request could not be read (its reason), and the `proxy:` block's `failure_mode` decided.
    Unreadable(&'static str),
    /// The limiter refused the question (its reason): counted, never an answer.
    Error(&'static str),
}

/// One limit that applied to a record.
#[derive(Debug, Clone, Copy)]
pub(super) struct LimitSeen<'d> {
    /// The rule it belongs to.
    pub(super) rule: &'d Arc<Rule>,
    /// The limit as configured, its name included; [`LimitSeen::text`] describes it.
    pub(super) limit: &'d CurrentLimit,
    /// Whether it refused.
    pub(super) refused: bool,
    /// The share of its capacity in use after the request (1.0: none left).
    pub(super) used: f64,
}

impl Side {
    /// Loads `dir` as `serve` would and builds its limiter on `clock`.
    pub(super) fn load(
        dir: &std::path::Path,
        merge_domains: bool,
        compile: CompileOptions,
        options: LimiterOptions,
        clock: &Arc<ManualClock>,
        max_keys: usize,
    ) -> Result<Self, String> {
        let metrics = Metrics::new();
        let rules = Arc::new(load_rules(dir, merge_domains, compile, &metrics).map_err(|e| e.to_string())?);
        let handle = Arc::new(arc_swap::ArcSwapOption::new(Some(Arc::clone(&rules))));
        let clock: Arc<dyn Clock> = Arc::clone(clock) as Arc<dyn Clock>;
        let store = MemoryStore::with_max_keys(clock, max_keys);
        let limiter = Limiter::new(handle, store, ValueHasher::new(""), options)
            .with_metrics(metrics)
            .untimed();
        Ok(Self { rules, limiter })
    }

    /// The `proxy:` block of `domain`, if it has one.
    pub(super) fn proxy(&self, domain: &str) -> Option<&ProxyRules> {
        self.rules.domain(domain)?.proxy()
    }

    /// Whether the rules define `domain`.
    pub(super) fn has_domain(&self, domain: &str) -> bool {
        self.rules.domain(domain).is_some()
    }

    /// Entries the store evicted for want of room (the replay under-counts when any were).
    pub(super) fn evictions(&self) -> u64 {
        self.limiter.store().evictions()
    }

    /// Decides `record`, at the clock's time; HTTP requests in `domain`.
    pub(super) fn decide(&self, record: &Record, domain: &str) -> Decided {
        match record {
            Record::Http(request) => self.decide_made(&self.make(request, domain), domain),
            Record::Decision(decision) => answer(self.limiter.should_rate_limit_now(
                &decision.domain,
                &decision.descriptors,
                0,
            )),
        }
    }

    /// What this side's `proxy:` block of `domain` makes of `request`.
    fn make<'a>(&'a self, request: &'a HttpRequest, domain: &str) -> Made<'a> {
        let Some(proxy) = self.proxy(domain) else {
            return Made::Answered(Decided::plain(false, How::Error("no_proxy_block")));
        };
        match proxy.descriptors(request) {
            Err(bad) => {
                let refused = proxy.failure_mode == Some(BadRequestAnswer::Closed);
                Made::Answered(Decided::plain(refused, How::Unreadable(bad.reason())))
            }
            Ok(descriptors) if descriptors.is_empty() => {
                Made::Answered(Decided::plain(false, How::NotLimited))
            }
            Ok(descriptors) => Made::Descriptors(descriptors),
        }
    }

    /// Decides a request made into `made` (by this side's `proxy:` block or an equal one), at the
    /// clock's time.
    fn decide_made(&self, made: &Made<'_>, domain: &str) -> Decided {
        match made {
            Made::Answered(decided) => decided.clone(),
            Made::Descriptors(descriptors) => answer(self.limiter.forward_auth_now(domain, descriptors)),
        }
    }

    /// Sweeps expired state; returns the entries left.
    fn sweep(&self) -> usize {
        let store = self.limiter.store();
        store.sweep();
        store.len()
    }
}

/// What a limiter's answer says.
fn answer(verdict: Result<Verdict, LimiterError>) -> Decided {
    match verdict {
        Ok(verdict) => Decided::from(verdict),
        Err(error) => Decided::plain(false, How::Error(reason(&error))),
    }
}

fn reason(error: &LimiterError) -> &'static str {
    match error {
        LimiterError::UnknownDomain(_) => "unknown_domain",
        LimiterError::NoConfig => "no_rules",
        _ => "invalid_request",
    }
}

impl Decided {
    fn plain(refused: bool, how: How) -> Self {
        Self {
            refused,
            how,
            statuses: Vec::new(),
            first_refused: None,
        }
    }

    /// What `verdict` says, its statuses moved out of it rather than copied.
    fn from(verdict: Verdict) -> Self {
        Self {
            refused: verdict.overall == Code::OverLimit,
            how: How::Rules,
            first_refused: verdict.statuses.iter().position(|s| s.code == Code::OverLimit),
            statuses: verdict.statuses,
        }
    }

    /// Each limit of a rule that applied.
    pub(super) fn limits(&self) -> impl Iterator<Item = LimitSeen<'_>> {
        self.statuses.iter().filter_map(|status| {
            let AppliedLimit::Limited(limit) = &status.limit else {
                return None;
            };
            let capacity = limit.burst.max(1);
            let left = status.remaining.min(capacity);
            Some(LimitSeen {
                rule: status.rule.as_ref()?,
                refused: status.code == Code::OverLimit,
                used: (capacity - left) as f64 / capacity as f64,
                limit,
            })
        })
    }
}

impl LimitSeen<'_> {
    /// How the limit reads: `300 per 1m (sliding_window)`.
    pub(super) fn text(&self) -> String {
        let window = humantime::format_duration(self.limit.window);
        format!(
            "{} per {window} ({})",
            self.limit.requests_per_unit,
            self.limit.algorithm.as_str()
        )
    }
}

/// Both sides on one clock.
pub(super) struct Replay {
    clock: Arc<ManualClock>,
    /// The rules in force.
    pub(super) current: Side,
    /// The rules proposed.
    pub(super) proposed: Side,
    next_sweep_us: u64,
    /// Records decided since the last sweep, and how many to wait for before the next: the entries
    /// the larger store kept at the last one, at most a quarter of its cap.
    since_sweep: usize,
    sweep_after: usize,
    /// A quarter of each store's key cap.
    quarter_cap: usize,
    /// The domain HTTP requests were last decided in, and whether both sides' `proxy:` blocks of it
    /// are equal: then a request's descriptors are made once for both.
    proxies_alike: Option<(String, bool)>,
}

impl Replay {
    /// Both sides, on `clock`, each store holding at most `max_keys` entries.
    pub(super) fn new(clock: Arc<ManualClock>, current: Side, proposed: Side, max_keys: usize) -> Self {
        Self {
            clock,
            current,
            proposed,
            next_sweep_us: 0,
            since_sweep: 0,
            sweep_after: 0,
            quarter_cap: max_keys / 4,
            proxies_alike: None,
        }
    }

    /// Decides `record` on both sides at its time (the clock never goes back: a record earlier than
    /// the last one, which the reordering lets through only within its window, is decided at the
    /// last one's time).
    pub(super) fn decide(&mut self, record: &Record, domain: &str) -> (Decided, Decided) {
        let now = record.time_us().max(self.clock.now_us());
        self.clock.set_us(now);
        self.since_sweep += 1;
        if now >= self.next_sweep_us && self.since_sweep > self.sweep_after {
            let kept = self.current.sweep().max(self.proposed.sweep());
            self.sweep_after = kept.min(self.quarter_cap);
            self.since_sweep = 0;
            self.next_sweep_us = now + SWEEP_EVERY_US;
        }
        match record {
            Record::Http(request) if self.proxies_alike(domain) => {
                let made = self.current.make(request, domain);
                (
                    self.current.decide_made(&made, domain),
                    self.proposed.decide_made(&made, domain),
                )
            }
            _ => (
                self.current.decide(record, domain),
                self.proposed.decide(record, domain),
            ),
        }
    }

    /// Whether both sides' `proxy:` blocks of `domain` are equal (compared once per domain).
    fn proxies_alike(&mut self, domain: &str) -> bool {
        match &self.proxies_alike {
            Some((known, alike)) if known == domain => *alike,
            _ => {
                let alike = self.current.proxy(domain) == self.proposed.proxy(domain);
                self.proxies_alike = Some((domain.to_owned(), alike));
                alike
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::what_if::input::{Fields, LineReader, LogFormat};
    use crate::what_if::time;

    /// A log of ever-new callers, each counter alive for a second: the stores are swept as the log
    /// goes, holding about the live counters and five seconds' new ones, and never evict.
    #[test]
    fn sweeps_keep_the_stores_near_their_live_counters() {
        let rules = tempfile::tempdir().expect("tempdir");
        std::fs::write(
            rules.path().join("d.yaml"),
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
        )
        .expect("rules");
        let start_us = 1_796_472_000_000_000;
        let clock = Arc::new(ManualClock::new(start_us));
        let max_keys = 4_096;
        let side = || {
            let options = LimiterOptions::default();
            Side::load(
                rules.path(),
                false,
                CompileOptions::default(),
                options,
                &clock,
                max_keys,
            )
            .expect("side")
        };
        let mut replay = Replay::new(Arc::clone(&clock), side(), side(), max_keys);
        let mut reader = LineReader::new(LogFormat::Decisions, Fields::default());
        let mut most = 0;
        // 100 records a simulated second, each from a new caller, for 200 seconds.
        for i in 0..20_000u64 {
            let time = time::format(start_us + i * 10_000);
            let line = format!(
                r#"{{"time":"{time}","domain":"d","descriptors":[{{"entries":[{{"key":"k","value":"c{i}"}}]}}]}}"#
            );
            let record = reader.read(&line).expect("a decision");
            let (before, _) = replay.decide(&record, "");
            assert!(!before.refused);
            most = most.max(replay.current.limiter.store().len());
        }
        // Without sweeps the store would fill to its cap (4,096) and evict.
        assert!(most <= 1_000, "the store held {most} counters");
        assert_eq!((replay.current.evictions(), replay.proposed.evictions()), (0, 0));
    }
}
