//! The decision core and the embedded store: atomicity under concurrency, failure modes when the store
//! fails, and memory that stays bounded under key churn.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use arc_swap::ArcSwapOption;
use tollgate_core::algorithm::{Algorithm, Decision, Limit};
use tollgate_core::clock::{ManualClock, SystemClock};
use tollgate_core::limiter::{Code, Limiter, LimiterError, LimiterOptions};
use tollgate_core::observe::metrics::Method;
use tollgate_core::rules::ValueHasher;
use tollgate_core::store::lease::{AcquireRequest, LeaseSlot, LeaseStore, ReleaseRequest, Released};
use tollgate_core::store::memory::MemoryStore;
use tollgate_core::store::{AnyStore, Batch, BatchItem, CommitPolicy, Store, StoreError};

use crate::common::{Harness, T0_US, assert_status, d, envoy, rules};

/// A store that is always down, as Redis is when it has been killed.
struct DownStore;

impl Store for DownStore {
    async fn apply(&self, _: &Batch) -> Result<Vec<Decision>, StoreError> {
        Err(StoreError::Unavailable("connection refused".into()))
    }

    fn name(&self) -> &'static str {
        "down"
    }

    fn shares_with_go(&self) -> bool {
        true
    }
}

impl LeaseStore for DownStore {
    async fn acquire(&self, _: &AcquireRequest) -> Result<Vec<LeaseSlot>, StoreError> {
        Err(StoreError::Unavailable("connection refused".into()))
    }

    async fn release(&self, _: &ReleaseRequest) -> Result<Vec<Released>, StoreError> {
        Err(StoreError::Unavailable("connection refused".into()))
    }
}

const FAILURE_MODES: &str = r#"
domain: fm
descriptors:
  - key: open
    rate_limit: {unit: second, requests_per_unit: 5, failure_mode: open}
  - key: closed
    rate_limit: {unit: second, requests_per_unit: 5, failure_mode: closed}
  - key: unset
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: free
    rate_limit: {unlimited: true}
"#;

fn down_limiter() -> Limiter<DownStore> {
    let set = rules(&[FAILURE_MODES], Algorithm::FixedWindow);
    Limiter::new(
        Arc::new(ArcSwapOption::from_pointee(set)),
        DownStore,
        ValueHasher::default(),
        LimiterOptions::default(),
    )
}

#[tokio::test]
async fn failure_mode_open_allows_and_closed_denies() {
    let limiter = down_limiter();
    let v = limiter
        .should_rate_limit("fm", &[d(&[("open", "a")]), d(&[("free", "x")])], 0)
        .await
        .expect("open");
    assert_eq!(v.overall, Code::Ok);
    assert!(v.statuses[0].from_failure_mode);
    assert_status(&v.statuses[0], Code::Ok, 0, Some(5));
    assert_eq!(envoy(&v.statuses[1]).limit_remaining, u32::MAX);
    let v = limiter
        .should_rate_limit("fm", &[d(&[("closed", "a")]), d(&[("open", "b")])], 0)
        .await
        .expect("closed");
    assert_eq!(v.overall, Code::OverLimit);
    assert_status(&v.statuses[0], Code::OverLimit, 0, Some(5));
    assert_status(&v.statuses[1], Code::Ok, 0, Some(5));
}

#[tokio::test]
async fn a_limit_without_failure_mode_turns_a_store_failure_into_an_error() {
    let limiter = down_limiter();
    for descriptors in [
        vec![d(&[("unset", "a")])],
        vec![d(&[("open", "a")]), d(&[("unset", "a")])],
    ] {
        let err = limiter
            .should_rate_limit("fm", &descriptors, 0)
            .await
            .expect_err("store down");
        assert!(
            matches!(err, LimiterError::Store(StoreError::Unavailable(_))),
            "{err:?}"
        );
    }
    // Nothing to count means nothing to fail: unmatched and unlimited descriptors still answer.
    let v = limiter
        .should_rate_limit("fm", &[d(&[("free", "x")]), d(&[("none", "x")])], 0)
        .await
        .expect("ok");
    assert_eq!(v.overall, Code::Ok);
}

/// `failure_mode: local` counts a down Redis's keys in an embedded store of this instance's. There a
/// key in Go's format (a lone fixed window: `k1` = `v_k2_w`) and the same text escaped (a rule with two
/// limits: `k1` = `v`, `k2` = `w`) are two counters, as they are two keys in Redis.
#[tokio::test]
async fn the_local_fallback_tells_a_go_key_from_an_escaped_one() {
    let rules_text = r#"
domain: fm
descriptors:
  - key: k1
    rate_limit: {unit: hour, requests_per_unit: 3, failure_mode: local}
    descriptors:
      - key: k2
        rate_limits:
          - {unit: hour, requests_per_unit: 3, failure_mode: local}
          - {unit: day, requests_per_unit: 100, failure_mode: local}
"#;
    let set = rules(&[rules_text], Algorithm::FixedWindow);
    let limiter = Limiter::new(
        Arc::new(ArcSwapOption::from_pointee(set)),
        DownStore,
        ValueHasher::default(),
        LimiterOptions::default(),
    );
    let ask = async |entries: &[(&str, &str)]| {
        let v = limiter.should_rate_limit("fm", &[d(entries)], 0).await;
        let v = v.expect("answered by the local fallback");
        assert!(v.statuses[0].from_failure_mode, "{entries:?}");
        (v.overall, envoy(&v.statuses[0]).limit_remaining)
    };
    for remaining in [2, 1, 0] {
        assert_eq!(ask(&[("k1", "v_k2_w")]).await, (Code::Ok, remaining));
    }
    assert_eq!(ask(&[("k1", "v_k2_w")]).await.0, Code::OverLimit);
    assert_eq!(
        ask(&[("k1", "v"), ("k2", "w")]).await,
        (Code::Ok, 2),
        "the victim's budget is its own"
    );
}

fn concurrency_rules(algorithm: Algorithm) -> String {
    format!(
        "domain: race\ndescriptors:\n  - key: k\n    rate_limit: {{unit: hour, requests_per_unit: 100, algorithm: {}}}\n",
        algorithm.as_str()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_four_concurrent_clients_get_exactly_the_limit() {
    for algorithm in Algorithm::ALL {
        let h = Arc::new(Harness::new(&[&concurrency_rules(algorithm)]));
        let admitted = Arc::new(AtomicUsize::new(0));
        let tasks: Vec<_> = (0..64)
            .map(|_| {
                let (h, admitted) = (Arc::clone(&h), Arc::clone(&admitted));
                tokio::spawn(async move {
                    for _ in 0..10 {
                        let v = h.check("race", &[d(&[("k", "hot")])]).await;
                        if v.overall == Code::Ok {
                            admitted.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.expect("task");
        }
        assert_eq!(admitted.load(Ordering::SeqCst), 100, "{}", algorithm.as_str());
    }
}

#[tokio::test]
async fn the_same_key_twice_in_one_request_counts_twice() {
    let h = Harness::new(&[&concurrency_rules(Algorithm::FixedWindow)]);
    let v = h.check("race", &[d(&[("k", "a")]), d(&[("k", "a")])]).await;
    assert_status(&v.statuses[0], Code::Ok, 99, Some(100));
    assert_status(&v.statuses[1], Code::Ok, 98, Some(100));
}

fn item(key: String, cost: u64) -> BatchItem {
    let limit = Limit {
        algorithm: Algorithm::FixedWindow,
        requests: 10,
        window_us: 1_000_000,
        burst: 10,
    };
    BatchItem {
        key,
        limit,
        cost,
        group: 0,
        go_format: false,
    }
}

#[tokio::test]
async fn a_million_distinct_keys_are_dropped_once_they_cannot_matter() {
    let clock = ManualClock::new(T0_US);
    const KEYS: usize = 1_000_000;
    // Room for all of them: this is about the sweep, not the key cap.
    let store = MemoryStore::with_max_keys(Arc::new(clock.clone()), 2 * KEYS);
    for i in 0..KEYS {
        let decisions = store
            .apply(&Batch::new(
                vec![item(format!("churn_ip_{i}_"), 1)],
                CommitPolicy::Independent,
            ))
            .await;
        assert!(decisions.expect("memory store never fails")[0].allowed);
    }
    assert_eq!(store.len(), KEYS);
    // Nothing expires while the window is open...
    assert_eq!(store.sweep(), 0);
    // ...and everything once it has closed.
    clock.advance_us(1_000_000);
    assert_eq!(store.sweep(), KEYS);
    assert!(store.is_empty());
}

#[tokio::test]
async fn expired_state_is_ignored_even_before_a_sweep() {
    let clock = ManualClock::new(T0_US);
    let store = MemoryStore::new(Arc::new(clock.clone()));
    let first = store
        .apply(&Batch::new(
            vec![item("k_v_".into(), 10)],
            CommitPolicy::Independent,
        ))
        .await
        .expect("ok");
    assert_eq!(first[0].remaining, 0);
    clock.advance_us(1_000_000);
    let again = store
        .apply(&Batch::new(
            vec![item("k_v_".into(), 1)],
            CommitPolicy::Independent,
        ))
        .await
        .expect("ok");
    assert_eq!(again[0].remaining, 9);
}

#[tokio::test]
async fn all_or_nothing_rolls_back_a_key_seen_twice() {
    let clock = ManualClock::new(T0_US);
    let store = MemoryStore::new(Arc::new(clock.clone()));
    let mut batch = vec![item("a_".into(), 4), item("a_".into(), 4), item("b_".into(), 11)];
    batch[1].group = 1;
    batch[2].group = 2;
    let decisions = store
        .apply(&Batch::new(batch, CommitPolicy::AllOrNothing))
        .await
        .expect("ok");
    assert!(decisions[0].allowed && decisions[1].allowed && !decisions[2].allowed);
    // Nothing was consumed: the full budget is still there for "a".
    let after = store
        .apply(&Batch::new(
            vec![item("a_".into(), 10)],
            CommitPolicy::Independent,
        ))
        .await
        .expect("ok");
    assert!(after[0].allowed);
    assert_eq!(after[0].remaining, 0);
}

/// A request's future is copied whole whenever it moves (into tonic's box, onto a task): it must not
/// hold the Redis call's state inline, which made it 14.5 KB on either store (the size is the type's, so
/// one store checks both).
#[tokio::test]
async fn a_requests_future_stays_small_on_either_store() {
    let limiter = Limiter::new(
        Arc::new(ArcSwapOption::from_pointee(rules(
            &[FAILURE_MODES],
            Algorithm::FixedWindow,
        ))),
        AnyStore::open(Default::default(), Arc::new(SystemClock), Default::default()),
        ValueHasher::default(),
        LimiterOptions::default(),
    );
    let descriptors = [d(&[("open", "a")])];
    let request = limiter.should_rate_limit("fm", &descriptors, 1);
    let size = std::mem::size_of_val(&request);
    assert!(size < 4096, "a request's future is {size} bytes");
    assert_eq!(request.await.expect("decided").overall, Code::Ok);
}

/// An owned embedded limiter decides without a future (`tollgate what-if` does): the same verdicts,
/// rule stats and request counts as the awaited path, request after request, for every algorithm,
/// shadow mode, `replaces`, an unlimited rule and a domain no rules define.
#[tokio::test]
async fn deciding_now_answers_and_counts_as_awaiting_does() {
    const RULES: &str = r#"
domain: now
descriptors:
  - key: fixed
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: bucket
    rate_limit: {unit: second, requests_per_unit: 4, algorithm: token_bucket, burst: 2}
  - key: sliding
    rate_limit: {unit: minute, requests_per_unit: 5, algorithm: sliding_window}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: second, requests_per_unit: 1, algorithm: gcra}
  - key: wide
    rate_limit: {name: wide, unit: second, requests_per_unit: 2}
  - key: narrow
    rate_limit: {unit: second, requests_per_unit: 9, replaces: [{name: wide}]}
  - key: free
    rate_limit: {unlimited: true}
"#;
    let clock = Arc::new(ManualClock::new(T0_US));
    let limiter = || {
        Limiter::new(
            Arc::new(ArcSwapOption::from_pointee(rules(
                &[RULES],
                Algorithm::FixedWindow,
            ))),
            MemoryStore::new(Arc::clone(&clock) as Arc<dyn tollgate_core::clock::Clock>),
            ValueHasher::default(),
            LimiterOptions::default(),
        )
    };
    let (awaited, now) = (limiter(), limiter());
    let requests = [
        vec![d(&[("fixed", "a")]), d(&[("bucket", "b")])],
        vec![d(&[("sliding", "c")]), d(&[("shadow", "d")])],
        vec![d(&[("wide", "e")]), d(&[("narrow", "f")]), d(&[("free", "g")])],
        vec![d(&[("unknown", "h")])],
    ];
    let mut refused = 0;
    // Each side's rules as its verdicts name them, to compare their stats at the end.
    let mut seen = [
        std::collections::BTreeMap::new(),
        std::collections::BTreeMap::new(),
    ];
    let mut note = |side: usize, verdict: &Result<tollgate_core::limiter::Verdict, LimiterError>| {
        for rule in verdict
            .iter()
            .flat_map(|v| &v.statuses)
            .filter_map(|s| s.rule.clone())
        {
            seen[side].insert(rule.path.to_string(), rule);
        }
    };
    for step in 0..40u64 {
        clock.set_us(T0_US + step * 150_000);
        let descriptors = &requests[step as usize % requests.len()];
        for domain in ["now", "nowhere"] {
            let a = awaited.should_rate_limit(domain, descriptors, 1).await;
            let b = now.should_rate_limit_now(domain, descriptors, 1);
            assert_eq!(format!("{a:?}"), format!("{b:?}"), "step {step} in {domain}");
            refused += usize::from(b.as_ref().is_ok_and(|v| v.overall == Code::OverLimit));
            note(0, &a);
            note(1, &b);
            let a = awaited.forward_auth(domain, &descriptors[..1]).await;
            let b = now.forward_auth_now(domain, &descriptors[..1]);
            assert_eq!(format!("{a:?}"), format!("{b:?}"), "step {step} in {domain}");
        }
    }
    assert!(refused > 5, "the sequence reaches the limits ({refused} refused)");
    let counts = |side: usize| -> Vec<(String, [u64; 5])> {
        seen[side]
            .iter()
            .map(|(path, rule)| (path.clone(), rule.stats.in_order().map(|c| c.get())))
            .collect()
    };
    assert_eq!(counts(0), counts(1));
    assert_eq!(counts(1).len(), 7, "every rule was seen");
    let methods = |limiter: &Limiter<MemoryStore>| {
        let metrics = limiter.metrics();
        let requests = [Method::ShouldRateLimit, Method::ForwardAuth].map(|m| metrics.requests(m));
        (requests, metrics.unknown_domains())
    };
    assert_eq!(methods(&awaited), methods(&now));
}
