//! Pure rate-limit decision algorithms.
//!
//! Everything here is a pure function of `(limit, state, now_us, cost)`: no clock, no I/O,
//! no locks. The caller reads a key's [`State`], calls [`decide`] (or [`refund`]), and stores
//! the returned state if it wants the decision to count. That keeps storage, concurrency and
//! replication out of the algorithms and makes every algorithm testable against a naive model.
//!
//! # Refunds
//!
//! [`refund`] gives units back to a key, for a caller that consumed them and then did not use
//! them (the request failed before doing any work, say). Each algorithm undoes a charge in its
//! own terms, so that a refund of `n` right after a consumption of `n` restores exactly what
//! was admissible before, and never makes more admissible than a fresh key allows:
//!
//! * token bucket: `n` tokens go back into the bucket, capped at its capacity;
//! * GCRA: the TAT moves back by `n` emission intervals, never before now;
//! * sliding window: `n` comes off the current window's count, then off the previous one's;
//! * sliding log: the newest live entries (or part of the newest) totalling `n` are removed;
//! * fixed window: `n` comes off the current window's count, saturating at 0.
//!
//! A refund cannot tell which charge it undoes, only which key. The fixed window shows the
//! consequence most plainly: a charge made in a window that has since rolled over is already
//! forgotten, so its refund lands in the current window and, since that window's count is
//! unrelated to the charge, refunds nothing if the window is fresh (and otherwise returns
//! units this window never charged for that request). Callers should refund promptly; a
//! refund long after the charge is meaningless for every algorithm once the charge has
//! drained.
//!
//! Units: instants are microseconds since the Unix epoch, durations are microseconds.
//!
//! A state is always read under the [`Limit`] passed with it. If a rule's limit is
//! reconfigured, existing states are reinterpreted under the new one (counts and levels
//! are capped where that matters) rather than rejected; this never panics, and the effect
//! fades once the old state has expired.
//!
//! Arithmetic: every product is formed in `u128` (a `u64 × u64` product always fits), and
//! the few sums that could still overflow saturate. Saturation only happens at absurd
//! magnitudes (instants near `u64::MAX`, costs near `u64::MAX`) and always errs towards
//! denying, so no input can panic or admit more than the limit allows.

pub mod fixed_window;
pub mod gcra;
pub mod sliding_log;
pub mod sliding_window;
pub mod token_bucket;

use std::fmt;
use std::str::FromStr;

/// Which algorithm a rule uses.
///
/// The default is [`Algorithm::FixedWindow`] because that is what envoyproxy/ratelimit does,
/// so a config that names no algorithm behaves like the Go service it replaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Algorithm {
    /// Epoch-aligned fixed windows with envoyproxy/ratelimit's counter semantics.
    #[default]
    FixedWindow,
    /// Two-window weighted counter: an O(1)-memory approximation of a sliding window.
    SlidingWindow,
    /// Exact sliding window over a log of admitted requests (memory grows with `requests`).
    SlidingLog,
    /// Continuously refilling token bucket holding at most `burst` tokens.
    TokenBucket,
    /// Generic Cell Rate Algorithm: token-bucket admission stored as a single instant.
    Gcra,
}

impl Algorithm {
    /// Every algorithm in declaration order; also the order used in error messages.
    pub const ALL: [Algorithm; 5] = [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::SlidingLog,
        Algorithm::TokenBucket,
        Algorithm::Gcra,
    ];

    /// The snake_case configuration name; [`FromStr`] accepts exactly these strings
    /// (case-sensitive, no surrounding whitespace).
    pub fn as_str(self) -> &'static str {
        match self {
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::SlidingWindow => "sliding_window",
            Algorithm::SlidingLog => "sliding_log",
            Algorithm::TokenBucket => "token_bucket",
            Algorithm::Gcra => "gcra",
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Algorithm {
    type Err = UnknownAlgorithm;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Algorithm::ALL
            .into_iter()
            .find(|algorithm| algorithm.as_str() == name)
            .ok_or_else(|| UnknownAlgorithm(name.to_owned()))
    }
}

/// A configured algorithm name that is none of [`Algorithm::ALL`]; holds the rejected text
/// verbatim so the config error can quote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownAlgorithm(pub String);

impl fmt::Display for UnknownAlgorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let expected: Vec<&str> = Algorithm::ALL.iter().map(|a| a.as_str()).collect();
        write!(
            f,
            "unknown algorithm '{}' (expected one of {})",
            self.0,
            expected.join(", ")
        )
    }
}

impl std::error::Error for UnknownAlgorithm {}

/// A limit as the algorithms see it. Time is in microseconds throughout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Limit {
    /// Which algorithm interprets the other fields and the [`State`].
    pub algorithm: Algorithm,
    /// Requests (cost units) allowed per window. May be 0: then every request with
    /// cost > 0 is denied, for every algorithm.
    pub requests: u64,
    /// Window length in µs. Callers guarantee > 0; 0 is still accepted and treated as 1.
    pub window_us: u64,
    /// Token-bucket capacity / GCRA burst, in cost units; the window algorithms ignore it.
    /// Callers set it to `requests` when the rule does not configure one.
    pub burst: u64,
}

impl Limit {
    /// Whether this is a per-second limit (a one-second window): those `REDIS_PERSECOND` counts in a
    /// Redis of their own.
    pub fn is_per_second(&self) -> bool {
        self.window_us == 1_000_000
    }

    /// The largest cost the limit can ever admit at once: its capacity (`burst` for the bucket
    /// algorithms, `requests` for the window ones; 0 for a limit of 0). A larger cost is refused
    /// whatever the state, and its retry hint is not exact.
    pub fn max_admissible(&self) -> u64 {
        match self.algorithm {
            Algorithm::TokenBucket | Algorithm::Gcra if self.requests == 0 => 0,
            Algorithm::TokenBucket | Algorithm::Gcra => self.burst,
            _ => self.requests,
        }
    }

    /// How long units consumed now can still affect a decision, in µs: a window (two for the sliding
    /// window, whose previous window still weighs), or the time the bucket takes to refill from empty.
    pub fn horizon_us(&self) -> u64 {
        let window = self.window();
        match self.algorithm {
            Algorithm::FixedWindow | Algorithm::SlidingLog => window,
            Algorithm::SlidingWindow => window.saturating_mul(2),
            Algorithm::TokenBucket | Algorithm::Gcra => {
                let per_unit = u128::from(window) * u128::from(self.burst.max(1));
                let refill = per_unit.div_ceil(u128::from(self.requests.max(1)));
                u64::try_from(refill).unwrap_or(u64::MAX)
            }
        }
    }

    /// The window length actually used: `window_us`, with 0 read as 1 µs so that no
    /// division or modulo can panic.
    pub(crate) fn window(&self) -> u64 {
        self.window_us.max(1)
    }
}

/// The outcome of one decision. The module docs of each algorithm say exactly what
/// `remaining` and `reset_after_us` mean for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Decision {
    /// Whether the request (with its cost) is admitted.
    pub allowed: bool,
    /// Cost units still admissible right after this decision. A denial reports 0, except by the
    /// fixed window, which counts denied requests (as the Go service does) and reports the part of
    /// the cost it had room for (less than the cost: the Go service's `near_limit` share of a
    /// request that crosses the limit); a store settling a batch (all-or-nothing, stop-increment)
    /// reports, for an item it refused without consuming, what the key still holds. The limiter
    /// reports 0 for every refusal.
    pub remaining: u64,
    /// µs from now until the key's usage has fully drained (algorithm-specific meaning).
    pub reset_after_us: u64,
    /// 0 when allowed. When denied: µs from now until the same request (same cost) would be
    /// allowed, never earlier than true (exact for every algorithm here). If the cost can
    /// never be allowed (cost > `requests`, or > `burst` for the bucket algorithms), the
    /// time until the state is fully reset, which may be 0 when it already is.
    pub retry_after_us: u64,
    /// The denial came from the over-limit cache in front of the store, which the request never
    /// reached (envoyproxy/ratelimit's `over_limit_with_local_cache`).
    pub from_local_cache: bool,
    /// The admission came from a hot-key slice this replica holds (`crate::store::hot_keys`), whose
    /// `remaining` is a lower bound (the slice's units), not the key's count: stats do not read it as
    /// nearness to the limit.
    pub from_slice: bool,
}

impl Decision {
    /// An admitting decision; `retry_after_us` is 0 by definition.
    pub(crate) fn allow(remaining: u64, reset_after_us: u64) -> Self {
        Decision {
            allowed: true,
            remaining,
            reset_after_us,
            retry_after_us: 0,
            from_local_cache: false,
            from_slice: false,
        }
    }

    /// A denying decision; `remaining` is 0 by definition.
    pub(crate) fn deny(reset_after_us: u64, retry_after_us: u64) -> Self {
        Decision {
            allowed: false,
            remaining: 0,
            reset_after_us,
            retry_after_us,
            from_local_cache: false,
            from_slice: false,
        }
    }
}

/// Per-key algorithm state. Cloning is cheap except for the sliding log, whose queue holds
/// at most `requests` entries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    /// Counter of the current fixed window.
    FixedWindow(fixed_window::State),
    /// Counters of the current and previous windows.
    SlidingWindow(sliding_window::State),
    /// Log of admitted requests still inside the window.
    SlidingLog(sliding_log::State),
    /// Exact fill level of the bucket and when it was computed.
    TokenBucket(token_bucket::State),
    /// Theoretical arrival time.
    Gcra(gcra::State),
}

/// Calls `$function` of the module of `$limit.algorithm` with that algorithm's own state (a
/// state of another algorithm reads as None) and the remaining arguments, and re-wraps the
/// state it returns.
macro_rules! dispatch {
    ($function:ident, $limit:expr, $state:expr, $($arg:expr),*) => {
        match $limit.algorithm {
            Algorithm::FixedWindow => {
                dispatch!(@one FixedWindow, fixed_window::$function, $limit, $state, $($arg),*)
            }
            Algorithm::SlidingWindow => {
                dispatch!(@one SlidingWindow, sliding_window::$function, $limit, $state, $($arg),*)
            }
            Algorithm::SlidingLog => {
                dispatch!(@one SlidingLog, sliding_log::$function, $limit, $state, $($arg),*)
            }
            Algorithm::TokenBucket => {
                dispatch!(@one TokenBucket, token_bucket::$function, $limit, $state, $($arg),*)
            }
            Algorithm::Gcra => dispatch!(@one Gcra, gcra::$function, $limit, $state, $($arg),*),
        }
    };
    (@one $variant:ident, $call:path, $limit:expr, $state:expr, $($arg:expr),*) => {{
        let own = match $state {
            Some(State::$variant(own)) => Some(own),
            _ => None,
        };
        let (decision, next) = $call($limit, own, $($arg),*);
        (decision, State::$variant(next))
    }};
}

/// Pure decision. `state` is None for a key never seen (or expired). If `state` is Some but
/// of another algorithm's variant, it is treated as None. Returns the decision and the state
/// to store IF the caller commits.
///
/// Denied requests leave the state unchanged for every algorithm except fixed_window, which
/// counts denied requests too (envoyproxy/ratelimit compatibility). Cost 0 is a "peek": it
/// never changes the state (a None state comes back as the equivalent empty state) and
/// reports what a zero-cost request sees.
pub fn decide(limit: &Limit, state: Option<&State>, now_us: u64, cost: u64) -> (Decision, State) {
    dispatch!(decide, limit, state, now_us, cost)
}

/// Pure refund: gives `amount` cost units back to the key whose state is `state` (see the
/// module docs, "Refunds", and each algorithm's module docs). Returns the state to store IF
/// the caller commits, and a decision that is always allowed, with no retry, whose
/// `remaining` and `reset_after_us` are what a zero-cost [`decide`] of the new state sees.
///
/// Like [`decide`], a state of another algorithm's variant is treated as None. A None state
/// (a key never seen, or expired) has nothing to give back: the result is the equivalent empty
/// state, and a store should not write it (a refund never creates a key). `amount == 0`
/// returns the state unchanged, as a zero-cost [`decide`] does. No input panics: every sum
/// saturates, and no refund makes more admissible than a fresh key allows.
pub fn refund(limit: &Limit, state: Option<&State>, now_us: u64, amount: u64) -> (Decision, State) {
    dispatch!(refund, limit, state, now_us, amount)
}

/// The instant (µs since epoch) after which this state is indistinguishable from no state at
/// all, so a store may drop it. It is > now for any state that can still affect a decision.
/// A state of another algorithm than `limit.algorithm` is ignored by [`decide`], so it
/// expires at 0.
pub fn expires_at_us(limit: &Limit, state: &State) -> u64 {
    match (limit.algorithm, state) {
        (Algorithm::FixedWindow, State::FixedWindow(s)) => fixed_window::expires_at_us(limit, s),
        (Algorithm::SlidingWindow, State::SlidingWindow(s)) => sliding_window::expires_at_us(limit, s),
        (Algorithm::SlidingLog, State::SlidingLog(s)) => sliding_log::expires_at_us(limit, s),
        (Algorithm::TokenBucket, State::TokenBucket(s)) => token_bucket::expires_at_us(limit, s),
        (Algorithm::Gcra, State::Gcra(s)) => gcra::expires_at_us(limit, s),
        _ => 0,
    }
}

/// Narrows a `u128` intermediate back to `u64`, saturating: every caller reports a duration
/// or instant for which "later than representable" and `u64::MAX` mean the same thing.
pub(crate) fn clamp_u64(value: u128) -> u64 {
    u64::try_from(value).unwrap_or(u64::MAX)
}

/// `ceil(numerator / denominator)`; a zero denominator is read as 1 so it cannot panic
/// (callers only pass non-zero ones).
pub(crate) fn ceil_div(numerator: u128, denominator: u128) -> u128 {
    numerator.div_ceil(denominator.max(1))
}

/// The decision reported for a refund, from what a zero-cost check of the refunded state sees:
/// a refund is never refused, so it is allowed with no retry, even where that check is denied
/// (a fixed window whose count is still above the limit, say), which then reports 0 remaining.
pub(crate) fn refunded(check: Decision) -> Decision {
    Decision::allow(check.remaining, check.reset_after_us)
}

/// Decision of the bucket algorithms when `requests == 0`: nothing ever refills, so every
/// request with cost > 0 is denied, even on a fresh (full) bucket. Nothing can change, so a
/// peek sees nothing to reset; a denial suggests one window as the retry hint.
pub(crate) fn never_refills(limit: &Limit, cost: u64) -> Decision {
    if cost == 0 {
        return Decision::allow(0, 0);
    }
    Decision::deny(limit.window(), limit.window())
}

#[cfg(test)]
mod harness;

#[cfg(test)]
mod tests {
    use super::harness::{
        check_invariants, large_case, refund_flags, run, run_mixed, small_case, with_refunds,
    };
    use super::*;
    use proptest::prelude::*;

    fn any_algorithm() -> impl Strategy<Value = Algorithm> {
        prop::sample::select(Algorithm::ALL.to_vec())
    }

    proptest! {
        #[test]
        fn invariants_hold_for_small_limits(
            (limit, start, steps) in any_algorithm().prop_flat_map(small_case)
        ) {
            check_invariants(&limit, &run(&limit, start, &steps));
        }

        #[test]
        fn invariants_hold_for_large_limits(
            (limit, start, steps) in any_algorithm().prop_flat_map(large_case)
        ) {
            check_invariants(&limit, &run(&limit, start, &steps));
        }

        #[test]
        fn invariants_hold_for_small_limits_with_refunds(
            (limit, start, steps) in any_algorithm().prop_flat_map(small_case),
            refunds in refund_flags(),
        ) {
            check_invariants(&limit, &run_mixed(&limit, start, &with_refunds(&steps, &refunds)));
        }

        #[test]
        fn invariants_hold_for_large_limits_with_refunds(
            (limit, start, steps) in any_algorithm().prop_flat_map(large_case),
            refunds in refund_flags(),
        ) {
            check_invariants(&limit, &run_mixed(&limit, start, &with_refunds(&steps, &refunds)));
        }

        #[test]
        fn refunding_what_was_just_consumed_restores_remaining(
            (limit, start, steps) in any_algorithm().prop_flat_map(small_case),
            refunds in refund_flags(),
            cost in 1u64..6,
        ) {
            // Any reachable state, then a consumption and its refund at the same instant.
            let history = run_mixed(&limit, start, &with_refunds(&steps, &refunds));
            let last = history.last().expect("at least one step");
            let state = Some(last.after.clone());
            let before = decide(&limit, state.as_ref(), last.now, 0).0;
            let (consumed, charged) = decide(&limit, state.as_ref(), last.now, cost);
            if consumed.allowed {
                let (refunded, _) = refund(&limit, Some(&charged), last.now, cost);
                prop_assert_eq!(refunded.remaining, before.remaining);
            }
        }

        #[test]
        fn arbitrary_inputs_never_panic(
            algorithm in any_algorithm(),
            (requests, window_us, burst) in any::<(u64, u64, u64)>(),
            (t1, t2, c1, c2) in any::<(u64, u64, u64, u64)>(),
        ) {
            let limit = Limit { algorithm, requests, window_us, burst };
            let (_, state) = decide(&limit, None, t1, c1);
            let (_, state) = decide(&limit, Some(&state), t2, c2);
            let _ = decide(&limit, Some(&state), t1, c2);
            let _ = expires_at_us(&limit, &state);
            let (_, state) = refund(&limit, Some(&state), t1, c1);
            let _ = refund(&limit, None, t2, c2);
            let _ = refund(&limit, Some(&state), t2, c2);
            let _ = expires_at_us(&limit, &state);
        }

        #[test]
        fn foreign_state_is_treated_as_none(now in 0u64..1_000_000, cost in 0u64..4) {
            for algorithm in Algorithm::ALL {
                let limit = Limit { algorithm, requests: 3, window_us: 1000, burst: 3 };
                for other in Algorithm::ALL.into_iter().filter(|&o| o != algorithm) {
                    let foreign_limit = Limit { algorithm: other, ..limit };
                    let (_, foreign) = decide(&foreign_limit, None, now, 2);
                    let with = decide(&limit, Some(&foreign), now, cost);
                    prop_assert_eq!(with, decide(&limit, None, now, cost));
                    let with = refund(&limit, Some(&foreign), now, cost);
                    prop_assert_eq!(with, refund(&limit, None, now, cost));
                    prop_assert_eq!(expires_at_us(&limit, &foreign), 0);
                }
            }
        }
    }

    #[test]
    fn extreme_values_never_panic() {
        let year_ms_in_us = 365 * 24 * 3600 * 1_000_000 * 1000;
        let requests = [0, 1, u64::from(u32::MAX), u64::MAX];
        let windows = [0, 1, year_ms_in_us, u64::MAX];
        let instants = [0, 1, u64::MAX / 2, u64::MAX - 1, u64::MAX];
        let costs = [0, 1, u64::from(u32::MAX), u64::MAX];
        for algorithm in Algorithm::ALL {
            for (&r, &w) in requests
                .iter()
                .zip(&windows)
                .chain(requests.iter().zip(windows.iter().rev()))
            {
                let limit = Limit {
                    algorithm,
                    requests: r,
                    window_us: w,
                    burst: r,
                };
                for &t in &instants {
                    for &c in &costs {
                        let (_, s) = decide(&limit, None, t, c);
                        for &t2 in &instants {
                            let _ = decide(&limit, Some(&s), t2, c);
                            let (_, r) = refund(&limit, Some(&s), t2, c);
                            let _ = expires_at_us(&limit, &r);
                        }
                        let _ = expires_at_us(&limit, &s);
                    }
                }
            }
        }
    }

    #[test]
    fn names_round_trip() {
        for algorithm in Algorithm::ALL {
            assert_eq!(algorithm.as_str().parse::<Algorithm>(), Ok(algorithm));
        }
        assert_eq!(Algorithm::default(), Algorithm::FixedWindow);
    }

    #[test]
    fn unknown_name_is_rejected_with_the_expected_list() {
        let err = "Token_Bucket".parse::<Algorithm>().unwrap_err();
        assert_eq!(err, UnknownAlgorithm("Token_Bucket".into()));
        assert_eq!(
            err.to_string(),
            "unknown algorithm 'Token_Bucket' (expected one of fixed_window, \
             sliding_window, sliding_log, token_bucket, gcra)"
        );
        assert!(" gcra".parse::<Algorithm>().is_err());
    }

    /// The targeted promises of the module docs, for every algorithm: a consumption of `n`
    /// refunded at once restores `remaining`, refunds never lift it above the limit (or burst),
    /// and a key without state is left without state.
    #[test]
    fn refunds_restore_and_never_overfill() {
        for algorithm in Algorithm::ALL {
            let limit = Limit {
                algorithm,
                requests: 5,
                window_us: 1_000_000,
                burst: 5,
            };
            let now = 7_250_000;
            let (fresh_check, fresh) = decide(&limit, None, now, 0);
            let (_, charged) = decide(&limit, None, now, 3);
            assert_eq!(
                refund(&limit, Some(&charged), now, 3).0,
                fresh_check,
                "{algorithm:?}"
            );
            let (d, _) = refund(&limit, Some(&charged), now, u64::MAX);
            assert_eq!(d.remaining, 5, "{algorithm:?}: capped at the limit");
            assert_eq!(
                refund(&limit, None, now, 4),
                (fresh_check, fresh),
                "{algorithm:?}"
            );
        }
    }

    #[test]
    fn zero_requests_denies_every_costed_request() {
        for algorithm in Algorithm::ALL {
            let limit = Limit {
                algorithm,
                requests: 0,
                window_us: 1000,
                burst: 5,
            };
            let (d, _) = decide(&limit, None, 42, 1);
            assert!(!d.allowed, "{algorithm:?}");
            assert!(decide(&limit, None, 42, 0).0.allowed, "{algorithm:?}");
        }
    }
}
