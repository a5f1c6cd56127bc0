//! Sliding window counter (the Cloudflare-style two-window approximation).
//!
//! Windows are epoch-aligned as in the fixed window. The state keeps the admitted cost of
//! the current window and of the one before it. At `elapsed = now - window_start` the usage
//! is estimated as
//!
//! ```text
//! estimated = previous * (window - elapsed) / window + current
//! ```
//!
//! i.e. the previous window's requests are assumed evenly spread, and the part of them that
//! still lies within the last `window` µs counts. A request of cost `c` is allowed iff
//! `estimated + c <= requests`, evaluated exactly by multiplying through by `window` in
//! `u128`. Only allowed requests are added to `current`; denied ones and peeks leave the
//! state unchanged. When time moves into the next window, `current` becomes `previous`;
//! after a gap of two or more windows both are 0.
//!
//! * `remaining`: `floor(requests - estimated_after)`.
//! * `reset_after_us`: time until the estimate decays to 0 with no further requests: the end
//!   of the next window if `current > 0`, else the end of this window if `previous > 0`,
//!   else 0. Expiry is the same instant.
//! * `retry_after_us`: the exact earliest µs (rounded up) at which `estimated + c <=
//!   requests`, found in closed form: the estimate only decreases while no request is
//!   admitted (the previous window's weight decays, and at the roll-over `current` takes
//!   over at full weight the value the formula had reached), so there is one threshold in
//!   this window or, failing that, one in the next. For `c > requests`: `reset_after_us`.
//!
//! # Error bound versus a true sliding window
//!
//! Each aligned window admits at most `requests` (an admission needs `current + c <=
//! requests`). A true sliding interval `[a, a + window)` starting `o` µs into window `k`
//! overlaps windows `k` and `k + 1`. If `x` cost units were admitted in `k` at or after `a`,
//! every admission in `k + 1` before `a + window` happened at `elapsed <= o - 1`, where the
//! estimate already charged at least `x * (window - o + 1) / window`. Hence the interval holds
//! at most `requests + floor(x * (o - 1) / window)`, and overall at most
//!
//! ```text
//! requests + floor(requests * (window - 2) / window)   <  2 * requests
//! ```
//!
//! (just `requests` for windows of 1 or 2 µs). The bound is tight: `requests` admitted in the
//! last µs of a window followed by the steady trickle the decaying estimate permits reaches
//! it. The property tests check the per-interval form at every admitted instant, the overall
//! form, and `<= requests` per aligned window. The bound needs a non-decreasing clock; if
//! the clock steps back, the state's window is used as "now" (conservative).
//!
//! # Refunds
//!
//! A refund of `n` is taken off the current window's count first, then off the previous
//! window's, each saturating at 0 (seen from the window containing `now`, as a decision sees
//! it). After a roll-over the charge being refunded lives in `previous`, where it now only
//! weighs `(window - elapsed) / window`, so the refund frees that much, not all of `n`: it
//! undoes exactly what the charge still costs. A refund in the window of the charge restores
//! the exact counts. The error bound above is for timelines without refunds: a refund lowers
//! the counts, so it lets through up to the refunded amount more, as it is meant to.

use super::{Decision, Limit, clamp_u64, refunded};

/// Admitted cost of the current and the previous epoch-aligned window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct State {
    /// First µs of the window `current` belongs to; `previous` belongs to the one before.
    pub(crate) window_start_us: u64,
    /// Cost admitted in the window starting at `window_start_us`.
    pub(crate) current: u64,
    /// Cost admitted in the window before it.
    pub(crate) previous: u64,
}

/// The state seen from the window containing a given instant.
struct View {
    start: u64,
    elapsed: u64,
    current: u64,
    previous: u64,
}

impl View {
    /// Shifts the stored counts into the window containing `at`.
    fn new(window: u64, state: Option<&State>, at: u64) -> View {
        let start = at - at % window;
        let (current, previous) = match state {
            Some(s) if s.window_start_us == start => (s.current, s.previous),
            Some(s) if s.window_start_us.checked_add(window) == Some(start) => (0, s.current),
            _ => (0, 0),
        };
        View {
            start,
            elapsed: at - start,
            current,
            previous,
        }
    }

    /// `window × (estimated usage + extra)`, exact (saturation only ever means "too much").
    fn scaled_usage(&self, window: u64, extra: u64) -> u128 {
        let decaying = u128::from(self.previous) * u128::from(window - self.elapsed);
        let whole = u128::from(self.current) + u128::from(extra);
        decaying.saturating_add(whole.saturating_mul(u128::from(window)))
    }

    /// µs from `at` until the estimate reaches 0.
    fn reset_after(&self, window: u64) -> u128 {
        let windows_left = match (self.current, self.previous) {
            (0, 0) => return 0,
            (0, _) => 1,
            _ => 2,
        };
        u128::from(window) * windows_left - u128::from(self.elapsed)
    }
}

/// See the module docs.
pub(crate) fn decide(limit: &Limit, state: Option<&State>, now_us: u64, cost: u64) -> (Decision, State) {
    let window = limit.window();
    // A clock that stepped back into an earlier window must not forget the counts.
    let at = state.map_or(now_us, |s| now_us.max(s.window_start_us));
    let lag = u128::from(at - now_us);
    let view = View::new(window, state, at);
    let budget = u128::from(limit.requests) * u128::from(window);
    let usage = view.scaled_usage(window, cost);
    if usage > budget {
        return (denial(limit, &view, cost, lag), unchanged(state, view.start));
    }
    let next = if cost == 0 {
        unchanged(state, view.start)
    } else {
        admit(&view, cost)
    };
    let remaining = clamp_u64((budget - usage) / u128::from(window));
    let reset = lag + View::new(window, Some(&next), at).reset_after(window);
    (Decision::allow(remaining, clamp_u64(reset)), next)
}

/// See the module docs ("Refunds").
pub(crate) fn refund(limit: &Limit, state: Option<&State>, now_us: u64, amount: u64) -> (Decision, State) {
    let window = limit.window();
    // The same view as `decide`, so a clock that stepped back refunds the counts it would judge.
    let at = state.map_or(now_us, |s| now_us.max(s.window_start_us));
    let view = View::new(window, state, at);
    let from_current = amount.min(view.current);
    let from_previous = (amount - from_current).min(view.previous);
    let next = if from_current == 0 && from_previous == 0 {
        unchanged(state, view.start)
    } else {
        State {
            window_start_us: view.start,
            current: view.current - from_current,
            previous: view.previous - from_previous,
        }
    };
    let (check, _) = decide(limit, Some(&next), now_us, 0);
    (refunded(check), next)
}

/// The denial of `cost` at the view's instant; `lag` (clock step-back) is added to both
/// durations so they stay relative to the caller's `now`.
fn denial(limit: &Limit, view: &View, cost: u64, lag: u128) -> Decision {
    let reset = lag + view.reset_after(limit.window());
    let retry = lag + retry_after(limit, view, cost);
    Decision::deny(clamp_u64(reset), clamp_u64(retry))
}

/// The state to return when nothing is admitted; a missing state becomes an empty one.
fn unchanged(state: Option<&State>, start: u64) -> State {
    state.cloned().unwrap_or(State {
        window_start_us: start,
        current: 0,
        previous: 0,
    })
}

/// The state after admitting `cost` in the view's window.
fn admit(view: &View, cost: u64) -> State {
    State {
        window_start_us: view.start,
        current: view.current.saturating_add(cost),
        previous: view.previous,
    }
}

/// Exact µs from the view's instant until `cost` fits, assuming no further admissions.
fn retry_after(limit: &Limit, view: &View, cost: u64) -> u128 {
    let window = u128::from(limit.window());
    let Some(room_later) = limit.requests.checked_sub(cost) else {
        return view.reset_after(limit.window());
    };
    // Still in this window: wait for the previous window's weight to decay enough.
    if let Some(room) = room_later.checked_sub(view.current) {
        let elapsed = earliest_elapsed(view.previous, room, window);
        if elapsed < window {
            return elapsed.saturating_sub(u128::from(view.elapsed));
        }
    }
    // After the roll-over `current` is the decaying weight and nothing is current yet.
    let elapsed_next = earliest_elapsed(view.current, room_later, window);
    window - u128::from(view.elapsed) + elapsed_next
}

/// Smallest elapsed time `e` in `[0, window]` with `weight * (window - e) <= room * window`.
fn earliest_elapsed(weight: u64, room: u64, window: u128) -> u128 {
    if weight == 0 {
        return 0;
    }
    let allowed_remainder = u128::from(room) * window / u128::from(weight);
    window.saturating_sub(allowed_remainder)
}

/// The instant the estimate reaches 0 (see `reset_after_us`).
pub(crate) fn expires_at_us(limit: &Limit, state: &State) -> u64 {
    let view = View {
        start: state.window_start_us,
        elapsed: 0,
        current: state.current,
        previous: state.previous,
    };
    clamp_u64(u128::from(state.window_start_us) + view.reset_after(limit.window()))
}

#[cfg(test)]
mod tests {
    use super::super::harness::{admitted, check_invariants, large_case, run, small_case, timeline};
    use super::super::{Algorithm, Decision, Limit};
    use super::*;
    use proptest::prelude::*;

    fn limit(requests: u64, window_us: u64) -> Limit {
        Limit {
            algorithm: Algorithm::SlidingWindow,
            requests,
            window_us,
            burst: requests,
        }
    }

    /// Naive model: recompute both window sums from the full list of admitted requests.
    fn model(limit: &Limit, timeline: &[(u64, u64)]) -> Vec<(bool, u64)> {
        let w = limit.window();
        let mut log: Vec<(u64, u64)> = Vec::new();
        let mut out = Vec::new();
        for &(now, cost) in timeline {
            let k = now / w;
            let sum_in = |idx: u64| -> u128 {
                log.iter()
                    .filter(|(t, _)| t / w == idx)
                    .map(|&(_, c)| u128::from(c))
                    .sum()
            };
            let previous = if k == 0 { 0 } else { sum_in(k - 1) };
            let scaled = previous * u128::from(w - now % w) + (sum_in(k) + u128::from(cost)) * u128::from(w);
            let budget = u128::from(limit.requests) * u128::from(w);
            let allowed = scaled <= budget;
            if allowed && cost > 0 {
                log.push((now, cost));
            }
            let remaining = if allowed {
                (budget - scaled) / u128::from(w)
            } else {
                0
            };
            out.push((allowed, remaining as u64));
        }
        out
    }

    proptest! {
        #[test]
        fn matches_recomputed_two_window_model(
            (limit, start, steps) in small_case(Algorithm::SlidingWindow)
        ) {
            let run = run(&limit, start, &steps);
            let timeline = timeline(&run);
            let got: Vec<_> = run.iter().map(|s| (s.decision.allowed, s.decision.remaining)).collect();
            prop_assert_eq!(got, model(&limit, &timeline));
            check_invariants(&limit, &run);
        }

        #[test]
        fn large_limits_match_model(
            (limit, start, steps) in large_case(Algorithm::SlidingWindow)
        ) {
            let run = run(&limit, start, &steps);
            let timeline = timeline(&run);
            let got: Vec<_> = run.iter().map(|s| (s.decision.allowed, s.decision.remaining)).collect();
            prop_assert_eq!(got, model(&limit, &timeline));
        }

        #[test]
        fn admitted_cost_respects_documented_bound(
            (limit, start, steps) in small_case(Algorithm::SlidingWindow)
        ) {
            let w = limit.window();
            let r = limit.requests;
            let log = admitted(&run(&limit, start, &steps));
            let overall = r + r * w.saturating_sub(2) / w;
            for &(a, _) in &log {
                let offset = a % w;
                let window_end = a - offset + w;
                let sum = |from: u64, to: u64| -> u64 {
                    log.iter().filter(|(t, _)| (from..to).contains(t)).map(|&(_, c)| c).sum()
                };
                let tail = sum(a, window_end);
                let total = sum(a, a + w);
                prop_assert!(sum(a - offset, window_end) <= r);
                prop_assert!(total <= r + tail * offset.saturating_sub(1) / w);
                prop_assert!(total <= overall);
            }
        }
    }

    #[test]
    fn previous_window_decays_linearly() {
        let limit = limit(10, 100);
        let (_, s) = decide(&limit, None, 50, 10);
        // At 150 half of the previous window still counts: 5 used, 5 left.
        assert_eq!(decide(&limit, Some(&s), 150, 0).0, Decision::allow(5, 50));
        let (d, _) = decide(&limit, Some(&s), 150, 6);
        // 10 * (100 - e) / 100 + 6 <= 10  <=>  e >= 60, i.e. at 160.
        assert_eq!(d, Decision::deny(50, 10));
        assert!(decide(&limit, Some(&s), 160, 6).0.allowed);
    }

    #[test]
    fn bound_is_reached_by_a_burst_at_a_window_edge() {
        let limit = limit(10, 100);
        let (_, mut s) = decide(&limit, None, 99, 10);
        let mut next_window = 0;
        for t in 100..199 {
            let (d, next) = decide(&limit, Some(&s), t, 1);
            if d.allowed {
                next_window += 1;
                s = next;
            }
        }
        // requests + floor(requests * (window - 2) / window) = 10 + 9 within [99, 199).
        assert_eq!(10 + next_window, 19);
    }

    #[test]
    fn retry_waits_for_roll_over_when_current_window_is_full() {
        let limit = limit(4, 100);
        let (_, s) = decide(&limit, None, 10, 4);
        let (d, _) = decide(&limit, Some(&s), 20, 1);
        // At 100 + e: 4 * (100 - e) / 100 + 1 <= 4  <=>  e >= 25.
        assert_eq!(d, Decision::deny(180, 105));
        assert_eq!(expires_at_us(&limit, &s), 200);
    }

    #[test]
    fn refund_in_the_same_window_restores_the_counts() {
        let limit = limit(10, 100);
        let (_, s) = decide(&limit, None, 50, 10);
        let (_, charged) = decide(&limit, Some(&s), 150, 3);
        let (d, r) = refund(&limit, Some(&charged), 150, 3);
        assert_eq!(d, decide(&limit, Some(&s), 150, 0).0);
        assert_eq!((r.current, r.previous), (0, 10));
    }

    #[test]
    fn refund_takes_from_current_then_from_previous() {
        let limit = limit(10, 100);
        let (_, s) = decide(&limit, None, 50, 10);
        let (_, s) = decide(&limit, Some(&s), 150, 2);
        // 10 * 50 / 100 + 2 = 7 used. Refund 4: current 2 -> 0, previous 10 -> 8: 4 used.
        let (d, r) = refund(&limit, Some(&s), 150, 4);
        assert_eq!((r.window_start_us, r.current, r.previous), (100, 0, 8));
        assert_eq!(d, Decision::allow(6, 50));
        let (d, r) = refund(&limit, Some(&r), 150, 100);
        assert_eq!((r.current, r.previous), (0, 0));
        assert_eq!(d, Decision::allow(10, 0), "never above the limit");
    }

    /// After the roll-over the charge lives in `previous`, weighted by what is left of it.
    #[test]
    fn refund_after_roll_over_frees_what_the_charge_still_weighs() {
        let limit = limit(10, 100);
        let (_, s) = decide(&limit, None, 50, 8);
        let (d, r) = refund(&limit, Some(&s), 175, 8);
        assert_eq!((r.window_start_us, r.current, r.previous), (100, 0, 0));
        assert_eq!(d, Decision::allow(10, 0));
        // Two windows later nothing is left to refund.
        let (d, r) = refund(&limit, Some(&s), 250, 8);
        assert_eq!((d, r), (Decision::allow(10, 0), s));
    }
}
