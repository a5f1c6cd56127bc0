//! Sliding log: an exact sliding window.
//!
//! The state is the log of admitted requests as `(timestamp, cost)` entries, oldest first.
//! An entry is live while `timestamp > now - window`, i.e. it expires exactly `window` µs
//! after it was admitted. With `used` the total cost of live entries, a request of cost `c`
//! is allowed iff `used + c <= requests`; then `(now, c)` is appended, merged into the last
//! entry when the timestamp is the same. Denied requests and peeks leave the state unchanged.
//!
//! Memory: every live entry has cost >= 1 and the live total never exceeds `requests`, so the
//! log holds at most `requests` entries (expired ones are dropped on the next admission).
//! That is why this algorithm suits small `requests`; each decision is O(entries).
//!
//! * `remaining`: `requests - used_after`.
//! * `reset_after_us`: time until the newest live entry expires (0 for an empty log); expiry
//!   is that same instant.
//! * `retry_after_us`: exact time until enough of the oldest entries expire for
//!   `used + c <= requests`; for `c > requests`: `reset_after_us`.
//!
//! If the clock steps back, a new entry is stamped with the newest existing timestamp
//! instead, so the log stays sorted and the entry expires later rather than earlier.
//!
//! # Refunds
//!
//! A refund of `n` removes the newest live entries totalling up to `n`, the last one only in
//! part if it holds more (its cost shrinks, it keeps its timestamp); expired entries are
//! dropped, and entries that already expired are never refunded (their charge is over). The
//! newest entries are the likeliest to be the charge being refunded, so a refund right after
//! a consumption of `n` restores the exact log; a refund matching an older charge frees the
//! same amount now but leaves the older entry to expire when it would have.

use super::{Decision, Limit, clamp_u64, refunded};
use std::collections::VecDeque;

/// Admitted requests that may still be inside the window, oldest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct State {
    /// Sorted by timestamp, no two entries with the same timestamp, every cost >= 1.
    entries: VecDeque<Entry>,
}

/// Cost admitted at one instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    at_us: u64,
    cost: u64,
}

impl Entry {
    /// First instant at which the entry no longer counts (may exceed `u64::MAX`).
    fn expiry(&self, window: u64) -> u128 {
        u128::from(self.at_us) + u128::from(window)
    }
}

impl State {
    /// Index of the oldest entry still live at `now` (entries are sorted, so binary search).
    fn first_live(&self, window: u64, now: u64) -> usize {
        let now = u128::from(now);
        self.entries.partition_point(|e| e.expiry(window) <= now)
    }

    /// Total cost of the entries from `first` on.
    fn used_from(&self, first: usize) -> u128 {
        self.entries.range(first..).map(|e| u128::from(e.cost)).sum()
    }

    /// µs from `now` until the newest entry expires.
    fn reset_after(&self, window: u64, now: u64) -> u128 {
        self.entries
            .back()
            .map_or(0, |e| e.expiry(window).saturating_sub(u128::from(now)))
    }

    /// µs from `now` until at least `excess` cost has expired, if the live entries hold it.
    fn time_until_freed(&self, first: usize, window: u64, now: u64, excess: u128) -> Option<u128> {
        let mut freed = 0u128;
        let entry = self.entries.range(first..).find(|e| {
            freed += u128::from(e.cost);
            freed >= excess
        })?;
        Some(entry.expiry(window).saturating_sub(u128::from(now)))
    }

    /// The live entries plus `cost` admitted at `now` (or at the newest timestamp, if later).
    fn admit(&self, first: usize, now: u64, cost: u64) -> State {
        let mut entries: VecDeque<Entry> = self.entries.range(first..).copied().collect();
        let at_us = entries.back().map_or(now, |e| e.at_us.max(now));
        match entries.back_mut() {
            Some(last) if last.at_us == at_us => last.cost = last.cost.saturating_add(cost),
            _ => entries.push_back(Entry { at_us, cost }),
        }
        State { entries }
    }

    /// The live entries minus the newest `amount` cost: whole entries, then part of the next.
    fn give_back(&self, first: usize, amount: u64) -> State {
        let mut entries: VecDeque<Entry> = self.entries.range(first..).copied().collect();
        let mut left = amount;
        while let Some(newest) = entries.back_mut().filter(|_| left > 0) {
            if newest.cost > left {
                // Leaves a cost >= 1, as the log requires.
                newest.cost -= left;
                break;
            }
            left -= newest.cost;
            entries.pop_back();
        }
        State { entries }
    }
}

/// See the module docs.
pub(crate) fn decide(limit: &Limit, state: Option<&State>, now_us: u64, cost: u64) -> (Decision, State) {
    let window = limit.window();
    let empty = State::default();
    let current = state.unwrap_or(&empty);
    let first = current.first_live(window, now_us);
    let after = current.used_from(first) + u128::from(cost);
    let requests = u128::from(limit.requests);
    if after > requests {
        let reset = current.reset_after(window, now_us);
        // A cost above `requests` needs more freed than the log holds: full reset then.
        let retry = current
            .time_until_freed(first, window, now_us, after - requests)
            .unwrap_or(reset);
        return (
            Decision::deny(clamp_u64(reset), clamp_u64(retry)),
            current.clone(),
        );
    }
    let next = if cost == 0 {
        current.clone()
    } else {
        current.admit(first, now_us, cost)
    };
    let reset = clamp_u64(next.reset_after(window, now_us));
    (Decision::allow(clamp_u64(requests - after), reset), next)
}

/// See the module docs ("Refunds").
pub(crate) fn refund(limit: &Limit, state: Option<&State>, now_us: u64, amount: u64) -> (Decision, State) {
    let empty = State::default();
    let current = state.unwrap_or(&empty);
    let first = current.first_live(limit.window(), now_us);
    let next = if amount == 0 || first == current.entries.len() {
        current.clone()
    } else {
        current.give_back(first, amount)
    };
    let (check, _) = decide(limit, Some(&next), now_us, 0);
    (refunded(check), next)
}

/// When the newest entry expires; an empty log is already expired.
pub(crate) fn expires_at_us(limit: &Limit, state: &State) -> u64 {
    state
        .entries
        .back()
        .map_or(0, |e| clamp_u64(e.expiry(limit.window())))
}

#[cfg(test)]
mod tests {
    use super::super::harness::{admitted, check_invariants, large_case, run, small_case, timeline};
    use super::super::{Algorithm, Decision, Limit};
    use super::*;
    use proptest::prelude::*;

    fn limit(requests: u64, window_us: u64) -> Limit {
        Limit {
            algorithm: Algorithm::SlidingLog,
            requests,
            window_us,
            burst: requests,
        }
    }

    /// Naive true sliding window: scan every admitted request for each decision.
    fn model(limit: &Limit, timeline: &[(u64, u64)]) -> Vec<Decision> {
        let w = limit.window();
        let mut log: Vec<(u64, u64)> = Vec::new();
        let mut out = Vec::new();
        for &(now, cost) in timeline {
            let live: Vec<_> = log.iter().filter(|(t, _)| t + w > now).copied().collect();
            let used: u64 = live.iter().map(|&(_, c)| c).sum();
            let allowed = used + cost <= limit.requests;
            if allowed && cost > 0 {
                log.push((now, cost));
            }
            let newest = log.last().map_or(0, |&(t, _)| (t + w).saturating_sub(now));
            out.push(if allowed {
                Decision::allow(limit.requests - used - cost, newest)
            } else {
                let retry = if cost > limit.requests {
                    newest
                } else {
                    // First instant at which enough live cost has expired.
                    let mut freed = 0;
                    live.iter()
                        .find(|&&(_, c)| {
                            freed += c;
                            used + cost - freed <= limit.requests
                        })
                        .map_or(newest, |&(t, _)| t + w - now)
                };
                Decision::deny(newest, retry)
            });
        }
        out
    }

    proptest! {
        #[test]
        fn matches_naive_true_sliding_window(
            (limit, start, steps) in small_case(Algorithm::SlidingLog)
        ) {
            let run = run(&limit, start, &steps);
            let timeline = timeline(&run);
            let got: Vec<_> = run.iter().map(|s| s.decision).collect();
            prop_assert_eq!(got, model(&limit, &timeline));
            check_invariants(&limit, &run);
        }

        #[test]
        fn every_window_length_interval_admits_at_most_requests(
            (limit, start, steps) in small_case(Algorithm::SlidingLog)
        ) {
            let run = run(&limit, start, &steps);
            let log = admitted(&run);
            for &(a, _) in &log {
                let sum: u64 = log.iter()
                    .filter(|(t, _)| (a..a + limit.window()).contains(t))
                    .map(|&(_, c)| c)
                    .sum();
                prop_assert!(sum <= limit.requests);
            }
            for step in &run {
                let State { entries } = match &step.after {
                    super::super::State::SlidingLog(s) => s,
                    other => panic!("wrong variant {other:?}"),
                };
                prop_assert!(entries.len() as u64 <= limit.requests);
            }
        }

        #[test]
        fn large_limits_keep_invariants(
            (limit, start, steps) in large_case(Algorithm::SlidingLog)
        ) {
            check_invariants(&limit, &run(&limit, start, &steps));
        }
    }

    #[test]
    fn entries_expire_exactly_one_window_after_admission() {
        let limit = limit(2, 100);
        let (_, s) = decide(&limit, None, 10, 1);
        let (_, s) = decide(&limit, Some(&s), 30, 1);
        let (d, _) = decide(&limit, Some(&s), 50, 2);
        // Both entries must go: the one from 30 expires at 130.
        assert_eq!(d, Decision::deny(80, 80));
        let (d, _) = decide(&limit, Some(&s), 109, 1);
        assert_eq!(d, Decision::deny(21, 1));
        assert_eq!(decide(&limit, Some(&s), 110, 1).0, Decision::allow(0, 100));
    }

    #[test]
    fn same_instant_admissions_share_one_entry() {
        let limit = limit(5, 100);
        let (_, s) = decide(&limit, None, 7, 2);
        let (_, s) = decide(&limit, Some(&s), 7, 3);
        assert_eq!(s.entries, [Entry { at_us: 7, cost: 5 }]);
        assert_eq!(expires_at_us(&limit, &s), 107);
    }

    #[test]
    fn refund_removes_the_newest_entries_first_in_part_if_needed() {
        let limit = limit(5, 100);
        let (_, s) = decide(&limit, None, 10, 2);
        let (_, s) = decide(&limit, Some(&s), 30, 3);
        let (d, r) = refund(&limit, Some(&s), 40, 4);
        assert_eq!(r.entries, [Entry { at_us: 10, cost: 1 }]);
        assert_eq!(d, Decision::allow(4, 70));
        let (d, r) = refund(&limit, Some(&r), 40, 9);
        assert!(r.entries.is_empty());
        assert_eq!(d, Decision::allow(5, 0), "never above the limit");
    }

    #[test]
    fn refund_restores_what_was_just_admitted_and_skips_expired_entries() {
        let limit = limit(5, 100);
        let (_, s) = decide(&limit, None, 10, 2);
        let (_, s) = decide(&limit, Some(&s), 30, 1);
        let (_, charged) = decide(&limit, Some(&s), 30, 2);
        let (d, r) = refund(&limit, Some(&charged), 30, 2);
        assert_eq!(d, decide(&limit, Some(&s), 30, 0).0);
        assert_eq!(r, s);
        // At 115 the entry from 10 has expired: only the one from 30 can be refunded.
        let (d, r) = refund(&limit, Some(&charged), 115, 5);
        assert!(r.entries.is_empty());
        assert_eq!(d, Decision::allow(5, 0));
    }
}
