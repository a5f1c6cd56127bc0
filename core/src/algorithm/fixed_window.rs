//! Fixed window counter, matching envoyproxy/ratelimit (Go) exactly.
//!
//! Windows are aligned to the Unix epoch: the window containing `now` starts at
//! `floor(now / window) * window`. The state is `(window_start, count)`; a state from any
//! other window counts as a fresh window with count 0.
//!
//! A request of cost `c` computes `after = count + c` (saturating) and is allowed iff
//! `after <= requests`. The stored count becomes `after` **even when denied**: the Go service
//! increments its counter on every request, over the limit or not, and we keep that
//! behaviour so that a mixed fleet (or a migration) counts identically. One consequence: once
//! a window is over the limit it stays denied for its remainder, whatever the cost.
//!
//! A peek (cost 0) leaves the state unchanged and is allowed iff `count <= requests`, so
//! right after the limit is exactly exhausted a peek is allowed with `remaining == 0`, and
//! once denied requests pushed the counter past the limit a peek is denied.
//!
//! * `remaining`: `requests - after` when allowed (for a peek, `requests - count`).
//! * `reset_after_us`: time until the window ends, allowed or not.
//! * `retry_after_us`: time until the window ends (the counter restarts at 0 there, and it
//!   only grows before); for a cost above `requests` that is also the "full reset" time.
//! * expiry: the window end.
//!
//! Near `u64::MAX` the window end saturates to `u64::MAX`, so the last window is truncated.
//!
//! # Refunds
//!
//! A refund of `n` subtracts `n` from the current window's count, saturating at 0, and reports
//! what a peek of the new count sees (allowed, even while the count is still above the limit).
//! The count is all the state there is: it does not record when each unit was charged. So a
//! refund for a charge made in a window that has since rolled over cannot be told apart from
//! one for this window: it lands in the current window, and a state from an earlier window is
//! no state, so **a refund into a fresh window refunds nothing** (it is meaningless, and
//! nothing is written). Into a window that already holds other charges it returns units of
//! those instead, which is the best a counter can do; callers refund right after the charge,
//! when the two are almost always the same window.

use super::{Decision, Limit, refunded};

/// Counter of one epoch-aligned window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct State {
    /// First µs of the window the count belongs to (a multiple of the window length).
    pub(crate) window_start_us: u64,
    /// Cost accumulated in that window, denied requests included (Go compatibility).
    pub(crate) count: u64,
}

/// Start and (saturating) end of the epoch-aligned window containing `now_us`.
fn window_bounds(limit: &Limit, now_us: u64) -> (u64, u64) {
    let window = limit.window();
    let start = now_us - now_us % window;
    (start, start.saturating_add(window))
}

/// See the module docs; every field of the decision follows from `(count, requests, end)`.
pub(crate) fn decide(limit: &Limit, state: Option<&State>, now_us: u64, cost: u64) -> (Decision, State) {
    let (start, end) = window_bounds(limit, now_us);
    let until_end = end - now_us;
    let count = state
        .filter(|s| s.window_start_us == start)
        .map_or(0, |s| s.count);
    if cost == 0 {
        let unchanged = state.cloned().unwrap_or(State {
            window_start_us: start,
            count: 0,
        });
        return (judge(limit.requests, count, count, until_end), unchanged);
    }
    let after = count.saturating_add(cost);
    let next = State {
        window_start_us: start,
        count: after,
    };
    (judge(limit.requests, count, after, until_end), next)
}

/// See the module docs ("Refunds"): only a count of the current window can be refunded.
pub(crate) fn refund(limit: &Limit, state: Option<&State>, now_us: u64, amount: u64) -> (Decision, State) {
    let (start, _) = window_bounds(limit, now_us);
    let next = match state {
        Some(current) if current.window_start_us == start && amount > 0 => State {
            window_start_us: start,
            count: current.count.saturating_sub(amount),
        },
        // Another window's count (or none) says nothing about this window: nothing to give back.
        _ => state.cloned().unwrap_or(State {
            window_start_us: start,
            count: 0,
        }),
    };
    let (check, _) = decide(limit, Some(&next), now_us, 0);
    (refunded(check), next)
}

/// Verdict for a window whose counter stood at `before` this request and stands at `after` with its
/// cost counted. A denial reports in `remaining` the part of the cost the window still had room for:
/// it is counted anyway (the Go service's `near_limit`/`over_limit` split of a request that crosses
/// the limit).
fn judge(requests: u64, before: u64, after: u64, until_end: u64) -> Decision {
    match requests.checked_sub(after) {
        Some(remaining) => Decision::allow(remaining, until_end),
        None => Decision {
            remaining: requests.saturating_sub(before),
            ..Decision::deny(until_end, until_end)
        },
    }
}

/// The decision for a counter that reads `after` with this request's `cost` counted, in the window the
/// caller named (starting at `window_start_us`), at `now_us`: what `lua/fixed_window.lua` decides, for
/// counters incremented without the script (`INCRBY`). The window is the caller's, not the one holding
/// `now_us`, so the time to its end is clamped to `[0, window]` as the script clamps it.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) fn decide_counted(
    limit: &Limit,
    window_start_us: u64,
    now_us: u64,
    after: u64,
    cost: u64,
) -> Decision {
    let window = limit.window_us.max(1);
    let until_end = window_start_us
        .saturating_add(window)
        .saturating_sub(now_us)
        .min(window);
    judge(limit.requests, after.saturating_sub(cost), after, until_end)
}

/// The window end: from then on the stored count is ignored.
pub(crate) fn expires_at_us(limit: &Limit, state: &State) -> u64 {
    state.window_start_us.saturating_add(limit.window())
}

#[cfg(test)]
mod tests {
    use super::super::harness::{admitted, check_invariants, run, small_case, timeline};
    use super::super::{Algorithm, Decision, Limit};
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    fn limit(requests: u64, window_us: u64) -> Limit {
        Limit {
            algorithm: Algorithm::FixedWindow,
            requests,
            window_us,
            burst: requests,
        }
    }

    /// Naive model: one counter per window index, bumped by every costed request.
    fn model(limit: &Limit, timeline: &[(u64, u64)]) -> Vec<Decision> {
        let w = limit.window();
        let mut counters: HashMap<u64, u64> = HashMap::new();
        let mut out = Vec::new();
        for &(now, cost) in timeline {
            let counter = counters.entry(now / w).or_default();
            let before = *counter;
            *counter = counter.saturating_add(cost);
            let until_end = (now / w + 1) * w - now;
            out.push(if *counter <= limit.requests {
                Decision::allow(limit.requests - *counter, until_end)
            } else {
                // What the window had room for before this request: counted, though denied.
                Decision {
                    remaining: limit.requests.saturating_sub(before),
                    ..Decision::deny(until_end, until_end)
                }
            });
        }
        out
    }

    proptest! {
        #[test]
        fn matches_per_window_counter_model(
            (limit, start, steps) in small_case(Algorithm::FixedWindow)
        ) {
            let run = run(&limit, start, &steps);
            let timeline = timeline(&run);
            let got: Vec<_> = run.iter().map(|s| s.decision).collect();
            prop_assert_eq!(got, model(&limit, &timeline));
            check_invariants(&limit, &run);
        }

        #[test]
        fn never_admits_more_than_requests_per_aligned_window(
            (limit, start, steps) in small_case(Algorithm::FixedWindow)
        ) {
            let mut per_window: HashMap<u64, u64> = HashMap::new();
            for (now, cost) in admitted(&run(&limit, start, &steps)) {
                *per_window.entry(now / limit.window()).or_default() += cost;
            }
            prop_assert!(per_window.values().all(|&sum| sum <= limit.requests));
        }

        /// The counter path (INCRBY, then decide from the count) answers what deciding from the state
        /// answers, for any count, cost and instant of the window.
        #[test]
        fn deciding_from_the_incremented_count_matches_deciding_from_the_state(
            requests in 0u64..50,
            window_us in 1u64..10_000_000,
            count in 0u64..100,
            cost in 1u64..60,
            window_index in 0u64..1_000,
            offset in 0u64..10_000_000,
        ) {
            let limit = limit(requests, window_us);
            let start = window_index * window_us;
            let now = start + offset % window_us;
            let state = State { window_start_us: start, count };
            let (expected, next) = decide(&limit, Some(&state), now, cost);
            prop_assert_eq!(decide_counted(&limit, start, now, next.count, cost), expected);
        }
    }

    #[test]
    fn a_counter_named_for_a_neighbouring_window_clamps_its_reset_as_the_script_does() {
        let limit = limit(5, 1_000_000);
        // Named for the window that ends at 3 s, decided at 3.2 s (the caller's clock was behind).
        assert_eq!(
            decide_counted(&limit, 2_000_000, 3_200_000, 1, 1),
            Decision::allow(4, 0)
        );
        // Named for the next window (the caller's clock was ahead): at most one window away.
        assert_eq!(
            decide_counted(&limit, 4_000_000, 3_200_000, 6, 1),
            Decision::deny(1_000_000, 1_000_000)
        );
        // A request of 4 hits that crosses the limit: the window had room for 2 of them.
        assert_eq!(
            decide_counted(&limit, 4_000_000, 3_200_000, 7, 4),
            Decision {
                remaining: 2,
                ..Decision::deny(1_000_000, 1_000_000)
            }
        );
    }

    #[test]
    fn counts_down_then_denies_until_the_aligned_window_ends() {
        let limit = limit(3, 1_000_000);
        let mut state = None;
        for expected in [2, 1, 0] {
            let (d, s) = decide(&limit, state.as_ref(), 2_250_000, 1);
            assert_eq!(d, Decision::allow(expected, 750_000));
            state = Some(s);
        }
        let (d, _) = decide(&limit, state.as_ref(), 2_999_999, 1);
        assert_eq!(d, Decision::deny(1, 1));
        assert!(decide(&limit, state.as_ref(), 3_000_000, 1).0.allowed);
    }

    #[test]
    fn denied_requests_still_count_like_the_go_service() {
        let limit = limit(2, 60_000_000);
        let (_, s) = decide(&limit, None, 0, 2);
        assert_eq!(decide(&limit, Some(&s), 0, 0).0, Decision::allow(0, 60_000_000));
        let (d, s) = decide(&limit, Some(&s), 1, 1);
        assert!(!d.allowed);
        assert_eq!(s.count, 3);
        // Over the limit now, so even a peek is denied for the rest of the window.
        assert!(!decide(&limit, Some(&s), 2, 0).0.allowed);
    }

    #[test]
    fn stale_window_counts_as_fresh() {
        let limit = limit(1, 10);
        let (_, s) = decide(&limit, None, 5, 1);
        assert_eq!(expires_at_us(&limit, &s), 10);
        assert_eq!(decide(&limit, Some(&s), 10, 1).0, Decision::allow(0, 10));
    }

    #[test]
    fn refund_in_the_same_window_restores_and_saturates_at_zero() {
        let limit = limit(5, 1_000_000);
        let (_, s) = decide(&limit, None, 2_250_000, 3);
        let (d, s) = refund(&limit, Some(&s), 2_400_000, 3);
        assert_eq!(d, Decision::allow(5, 600_000));
        assert_eq!(s.count, 0);
        let (_, s) = decide(&limit, Some(&s), 2_500_000, 2);
        let (d, s) = refund(&limit, Some(&s), 2_500_000, u64::MAX);
        assert_eq!((d, s.count), (Decision::allow(5, 500_000), 0));
    }

    #[test]
    fn refund_over_the_limit_is_allowed_with_nothing_remaining() {
        let limit = limit(5, 1_000_000);
        let (_, s) = decide(&limit, None, 0, 7);
        let (d, s) = refund(&limit, Some(&s), 10, 1);
        assert_eq!((d, s.count), (Decision::allow(0, 999_990), 6));
        assert!(!decide(&limit, Some(&s), 10, 0).0.allowed, "still over the limit");
    }

    /// The documented "meaningless refund": the charge's window rolled over, so the refund
    /// lands in a fresh window and gives nothing back (the state is left as it was).
    #[test]
    fn refund_after_roll_over_refunds_nothing() {
        let limit = limit(5, 1_000_000);
        let (_, charged) = decide(&limit, None, 2_900_000, 5);
        let (d, s) = refund(&limit, Some(&charged), 3_100_000, 5);
        assert_eq!(d, Decision::allow(5, 900_000));
        assert_eq!(s, charged, "the old window's state is untouched");
        // This window charges 2; the late refund of 5 can only take those 2 off.
        let (_, s) = decide(&limit, Some(&s), 3_200_000, 2);
        let (d, s) = refund(&limit, Some(&s), 3_300_000, 5);
        assert_eq!((d, s.count), (Decision::allow(5, 700_000), 0));
        assert!(
            !decide(&limit, Some(&s), 3_300_000, 6).0.allowed,
            "never above the limit"
        );
    }
}
