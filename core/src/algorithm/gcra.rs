//! GCRA (Generic Cell Rate Algorithm): token-bucket admission stored as one instant.
//!
//! The state is the theoretical arrival time TAT: when the key would be fully replenished.
//! The emission interval is `T = window_us / requests` µs, generally fractional, so all
//! arithmetic runs in *ticks* of `1 / requests` µs, where `T` is exactly `window_us` ticks.
//! TAT is stored exactly as `tat_us + tat_frac / requests` µs (`tat_frac < requests`), which
//! fits two `u64`s where a single tick count would overflow even `u128` near `u64::MAX`.
//!
//! With `debt = max(TAT - now, 0)` and the tolerance `burst * T` (so that a fresh key admits
//! `burst` unit requests at once), a request of cost `c` gives
//! `new_tat = max(TAT, now) + c * T` and is allowed iff `new_tat - now <= burst * T`; the
//! stored TAT becomes `new_tat`. Denied requests and peeks leave the state unchanged.
//! `requests == 0` (infinite `T`) denies every request with cost > 0, like the token bucket.
//!
//! * `remaining`: `floor((burst * T - (new_tat - now)) / T)`.
//! * `reset_after_us`: `new_tat - now` rounded up, the time until fully replenished (when
//!   denied, computed from the unchanged TAT); expiry is TAT rounded up.
//! * `retry_after_us`: `new_tat - now - burst * T` rounded up, exact; for `c > burst`:
//!   `reset_after_us`.
//!
//! This is the same algorithm as [`super::token_bucket`]: the bucket's credits are exactly
//! `burst * T - debt` in the same units, so on a non-decreasing clock both return identical
//! decisions (property-tested field by field). If the clock steps back, GCRA charges the gap
//! as extra debt, so it is slightly stricter there than the bucket (which pauses refill).
//!
//! # Refunds
//!
//! A refund of `n` moves the TAT back by `n` emission intervals (`n * window_us` ticks of
//! debt), never before `now`: a TAT at or before now is a full bucket, which nothing can
//! overfill. A refund right after a consumption of `n` restores the exact TAT (or, if the key
//! had no debt, one at now, which is the same bucket). Exactly the token bucket's refund,
//! since the bucket's credits are `burst * T - debt`. A state without debt (or none), and any
//! state when `requests == 0`, is left alone.

use super::{Decision, Limit, ceil_div, clamp_u64, never_refills, refunded};

/// Theoretical arrival time `tat_us + tat_frac / requests` µs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct State {
    /// Whole µs of the TAT.
    pub(crate) tat_us: u64,
    /// Fraction of a µs, in ticks of `1 / requests` µs; always `< requests`.
    pub(crate) tat_frac: u64,
}

/// Ticks by which the TAT lies beyond `now_us` (0 when already replenished).
fn debt_at(state: Option<&State>, now_us: u64, ticks_per_us: u128) -> u128 {
    let Some(state) = state else { return 0 };
    let Some(ahead) = state.tat_us.checked_sub(now_us) else {
        return 0;
    };
    // After a change of `requests` the stored fraction may be out of range; clamping keeps
    // the reinterpreted TAT within 1 µs of the stored one.
    let frac = u128::from(state.tat_frac).min(ticks_per_us - 1);
    (u128::from(ahead) * ticks_per_us).saturating_add(frac)
}

/// The state whose TAT lies `debt` ticks after `now_us` (saturating at the end of time).
fn from_debt(now_us: u64, debt: u128, ticks_per_us: u128) -> State {
    State {
        tat_us: now_us.saturating_add(clamp_u64(debt / ticks_per_us)),
        tat_frac: clamp_u64(debt % ticks_per_us),
    }
}

/// See the module docs.
pub(crate) fn decide(limit: &Limit, state: Option<&State>, now_us: u64, cost: u64) -> (Decision, State) {
    let stored = state.cloned().unwrap_or(State {
        tat_us: now_us,
        tat_frac: 0,
    });
    if limit.requests == 0 {
        return (never_refills(limit, cost), stored);
    }
    let ticks_per_us = u128::from(limit.requests);
    let interval = u128::from(limit.window());
    let tolerance = u128::from(limit.burst) * interval;
    let debt = debt_at(state, now_us, ticks_per_us);
    let new_debt = debt.saturating_add(u128::from(cost) * interval);
    if new_debt > tolerance {
        return (denial(limit, debt, new_debt - tolerance, cost), stored);
    }
    let remaining = clamp_u64((tolerance - new_debt) / interval);
    let reset = clamp_u64(ceil_div(new_debt, ticks_per_us));
    let next = if cost == 0 {
        stored
    } else {
        from_debt(now_us, new_debt, ticks_per_us)
    };
    (Decision::allow(remaining, reset), next)
}

/// See the module docs ("Refunds").
pub(crate) fn refund(limit: &Limit, state: Option<&State>, now_us: u64, amount: u64) -> (Decision, State) {
    let stored = state.cloned().unwrap_or(State {
        tat_us: now_us,
        tat_frac: 0,
    });
    let ticks_per_us = u128::from(limit.requests);
    let debt = if limit.requests == 0 {
        0
    } else {
        debt_at(state, now_us, ticks_per_us)
    };
    let next = if debt == 0 || amount == 0 {
        stored
    } else {
        let back = u128::from(amount) * u128::from(limit.window());
        from_debt(now_us, debt.saturating_sub(back), ticks_per_us)
    };
    let (check, _) = decide(limit, Some(&next), now_us, 0);
    (refunded(check), next)
}

/// The denial of `cost`, which would overshoot the tolerance by `excess` ticks, with
/// `debt` ticks outstanding before it.
fn denial(limit: &Limit, debt: u128, excess: u128, cost: u64) -> Decision {
    let ticks_per_us = u128::from(limit.requests);
    let reset = ceil_div(debt, ticks_per_us);
    // A cost above the burst never fits; the hint is then the full reset.
    let retry = if cost > limit.burst {
        reset
    } else {
        ceil_div(excess, ticks_per_us)
    };
    Decision::deny(clamp_u64(reset), clamp_u64(retry))
}

/// TAT rounded up to a whole µs: from then on there is no debt.
pub(crate) fn expires_at_us(_limit: &Limit, state: &State) -> u64 {
    state.tat_us.saturating_add(u64::from(state.tat_frac > 0))
}

#[cfg(test)]
mod tests {
    use super::super::harness::{
        check_burst_plus_refill, check_invariants, large_case, refund_flags, run, run_mixed, small_case,
        with_refunds,
    };
    use super::super::{Algorithm, Decision, Limit};
    use super::*;
    use proptest::prelude::*;

    fn limit(requests: u64, window_us: u64, burst: u64) -> Limit {
        Limit {
            algorithm: Algorithm::Gcra,
            requests,
            window_us,
            burst,
        }
    }

    /// Runs the same timeline through the token bucket and compares every field.
    fn same_as_token_bucket(limit: &Limit, start: u64, steps: &[(u64, u64)]) {
        let bucket = Limit {
            algorithm: Algorithm::TokenBucket,
            ..*limit
        };
        let gcra: Vec<_> = run(limit, start, steps).iter().map(|s| s.decision).collect();
        let tb: Vec<_> = run(&bucket, start, steps).iter().map(|s| s.decision).collect();
        assert_eq!(gcra, tb);
    }

    proptest! {
        #[test]
        fn decides_exactly_like_the_token_bucket(
            (limit, start, steps) in small_case(Algorithm::Gcra)
        ) {
            same_as_token_bucket(&limit, start, &steps);
            check_invariants(&limit, &run(&limit, start, &steps));
        }

        #[test]
        fn large_limits_decide_like_the_token_bucket(
            (limit, start, steps) in large_case(Algorithm::Gcra)
        ) {
            same_as_token_bucket(&limit, start, &steps);
            check_invariants(&limit, &run(&limit, start, &steps));
        }

        #[test]
        fn any_interval_admits_at_most_burst_plus_refill(
            (limit, start, steps) in small_case(Algorithm::Gcra)
        ) {
            check_burst_plus_refill(&limit, &run(&limit, start, &steps))?;
        }
    }

    #[test]
    fn fresh_key_admits_the_burst_then_one_per_interval() {
        // T = 1_000_000 / 3 µs; tolerance 2 T.
        let limit = limit(3, 1_000_000, 2);
        let (d, s) = decide(&limit, None, 0, 1);
        assert_eq!(d, Decision::allow(1, 333_334));
        let (d, s) = decide(&limit, Some(&s), 0, 1);
        assert_eq!(d, Decision::allow(0, 666_667));
        assert_eq!(
            s,
            State {
                tat_us: 666_666,
                tat_frac: 2
            }
        );
        assert_eq!(decide(&limit, Some(&s), 0, 1).0, Decision::deny(666_667, 333_334));
        assert!(decide(&limit, Some(&s), 333_334, 1).0.allowed);
        assert_eq!(expires_at_us(&limit, &s), 666_667);
    }

    #[test]
    fn tat_survives_the_end_of_time_without_panicking() {
        let limit = limit(u64::MAX, u64::MAX, u64::MAX);
        let (d, s) = decide(&limit, None, u64::MAX - 1, u64::MAX);
        assert!(d.allowed);
        assert_eq!(expires_at_us(&limit, &s), u64::MAX);
    }

    proptest! {
        /// Refunds keep GCRA and the token bucket in lockstep: credits are `burst * T - debt`,
        /// and a refund adds to one exactly what it takes off the other.
        #[test]
        fn refunds_decide_exactly_like_the_token_bucket(
            (limit, start, steps) in small_case(Algorithm::Gcra),
            refunds in refund_flags(),
        ) {
            let mixed = with_refunds(&steps, &refunds);
            let bucket = Limit { algorithm: Algorithm::TokenBucket, ..limit };
            let gcra: Vec<_> = run_mixed(&limit, start, &mixed).iter().map(|s| s.decision).collect();
            let tb: Vec<_> = run_mixed(&bucket, start, &mixed).iter().map(|s| s.decision).collect();
            prop_assert_eq!(gcra, tb);
        }
    }

    #[test]
    fn refund_moves_the_tat_back_but_never_before_now() {
        // T = 1_000_000 / 3 µs.
        let limit = limit(3, 1_000_000, 3);
        let (_, s) = decide(&limit, None, 0, 3);
        assert_eq!(
            s,
            State {
                tat_us: 1_000_000,
                tat_frac: 0
            }
        );
        let (d, r) = refund(&limit, Some(&s), 100_000, 1);
        assert_eq!(
            r,
            State {
                tat_us: 666_666,
                tat_frac: 2
            }
        );
        assert_eq!(d, Decision::allow(1, 566_667));
        let (d, r) = refund(&limit, Some(&r), 100_000, 5);
        assert_eq!(
            r,
            State {
                tat_us: 100_000,
                tat_frac: 0
            },
            "a full bucket, not a TAT in the past"
        );
        assert_eq!(d, Decision::allow(3, 0));
    }

    #[test]
    fn refund_without_debt_changes_nothing() {
        let three = limit(3, 1_000_000, 3);
        let (_, s) = decide(&three, None, 0, 1);
        let (d, r) = refund(&three, Some(&s), 2_000_000, 2);
        assert_eq!((d, r), (Decision::allow(3, 0), s));
        let never_refills = limit(0, 1_000_000, 3);
        let (_, s) = decide(&never_refills, None, 5, 0);
        assert_eq!(refund(&never_refills, Some(&s), 5, 1), (Decision::allow(0, 0), s));
    }
}
