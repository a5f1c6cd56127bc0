//! The shared test harness of the algorithms (compiled for tests only): a timeline runner that
//! commits every returned state as the service does, the invariants every algorithm must satisfy
//! at every step, and the proptest strategies that generate small and realistic cases. Each
//! algorithm's tests use it against their own naive model.

use proptest::prelude::*;

use super::{Algorithm, Decision, Limit, State, decide, expires_at_us, refund};

/// One committed step of a simulated timeline.
#[derive(Debug, Clone)]
pub(crate) struct Step {
    pub now: u64,
    /// The cost decided, or for a refund step the amount given back.
    pub cost: u64,
    /// Whether this step is a [`refund`] rather than a [`decide`].
    pub refund: bool,
    pub before: Option<State>,
    pub decision: Decision,
    pub after: State,
}

/// Runs `(time delta, cost)` steps from `start`, always committing the returned state
/// (as the service does). Time never goes backwards here.
pub(crate) fn run(limit: &Limit, start: u64, steps: &[(u64, u64)]) -> Vec<Step> {
    let decisions: Vec<_> = steps.iter().map(|&(delta, cost)| (delta, cost, false)).collect();
    run_mixed(limit, start, &decisions)
}

/// Like [`run`], with `(time delta, cost or amount, is a refund)` steps.
pub(crate) fn run_mixed(limit: &Limit, start: u64, steps: &[(u64, u64, bool)]) -> Vec<Step> {
    let mut now = start;
    let mut state: Option<State> = None;
    let mut out = Vec::with_capacity(steps.len());
    for &(delta, cost, is_refund) in steps {
        now = now.saturating_add(delta);
        let apply = if is_refund { refund } else { decide };
        let (decision, after) = apply(limit, state.as_ref(), now, cost);
        let before = state.replace(after.clone());
        out.push(Step {
            now,
            cost,
            refund: is_refund,
            before,
            decision,
            after,
        });
    }
    out
}

/// Turns decision steps into a mixed timeline: step `i` becomes a refund of its cost when
/// `refunds[i]` (missing flags mean a decision).
pub(crate) fn with_refunds(steps: &[(u64, u64)], refunds: &[bool]) -> Vec<(u64, u64, bool)> {
    let flags = refunds.iter().copied().chain(std::iter::repeat(false));
    steps
        .iter()
        .zip(flags)
        .map(|(&(delta, cost), refund)| (delta, cost, refund))
        .collect()
}

/// Admitted `(instant, cost)` pairs of a timeline, ignoring peeks (and refunds).
pub(crate) fn admitted(steps: &[Step]) -> Vec<(u64, u64)> {
    steps
        .iter()
        .filter(|s| !s.refund && s.decision.allowed && s.cost > 0)
        .map(|s| (s.now, s.cost))
        .collect()
}

/// The (time, cost) of every step, to feed a model.
pub(crate) fn timeline(steps: &[Step]) -> Vec<(u64, u64)> {
    steps.iter().map(|s| (s.now, s.cost)).collect()
}

/// Token bucket and GCRA promise: any interval admits at most `burst` plus what refills during it.
pub(crate) fn check_burst_plus_refill(limit: &Limit, steps: &[Step]) -> Result<(), TestCaseError> {
    let log = admitted(steps);
    for (i, &(from, _)) in log.iter().enumerate() {
        let mut sum = 0;
        for &(to, cost) in &log[i..] {
            sum += cost;
            let refill = (to - from) * limit.requests / limit.window();
            prop_assert!(sum <= limit.burst + refill);
        }
    }
    Ok(())
}

/// Upper bound on `remaining`.
fn max_remaining(limit: &Limit) -> u64 {
    match limit.algorithm {
        Algorithm::TokenBucket | Algorithm::Gcra => limit.burst,
        _ => limit.requests,
    }
}

/// Checks every per-step invariant the contract promises.
pub(crate) fn check_invariants(limit: &Limit, steps: &[Step]) {
    for step in steps {
        check_shape(limit, step);
        check_peek(limit, step);
        if step.refund {
            check_refund(limit, step);
        } else {
            check_retry(limit, step);
        }
        check_expiry(limit, step);
    }
}

/// A refund is allowed with no retry, reports what a zero-cost check of the new state
/// sees, never lowers what is admissible, raises it by at most the amount, and changes
/// nothing when the amount is 0.
fn check_refund(limit: &Limit, step: &Step) {
    let d = step.decision;
    assert!(d.allowed && d.retry_after_us == 0, "{step:?}");
    let after = decide(limit, Some(&step.after), step.now, 0).0;
    assert_eq!(
        (d.remaining, d.reset_after_us),
        (after.remaining, after.reset_after_us),
        "{step:?}"
    );
    let (before, unchanged) = decide(limit, step.before.as_ref(), step.now, 0);
    assert!(
        d.remaining >= before.remaining,
        "refund lowered remaining: {step:?}"
    );
    assert!(
        d.remaining <= before.remaining.saturating_add(step.cost),
        "refund gave back more than its amount: {step:?}"
    );
    if step.cost == 0 {
        assert_eq!(step.after, unchanged, "a refund of 0 changed the state");
    }
}

fn check_shape(limit: &Limit, step: &Step) {
    let d = step.decision;
    assert!(d.remaining <= max_remaining(limit), "{step:?}");
    if d.allowed {
        assert_eq!(d.retry_after_us, 0, "{step:?}");
    }
    // Only the fixed window (Go compatibility) records denied requests, and says what part of
    // their cost it had room for; a denial by the others consumes, and reports, nothing.
    let counts_denials = limit.algorithm == Algorithm::FixedWindow;
    if !d.allowed {
        let held = if counts_denials {
            step.cost.saturating_sub(1)
        } else {
            0
        };
        assert!(d.remaining <= held, "{step:?}");
    }
    if let Some(before) = step.before.as_ref().filter(|_| !d.allowed && !counts_denials) {
        assert_eq!(&step.after, before, "denial changed state");
    }
}

fn check_peek(limit: &Limit, step: &Step) {
    let after = Some(&step.after);
    assert_eq!(decide(limit, after, step.now, 0).1, step.after);
    if let Some(before) = &step.before {
        assert_eq!(&decide(limit, Some(before), step.now, 0).1, before);
    }
}

/// retry_after is exact: allowed at now + retry, still denied one µs earlier.
fn check_retry(limit: &Limit, step: &Step) {
    let d = step.decision;
    if d.allowed || step.cost > limit.max_admissible() {
        return;
    }
    let Some(at) = step.now.checked_add(d.retry_after_us) else {
        return;
    };
    let before = step.before.as_ref();
    let later = decide(limit, before, at, step.cost).0;
    assert!(later.allowed, "not allowed at retry: {step:?} -> {later:?}");
    assert!(d.retry_after_us > 0, "{step:?}");
    let earlier = decide(limit, before, at - 1, step.cost).0;
    assert!(!earlier.allowed, "allowed before retry: {step:?}");
}

/// At or after expires_at the stored state decides exactly like no state; before it,
/// a state that still matters must not be reported as expired.
fn check_expiry(limit: &Limit, step: &Step) {
    let expires = expires_at_us(limit, &step.after);
    let window = limit.window();
    for cost in [0, 1, step.cost] {
        let with = |t| decide(limit, Some(&step.after), t, cost).0;
        let without = |t| decide(limit, None, t, cost).0;
        if with(step.now) != without(step.now) {
            assert!(expires > step.now, "{step:?} expires {expires}");
        }
        for t in [Some(expires), expires.checked_add(1), expires.checked_add(window)] {
            if let Some(t) = t.filter(|&t| t >= step.now) {
                assert_eq!(with(t), without(t), "{step:?} at {t}, expires {expires}");
            }
        }
    }
}

/// Small limits and steps so timelines cross many windows and hit every edge.
pub(crate) fn small_case(algorithm: Algorithm) -> impl Strategy<Value = (Limit, u64, Vec<(u64, u64)>)> {
    let limit = (0u64..12, 1u64..200, 0u64..15).prop_map(move |(r, w, b)| Limit {
        algorithm,
        requests: r,
        window_us: w,
        burst: b,
    });
    let steps = prop::collection::vec((0u64..300, 0u64..5), 1..60);
    (limit, 0u64..1_000_000, steps)
}

/// Realistic magnitudes: rates that do not divide windows, epoch-sized instants.
pub(crate) fn large_case(algorithm: Algorithm) -> impl Strategy<Value = (Limit, u64, Vec<(u64, u64)>)> {
    let limit =
        (1u64..1_000_000, 1u64..1_000_000_000_000, 1u64..2_000_000).prop_map(move |(r, w, b)| Limit {
            algorithm,
            requests: r,
            window_us: w,
            burst: b,
        });
    (limit, 0u64..(1 << 52)).prop_flat_map(|(limit, start)| {
        let step = 0..limit.window_us.saturating_mul(2);
        let cost = 0..limit.requests.max(limit.burst).saturating_add(2);
        let steps = prop::collection::vec((step, cost), 1..40);
        (Just(limit), Just(start), steps)
    })
}

/// Which steps of a case are refunds: about one in three, so that timelines both build
/// usage up and give it back.
pub(crate) fn refund_flags() -> impl Strategy<Value = Vec<bool>> {
    prop::collection::vec(prop::bool::weighted(0.35), 60)
}
