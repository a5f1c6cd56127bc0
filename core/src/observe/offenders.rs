//! Top offenders: who is being limited, per domain, without putting caller values into metric labels.
//!
//! Each domain keeps a space-saving sketch (Metwally et al.) of the descriptors that were refused or
//! came close to their limit: at most [`CAPACITY`] entries. A new caller that does not fit evicts the
//! smallest entry and inherits its count as an error bound, so every caller whose true count exceeds
//! `total / CAPACITY` is guaranteed to be listed, with `count - error <= true count <= count`. Memory is
//! bounded whatever the traffic. Entries are storage keys, so values a rule hashes stay hashed. Served as
//! JSON at `/top` on the debug port and summarised in the log periodically.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, PoisonError};

use serde::Serialize;

/// Callers tracked per domain.
pub const CAPACITY: usize = 100;

/// One tracked caller.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Offender {
    /// The descriptor's storage key (`domain_key_value_…`, hashed where the rule hashes).
    pub key: String,
    /// Hits counted (an overestimate by at most `error`).
    pub count: u64,
    /// How much of `count` may belong to callers evicted before this one.
    pub error: u64,
}

#[derive(Debug, Default)]
struct Sketch {
    entries: HashMap<String, (u64, u64)>,
}

impl Sketch {
    fn observe(&mut self, key: &str, hits: u64) {
        if let Some((count, _)) = self.entries.get_mut(key) {
            *count = count.saturating_add(hits);
            return;
        }
        if self.entries.len() < CAPACITY {
            self.entries.insert(key.to_owned(), (hits, 0));
            return;
        }
        // Evict the smallest; the newcomer inherits its count as the error bound.
        let smallest = self
            .entries
            .iter()
            .min_by_key(|(_, (count, _))| *count)
            .map(|(k, (c, _))| (k.clone(), *c));
        if let Some((evicted, floor)) = smallest {
            self.entries.remove(&evicted);
            self.entries
                .insert(key.to_owned(), (floor.saturating_add(hits), floor));
        }
    }

    fn top(&self, n: usize) -> Vec<Offender> {
        let mut all: Vec<Offender> = self
            .entries
            .iter()
            .map(|(key, (count, error))| Offender {
                key: key.clone(),
                count: *count,
                error: *error,
            })
            .collect();
        all.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.key.cmp(&b.key)));
        all.truncate(n);
        all
    }
}

/// The sketches of every domain.
#[derive(Debug, Default)]
pub struct TopOffenders {
    domains: Mutex<BTreeMap<String, Sketch>>,
}

impl TopOffenders {
    /// Counts `hits` against the caller `key` of `domain` (a domain from the rules, so the number of
    /// sketches is bounded by the configuration).
    pub fn observe(&self, domain: &str, key: &str, hits: u64) {
        let mut domains = self.domains.lock().unwrap_or_else(PoisonError::into_inner);
        match domains.get_mut(domain) {
            Some(sketch) => sketch.observe(key, hits),
            None => domains.entry(domain.to_owned()).or_default().observe(key, hits),
        }
    }

    /// The `n` heaviest callers of every domain, heaviest first.
    pub fn top(&self, n: usize) -> BTreeMap<String, Vec<Offender>> {
        let domains = self.domains.lock().unwrap_or_else(PoisonError::into_inner);
        domains
            .iter()
            .map(|(domain, sketch)| (domain.clone(), sketch.top(n)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heavy_hitters_survive_a_flood_of_distinct_callers() {
        let top = TopOffenders::default();
        for round in 0..1_000u64 {
            top.observe("api", "api_ip_attacker_", 10);
            top.observe("api", "api_user_cron_", 3);
            top.observe("api", &format!("api_ip_{round}_"), 1);
        }
        let api = &top.top(2)["api"];
        assert_eq!(api[0].key, "api_ip_attacker_");
        assert_eq!(api[1].key, "api_user_cron_");
        assert!(api[0].count - api[0].error <= 10_000 && api[0].count >= 10_000);
        let sketch_size = top.top(usize::MAX)["api"].len();
        assert!(sketch_size <= CAPACITY, "{sketch_size}");
    }
}
