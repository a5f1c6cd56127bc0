//! The rules-file format (envoyproxy/ratelimit's YAML plus Tollgate's keys) through its public entry
//! point, `parse_file`: what is accepted, what it becomes, and Go's exact messages for what is not.
//! (`lease_ttl`'s own grammar is unit-tested next to it, in `core/src/rules/file/validate.rs`.)

use std::collections::BTreeMap;

use tollgate_core::rules::file::*;

const FILE: &str = "rules.yaml";

fn ok(text: &str) -> DomainConfig {
    match parse_file(FILE, text) {
        Ok(c) => c,
        Err(e) => panic!("rejected: {e}"),
    }
}

fn err(text: &str) -> String {
    match parse_file(FILE, text) {
        Ok(c) => panic!("accepted: {c:?}"),
        Err(e) => {
            assert!(matches!(e, ConfigError::Invalid { ref file, .. } if file == FILE));
            e.to_string()
        }
    }
}

#[track_caller]
fn assert_err(text: &str, message: &str) {
    assert_eq!(err(text), format!("{FILE}: {message}"));
}

/// Error for a single top-level descriptor written as YAML lines (indented by 4).
#[track_caller]
fn assert_descriptor_err(descriptor: &str, message: &str) {
    assert_err(&format!("domain: d\ndescriptors:\n  - {descriptor}\n"), message);
}

fn limited(unit: Unit, rpu: u32) -> RateLimitConfig {
    RateLimitConfig {
        name: None,
        replaces: vec![],
        failure_mode: None,
        policy: LimitPolicy::Limited(LimitSpec {
            unit,
            unit_multiplier: 1,
            requests_per_unit: rpu,
            algorithm: None,
            burst: None,
        }),
    }
}

fn node(key: &str, value: Option<&str>) -> DescriptorConfig {
    DescriptorConfig {
        key: key.into(),
        value: value.map(Into::into),
        value_match: if value.is_some_and(|v| v.contains('*')) {
            ValueMatch::Wildcard
        } else {
            ValueMatch::Exact
        },
        rate_limits: vec![],
        concurrency: None,
        shadow_mode: false,
        quota_mode: false,
        detailed_metric: false,
        value_to_metric: false,
        share_threshold: false,
        metadata: None,
        normalize: Normalize::default(),
        descriptors: vec![],
    }
}

fn with_limit(mut d: DescriptorConfig, l: RateLimitConfig) -> DescriptorConfig {
    d.rate_limits.push(l);
    d
}

fn with_children(mut d: DescriptorConfig, c: Vec<DescriptorConfig>) -> DescriptorConfig {
    d.descriptors = c;
    d
}

fn spec(c: &DomainConfig, path: &[usize]) -> LimitSpec {
    let mut d = &c.descriptors[path[0]];
    for i in &path[1..] {
        d = &d.descriptors[*i];
    }
    match &d.rate_limits[0].policy {
        LimitPolicy::Limited(s) => s.clone(),
        LimitPolicy::Unlimited => panic!("unlimited"),
    }
}

// ----- the Go repository's config fixtures ------------------------------------------------------

const BASIC: &str = r#"
# Equivalent of test/config/basic_config.yaml.
domain: test-domain
descriptors:
  # Top level key/value with no rate limit.
  - key: key1
    value: value1
    descriptors:
      # 2nd level key only with default rate limit.
      - key: subkey1
        rate_limit:
          unit: second
          requests_per_unit: 5
      # 2nd level key/value with limit. Specific override at 2nd level.
      - key: subkey1
        value: subvalue1
        rate_limit:
          unit: second
          requests_per_unit: 10

  # Top level key only with default rate limit.
  - key: key2
    rate_limit:
      unit: minute
      requests_per_unit: 20

  # Top level key/value with limit. Specific override at 1st level.
  - key: key2
    value: value2
    rate_limit:
      unit: MINUTE
      requests_per_unit: 30

  # Top level key/value with no limit (whitelist).
  - key: key2
    value: value3

  - key: key3
    rate_limit:
      unit: hour
      requests_per_unit: 1

  - key: key4
    rate_limit:
      unit: Day
      requests_per_unit: 1

  # A limit at an intermediate level plus children.
  - key: key5
    value: value5
    rate_limit:
      unit: second
      requests_per_unit: 5
    descriptors:
      - key: subkey5
        value: subvalue
        rate_limit:
          unit: second
          requests_per_unit: 10
"#;

#[test]
fn basic_config_model() {
    let c = ok(BASIC);
    let expected = DomainConfig {
        domain: "test-domain".into(),
        file: FILE.into(),
        all_or_nothing: false,
        proxy: None,
        descriptors: vec![
            with_children(
                node("key1", Some("value1")),
                vec![
                    with_limit(node("subkey1", None), limited(Unit::Second, 5)),
                    with_limit(node("subkey1", Some("subvalue1")), limited(Unit::Second, 10)),
                ],
            ),
            with_limit(node("key2", None), limited(Unit::Minute, 20)),
            with_limit(node("key2", Some("value2")), limited(Unit::Minute, 30)),
            node("key2", Some("value3")),
            with_limit(node("key3", None), limited(Unit::Hour, 1)),
            with_limit(node("key4", None), limited(Unit::Day, 1)),
            with_children(
                with_limit(node("key5", Some("value5")), limited(Unit::Second, 5)),
                vec![with_limit(
                    node("subkey5", Some("subvalue")),
                    limited(Unit::Second, 10),
                )],
            ),
        ],
    };
    assert_eq!(c, expected);
}

#[test]
fn concurrency_rules() {
    let c = ok(
        "domain: d\ndescriptors:\n  - key: export\n    concurrency: {max_in_flight: 20, lease_ttl: 30s}\n  - key: job\n    concurrency: {max_in_flight: 0, failure_mode: open}\n    rate_limit: {unit: minute, requests_per_unit: 5}\n",
    );
    assert_eq!(
        c.descriptors[0].concurrency,
        Some(ConcurrencyConfig {
            max_in_flight: 20,
            lease_ttl: std::time::Duration::from_secs(30),
            failure_mode: None,
        })
    );
    let job = c.descriptors[1].concurrency.expect("job has a concurrency rule");
    assert_eq!((job.max_in_flight, job.lease_ttl), (0, DEFAULT_LEASE_TTL));
    assert_eq!(job.failure_mode, Some(FailureMode::Open));
    assert_eq!(c.descriptors[1].rate_limits.len(), 1);
}

#[test]
fn concurrency_errors() {
    assert_descriptor_err(
        "{key: k, concurrency: {lease_ttl: 5s}}",
        "concurrency of descriptor 'd.k' needs max_in_flight",
    );
    assert_descriptor_err(
        "{key: k, concurrency: {max_in_flight: 100001}}",
        "max_in_flight 100001 in descriptor 'd.k' exceeds 100000",
    );
    assert_descriptor_err(
        "{key: k, concurrency: {max_in_flight: 2, lease_ttl: forever}}",
        "lease_ttl 'forever' in descriptor 'd.k' must be a duration such as 30s or 500ms, between 1ms and 1day",
    );
    assert_descriptor_err(
        "{key: k, concurrency: {max_in_flight: 2, failure_mode: maybe}}",
        "invalid failure_mode 'maybe' in descriptor 'd.k' (valid: open, closed)",
    );
    assert_descriptor_err(
        "{key: k, concurrency: {max_in_flight: 2, failure_mode: local}}",
        "failure_mode 'local' in descriptor 'd.k' applies to rate limits, not concurrency (valid: open, closed)",
    );
}

#[test]
fn bad_yaml() {
    let e = err("domain: test-domain\ndescriptors:\n  - key: [unclosed\n");
    assert!(
        e.starts_with(&format!("{FILE}: error loading config file: ")),
        "{e}"
    );
    assert!(!e.contains('\n'), "one-line message: {e}");
    let e = err("domain: d\n  key: x\n bad indentation: [\n");
    assert!(e.starts_with(&format!("{FILE}: error loading config file: ")));
}

#[test]
fn non_string_key() {
    assert_err(
        "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n    rate_limit:\n      unit: day\n      4: 5\n",
        "config error, key is not of type string: 4",
    );
    assert_err(
        "domain: d\ntrue: x\n",
        "config error, key is not of type string: true",
    );
}

#[test]
fn misspelled_keys() {
    assert_err(
        "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n    ratelimit:\n      unit: day\n      requests_per_unit: 5\n",
        "config error, unknown key 'ratelimit'",
    );
    assert_err(
        "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n    rate_limit:\n      unit: day\n      requestsperunit: 5\n",
        "config error, unknown key 'requestsperunit'",
    );
    // Keys are case-sensitive.
    assert_err("Domain: d\n", "config error, unknown key 'Domain'");
    // Metadata contents are free-form, but the key itself is checked.
    assert_err(
        "domain: d\ndescriptors:\n  - key: k\n    meta: {a: 1}\n",
        "config error, unknown key 'meta'",
    );
}

#[test]
fn non_map_list() {
    assert_err(
        "domain: test-domain\ndescriptors:\n  - a\n  - b\n",
        "config error, yaml file contains list of type other than map: a",
    );
    assert_err(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      replaces: [x]\n",
        "config error, yaml file contains list of type other than map: x",
    );
}

#[test]
fn unsupported_leaf_types() {
    assert_descriptor_err(
        "key: k\n    rate_limit: {unit: second, requests_per_unit: 1.5}",
        "error checking config",
    );
    assert_descriptor_err("key: k\n    value: 1e3", "error checking config");
    assert_err(
        "domain: d\ndescriptors:\n  - key: k\n    value: .nan\n",
        "error checking config",
    );
}

#[test]
fn requests_per_unit_out_of_range() {
    for bad in ["-1", "4294967296", "99999999999999999999"] {
        let text = format!(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: {bad}\n"
        );
        let e = err(&text);
        if bad == "99999999999999999999" {
            // Beyond int64 yaml.v2 produces a float, rejected by the validator.
            assert_eq!(e, format!("{FILE}: error checking config"));
            continue;
        }
        assert_eq!(
            e,
            format!(
                "{FILE}: error loading config file: line 6: cannot unmarshal !!int `{bad}` into uint32 (requests_per_unit must be between 0 and 4294967295)"
            )
        );
    }
    let c = ok(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 4294967295}\n",
    );
    assert_eq!(spec(&c, &[0]).requests_per_unit, u32::MAX);
}

#[test]
fn type_mismatches() {
    assert_descriptor_err(
        "key: k\n    rate_limit: {unit: second, requests_per_unit: \"10\"}",
        "error loading config file: line 4: cannot unmarshal !!str `10` into uint32 (key 'requests_per_unit')",
    );
    assert_descriptor_err(
        "key: k\n    shadow_mode: 1",
        "error loading config file: line 4: cannot unmarshal !!int `1` into bool (key 'shadow_mode')",
    );
    assert_descriptor_err(
        "key: {}",
        "error loading config file: line 3: cannot unmarshal !!map into string (key 'key')",
    );
    assert_descriptor_err(
        "key: k\n    rate_limit: second",
        "error loading config file: line 4: cannot unmarshal !!str `second` into a mapping (key 'rate_limit')",
    );
    assert_err(
        "domain: d\ndescriptors: oops\n",
        "error loading config file: line 2: cannot unmarshal !!str `oops` into a list (key 'descriptors')",
    );
    let e = err("[domain, d]\n");
    assert!(e.starts_with(&format!(
        "{FILE}: error loading config file: line 1: cannot unmarshal !!seq"
    )));
}

/// Errors never echo a file's content whole: a file that is one scalar (a token mounted among the rules
/// by mistake) is not shown at all, and a long value in a type error is cut as yaml.v2 cuts it (its
/// first 7 bytes).
#[test]
fn errors_do_not_echo_secrets_from_the_file() {
    let e = err("s3cr3t-t0ken-0123456789abcdef\n");
    assert!(!e.contains("s3cr3t"), "{e}");
    assert!(
        e.contains("cannot unmarshal !!str into a mapping (the document root)"),
        "{e}"
    );
    assert_err(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: password-in-the-wrong-place\n",
        "error loading config file: line 4: cannot unmarshal !!str `passwor...` into a mapping (key 'rate_limit')",
    );
}

#[test]
fn empty_domain() {
    assert_err(
        "domain: \"\"\ndescriptors:\n  - key: k\n",
        "config file cannot have empty domain",
    );
    assert_err(
        "descriptors:\n  - key: k\n",
        "config file cannot have empty domain",
    );
    assert_err("", "config file cannot have empty domain");
    assert_err("# only a comment\n", "config file cannot have empty domain");
}

#[test]
fn empty_key() {
    assert_err(
        "domain: test-domain\ndescriptors:\n  - key: key1\n    descriptors:\n      - value: v\n        rate_limit: {unit: second, requests_per_unit: 1}\n",
        "descriptor has empty key",
    );
    assert_descriptor_err("key: ~", "descriptor has empty key");
}

#[test]
fn duplicate_key() {
    assert_err(
        "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n  - key: key1\n    value: value1\n",
        "duplicate descriptor composite key 'test-domain.key1_value1'",
    );
    assert_err(
        "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n    descriptors:\n      - key: subkey1\n      - key: subkey1\n",
        "duplicate descriptor composite key 'test-domain.key1_value1.subkey1'",
    );
    // The well-known surprise: two windows on one key need rate_limits (or two keys).
    assert_err(
        "domain: d\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: user\n    rate_limit: {unit: day, requests_per_unit: 100}\n",
        "duplicate descriptor composite key 'd.user'",
    );
    // Go's finalKey collision: key "a_b" vs key "a" + value "b".
    assert_err(
        "domain: d\ndescriptors:\n  - key: a_b\n  - key: a\n    value: b\n",
        "duplicate descriptor composite key 'd.a_b'",
    );
    // An empty value is no value.
    assert_err(
        "domain: d\ndescriptors:\n  - key: a\n  - key: a\n    value: \"\"\n",
        "duplicate descriptor composite key 'd.a'",
    );
}

/// A file of `routes` Envoy Gateway routes (one top-level descriptor each, a client key below it),
/// `tail` after the list: some 250 bytes a route.
fn routes_file(routes: usize, tail: &str) -> String {
    let mut text = "domain: eg\ndescriptors:\n".to_owned();
    for i in 0..routes {
        let name = format!("httproute/default/route-{i}/rule/0/match/0");
        text.push_str(&format!(
            "  - key: {name}\n    value: {name}\n    descriptors:\n      - key: x-user-id\n        \
             rate_limit: {{unit: minute, requests_per_unit: {}}}\n",
            i + 1
        ));
    }
    text + tail
}

/// A file of several mebibytes is read in pieces on the machine's cores: what it yields, and the error
/// Go reports, are those of one reading, including a check between the first descriptor and the last.
/// (The pieces' other checks are unit-tested in `core/src/rules/file/pieces.rs`.)
#[test]
fn a_large_file_reads_as_a_small_one() {
    let routes = 12_000;
    let text = routes_file(routes, "all_or_nothing: true\n");
    assert!(text.len() > 2 << 20, "large enough to be read in pieces");
    let config = ok(&text);
    assert!(config.all_or_nothing);
    assert_eq!(config.descriptors.len(), routes);
    for (i, d) in config.descriptors.iter().enumerate() {
        assert_eq!(d.key, format!("httproute/default/route-{i}/rule/0/match/0"));
        assert_eq!(spec(&config, &[i, 0]).requests_per_unit as usize, i + 1);
    }
    let first = "httproute/default/route-0/rule/0/match/0";
    assert_err(
        &routes_file(routes, &format!("  - key: {first}\n    value: {first}\n")),
        &format!("duplicate descriptor composite key 'eg.{first}_{first}'"),
    );
}

#[test]
fn duplicate_in_children_reported_before_later_sibling() {
    // Go loads a node's children before looking at the next sibling.
    assert_err(
        "domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - key: c\n      - key: c\n  - key: a\n",
        "duplicate descriptor composite key 'd.a.c'",
    );
}

#[test]
fn bad_limit_unit() {
    for (unit, shown) in [("foo", "foo"), ("UNKNOWN", "UNKNOWN"), ("~", ""), ("", "")] {
        assert_descriptor_err(
            &format!("key: k\n    rate_limit:\n      unit: {unit}\n      requests_per_unit: 5"),
            &format!("invalid rate limit unit '{shown}'"),
        );
    }
    assert_descriptor_err(
        "key: k\n    rate_limit:\n      requests_per_unit: 5",
        "invalid rate limit unit ''",
    );
}

#[test]
fn unlimited_with_unit() {
    assert_descriptor_err(
        "key: k\n    rate_limit:\n      unlimited: true\n      unit: second\n      requests_per_unit: 5",
        "should not specify rate limit unit when unlimited",
    );
    // Missing or invalid units are fine with unlimited.
    for unit in ["", "\n      unit: foo", "\n      unit: unknown"] {
        let c = ok(&format!(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unlimited: true{unit}\n"
        ));
        assert_eq!(c.descriptors[0].rate_limits[0].policy, LimitPolicy::Unlimited);
    }
}

#[test]
fn replaces_errors() {
    assert_descriptor_err(
        "key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 5\n      name: a\n      replaces:\n        - name: \"\"",
        "should not have an empty replaces entry",
    );
    assert_descriptor_err(
        "key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 5\n      replaces:\n        - {}",
        "should not have an empty replaces entry",
    );
    assert_descriptor_err(
        "key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 5\n      name: a\n      replaces:\n        - name: b\n        - name: a",
        "replaces should not contain name of same descriptor",
    );
}

#[test]
fn share_threshold_requires_wildcard() {
    assert_descriptor_err(
        "key: path\n    value: /foo\n    share_threshold: true",
        "share_threshold can only be used with wildcard values (containing '*'), but found key 'path_/foo'",
    );
    assert_descriptor_err(
        "key: path\n    share_threshold: true",
        "share_threshold can only be used with wildcard values (containing '*'), but found key 'path'",
    );
    let c = ok(
        "domain: d\ndescriptors:\n  - key: path\n    value: /foo/*\n    share_threshold: true\n    rate_limit: {unit: minute, requests_per_unit: 5}\n",
    );
    assert!(c.descriptors[0].share_threshold);
    assert_eq!(c.descriptors[0].value_match, ValueMatch::Wildcard);
}

#[test]
fn metadata() {
    let c = ok(r#"
domain: d
descriptors:
  - key: k
    metadata:
      team: payments
      weight: 1.5
      count: 3
      enabled: yes
      none: ~
      tags: [a, 2]
      nested: {x: {y: z}}
      7: seven
"#);
    let m = c.descriptors[0].metadata.clone().unwrap_or_default();
    assert_eq!(m.get("team"), Some(&MetaValue::String("payments".into())));
    assert_eq!(m.get("weight"), Some(&MetaValue::Float(1.5)));
    assert_eq!(m.get("count"), Some(&MetaValue::Int(3)));
    assert_eq!(m.get("enabled"), Some(&MetaValue::Bool(true)));
    assert_eq!(m.get("none"), Some(&MetaValue::Null));
    assert_eq!(
        m.get("tags"),
        Some(&MetaValue::List(vec![
            MetaValue::String("a".into()),
            MetaValue::Int(2)
        ]))
    );
    assert_eq!(m.get("7"), Some(&MetaValue::String("seven".into())));
    let inner = BTreeMap::from([("y".to_owned(), MetaValue::String("z".into()))]);
    assert_eq!(
        m.get("nested"),
        Some(&MetaValue::Map(BTreeMap::from([(
            "x".to_owned(),
            MetaValue::Map(inner)
        )])))
    );
    assert_eq!(
        ok("domain: d\ndescriptors:\n  - key: k\n    metadata: ~\n").descriptors[0].metadata,
        None
    );
    assert_descriptor_err(
        "key: k\n    metadata: {a: {~: 1}}",
        "error parsing metadata: key is not of type string: <nil>",
    );
    assert_descriptor_err(
        "key: k\n    metadata: [a]",
        "error loading config file: line 4: cannot unmarshal !!seq into a mapping (key 'metadata')",
    );
}

// ----- Accepted configurations -----------------------------------------------------------

#[test]
fn accepted_go_variants() {
    let c = ok(r#"
---
domain: d
descriptors:
  - key: no_rpu
    rate_limit:
      unit: second
  - key: placeholder
  - key: null_limit
    rate_limit:
  - key: a
    value: v
    domain: ignored-inside-descriptor
    descriptors:
      - key: a
        value: v
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: b
    descriptors:
      - key: a
        value: v
"#);
    assert_eq!(spec(&c, &[0]).requests_per_unit, 0);
    assert!(c.descriptors[1].rate_limits.is_empty());
    assert!(c.descriptors[2].rate_limits.is_empty());
    assert_eq!(c.descriptors[3].descriptors[0].value.as_deref(), Some("v"));
    assert_eq!(c.descriptors[4].descriptors[0].key, "a");
}

#[test]
fn scalars_in_string_fields_keep_their_spelling() {
    let c = ok(
        "domain: 123\ndescriptors:\n  - key: on\n    value: 0x1F\n  - key: flag\n    value: Yes\n  - key: octal\n    value: 010\n",
    );
    assert_eq!(c.domain, "123");
    assert_eq!(c.descriptors[0].key, "on");
    assert_eq!(c.descriptors[0].value.as_deref(), Some("0x1F"));
    assert_eq!(c.descriptors[1].value.as_deref(), Some("Yes"));
    assert_eq!(c.descriptors[2].value.as_deref(), Some("010"));
}

#[test]
fn value_kinds_without_collision() {
    let c = ok(
        "domain: d\ndescriptors:\n  - key: k\n  - key: k\n    value: exact\n  - key: k\n    value: \"foo*bar*\"\n",
    );
    let kinds: Vec<_> = c
        .descriptors
        .iter()
        .map(|d| (d.value.clone(), d.value_match.clone()))
        .collect();
    assert_eq!(
        kinds,
        vec![
            (None, ValueMatch::Exact),
            (Some("exact".into()), ValueMatch::Exact),
            (Some("foo*bar*".into()), ValueMatch::Wildcard),
        ]
    );
}

#[test]
fn unlimited_and_replaces() {
    let c = ok(r#"
domain: d
descriptors:
  - key: ldap
    rate_limit:
      unlimited: true
      name: ldap_unlimited
  - key: user
    rate_limit:
      unit: minute
      requests_per_unit: 10
      name: ""
      replaces:
        - name: global
        - name: other
"#);
    assert_eq!(
        c.descriptors[0].rate_limits[0],
        RateLimitConfig {
            name: Some("ldap_unlimited".into()),
            replaces: vec![],
            failure_mode: None,
            policy: LimitPolicy::Unlimited,
        }
    );
    let user = &c.descriptors[1].rate_limits[0];
    assert_eq!(user.name, None);
    assert_eq!(user.replaces, vec!["global".to_owned(), "other".to_owned()]);
}

#[test]
fn per_node_flags() {
    let c = ok(
        "domain: d\nall_or_nothing: true\ndescriptors:\n  - key: k\n    shadow_mode: true\n    quota_mode: true\n    detailed_metric: true\n    value_to_metric: true\n",
    );
    assert!(c.all_or_nothing);
    let d = &c.descriptors[0];
    assert!(d.shadow_mode && d.quota_mode && d.detailed_metric && d.value_to_metric);
    assert!(!d.share_threshold);
}

// ----- README examples -------------------------------------------------------------------

#[test]
fn readme_examples() {
    let per_ip = ok(r#"
domain: edge_proxy_per_ip
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 10

  # Black list IP
  - key: remote_address
    value: 50.0.0.5
    rate_limit:
      unit: second
      requests_per_unit: 0
"#);
    assert_eq!(spec(&per_ip, &[0]).requests_per_unit, 10);
    assert_eq!(per_ip.descriptors[1].value.as_deref(), Some("50.0.0.5"));
    assert_eq!(spec(&per_ip, &[1]).requests_per_unit, 0);

    let nested = ok(r#"
domain: messaging
descriptors:
  # Only allow 5 marketing messages a day
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit:
          unit: day
          requests_per_unit: 5

  # Only allow 100 messages a day to any unique phone number
  - key: to_number
    rate_limit:
      unit: day
      requests_per_unit: 100
"#);
    assert_eq!(spec(&nested, &[0, 0]).requests_per_unit, 5);
    assert_eq!(spec(&nested, &[1]).unit, Unit::Day);

    let wildcard = ok(r#"
domain: example_wildcard
descriptors:
  - key: path
    value: "/foo/*"
    rate_limit:
      unit: minute
      requests_per_unit: 20
  - key: path
    value: "/foo/bar"
    rate_limit:
      unit: minute
      requests_per_unit: 10
"#);
    assert_eq!(wildcard.descriptors[0].value_match, ValueMatch::Wildcard);
    assert_eq!(wildcard.descriptors[1].value_match, ValueMatch::Exact);

    let unlimited = ok(r#"
domain: internal
descriptors:
  - key: ldap
    rate_limit:
      unlimited: true

  - key: azure
    rate_limit:
      unit: minute
      requests_per_unit: 100
"#);
    assert_eq!(
        unlimited.descriptors[0].rate_limits[0].policy,
        LimitPolicy::Unlimited
    );
}

#[test]
fn readme_replaces_example() {
    let c = ok(r#"
domain: example7
descriptors:
  - key: key1
    value: value1
    descriptors:
      - key: key2
        value: value2
        rate_limit:
          requests_per_unit: 10
          unit: second
          name: "ratelimit_1"
  - key: key3
    value: value3
    rate_limit:
      requests_per_unit: 20
      unit: second
      replaces:
        - name: "ratelimit_1"
"#);
    assert_eq!(
        c.descriptors[0].descriptors[0].rate_limits[0].name.as_deref(),
        Some("ratelimit_1")
    );
    assert_eq!(c.descriptors[1].rate_limits[0].replaces, vec!["ratelimit_1"]);
}

#[test]
fn readme_shadow_mode_example() {
    let c = ok(r#"
domain: example5
descriptors:
  - key: key
    value: value
    shadow_mode: true
    rate_limit:
      unit: minute
      requests_per_unit: 5
"#);
    assert!(c.descriptors[0].shadow_mode);
}

// ----- Tollgate extensions ---------------------------------------------------------------

#[test]
fn extension_rate_limits() {
    let c = ok(r#"
domain: d
descriptors:
  - key: user
    rate_limits:
      - unit: second
        requests_per_unit: 10
        algorithm: GCRA
        burst: 5
        failure_mode: open
      - unit: day
        requests_per_unit: 1000
        unit_multiplier: 7
        algorithm: sliding_window
        name: daily
        failure_mode: Closed
      - unit: day
        requests_per_unit: 100000
        algorithm: sliding_log
"#);
    let limits = &c.descriptors[0].rate_limits;
    assert_eq!(limits.len(), 3);
    assert_eq!(
        limits[0],
        RateLimitConfig {
            name: None,
            replaces: vec![],
            failure_mode: Some(FailureMode::Open),
            policy: LimitPolicy::Limited(LimitSpec {
                unit: Unit::Second,
                unit_multiplier: 1,
                requests_per_unit: 10,
                algorithm: Some("gcra".into()),
                burst: Some(5),
            }),
        }
    );
    assert_eq!(limits[1].failure_mode, Some(FailureMode::Closed));
    assert_eq!(limits[1].name.as_deref(), Some("daily"));
    match &limits[1].policy {
        LimitPolicy::Limited(s) => {
            assert_eq!(s.unit_multiplier, 7);
            assert_eq!(s.window_seconds(), 7 * 86_400);
        }
        LimitPolicy::Unlimited => panic!("unlimited"),
    }
}

#[test]
fn extension_rate_limits_errors() {
    assert_descriptor_err(
        "key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n    rate_limits:\n      - {unit: day, requests_per_unit: 1}",
        "descriptor 'd.k' has both rate_limit and rate_limits; use only one of them",
    );
    assert_descriptor_err(
        "key: k\n    rate_limits: []",
        "rate_limits of descriptor 'd.k' must be a non-empty list",
    );
    assert_descriptor_err(
        "key: k\n    rate_limits: ~",
        "rate_limits of descriptor 'd.k' must be a non-empty list",
    );
    assert_descriptor_err(
        "key: k\n    rate_limits: [1]",
        "config error, yaml file contains list of type other than map: 1",
    );
    assert_descriptor_err(
        "key: k\n    rate_limits:\n      - {unlimited: true}",
        "rate_limits of descriptor 'd.k' cannot contain an unlimited entry; use rate_limit with unlimited: true instead",
    );
    assert_descriptor_err(
        "key: k\n    rate_limits:\n      - {unit: minute, requests_per_unit: 1}\n      - {unit: minute, requests_per_unit: 5}",
        "rate_limits of descriptor 'd.k' has two entries with the same algorithm (default), unit (MINUTE) and unit_multiplier (1)",
    );
    assert_descriptor_err(
        "key: k\n    rate_limits:\n      - {unit: minute, requests_per_unit: 1, algorithm: gcra}\n      - {unit: MINUTE, requests_per_unit: 5, algorithm: Gcra, unit_multiplier: 1}",
        "rate_limits of descriptor 'd.k' has two entries with the same algorithm (gcra), unit (MINUTE) and unit_multiplier (1)",
    );
    // Same unit with a different multiplier or algorithm is fine.
    ok(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limits:\n      - {unit: minute, requests_per_unit: 1}\n      - {unit: minute, requests_per_unit: 5, unit_multiplier: 5}\n      - {unit: minute, requests_per_unit: 5, algorithm: gcra}\n",
    );
    // Go checks still apply inside rate_limits.
    assert_descriptor_err(
        "key: k\n    rate_limits:\n      - {unit: fortnight}",
        "invalid rate limit unit 'fortnight'",
    );
}

#[test]
fn extension_limit_errors() {
    let limit =
        |extra: &str| format!("key: k\n    rate_limit: {{unit: second, requests_per_unit: 10, {extra}}}");
    assert_descriptor_err(
        &limit("algorithm: leaky_bucket"),
        "unknown algorithm 'leaky_bucket' in descriptor 'd.k' (valid: fixed_window, sliding_window, sliding_log, token_bucket, gcra)",
    );
    assert_descriptor_err(
        &limit("unit_multiplier: 0"),
        "unit_multiplier must be at least 1 in descriptor 'd.k'",
    );
    assert_descriptor_err(&limit("burst: 0"), "burst must be at least 1 in descriptor 'd.k'");
    assert_descriptor_err(
        &limit("burst: 3, algorithm: fixed_window"),
        "burst is only valid with algorithm token_bucket or gcra (descriptor 'd.k' uses 'fixed_window')",
    );
    assert_descriptor_err(
        &limit("burst: -3"),
        "error loading config file: line 4: cannot unmarshal !!int `-3` into uint32 (burst must be between 0 and 4294967295)",
    );
    assert_descriptor_err(
        &limit("failure_mode: maybe"),
        "invalid failure_mode 'maybe' in descriptor 'd.k' (valid: open, closed, local)",
    );
    assert_descriptor_err(
        "key: k\n    rate_limit: {unit: second, requests_per_unit: 100001, algorithm: sliding_log}",
        "sliding_log keeps one entry per request: requests_per_unit 100001 in descriptor 'd.k' exceeds MAX_SLIDING_LOG_REQUESTS_PER_UNIT (100000); use sliding_window or gcra",
    );
    for key in ["algorithm: gcra", "burst: 2", "unit_multiplier: 2"] {
        let name = key.split(':').next().unwrap_or_default();
        assert_descriptor_err(
            &format!("key: k\n    rate_limit: {{unlimited: true, {key}}}"),
            &format!("{name} cannot be used with unlimited: true (descriptor 'd.k')"),
        );
    }
    // burst without an algorithm is left to the service default.
    let c = ok(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, burst: 4, algorithm: token_bucket}\n  - key: j\n    rate_limit: {unit: second, requests_per_unit: 1, burst: 4}\n",
    );
    assert_eq!(spec(&c, &[0]).burst, Some(4));
    assert_eq!(spec(&c, &[1]).algorithm, None);
    // Failure mode is allowed on unlimited rules (it is simply never needed).
    let c =
        ok("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, failure_mode: open}\n");
    assert_eq!(
        c.descriptors[0].rate_limits[0].failure_mode,
        Some(FailureMode::Open)
    );
}

#[test]
fn extension_match_cidr() {
    let c = ok(r#"
domain: d
descriptors:
  - key: remote_address
    value: 10.1.2.3/8
    match: cidr
    share_threshold: true
    rate_limit: {unit: second, requests_per_unit: 100}
  - key: remote_address
    value: 192.168.0.1
    match: CIDR
  - key: remote_address
    value: "2001:db8::/32"
    match: cidr
  - key: remote_address
    value: 10.0.0.1
    match: exact
"#);
    let net = |s: &str| match s.parse::<ipnet::IpNet>() {
        Ok(n) => ValueMatch::Cidr(n),
        Err(e) => panic!("{e}"),
    };
    let m: Vec<_> = c.descriptors.iter().map(|d| d.value_match.clone()).collect();
    assert_eq!(
        m,
        vec![
            net("10.0.0.0/8"),
            net("192.168.0.1/32"),
            net("2001:db8::/32"),
            ValueMatch::Exact
        ]
    );
    assert_eq!(c.descriptors[0].value.as_deref(), Some("10.1.2.3/8"));
    assert!(c.descriptors[0].share_threshold);
}

#[test]
fn extension_match_errors() {
    assert_descriptor_err(
        "key: ip\n    match: cidr",
        "match: cidr requires a value (descriptor 'd.ip')",
    );
    assert_descriptor_err(
        "key: ip\n    value: 10.0.0.0/33\n    match: cidr",
        "value '10.0.0.0/33' is not a CIDR or IP address (match: cidr, descriptor 'd.ip_10.0.0.0/33')",
    );
    assert_descriptor_err(
        "key: ip\n    value: \"10.*\"\n    match: cidr",
        "value '10.*' is not a CIDR or IP address (match: cidr, descriptor 'd.ip_10.*')",
    );
    assert_descriptor_err(
        "key: ip\n    value: \"a*\"\n    match: exact",
        "match: exact cannot be used with a value containing '*' (descriptor 'd.ip_a*')",
    );
    assert_descriptor_err(
        "key: ip\n    value: a\n    match: regex",
        "unknown match 'regex' in descriptor 'd.ip_a' (valid: exact, cidr)",
    );
}

#[test]
fn extension_normalisation() {
    let c = ok(r#"
domain: d
descriptors:
  - key: user
    lowercase: true
    trim: true
    hash: true
  - key: user
    value: admin
    lowercase: true
    trim: true
    hash: true
  - key: user
    value: bob
  - key: ip
    ip_prefix: {v4: 24}
  - key: ip6
    ip_prefix: {v6: 64, v4: 0}
"#);
    let n: Vec<_> = c.descriptors.iter().map(|d| d.normalize.clone()).collect();
    let all = Normalize {
        lowercase: true,
        trim: true,
        ip_prefix: None,
        hash: true,
    };
    assert_eq!(n[0], all);
    assert_eq!(n[1], all);
    assert!(n[2].is_none());
    assert_eq!(n[3].ip_prefix, Some(IpPrefix { v4: 24, v6: 128 }));
    assert_eq!(n[4].ip_prefix, Some(IpPrefix { v4: 0, v6: 64 }));
}

#[test]
fn extension_normalisation_errors() {
    assert_err(
        "domain: d\ndescriptors:\n  - key: user\n    lowercase: true\n  - key: user\n    value: x\n    trim: true\n",
        "conflicting value normalisation for key 'user'",
    );
    // Different keys or different parents do not conflict.
    ok(
        "domain: d\ndescriptors:\n  - key: a\n    lowercase: true\n  - key: b\n    trim: true\n  - key: c\n    descriptors:\n      - key: a\n        trim: true\n",
    );
    assert_descriptor_err(
        "key: ip\n    ip_prefix: {v4: 33}",
        "ip_prefix v4 must be between 0 and 32, got 33 (descriptor 'd.ip')",
    );
    assert_descriptor_err(
        "key: ip\n    ip_prefix: {v6: 300}",
        "ip_prefix v6 must be between 0 and 128, got 300 (descriptor 'd.ip')",
    );
    assert_descriptor_err(
        "key: ip\n    ip_prefix: 24",
        "error loading config file: line 4: cannot unmarshal !!int `24` into a mapping (key 'ip_prefix')",
    );
    assert_descriptor_err(
        "key: ip\n    ip_prefix: {v4: 24, v5: 1}",
        "config error, unknown key 'v5'",
    );
}

#[test]
fn extension_all_or_nothing_must_be_bool() {
    assert_err(
        "domain: d\nall_or_nothing: sometimes\n",
        "error loading config file: line 2: cannot unmarshal !!str `sometimes` into bool (key 'all_or_nothing')",
    );
    // Flat allow-list: accepted (and ignored) below the top level.
    assert!(!ok("domain: d\ndescriptors:\n  - key: k\n    all_or_nothing: true\n").all_or_nothing);
}
