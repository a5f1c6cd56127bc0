//! What the replay found, counted as it goes, in memory that does not grow with the log: per rule
//! the refusals on each side, over time, and the highest share of the limit in use; the clients the
//! proposed rules newly refuse (the first [`MAX_CLIENTS`] by name, the rest counted together); the
//! requests that would now pass.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use super::replay::{Decided, How, LimitSeen};

/// Clients listed by name; beyond these, newly refused requests count together.
pub(super) const MAX_CLIENTS: usize = 100_000;

/// Most time buckets: when the log's span needs more, buckets double in width.
const MAX_BUCKETS: usize = 240;

/// The sides, as indexes into the per-side arrays.
pub(super) const CURRENT: usize = 0;
/// The proposed rules' index.
pub(super) const PROPOSED: usize = 1;

/// Everything counted.
#[derive(Debug, Default)]
pub(super) struct Tally {
    /// Records replayed.
    pub(super) requests: u64,
    /// The first and last record's times.
    pub(super) span_us: Option<(u64, u64)>,
    /// Per side.
    pub(super) sides: [SideTally; 2],
    /// Requests the current rules allow and the proposed ones refuse.
    pub(super) newly_refused: u64,
    /// Requests the current rules refuse and the proposed ones allow.
    pub(super) now_allowed: u64,
    /// Per limit of a rule, in the order first seen.
    pub(super) rules: Vec<RuleTally>,
    /// Where each limit is in `rules`, by its rule's path and its name: the same limit on both
    /// sides is one tally.
    index: HashMap<(Arc<str>, Option<Arc<str>>), usize>,
    /// The same, by the identity of the loaded rule and name ([`identity`]): what a request looks up,
    /// without hashing a string.
    seen: hashbrown::HashMap<(usize, usize), usize>,
    /// The newly refused, by client.
    pub(super) clients: HashMap<String, ClientTally>,
    /// Newly refused requests of clients beyond [`MAX_CLIENTS`].
    pub(super) unlisted: u64,
    /// Refusals over time.
    pub(super) timeline: Timeline,
}

/// One side's totals.
#[derive(Debug, Default)]
pub(super) struct SideTally {
    /// Requests refused.
    pub(super) refused: u64,
    /// Requests that made no descriptor.
    pub(super) not_limited: u64,
    /// Requests that could not be read, per reason.
    pub(super) unreadable: BTreeMap<&'static str, u64>,
    /// Requests the limiter refused to decide, per reason.
    pub(super) errors: BTreeMap<&'static str, u64>,
}

/// One limit of one rule.
#[derive(Debug)]
pub(super) struct RuleTally {
    /// The rule's path.
    pub(super) path: Arc<str>,
    /// The limit's name.
    pub(super) name: Option<Arc<str>>,
    /// How the limit reads on each side where it applied.
    pub(super) limit: [Option<String>; 2],
    /// Requests it applied to, per side.
    pub(super) requests: [u64; 2],
    /// Requests it refused, per side.
    pub(super) refused: [u64; 2],
    /// The highest share of it in use after a request, per side.
    pub(super) peak: [f64; 2],
}

impl RuleTally {
    /// `api.remote_address (per-ip)`.
    pub(super) fn label(&self) -> String {
        match &self.name {
            Some(name) => format!("{} ({name})", self.path),
            None => self.path.to_string(),
        }
    }
}

/// A newly refused client.
#[derive(Debug, Clone, Copy)]
pub(super) struct ClientTally {
    /// Its newly refused requests.
    pub(super) requests: u64,
    /// When the first was.
    pub(super) first_us: u64,
}

/// Refusals per time bucket, per rule and side.
#[derive(Debug, Default)]
pub(super) struct Timeline {
    /// The first bucket's start.
    pub(super) start_us: u64,
    /// A bucket's width.
    pub(super) bucket_us: u64,
    /// Per rule (the index of [`Tally::rules`]), per side, the refusals in each bucket.
    pub(super) series: Vec<[Vec<u64>; 2]>,
    /// Buckets in use.
    pub(super) buckets: usize,
}

impl Timeline {
    /// Starts the buckets at the second of `time_us`, the log's first record.
    fn begin(&mut self, time_us: u64) {
        self.bucket_us = 1_000_000;
        self.start_us = time_us - time_us % self.bucket_us;
    }

    fn count(&mut self, rule: usize, side: usize, time_us: u64) {
        let mut at = (time_us.saturating_sub(self.start_us) / self.bucket_us) as usize;
        while at >= MAX_BUCKETS {
            self.halve();
            at = (time_us.saturating_sub(self.start_us) / self.bucket_us) as usize;
        }
        self.buckets = self.buckets.max(at + 1);
        while self.series.len() <= rule {
            self.series.push([vec![0; MAX_BUCKETS], vec![0; MAX_BUCKETS]]);
        }
        self.series[rule][side][at] += 1;
    }

    /// Doubles the buckets' width, adding each pair together.
    fn halve(&mut self) {
        for sides in &mut self.series {
            for buckets in sides.iter_mut() {
                for i in 0..MAX_BUCKETS {
                    buckets[i] = if i < MAX_BUCKETS / 2 {
                        buckets[2 * i] + buckets[2 * i + 1]
                    } else {
                        0
                    };
                }
            }
        }
        self.bucket_us *= 2;
        self.buckets = self.buckets.div_ceil(2);
    }
}

impl Tally {
    /// Counts one record, decided `before` (current rules) and `after` (proposed) at `time_us`;
    /// `who` names its client, asked only for a newly refused request.
    pub(super) fn add(&mut self, time_us: u64, decided: [&Decided; 2], who: impl FnOnce() -> String) {
        self.requests += 1;
        self.span_us = Some(match self.span_us {
            Some((first, last)) => (first.min(time_us), last.max(time_us)),
            None => {
                self.timeline.begin(time_us);
                (time_us, time_us)
            }
        });
        for (side, decided) in decided.iter().enumerate() {
            self.side(side, decided, time_us);
        }
        let [before, after] = decided;
        if !before.refused && after.refused {
            self.newly_refused += 1;
            let who = who();
            if let Some(client) = self.clients.get_mut(&who) {
                client.requests += 1;
            } else if self.clients.len() < MAX_CLIENTS {
                let first = ClientTally {
                    requests: 1,
                    first_us: time_us,
                };
                self.clients.insert(who, first);
            } else {
                self.unlisted += 1;
            }
        } else if before.refused && !after.refused {
            self.now_allowed += 1;
        }
    }

    fn side(&mut self, side: usize, decided: &Decided, time_us: u64) {
        let totals = &mut self.sides[side];
        if decided.refused {
            totals.refused += 1;
        }
        match decided.how {
            How::Rules => {}
            How::NotLimited => totals.not_limited += 1,
            How::Unreadable(reason) => *totals.unreadable.entry(reason).or_default() += 1,
            How::Error(reason) => *totals.errors.entry(reason).or_default() += 1,
        }
        for seen in decided.limits() {
            let at = match self.seen.get(&identity(&seen)) {
                Some(at) => *at,
                None => self.first_sight(&seen),
            };
            let rule = &mut self.rules[at];
            if rule.limit[side].is_none() {
                rule.limit[side] = Some(seen.text());
            }
            rule.requests[side] += 1;
            rule.peak[side] = rule.peak[side].max(seen.used);
            if seen.refused {
                rule.refused[side] += 1;
                self.timeline.count(at, side, time_us);
            }
        }
    }

    /// The tally of a limit not looked up by identity yet: the one of the same path and name if the
    /// other side has one, else a new one.
    fn first_sight(&mut self, seen: &LimitSeen<'_>) -> usize {
        let key = (Arc::clone(&seen.rule.path), seen.limit.name.clone());
        let at = match self.index.get(&key) {
            Some(at) => *at,
            None => {
                self.rules.push(RuleTally {
                    path: Arc::clone(&seen.rule.path),
                    name: seen.limit.name.clone(),
                    limit: [None, None],
                    requests: [0; 2],
                    refused: [0; 2],
                    peak: [0.0; 2],
                });
                self.index.insert(key, self.rules.len() - 1);
                self.rules.len() - 1
            }
        };
        self.seen.insert(identity(seen), at);
        at
    }

    /// The newly refused clients, most requests first (then the earliest), at most `n`.
    pub(super) fn top_clients(&self, n: usize) -> Vec<(&str, ClientTally)> {
        let mut clients: Vec<(&str, ClientTally)> =
            self.clients.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        clients.sort_by(|a, b| {
            b.1.requests
                .cmp(&a.1.requests)
                .then(a.1.first_us.cmp(&b.1.first_us))
        });
        clients.truncate(n);
        clients
    }
}

/// A limit's identity in the rules loaded for the replay: its rule's address and its name's. Each
/// side holds its rules for the whole run, so an address is never reused for another limit.
fn identity(seen: &LimitSeen<'_>) -> (usize, usize) {
    let name = seen
        .limit
        .name
        .as_ref()
        .map_or(0, |name| Arc::as_ptr(name).cast::<u8>() as usize);
    (Arc::as_ptr(seen.rule) as usize, name)
}
