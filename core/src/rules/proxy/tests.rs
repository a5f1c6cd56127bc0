//! The `proxy:` block: read from rules files, and what it makes of requests, against Envoy's answers.

use std::borrow::Cow;

use super::*;
use crate::rules::file::{ConfigError, parse_file};

/// A forwarded request: its headers, in order, names lowercase.
struct Request(Vec<(&'static str, &'static str)>);

impl ProxiedRequest for Request {
    fn values(&self, name: &str) -> impl Iterator<Item = Cow<'_, str>> {
        self.0
            .iter()
            .filter(move |(n, _)| *n == name)
            .map(|(_, v)| Cow::Borrowed(*v))
    }
}

fn proxy(block: &str) -> ProxyRules {
    let text = format!("domain: d\nproxy:\n{block}");
    parse_file("f.yaml", &text)
        .expect("loads")
        .proxy
        .expect("a proxy block")
}

fn load_error(block: &str) -> String {
    let text = format!("domain: d\nproxy:\n{block}");
    match parse_file("f.yaml", &text) {
        Err(ConfigError::Invalid { message, .. }) => message,
        other => panic!("expected an error, got {other:?}"),
    }
}

/// The descriptors as `key=value` lists, with their costs.
fn made(rules: &ProxyRules, headers: &[(&'static str, &'static str)]) -> Vec<(Vec<String>, Option<u64>)> {
    let request = Request(headers.to_vec());
    rules
        .descriptors(&request)
        .expect("readable")
        .into_iter()
        .map(|d| {
            let entries = d
                .entries
                .iter()
                .map(|e| format!("{}={}", e.key, e.value))
                .collect();
            (entries, d.hits_addend)
        })
        .collect()
}

fn entries(rules: &ProxyRules, headers: &[(&'static str, &'static str)]) -> Vec<Vec<String>> {
    made(rules, headers).into_iter().map(|(e, _)| e).collect()
}

const XFF_AND_LOGIN: &str = "  rate_limits:
    - actions: [{remote_address: {}}]
    - actions:
        - header_value_match: {descriptor_value: login, headers: [{name: ':path', prefix_match: /auth/login}]}
        - remote_address: {}
";

#[test]
fn each_rate_limit_makes_one_descriptor_and_a_failed_match_drops_it() {
    let rules = proxy(XFF_AND_LOGIN);
    let login = [
        ("x-forwarded-for", "192.0.2.9"),
        ("x-forwarded-uri", "/auth/login?next=/"),
    ];
    assert_eq!(
        entries(&rules, &login),
        [
            vec!["remote_address=192.0.2.9"],
            vec!["header_match=login", "remote_address=192.0.2.9"]
        ]
    );
    let other = [("x-forwarded-for", "192.0.2.9"), ("x-forwarded-uri", "/orders")];
    assert_eq!(entries(&rules, &other), [vec!["remote_address=192.0.2.9"]]);
}

#[test]
fn the_client_is_the_nth_address_from_the_right() {
    let one = proxy(XFF_AND_LOGIN);
    let two = proxy(&format!(
        "  client_address: {{x_forwarded_for: {{trusted_hops: 2}}}}\n{XFF_AND_LOGIN}"
    ));
    let client =
        |rules: &ProxyRules, headers: &[(&'static str, &'static str)]| entries(rules, headers)[0][0].clone();
    // The client's own entries are on the left and never chosen.
    let spoofed = [("x-forwarded-for", "203.0.113.1, 198.51.100.7, 10.0.0.2")];
    assert_eq!(client(&one, &spoofed), "remote_address=10.0.0.2");
    assert_eq!(client(&two, &spoofed), "remote_address=198.51.100.7");
    // Several headers are one list, in order.
    let split = [
        ("x-forwarded-for", "203.0.113.1"),
        ("x-forwarded-for", "198.51.100.7,10.0.0.2"),
    ];
    assert_eq!(client(&two, &split), "remote_address=198.51.100.7");
    // Fewer entries than trusted hops: all were written by trusted hops, the leftmost is the client.
    assert_eq!(
        client(&two, &[("x-forwarded-for", "198.51.100.7")]),
        "remote_address=198.51.100.7"
    );
    // Ports, brackets, blanks and IPv4 mapped into IPv6.
    for (written, address) in [
        (" 192.0.2.1:5000", "192.0.2.1"),
        ("[2001:db8::1]:443", "2001:db8::1"),
        ("[2001:db8::2]", "2001:db8::2"),
        ("::ffff:192.0.2.3", "192.0.2.3"),
    ] {
        let headers = [("x-forwarded-for", written)];
        let headers: Vec<_> = headers.to_vec();
        let rules = &one;
        let request = Request(headers);
        let descriptors = rules.descriptors(&request).expect("readable");
        assert_eq!(descriptors[0].entries[0].value, address, "{written}");
    }
}

#[test]
fn a_missing_or_garbled_address_is_a_bad_request_naming_the_header() {
    let rules = proxy(XFF_AND_LOGIN);
    let missing = Request(vec![("x-real-ip", "192.0.2.1")]);
    assert_eq!(
        rules.descriptors(&missing),
        Err(BadRequest::NoClientAddress("x-forwarded-for".into()))
    );
    for garbled in [
        "unknown",
        "192.0.2.1, ",
        "192.0.2.300",
        "[2001:db8::1",
        "192.0.2.1:port",
    ] {
        let request = Request(vec![("x-forwarded-for", garbled)]);
        let error = rules.descriptors(&request).expect_err(garbled);
        assert_eq!(error, BadRequest::GarbledClientAddress("x-forwarded-for".into()));
        assert!(
            !error.to_string().contains(garbled),
            "values stay out of messages"
        );
    }
    let real_ip = proxy(&format!(
        "  client_address: {{header: X-Real-IP}}\n{XFF_AND_LOGIN}"
    ));
    assert_eq!(
        entries(
            &real_ip,
            &[("x-forwarded-for", "10.0.0.1"), ("x-real-ip", "192.0.2.44")]
        )[0],
        ["remote_address=192.0.2.44"]
    );
    // An address is only needed when an action reads it.
    let no_address = proxy("  rate_limits: [{actions: [{generic_key: {descriptor_value: all}}]}]\n");
    assert_eq!(entries(&no_address, &[]), [vec!["generic_key=all"]]);
}

#[test]
fn masked_addresses_and_generic_keys_are_written_as_envoy_writes_them() {
    let rules = proxy(
        "  rate_limits:
    - actions:
        - generic_key: {descriptor_value: edge}
        - generic_key: {descriptor_key: tier, descriptor_value: free}
        - masked_remote_address: {v4_prefix_mask_len: 24, v6_prefix_mask_len: 64}
    - actions: [{masked_remote_address: {}}]
",
    );
    assert_eq!(
        entries(&rules, &[("x-forwarded-for", "192.0.2.77")]),
        [
            vec![
                "generic_key=edge",
                "tier=free",
                "masked_remote_address=192.0.2.0/24"
            ],
            vec!["masked_remote_address=192.0.2.77/32"]
        ]
    );
    assert_eq!(
        entries(&rules, &[("x-forwarded-for", "2001:db8:1:2:3::9")])[0][2],
        "masked_remote_address=2001:db8:1:2::/64"
    );
}

#[test]
fn request_headers_take_the_first_value_and_drop_or_skip_when_absent() {
    let rules = proxy(
        "  rate_limits:
    - actions: [{request_headers: {header_name: X-User, descriptor_key: user}}]
    - actions:
        - generic_key: {descriptor_value: plan}
        - request_headers: {header_name: x-plan, descriptor_key: plan, skip_if_absent: true}
",
    );
    assert_eq!(
        entries(
            &rules,
            &[("x-user", "ada"), ("x-user", "bob"), ("x-plan", "gold")]
        ),
        [vec!["user=ada"], vec!["generic_key=plan", "plan=gold"]]
    );
    assert_eq!(entries(&rules, &[]), [vec!["generic_key=plan"]]);
}

#[test]
fn header_matchers_answer_as_envoy_does() {
    let matcher = |spec: &str| {
        proxy(&format!(
            "  rate_limits: [{{actions: [{{header_value_match: {{descriptor_value: m, headers: [{spec}]}}}}]}}]\n"
        ))
    };
    let hits =
        |rules: &ProxyRules, headers: &[(&'static str, &'static str)]| !entries(rules, headers).is_empty();
    let post = matcher("{name: ':method', exact_match: POST}");
    assert!(hits(&post, &[("x-forwarded-method", "POST")]));
    assert!(!hits(&post, &[("x-forwarded-method", "post")]));
    // A header sent twice is matched as its values joined by a comma.
    let joined = matcher("{name: x-tag, exact_match: 'a,b'}");
    assert!(hits(&joined, &[("x-tag", "a"), ("x-tag", "b")]));
    // Regexes match the whole value.
    let regex = matcher("{name: ':path', safe_regex_match: {regex: '/users/[0-9]+'}}");
    assert!(hits(&regex, &[("x-forwarded-uri", "/users/42")]));
    assert!(!hits(&regex, &[("x-forwarded-uri", "/users/42/orders")]));
    let folded = matcher("{name: ':authority', string_match: {suffix: .EXAMPLE.com, ignore_case: true}}");
    assert!(hits(&folded, &[("x-forwarded-host", "api.example.COM")]));
    let range = matcher("{name: x-n, range_match: {start: 10, end: 20}}");
    assert!(hits(&range, &[("x-n", "19")]) && !hits(&range, &[("x-n", "20")]));
    // Absent: only `present_match: false` matches, or `present_match: true` inverted; an inverted
    // value rule does not.
    let absent = matcher("{name: x-key, present_match: false}");
    assert!(hits(&absent, &[]) && !hits(&absent, &[("x-key", "")]));
    let inverted_present = matcher("{name: x-key, present_match: true, invert_match: true}");
    assert!(hits(&inverted_present, &[]));
    let inverted_value = matcher("{name: x-key, exact_match: k, invert_match: true}");
    assert!(!hits(&inverted_value, &[]) && hits(&inverted_value, &[("x-key", "j")]));
    let as_empty = matcher("{name: x-key, exact_match: '', treat_missing_header_as_empty: true}");
    assert!(hits(&as_empty, &[]));
    // A name alone asks that the header be there.
    let named = matcher("{name: authorization}");
    assert!(hits(&named, &[("authorization", "x")]) && !hits(&named, &[]));
    // expect_match: false makes the entry when the headers do not match.
    let not_get = proxy(
        "  rate_limits: [{actions: [{header_value_match: {descriptor_value: write, expect_match: false, headers: [{name: ':method', exact_match: GET}]}}]}]\n",
    );
    assert!(hits(&not_get, &[("x-forwarded-method", "DELETE")]));
    assert!(!hits(&not_get, &[("x-forwarded-method", "GET")]));
}

#[test]
fn query_parameters_are_read_from_the_forwarded_uri_decoded() {
    let rules = proxy(
        "  rate_limits:
    - actions: [{query_parameters: {query_parameter_name: api key, descriptor_key: key}}]
    - actions:
        - query_parameter_value_match:
            descriptor_value: export
            query_parameters: [{name: format, string_match: {exact: csv}}, {name: all, present_match: true}]
",
    );
    let uri = [(
        "x-forwarded-uri",
        "/r?api+key=k%2F1&format=csv&all&format=json#frag",
    )];
    assert_eq!(
        entries(&rules, &uri),
        [vec!["key=k/1"], vec!["query_match=export"]]
    );
    assert!(entries(&rules, &[("x-forwarded-uri", "/r?format=json&all")]).is_empty());
}

#[test]
fn costs_come_from_a_number_or_a_header_and_a_garbled_one_is_a_bad_request() {
    let rules = proxy(
        "  rate_limits:
    - actions: [{generic_key: {descriptor_value: a}}]
      hits_addend: {number: 5}
    - actions: [{generic_key: {descriptor_value: b}}]
      hits_addend: {format: '%REQ(X-Cost)%'}
",
    );
    let costs: Vec<_> = made(&rules, &[("x-cost", " 12 ")])
        .into_iter()
        .map(|(_, c)| c)
        .collect();
    assert_eq!(costs, [Some(5), Some(12)]);
    for garbled in ["", "-1", "1.5", "1000000001", "0x10", "99999999999999999999"] {
        let request = Request(vec![("x-cost", garbled)]);
        assert_eq!(
            rules.descriptors(&request),
            Err(BadRequest::GarbledCost("x-cost".into())),
            "{garbled:?}"
        );
    }
    assert!(rules.descriptors(&Request(vec![])).is_err(), "an absent cost too");
}

#[test]
fn destination_cluster_reads_the_route_header() {
    let rules = proxy("  route_header: X-Route\n  rate_limits: [{actions: [{destination_cluster: {}}]}]\n");
    assert_eq!(
        entries(&rules, &[("x-route", "orders")]),
        [vec!["destination_cluster=orders"]]
    );
    assert!(entries(&rules, &[]).is_empty());
}

#[test]
fn a_block_that_cannot_be_used_fails_the_load_naming_its_place() {
    for (block, expected) in [
        ("  rate_limits: []\n", "proxy: rate_limits is required"),
        ("  ratelimits: []\n", "proxy: unknown key 'ratelimits'"),
        (
            "  rate_limits: [{actions: [{metadata: {}}]}]\n",
            "proxy.rate_limits[0].actions[0].metadata: reads what only Envoy knows",
        ),
        (
            "  rate_limits: [{actions: [{remote_adress: {}}]}]\n",
            "proxy.rate_limits[0].actions[0].remote_adress: unknown action",
        ),
        (
            "  rate_limits: [{actions: [{destination_cluster: {}}]}]\n",
            "destination_cluster: needs proxy.route_header",
        ),
        (
            "  rate_limits: [{actions: [{header_value_match: {descriptor_value: v, headers: [{name: p, safe_regex_match: {regex: '('}}]}}]}]\n",
            "headers[0].safe_regex_match: regex does not compile",
        ),
        (
            "  rate_limits: [{actions: [{header_value_match: {descriptor_value: v, headers: [{name: ':status', present_match: true}]}}]}]\n",
            "a proxy forwards only :method, :path, :authority and :scheme",
        ),
        (
            "  client_address: {x_forwarded_for: {trusted_hops: 0}}\n  rate_limits: [{actions: [{remote_address: {}}]}]\n",
            "trusted_hops must be between 1",
        ),
        (
            "  rate_limits: [{actions: [{generic_key: {descriptor_value: v}}], hits_addend: {format: '%DYNAMIC_METADATA(x)%'}}]\n",
            "only %REQ(header-name)% is supported",
        ),
        (
            "  rate_limits: [{actions: [{generic_key: {descriptor_value: v}}], stage: 1}]\n",
            "stage is Envoy's alone",
        ),
        (
            "  failure_mode: local\n  rate_limits: [{actions: [{remote_address: {}}]}]\n",
            "failure_mode 'local': expected open or closed",
        ),
    ] {
        let message = load_error(block);
        assert!(message.contains(expected), "{block}: {message}");
    }
    let nested = "domain: d\ndescriptors:\n  - key: k\n    proxy: {rate_limits: []}\n";
    let Err(ConfigError::Invalid { message, .. }) = parse_file("f.yaml", nested) else {
        panic!("a proxy block below the root is refused");
    };
    assert!(message.contains("proxy is a top-level key"), "{message}");
}

#[test]
fn the_fast_and_the_whole_reading_of_a_file_agree_on_the_block() {
    // A repeated root key sends the file down the slow path (Go's order); both read the same block.
    let block = format!("proxy:\n{XFF_AND_LOGIN}");
    let fast = parse_file("f.yaml", &format!("domain: d\n{block}")).expect("fast");
    let slow = parse_file("f.yaml", &format!("domain: x\ndomain: d\n{block}")).expect("slow");
    assert_eq!(fast.proxy, slow.proxy);
    assert!(fast.proxy.is_some());
}
