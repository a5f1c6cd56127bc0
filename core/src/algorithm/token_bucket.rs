//! Token bucket with continuous, exact refill and cost-aware admission.
//!
//! The bucket holds at most `burst` tokens and refills at `requests` tokens per `window_us`,
//! i.e. one token every `window_us / requests` µs, fractional. To keep that exact in
//! integers, the fill level is stored in *credits*: one token is `window_us` credits and
//! every elapsed µs adds `requests` credits, capped at `burst * window_us`. A new key starts
//! full. A request of cost `c` is allowed iff the bucket holds at least `c` tokens
//! (`c * window_us` credits), which are then removed. Denied requests and peeks leave the
//! state unchanged. `requests == 0` means nothing ever refills: every request with cost > 0
//! is denied (with a retry hint of one window), even on a full bucket.
//!
//! * `remaining`: whole tokens left after the decision, `floor(credits / window_us)`.
//! * `reset_after_us`: µs until the bucket is full again (rounded up); expiry is that
//!   instant.
//! * `retry_after_us`: exact µs (rounded up) until the bucket holds `c` tokens; for
//!   `c > burst`: `reset_after_us`.
//!
//! If the clock steps back (`now < last update`), elapsed time counts as 0 so no tokens are
//! minted, and the decision is made as of the last update: reported durations include the
//! gap so they stay exact.
//!
//! [`super::gcra`] makes the same decisions from a single timestamp; the property tests
//! check that the two agree on every field.
//!
//! # Refunds
//!
//! A refund of `n` first refills the bucket as a decision would (as of `max(now, last
//! update)`), then puts `n` tokens (`n * window_us` credits) back, capped at the capacity: a
//! refund right after a consumption of `n` restores the exact level, fractions included, and
//! no refund fills the bucket beyond `burst`. A missing state is a full bucket, so there is
//! nothing to give back; with `requests == 0` the level never matters, and it is left alone.

use super::{Decision, Limit, ceil_div, clamp_u64, never_refills, refunded};

/// Exact fill level of the bucket at an instant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct State {
    /// Tokens × `window_us` (so that refill by `requests` per µs is an integer).
    pub(crate) credits: u128,
    /// The instant `credits` was computed for; refill accrues from here.
    pub(crate) updated_us: u64,
}

/// Bucket capacity in credits.
fn capacity(limit: &Limit) -> u128 {
    u128::from(limit.burst) * u128::from(limit.window())
}

/// A full bucket as of `now_us`: indistinguishable from a key never seen.
fn full(limit: &Limit, now_us: u64) -> State {
    State {
        credits: capacity(limit),
        updated_us: now_us,
    }
}

/// Credits at `at` (which must be >= `state.updated_us`), refilled and capped.
fn credits_at(limit: &Limit, state: &State, at: u64) -> u128 {
    let refill = u128::from(at - state.updated_us) * u128::from(limit.requests);
    state.credits.saturating_add(refill).min(capacity(limit))
}

/// µs (rounded up) for the bucket to refill from `from` to `target` credits.
fn time_to(limit: &Limit, from: u128, target: u128) -> u128 {
    ceil_div(target.saturating_sub(from), u128::from(limit.requests))
}

/// See the module docs.
pub(crate) fn decide(limit: &Limit, state: Option<&State>, now_us: u64, cost: u64) -> (Decision, State) {
    let stored = state.cloned().unwrap_or_else(|| full(limit, now_us));
    if limit.requests == 0 {
        return (never_refills(limit, cost), stored);
    }
    let at = now_us.max(stored.updated_us);
    let lag = u128::from(at - now_us);
    let credits = credits_at(limit, &stored, at);
    let need = u128::from(cost) * u128::from(limit.window());
    let Some(left) = credits.checked_sub(need) else {
        return (denial(limit, credits, need, lag), stored);
    };
    let remaining = clamp_u64(left / u128::from(limit.window()));
    let reset = clamp_u64(lag + time_to(limit, left, capacity(limit)));
    let next = if cost == 0 {
        stored
    } else {
        State {
            credits: left,
            updated_us: at,
        }
    };
    (Decision::allow(remaining, reset), next)
}

/// See the module docs ("Refunds").
pub(crate) fn refund(limit: &Limit, state: Option<&State>, now_us: u64, amount: u64) -> (Decision, State) {
    let next = match state {
        Some(stored) if limit.requests > 0 && amount > 0 => {
            let at = now_us.max(stored.updated_us);
            let back = u128::from(amount) * u128::from(limit.window());
            State {
                credits: credits_at(limit, stored, at)
                    .saturating_add(back)
                    .min(capacity(limit)),
                updated_us: at,
            }
        }
        _ => state.cloned().unwrap_or_else(|| full(limit, now_us)),
    };
    let (check, _) = decide(limit, Some(&next), now_us, 0);
    (refunded(check), next)
}

/// The denial of `need` credits when the bucket holds `credits`; `lag` (clock step-back)
/// is added to both durations so they stay relative to the caller's `now`.
fn denial(limit: &Limit, credits: u128, need: u128, lag: u128) -> Decision {
    let reset = lag + time_to(limit, credits, capacity(limit));
    // A cost above the capacity never fits; the hint is then the full reset.
    let retry = if need > capacity(limit) {
        reset
    } else {
        lag + time_to(limit, credits, need)
    };
    Decision::deny(clamp_u64(reset), clamp_u64(retry))
}

/// The instant the bucket is full again; with `requests == 0` the state never matters.
pub(crate) fn expires_at_us(limit: &Limit, state: &State) -> u64 {
    if limit.requests == 0 {
        return state.updated_us;
    }
    let refill = time_to(limit, state.credits, capacity(limit));
    clamp_u64(u128::from(state.updated_us) + refill)
}

#[cfg(test)]
mod tests {
    use super::super::harness::{
        check_burst_plus_refill, check_invariants, large_case, run, small_case, timeline,
    };
    use super::super::{Algorithm, Decision, Limit};
    use super::*;
    use proptest::prelude::*;

    fn limit(requests: u64, window_us: u64, burst: u64) -> Limit {
        Limit {
            algorithm: Algorithm::TokenBucket,
            requests,
            window_us,
            burst,
        }
    }

    /// Independent min-plus model: the level at `t`, in credits, is the minimum over every
    /// instant `s` the bucket may last have been full (the first request, any admission, or
    /// now) of `capacity + refill(t - s) - admitted_since(s)`.
    fn model(limit: &Limit, timeline: &[(u64, u64)]) -> Vec<bool> {
        let (w, cap) = (u128::from(limit.window()), capacity(limit));
        let mut log: Vec<(u64, u64)> = Vec::new();
        let mut out = Vec::new();
        let first = timeline.first().map_or(0, |&(t, _)| t);
        for &(now, cost) in timeline {
            let level = [first, now]
                .into_iter()
                .chain(log.iter().map(|&(s, _)| s))
                .map(|s| {
                    let spent: u128 = log
                        .iter()
                        .filter(|&&(t, _)| t >= s)
                        .map(|&(_, c)| u128::from(c))
                        .sum();
                    (cap + u128::from(now - s) * u128::from(limit.requests)).saturating_sub(spent * w)
                })
                .min()
                .unwrap_or(cap);
            let allowed = cost == 0 || (limit.requests > 0 && level >= u128::from(cost) * w);
            if allowed && cost > 0 {
                log.push((now, cost));
            }
            out.push(allowed);
        }
        out
    }

    proptest! {
        #[test]
        fn matches_min_plus_model(
            (limit, start, steps) in small_case(Algorithm::TokenBucket)
        ) {
            let run = run(&limit, start, &steps);
            let timeline = timeline(&run);
            let got: Vec<_> = run.iter().map(|s| s.decision.allowed).collect();
            prop_assert_eq!(got, model(&limit, &timeline));
            check_invariants(&limit, &run);
        }

        #[test]
        fn any_interval_admits_at_most_burst_plus_refill(
            (limit, start, steps) in small_case(Algorithm::TokenBucket)
        ) {
            check_burst_plus_refill(&limit, &run(&limit, start, &steps))?;
        }

        #[test]
        fn large_limits_keep_invariants(
            (limit, start, steps) in large_case(Algorithm::TokenBucket)
        ) {
            check_invariants(&limit, &run(&limit, start, &steps));
        }

        #[test]
        fn clock_going_back_mints_nothing(back in 0u64..10_000, cost in 0u64..5) {
            let limit = limit(3, 1000, 3);
            let (_, s) = decide(&limit, None, 50_000, 3);
            let (d, s2) = decide(&limit, Some(&s), 50_000 - back, cost);
            prop_assert_eq!(d.allowed, cost == 0);
            prop_assert_eq!(s2, s);
        }
    }

    #[test]
    fn refill_is_exact_when_the_rate_does_not_divide_the_window() {
        // 3 per second: one token every 333_333.33 µs.
        let limit = limit(3, 1_000_000, 3);
        let (_, empty) = decide(&limit, None, 0, 3);
        assert_eq!(
            decide(&limit, Some(&empty), 0, 1).0,
            Decision::deny(1_000_000, 333_334)
        );
        assert!(!decide(&limit, Some(&empty), 333_333, 1).0.allowed);
        assert_eq!(
            decide(&limit, Some(&empty), 333_334, 1).0,
            Decision::allow(0, 1_000_000)
        );
        assert!(!decide(&limit, Some(&empty), 666_666, 2).0.allowed);
        assert!(decide(&limit, Some(&empty), 666_667, 2).0.allowed);
        assert_eq!(
            decide(&limit, Some(&empty), 1_000_000, 0).0,
            Decision::allow(3, 0)
        );
    }

    #[test]
    fn refill_is_exact_when_the_rate_divides_the_window() {
        let limit = limit(4, 1_000_000, 2);
        let (_, empty) = decide(&limit, None, 10, 2);
        assert!(!decide(&limit, Some(&empty), 250_009, 1).0.allowed);
        assert!(decide(&limit, Some(&empty), 250_010, 1).0.allowed);
    }

    #[test]
    fn costs_above_burst_are_hinted_with_the_full_reset() {
        let limit = limit(1, 100, 2);
        let (_, s) = decide(&limit, None, 0, 1);
        assert_eq!(decide(&limit, Some(&s), 0, 3).0, Decision::deny(100, 100));
        assert_eq!(decide(&limit, None, 0, 3).0, Decision::deny(0, 0));
    }

    #[test]
    fn refund_restores_the_exact_level_with_a_fractional_rate() {
        // 3 per second: one token every 333_333.33 µs.
        let limit = limit(3, 1_000_000, 3);
        let (_, s) = decide(&limit, None, 0, 3);
        let before = decide(&limit, Some(&s), 500_000, 0).0;
        let (_, charged) = decide(&limit, Some(&s), 500_000, 1);
        let (d, s) = refund(&limit, Some(&charged), 500_000, 1);
        assert_eq!(d, before);
        assert_eq!(s.credits, 1_500_000, "1.5 tokens, fraction kept");
        let (d, s) = refund(&limit, Some(&s), 600_000, 7);
        assert_eq!(d, Decision::allow(3, 0), "capped at the burst");
        assert_eq!(s.credits, capacity(&limit));
    }

    #[test]
    fn refund_refills_first_and_pauses_on_a_clock_step_back() {
        let limit = limit(1, 1000, 4);
        let (_, s) = decide(&limit, None, 10_000, 4);
        // 500 µs later half a token has refilled; the refund adds one more.
        let (d, r) = refund(&limit, Some(&s), 10_500, 1);
        assert_eq!((r.credits, r.updated_us), (1_500, 10_500));
        assert_eq!(d, Decision::allow(1, 2_500));
        // A clock behind the last update refunds as of that update.
        let (d, back) = refund(&limit, Some(&r), 10_000, 1);
        assert_eq!((back.credits, back.updated_us), (2_500, 10_500));
        assert_eq!(d, Decision::allow(2, 2_000));
    }

    #[test]
    fn zero_requests_leave_the_level_alone() {
        let limit = limit(0, 1000, 4);
        let (_, s) = decide(&limit, None, 10, 0);
        assert_eq!(refund(&limit, Some(&s), 20, 3), (Decision::allow(0, 0), s));
    }
}
