//! envoyproxy/ratelimit's behaviours (its matching, counting and answers), checked on the embedded store with a manual clock.

use tollgate_core::limiter::{Code, LimitOverride, LimiterError, LimiterOptions};
use tollgate_core::rules::file::Unit;

use crate::common::{Desc, Harness, T0_US, assert_status, d, duration_until_reset, envoy};

const BASIC: &str = r#"
domain: test-domain
descriptors:
  - key: key1
    value: value1
    rate_limit:
      unit: second
      requests_per_unit: 5
  - key: key2
    rate_limit:
      unit: minute
      requests_per_unit: 20
    descriptors:
      - key: subkey1
        rate_limit:
          unit: hour
          requests_per_unit: 10
  - key: key2
    value: value2
    rate_limit:
      unit: minute
      requests_per_unit: 30
  - key: key2
    value: value3
  - key: key3
    rate_limit:
      unit: hour
      requests_per_unit: 1
  - key: key4
    rate_limit:
      unit: day
      requests_per_unit: 0
  - key: key5
    value: value5
    rate_limit:
      unit: second
      requests_per_unit: 2
    descriptors:
      - key: subkey5
        value: subvalue
        rate_limit:
          unit: hour
          requests_per_unit: 3
"#;

#[tokio::test]
async fn exact_value_then_key_default_then_whitelist() {
    let h = Harness::new(&[BASIC]);
    let v = h
        .check(
            "test-domain",
            &[
                d(&[("key2", "value2")]),
                d(&[("key2", "other")]),
                d(&[("key2", "value3")]),
            ],
        )
        .await;
    assert_status(&v.statuses[0], Code::Ok, 29, Some(30));
    assert_status(&v.statuses[1], Code::Ok, 19, Some(20));
    // A value node without rate_limit whitelists the value: exact match beats the key default.
    assert_status(&v.statuses[2], Code::Ok, 0, None);
    assert_eq!(v.overall, Code::Ok);
}

#[tokio::test]
async fn request_depth_must_equal_config_depth() {
    let h = Harness::new(&[BASIC]);
    // key2 has a limit and children: both depths are usable.
    let v = h
        .check(
            "test-domain",
            &[d(&[("key2", "x")]), d(&[("key2", "x"), ("subkey1", "y")])],
        )
        .await;
    assert_status(&v.statuses[0], Code::Ok, 19, Some(20));
    assert_status(&v.statuses[1], Code::Ok, 9, Some(10));
    // Deeper than the config, or an unknown child: no limit.
    let v = h
        .check(
            "test-domain",
            &[
                d(&[("key1", "value1"), ("extra", "x")]),
                d(&[("key2", "x"), ("nope", "y")]),
            ],
        )
        .await;
    assert_status(&v.statuses[0], Code::Ok, 0, None);
    assert_status(&v.statuses[1], Code::Ok, 0, None);
    // Shallower than a rule with no limit of its own: no limit.
    let v = h
        .check(
            "test-domain",
            &[
                d(&[("key5", "value5"), ("subkey5", "subvalue")]),
                d(&[("key5", "value5")]),
            ],
        )
        .await;
    assert_status(&v.statuses[0], Code::Ok, 2, Some(3));
    assert_status(&v.statuses[1], Code::Ok, 1, Some(2));
}

#[tokio::test]
async fn entry_order_matters_and_unknown_keys_get_no_limit() {
    let h = Harness::new(&[BASIC]);
    let v = h
        .check(
            "test-domain",
            &[d(&[("subkey1", "y"), ("key2", "x")]), d(&[("nokey", "v")])],
        )
        .await;
    assert_status(&v.statuses[0], Code::Ok, 0, None);
    assert_status(&v.statuses[1], Code::Ok, 0, None);
}

#[tokio::test]
async fn fixed_window_counts_to_the_limit_and_reports_time_to_window_end() {
    let h = Harness::new(&[BASIC]);
    h.clock.set_us(T0_US + 12_300_000); // 12.3 s into the minute
    let key = d(&[("key2", "value2")]);
    for expected in (0..30).rev() {
        let v = h.check("test-domain", std::slice::from_ref(&key)).await;
        assert_status(&v.statuses[0], Code::Ok, expected, Some(30));
    }
    let v = h.check("test-domain", std::slice::from_ref(&key)).await;
    assert_status(&v.statuses[0], Code::OverLimit, 0, Some(30));
    assert_eq!(v.overall, Code::OverLimit);
    // Go: unit - (now mod unit) in whole seconds = 60 - 12.
    assert_eq!(
        duration_until_reset(&v.statuses[0]),
        Some(std::time::Duration::from_secs(48))
    );
    let limit = v.statuses[0].current_limit().expect("limit");
    assert_eq!(limit.unit, Unit::Minute);
    h.advance_secs(48); // the next minute
    let v = h.check("test-domain", std::slice::from_ref(&key)).await;
    assert_status(&v.statuses[0], Code::Ok, 29, Some(30));
    assert_eq!(
        duration_until_reset(&v.statuses[0]),
        Some(std::time::Duration::from_secs(60))
    );
}

#[tokio::test]
async fn zero_requests_per_unit_blocks_everything() {
    let h = Harness::new(&[BASIC]);
    let v = h.check("test-domain", &[d(&[("key4", "anything")])]).await;
    assert_status(&v.statuses[0], Code::OverLimit, 0, Some(0));
}

#[tokio::test]
async fn values_have_their_own_counters() {
    let h = Harness::new(&[BASIC]);
    let v = h
        .check("test-domain", &[d(&[("key3", "a")]), d(&[("key3", "b")])])
        .await;
    assert_status(&v.statuses[0], Code::Ok, 0, Some(1));
    assert_status(&v.statuses[1], Code::Ok, 0, Some(1));
    let v = h.check("test-domain", &[d(&[("key3", "a")])]).await;
    assert_status(&v.statuses[0], Code::OverLimit, 0, Some(1));
}

#[tokio::test]
async fn other_descriptors_keep_counting_when_one_is_over() {
    // Go's integration test "Limit now against 2 keys": both counters move on every request.
    let h = Harness::new(&[BASIC]);
    let pair = [d(&[("key3", "u")]), d(&[("key2", "value2")])];
    let v = h.check("test-domain", &pair).await;
    assert_status(&v.statuses[0], Code::Ok, 0, Some(1));
    assert_status(&v.statuses[1], Code::Ok, 29, Some(30));
    let v = h.check("test-domain", &pair).await;
    assert_status(&v.statuses[0], Code::OverLimit, 0, Some(1));
    assert_status(&v.statuses[1], Code::Ok, 28, Some(30));
    assert_eq!(v.overall, Code::OverLimit);
}

#[tokio::test]
async fn stop_increment_when_over_limit_leaves_the_other_counters_alone() {
    let options = LimiterOptions {
        stop_increment_when_over_limit: true,
        ..LimiterOptions::default()
    };
    let h = Harness::with_options(&[BASIC], options);
    let pair = [d(&[("key3", "u")]), d(&[("key2", "value2")])];
    h.check("test-domain", &pair).await;
    for _ in 0..3 {
        let v = h.check("test-domain", &pair).await;
        assert_status(&v.statuses[0], Code::OverLimit, 0, Some(1));
        // Not incremented: still 29 left, as after the first request.
        assert_status(&v.statuses[1], Code::Ok, 29, Some(30));
    }
}

#[tokio::test]
async fn unknown_domain_answers_ok_without_limits() {
    let h = Harness::new(&[BASIC]);
    let v = h.check("other-domain", &[d(&[("key1", "value1")])]).await;
    assert_eq!(v.overall, Code::Ok);
    assert_status(&v.statuses[0], Code::Ok, 0, None);
}

#[tokio::test]
async fn request_errors_carry_the_go_messages() {
    let h = Harness::new(&[BASIC]);
    let err = h
        .try_check("", &[d(&[("key1", "value1")])], 0)
        .await
        .expect_err("empty domain");
    assert_eq!(err.to_string(), "rate limit domain must not be empty");
    let err = h
        .try_check("test-domain", &[] as &[Desc], 0)
        .await
        .expect_err("no descriptors");
    assert_eq!(err.to_string(), "rate limit descriptor list must not be empty");
}

#[tokio::test]
async fn no_rules_loaded_is_an_error() {
    use std::sync::Arc;
    let store = tollgate_core::store::memory::MemoryStore::new(Arc::new(
        tollgate_core::clock::ManualClock::new(T0_US),
    ));
    let limiter = tollgate_core::limiter::Limiter::new(
        Arc::new(arc_swap::ArcSwapOption::empty()),
        store,
        tollgate_core::rules::ValueHasher::default(),
        LimiterOptions::default(),
    );
    let err = limiter
        .should_rate_limit("d", &[d(&[("k", "v")])], 0)
        .await
        .expect_err("no config");
    assert_eq!(err, LimiterError::NoConfig);
    assert_eq!(err.to_string(), "no rate limit configuration loaded");
}

const WILDCARDS: &str = r#"
domain: wild
descriptors:
  - key: path
    value: /api/*
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: path
    value: /api/v1/*
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: path
    value: /api/exact
    rate_limit: {unit: hour, requests_per_unit: 7}
  - key: shared
    value: team-*
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: path
    rate_limit: {unit: hour, requests_per_unit: 50}
"#;

#[tokio::test]
async fn wildcards_first_declared_wins_after_exact() {
    let h = Harness::new(&[WILDCARDS]);
    let v = h
        .check(
            "wild",
            &[
                d(&[("path", "/api/v1/users")]),
                d(&[("path", "/api/exact")]),
                d(&[("path", "/other")]),
            ],
        )
        .await;
    // /api/* is declared first, so it wins over the longer /api/v1/* (Go's rule, not longest match).
    assert_status(&v.statuses[0], Code::Ok, 1, Some(2));
    assert_status(&v.statuses[1], Code::Ok, 6, Some(7));
    assert_status(&v.statuses[2], Code::Ok, 49, Some(50));
}

#[tokio::test]
async fn wildcard_values_count_separately_unless_share_threshold() {
    let h = Harness::new(&[WILDCARDS]);
    let v = h
        .check("wild", &[d(&[("path", "/api/a")]), d(&[("path", "/api/b")])])
        .await;
    assert_status(&v.statuses[0], Code::Ok, 1, Some(2));
    assert_status(&v.statuses[1], Code::Ok, 1, Some(2));
    let v = h
        .check(
            "wild",
            &[
                d(&[("shared", "team-a")]),
                d(&[("shared", "team-b")]),
                d(&[("shared", "team-c")]),
            ],
        )
        .await;
    assert_status(&v.statuses[0], Code::Ok, 2, Some(3));
    assert_status(&v.statuses[1], Code::Ok, 1, Some(3));
    assert_status(&v.statuses[2], Code::Ok, 0, Some(3));
    let v = h.check("wild", &[d(&[("shared", "team-z")])]).await;
    assert_status(&v.statuses[0], Code::OverLimit, 0, Some(3));
}

const UNLIMITED_AND_REPLACES: &str = r#"
domain: rl
descriptors:
  - key: internal
    rate_limit:
      unlimited: true
  - key: user
    rate_limit:
      name: per-user
      unit: hour
      requests_per_unit: 5
  - key: premium
    rate_limit:
      name: premium
      unit: hour
      requests_per_unit: 100
      replaces:
        - name: per-user
"#;

#[tokio::test]
async fn unlimited_reports_max_remaining_and_no_limit() {
    let h = Harness::new(&[UNLIMITED_AND_REPLACES]);
    let v = h.check("rl", &[d(&[("internal", "svc")])]).await;
    assert_eq!(envoy(&v.statuses[0]).limit_remaining, u32::MAX);
    assert!(v.statuses[0].current_limit().is_none());
    assert!(duration_until_reset(&v.statuses[0]).is_none());
}

#[tokio::test]
async fn replaces_drops_the_named_limit_in_the_same_request() {
    let h = Harness::new(&[UNLIMITED_AND_REPLACES]);
    let v = h.check("rl", &[d(&[("user", "alice")])]).await;
    assert_status(&v.statuses[0], Code::Ok, 4, Some(5));
    assert_eq!(
        v.statuses[0].current_limit().and_then(|l| l.name.as_deref()),
        Some("per-user")
    );
    let v = h
        .check("rl", &[d(&[("user", "alice")]), d(&[("premium", "alice")])])
        .await;
    assert_status(&v.statuses[0], Code::Ok, 0, None);
    assert_status(&v.statuses[1], Code::Ok, 99, Some(100));
    // The replaced counter was not touched.
    let v = h.check("rl", &[d(&[("user", "alice")])]).await;
    assert_status(&v.statuses[0], Code::Ok, 3, Some(5));
}

#[tokio::test]
async fn override_applies_even_without_a_matching_rule_and_shares_the_counter() {
    let h = Harness::new(&[BASIC]);
    let mut over = d(&[("key2", "value2")]);
    over.limit = Some(LimitOverride {
        requests_per_unit: 3,
        unit: Unit::Minute as i32,
    });
    let v = h.check("test-domain", std::slice::from_ref(&over)).await;
    assert_status(&v.statuses[0], Code::Ok, 2, Some(3));
    assert!(v.statuses[0].current_limit().expect("limit").name.is_none());
    // Same unit as the rule: the same counter (Go keys by domain, entries and window only).
    let v = h.check("test-domain", &[d(&[("key2", "value2")])]).await;
    assert_status(&v.statuses[0], Code::Ok, 28, Some(30));
    let mut unmatched = d(&[("nothing", "here")]);
    unmatched.limit = Some(LimitOverride {
        requests_per_unit: 1,
        unit: Unit::Hour as i32,
    });
    let v = h.check("test-domain", std::slice::from_ref(&unmatched)).await;
    assert_status(&v.statuses[0], Code::Ok, 0, Some(1));
    // Unknown domain: the override is ignored.
    let v = h.check("other", std::slice::from_ref(&unmatched)).await;
    assert_status(&v.statuses[0], Code::Ok, 0, None);
}

#[tokio::test]
async fn override_with_unknown_unit_is_refused() {
    let h = Harness::new(&[BASIC]);
    let mut bad = d(&[("key1", "value1")]);
    bad.limit = Some(LimitOverride {
        requests_per_unit: 3,
        unit: 0,
    });
    let err = h
        .try_check("test-domain", &[d(&[("key1", "value1")]), bad], 0)
        .await
        .expect_err("UNKNOWN unit");
    assert_eq!(err, LimiterError::InvalidOverrideUnit { index: 1, unit: 0 });
}

#[tokio::test]
async fn hits_addend_request_and_descriptor_level() {
    let h = Harness::new(&[BASIC]);
    let v = h
        .try_check("test-domain", &[d(&[("key2", "value2")])], 10)
        .await
        .expect("ok");
    assert_status(&v.statuses[0], Code::Ok, 20, Some(30));
    let mut per = d(&[("key2", "value2")]);
    per.hits = Some(5);
    let v = h
        .try_check("test-domain", &[per, d(&[("key2", "other")])], 2)
        .await
        .expect("ok");
    // Descriptor-level wins over request-level; request-level applies to the rest.
    assert_status(&v.statuses[0], Code::Ok, 15, Some(30));
    assert_status(&v.statuses[1], Code::Ok, 18, Some(20));
    let v = h
        .try_check("test-domain", &[d(&[("key2", "value2")])], 16)
        .await
        .expect("ok");
    assert_status(&v.statuses[0], Code::OverLimit, 0, Some(30));
}

#[tokio::test]
async fn check_only_hits_addend_zero() {
    // Go's fixed_cache_impl_test key3 case: after exhausting, a check-only request is OK with 0 left;
    // once the counter passed the limit it is OVER_LIMIT.
    let h = Harness::new(&[BASIC]);
    let mut peek = d(&[("key3", "z")]);
    peek.hits = Some(0);
    let v = h.check("test-domain", std::slice::from_ref(&peek)).await;
    assert_status(&v.statuses[0], Code::Ok, 1, Some(1));
    h.check("test-domain", &[d(&[("key3", "z")])]).await;
    let v = h.check("test-domain", std::slice::from_ref(&peek)).await;
    assert_status(&v.statuses[0], Code::Ok, 0, Some(1));
    h.check("test-domain", &[d(&[("key3", "z")])]).await;
    let v = h.check("test-domain", std::slice::from_ref(&peek)).await;
    assert_status(&v.statuses[0], Code::OverLimit, 0, Some(1));
}

const SHADOW_AND_QUOTA: &str = r#"
domain: sq
descriptors:
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: strict
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: quota
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
"#;

#[tokio::test]
async fn shadow_rule_reports_ok_but_keeps_counting() {
    let h = Harness::new(&[SHADOW_AND_QUOTA]);
    h.check("sq", &[d(&[("shadow", "a")])]).await;
    let v = h.check("sq", &[d(&[("shadow", "a")])]).await;
    assert_status(&v.statuses[0], Code::Ok, 0, Some(1));
    assert_eq!(v.overall, Code::Ok);
    // Other, non-shadow descriptors still decide.
    h.check("sq", &[d(&[("strict", "a")])]).await;
    let v = h
        .check("sq", &[d(&[("shadow", "a")]), d(&[("strict", "a")])])
        .await;
    assert_eq!(v.overall, Code::OverLimit);
    assert_eq!(v.statuses[0].code, Code::Ok);
}

#[tokio::test]
async fn global_shadow_mode_only_changes_the_overall_code() {
    let options = LimiterOptions {
        global_shadow_mode: true,
        ..LimiterOptions::default()
    };
    let h = Harness::with_options(&[SHADOW_AND_QUOTA], options);
    h.check("sq", &[d(&[("strict", "a")])]).await;
    let v = h.check("sq", &[d(&[("strict", "a")])]).await;
    assert_eq!(v.overall, Code::Ok);
    assert_status(&v.statuses[0], Code::OverLimit, 0, Some(1));
}

#[tokio::test]
async fn quota_mode_is_over_only_when_every_quota_descriptor_is() {
    let h = Harness::new(&[SHADOW_AND_QUOTA]);
    h.check("sq", &[d(&[("quota", "a")])]).await;
    let v = h.check("sq", &[d(&[("quota", "a")]), d(&[("quota", "b")])]).await;
    assert_eq!(v.statuses[0].code, Code::OverLimit);
    assert_eq!(v.statuses[1].code, Code::Ok);
    assert_eq!(v.overall, Code::Ok);
    let v = h.check("sq", &[d(&[("quota", "a")]), d(&[("quota", "b")])]).await;
    assert_eq!(v.overall, Code::OverLimit);
    // A non-quota descriptor over the limit is enough on its own.
    h.check("sq", &[d(&[("strict", "x")])]).await;
    let v = h
        .check("sq", &[d(&[("strict", "x")]), d(&[("quota", "fresh")])])
        .await;
    assert_eq!(v.overall, Code::OverLimit);
}

#[tokio::test]
async fn global_quota_mode_applies_to_every_descriptor() {
    let options = LimiterOptions {
        global_quota_mode: true,
        ..LimiterOptions::default()
    };
    let h = Harness::with_options(&[SHADOW_AND_QUOTA], options);
    h.check("sq", &[d(&[("strict", "x")])]).await;
    let v = h
        .check("sq", &[d(&[("strict", "x")]), d(&[("strict", "y")])])
        .await;
    assert_eq!(v.overall, Code::Ok);
}

#[tokio::test]
async fn cache_key_prefix_keeps_deployments_apart_but_same_prefix_shares() {
    // Two limiters over two stores cannot share; this checks the prefix reaches the key without
    // breaking matching, and that all units accept it.
    let options = LimiterOptions {
        cache_key_prefix: "prefix:".into(),
        ..LimiterOptions::default()
    };
    let h = Harness::with_options(&[BASIC], options);
    let v = h.check("test-domain", &[d(&[("key1", "value1")])]).await;
    assert_status(&v.statuses[0], Code::Ok, 4, Some(5));
}
