//! Tollgate's extensions to the rules format: algorithms per rule, several limits per key, custom
//! windows, value normalisation and hashing, CIDR values, all-or-nothing domains.

use std::time::Duration;

use tollgate_core::algorithm::Algorithm;
use tollgate_core::limiter::{Code, LimitOverride, LimiterError, LimiterOptions};
use tollgate_core::rules::file::Unit;
use tollgate_core::rules::{HASH_MARK, ValueEncoding, ValueHasher};

use crate::common::{Harness, assert_status, d, duration_until_reset, rules};

const ALGORITHMS: &str = r#"
domain: algo
descriptors:
  - key: bucket
    rate_limit: {unit: second, requests_per_unit: 2, algorithm: token_bucket, burst: 5}
  - key: gcra
    rate_limit: {unit: second, requests_per_unit: 2, algorithm: gcra, burst: 5}
  - key: sliding
    rate_limit: {unit: minute, requests_per_unit: 10, algorithm: sliding_window}
  - key: log
    rate_limit: {unit: minute, requests_per_unit: 3, algorithm: sliding_log}
  - key: quarter
    rate_limit: {unit: minute, unit_multiplier: 15, requests_per_unit: 2}
"#;

#[tokio::test]
async fn token_bucket_allows_the_burst_then_refills_continuously() {
    let h = Harness::new(&[ALGORITHMS]);
    let key = d(&[("bucket", "u")]);
    assert_eq!(h.admitted("algo", &key, 10).await, 5, "burst of 5");
    let v = h.check("algo", std::slice::from_ref(&key)).await;
    assert_eq!(v.statuses[0].code, Code::OverLimit);
    // 2 per second: the next token is 0.5 s away; the hint is rounded up to whole seconds on the wire
    // and exact in `retry_after`.
    assert_eq!(v.statuses[0].retry_after, Some(Duration::from_millis(500)));
    assert_eq!(duration_until_reset(&v.statuses[0]), Some(Duration::from_secs(1)));
    h.clock.advance_us(500_000);
    assert_eq!(h.admitted("algo", &key, 3).await, 1);
    h.advance_secs(10);
    assert_eq!(
        h.admitted("algo", &key, 10).await,
        5,
        "refilled to the burst, not beyond"
    );
}

#[tokio::test]
async fn gcra_admits_exactly_like_the_token_bucket() {
    let h = Harness::new(&[ALGORITHMS]);
    for step_ms in [0u64, 100, 250, 499, 500, 1_000, 3_000] {
        h.clock.advance_us(step_ms * 1_000);
        let bucket = h.admitted("algo", &d(&[("bucket", "x")]), 4).await;
        let gcra = h.admitted("algo", &d(&[("gcra", "x")]), 4).await;
        assert_eq!(bucket, gcra, "after a step of {step_ms} ms");
    }
}

#[tokio::test]
async fn sliding_window_weights_the_previous_window() {
    let h = Harness::new(&[ALGORITHMS]);
    let key = d(&[("sliding", "u")]);
    assert_eq!(h.admitted("algo", &key, 12).await, 10);
    // Half-way through the next minute the previous minute still weighs half: 5 of 10 are used.
    h.advance_secs(90);
    assert_eq!(h.admitted("algo", &key, 10).await, 5);
}

#[tokio::test]
async fn sliding_log_is_exact_across_the_window_edge() {
    let h = Harness::new(&[ALGORITHMS]);
    let key = d(&[("log", "u")]);
    h.advance_secs(59);
    assert_eq!(h.admitted("algo", &key, 5).await, 3);
    // A fixed window would reset here; the log still remembers the last 60 seconds.
    h.advance_secs(2);
    let v = h.check("algo", std::slice::from_ref(&key)).await;
    assert_eq!(v.statuses[0].code, Code::OverLimit);
    assert_eq!(v.statuses[0].retry_after, Some(Duration::from_secs(58)));
    h.advance_secs(58);
    assert_eq!(h.admitted("algo", &key, 5).await, 3);
}

#[tokio::test]
async fn unit_multiplier_makes_a_fifteen_minute_window() {
    let h = Harness::new(&[ALGORITHMS]);
    let key = d(&[("quarter", "u")]);
    assert_eq!(h.admitted("algo", &key, 3).await, 2);
    let v = h.check("algo", std::slice::from_ref(&key)).await;
    // T0 is on an hour boundary, so the 15-minute window ends 900 s later.
    assert_eq!(
        duration_until_reset(&v.statuses[0]),
        Some(Duration::from_secs(900))
    );
    h.advance_secs(899);
    assert_eq!(h.admitted("algo", &key, 1).await, 0);
    h.advance_secs(1);
    assert_eq!(h.admitted("algo", &key, 3).await, 2);
}

const SEVERAL_LIMITS: &str = r#"
domain: multi
descriptors:
  - key: user
    rate_limits:
      - {name: per-second, unit: second, requests_per_unit: 2}
      - {name: per-day, unit: day, requests_per_unit: 5}
"#;

#[tokio::test]
async fn several_limits_on_one_key_must_all_pass() {
    let h = Harness::new(&[SEVERAL_LIMITS]);
    let key = d(&[("user", "alice")]);
    let v = h.check("multi", std::slice::from_ref(&key)).await;
    // The limit closest to exhaustion is reported: 1 of 2 left this second.
    assert_status(&v.statuses[0], Code::Ok, 1, Some(2));
    assert_eq!(h.admitted("multi", &key, 3).await, 1, "the per-second limit");
    h.advance_secs(1);
    assert_eq!(h.admitted("multi", &key, 2).await, 2);
    h.advance_secs(1);
    // Denied requests did not eat the daily budget: 1 + 1 + 2 used, so the fifth is allowed...
    let v = h.check("multi", std::slice::from_ref(&key)).await;
    assert_status(&v.statuses[0], Code::Ok, 0, Some(5));
    h.advance_secs(1);
    // ...and the sixth is refused by the per-day limit, which is the one reported.
    let v = h.check("multi", std::slice::from_ref(&key)).await;
    assert_status(&v.statuses[0], Code::OverLimit, 0, Some(5));
    assert_eq!(
        v.statuses[0].current_limit().and_then(|l| l.name.as_deref()),
        Some("per-day")
    );
}

const NORMALISED: &str = r#"
domain: norm
descriptors:
  - key: email
    lowercase: true
    trim: true
    hash: true
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: email
    value: VIP@Example.com
  - key: remote_address
    ip_prefix: {v4: 32, v6: 64}
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: remote_address
    value: 10.0.0.0/8
    match: cidr
    rate_limit: {unit: hour, requests_per_unit: 100}
"#;

#[tokio::test]
async fn lowercase_and_trim_share_one_counter_and_apply_to_configured_values() {
    let h = Harness::new(&[NORMALISED]);
    let v = h
        .check(
            "norm",
            &[
                d(&[("email", "Alice@Example.com")]),
                d(&[("email", " alice@example.COM ")]),
            ],
        )
        .await;
    assert_status(&v.statuses[0], Code::Ok, 1, Some(2));
    assert_status(&v.statuses[1], Code::Ok, 0, Some(2));
    // The configured value is normalised too, so any spelling of the VIP address is whitelisted.
    let v = h.check("norm", &[d(&[("email", "vip@example.COM")])]).await;
    assert_status(&v.statuses[0], Code::Ok, 0, None);
}

#[tokio::test]
async fn ipv6_addresses_of_one_slash_64_share_a_counter_ipv4_does_not() {
    let h = Harness::new(&[NORMALISED]);
    let v = h
        .check(
            "norm",
            &[
                d(&[("remote_address", "2001:db8:1:2::1")]),
                d(&[("remote_address", "2001:db8:1:2:ffff::9")]),
                d(&[("remote_address", "2001:db8:1:3::1")]),
                d(&[("remote_address", "192.0.2.1")]),
                d(&[("remote_address", "192.0.2.2")]),
            ],
        )
        .await;
    assert_status(&v.statuses[0], Code::Ok, 1, Some(2));
    assert_status(&v.statuses[1], Code::Ok, 0, Some(2));
    assert_status(&v.statuses[2], Code::Ok, 1, Some(2));
    assert_status(&v.statuses[3], Code::Ok, 1, Some(2));
    assert_status(&v.statuses[4], Code::Ok, 1, Some(2));
}

#[tokio::test]
async fn cidr_values_match_ranges_before_the_key_default() {
    let h = Harness::new(&[NORMALISED]);
    let v = h
        .check(
            "norm",
            &[
                d(&[("remote_address", "10.1.2.3")]),
                d(&[("remote_address", "11.1.2.3")]),
            ],
        )
        .await;
    assert_status(&v.statuses[0], Code::Ok, 99, Some(100));
    assert_status(&v.statuses[1], Code::Ok, 1, Some(2));
}

const SHARED_NETWORK: &str = r#"
domain: net
descriptors:
  - key: remote_address
    value: 10.0.0.0/8
    match: cidr
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: remote_address
    value: 192.168.0.0/16
    match: cidr
    rate_limit: {unit: hour, requests_per_unit: 3}
"#;

/// `share_threshold` on a network (accepted beside wildcards): every address inside it counts on one
/// counter; without it, each address counts on its own.
#[tokio::test]
async fn a_shared_network_counts_its_addresses_together() {
    let h = Harness::new(&[SHARED_NETWORK]);
    let addresses = ["10.1.2.3", "10.9.9.9", "192.168.1.1", "192.168.1.2"];
    let descriptors: Vec<_> = addresses.iter().map(|a| d(&[("remote_address", a)])).collect();
    let v = h.check("net", &descriptors).await;
    assert_status(&v.statuses[0], Code::Ok, 2, Some(3));
    assert_status(&v.statuses[1], Code::Ok, 1, Some(3));
    assert_status(&v.statuses[2], Code::Ok, 2, Some(3));
    assert_status(&v.statuses[3], Code::Ok, 2, Some(3));
}

/// A dual-stack front end reports an IPv4 client as `::ffff:a.b.c.d`: it is that IPv4 client, grouped
/// and matched as one, never one of all IPv4 clients sharing `::/64`.
#[tokio::test]
async fn ipv4_mapped_clients_are_their_ipv4_address() {
    let h = Harness::new(&[NORMALISED]);
    let v = h
        .check(
            "norm",
            &[
                d(&[("remote_address", "::ffff:203.0.113.9")]),
                d(&[("remote_address", "203.0.113.9")]),
                d(&[("remote_address", "::ffff:203.0.113.10")]),
                d(&[("remote_address", "::ffff:10.1.2.3")]),
            ],
        )
        .await;
    assert_status(&v.statuses[0], Code::Ok, 1, Some(2));
    assert_status(&v.statuses[1], Code::Ok, 0, Some(2));
    assert_status(&v.statuses[2], Code::Ok, 1, Some(2));
    assert_status(&v.statuses[3], Code::Ok, 99, Some(100));
}

#[test]
fn hashed_values_never_reach_the_storage_key() {
    let set = rules(&[NORMALISED], Algorithm::FixedWindow);
    let domain = set.domain("norm").expect("domain");
    let mut key = String::from("norm_");
    domain
        .find(
            &[("email", " Alice@Example.com")],
            &ValueHasher::new("secret"),
            &mut key,
            ValueEncoding::Go,
        )
        .expect("rule");
    assert!(!key.to_lowercase().contains("alice"), "{key}");
    assert!(key.starts_with("norm_email_") && key.ends_with('_'), "{key}");
    let hashed = &key["norm_email_".len()..key.len() - 1];
    let digest = hashed.strip_prefix(HASH_MARK).expect("a hash is marked");
    assert_eq!(digest.len(), 32);
    assert!(digest.chars().all(|c| c.is_ascii_hexdigit()), "{key}");
    // The same caller, spelled differently, gets the same key; another secret gives another key.
    let mut again = String::from("norm_");
    domain
        .find(
            &[("email", "alice@example.com")],
            &ValueHasher::new("secret"),
            &mut again,
            ValueEncoding::Go,
        )
        .expect("rule");
    assert_eq!(key, again);
    let mut other = String::from("norm_");
    domain
        .find(
            &[("email", "alice@example.com")],
            &ValueHasher::new("other"),
            &mut other,
            ValueEncoding::Go,
        )
        .expect("rule");
    assert_ne!(key, other);
}

const ALL_OR_NOTHING: &str = r#"
domain: aon
all_or_nothing: true
descriptors:
  - key: roomy
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: tight
    rate_limit: {unit: hour, requests_per_unit: 1}
"#;

#[tokio::test]
async fn all_or_nothing_consumes_nothing_when_one_descriptor_is_over() {
    let h = Harness::new(&[ALL_OR_NOTHING]);
    let pair = [d(&[("roomy", "a")]), d(&[("tight", "a")])];
    let v = h.check("aon", &pair).await;
    assert_status(&v.statuses[0], Code::Ok, 9, Some(10));
    assert_status(&v.statuses[1], Code::Ok, 0, Some(1));
    for _ in 0..3 {
        let v = h.check("aon", &pair).await;
        assert_eq!(v.overall, Code::OverLimit);
        // The roomy descriptor passed but consumed nothing: still 9 left.
        assert_status(&v.statuses[0], Code::Ok, 9, Some(10));
        assert_status(&v.statuses[1], Code::OverLimit, 0, Some(1));
    }
}

#[tokio::test]
async fn default_algorithm_applies_to_rules_and_overrides_that_name_none() {
    let yaml =
        "domain: dflt\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 2}\n";
    let options = LimiterOptions {
        default_algorithm: Algorithm::TokenBucket,
        ..LimiterOptions::default()
    };
    let h = Harness::with_options(&[yaml], options);
    let key = d(&[("k", "v")]);
    assert_eq!(h.admitted("dflt", &key, 3).await, 2);
    // A token bucket refills continuously: half a second later one more is allowed (a fixed window
    // starting at T0 would still be closed).
    h.clock.advance_us(500_000);
    assert_eq!(h.admitted("dflt", &key, 2).await, 1);
}

#[test]
fn more_than_sixty_four_limits_on_one_key_are_refused_by_name() {
    let mut yaml = String::from("domain: many\ndescriptors:\n  - key: k\n    rate_limits:\n");
    for seconds in 1..=65 {
        yaml.push_str(&format!(
            "      - {{unit: second, unit_multiplier: {seconds}, requests_per_unit: 1}}\n"
        ));
    }
    let domain = tollgate_core::rules::file::parse_file("many.yaml", &yaml).expect("valid YAML and rules");
    let options = tollgate_core::rules::CompileOptions {
        default_algorithm: Algorithm::FixedWindow,
        ..Default::default()
    };
    let error = tollgate_core::rules::RuleSet::compile(vec![domain], options).expect_err("65 limits");
    assert!(
        error.to_string().contains("many.yaml") && error.to_string().contains("at most 64"),
        "{error}"
    );
}

/// The sliding log's cap (one entry per request) holds however the algorithm is chosen: named in the
/// file, taken from `TOLLGATE_DEFAULT_ALGORITHM`, or applied to a request's limit override.
#[tokio::test]
async fn the_sliding_log_cap_holds_for_the_default_algorithm_and_for_overrides() {
    let yaml =
        "domain: log\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 200000}\n";
    let domain =
        tollgate_core::rules::file::parse_file("log.yaml", yaml).expect("valid without an algorithm");
    let options = tollgate_core::rules::CompileOptions {
        default_algorithm: Algorithm::SlidingLog,
        ..Default::default()
    };
    let error = tollgate_core::rules::RuleSet::compile(vec![domain], options).expect_err("over the cap");
    assert!(
        error.to_string().contains("log.yaml")
            && error.to_string().contains("MAX_SLIDING_LOG_REQUESTS_PER_UNIT"),
        "{error}"
    );
    let small =
        "domain: log\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 10}\n";
    let options = LimiterOptions {
        default_algorithm: Algorithm::SlidingLog,
        ..LimiterOptions::default()
    };
    let h = Harness::with_options(&[small], options);
    let mut over = d(&[("k", "v")]);
    over.limit = Some(LimitOverride {
        requests_per_unit: 200_000,
        unit: Unit::Hour as i32,
    });
    let error = h.try_check("log", &[over], 0).await.expect_err("over the cap");
    assert!(
        matches!(error, LimiterError::InvalidOverride { index: 0, .. }),
        "{error}"
    );
}

/// Nothing from a request makes a storage-key component longer than 256 bytes: an override's entry
/// key and value are hashed beyond that, as matched values are.
#[test]
fn override_keys_stay_bounded_whatever_the_entry_key() {
    let yaml = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1}\n";
    let domain = tollgate_core::rules::file::parse_file("d.yaml", yaml).expect("valid");
    let options = tollgate_core::rules::CompileOptions::default();
    let rules = tollgate_core::rules::RuleSet::compile(vec![domain], options).expect("compiles");
    let domain = rules.domain("d").expect("domain d");
    let hasher = ValueHasher::new("test");
    let (long_key, long_value) = ("k".repeat(3 << 20), "v".repeat(3 << 20));
    for encoding in [ValueEncoding::Go, ValueEncoding::Escaped] {
        let mut key = String::from("d_");
        domain.raw_key(
            &[(long_key.as_str(), long_value.as_str())],
            &hasher,
            &mut key,
            encoding,
        );
        assert!(key.len() < 2 * 64 + 8, "{} bytes", key.len());
        let mut other = String::from("d_");
        domain.raw_key(&[(long_key.as_str(), "w")], &hasher, &mut other, encoding);
        assert_ne!(key, other, "hashed components still tell values apart");
        let mut short = String::from("d_");
        domain.raw_key(&[("user", "alice")], &hasher, &mut short, encoding);
        assert_eq!(
            short, "d_user_alice_",
            "short ones stay as envoyproxy/ratelimit writes them"
        );
    }
    // Values in the escaped encoding are escaped; entry keys come from Envoy's configuration, as
    // they are.
    let mut escaped = String::from("d_");
    domain.raw_key(
        &[("remote_address", "a_b%")],
        &hasher,
        &mut escaped,
        ValueEncoding::Escaped,
    );
    assert_eq!(escaped, "d_remote_address_a%5Fb%25_");
}
