//! `/forward-auth/{domain}` on the HTTP port, over real sockets, as a proxy calls it: the domain's
//! `proxy:` block makes the descriptors, Envoy's counting decides them, the answer is 200 or a
//! refusal with the rate-limit headers. The proxies themselves are run in `tests/proxies/`.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::common::redis::RedisServer;
use crate::common::{TestServer, header, read_answer, send_with_headers};
use crate::require_redis;

const RULES: &str = "domain: edge
proxy:
  rate_limits:
    - actions: [{remote_address: {}}]
    - actions:
        - header_value_match: {descriptor_value: login, headers: [{name: ':path', prefix_match: /auth/login}]}
        - remote_address: {}
      hits_addend: {format: '%REQ(x-cost)%'}
descriptors:
  - key: remote_address
    rate_limit: {unit: hour, requests_per_unit: 3, name: per-client}
  - key: header_match
    value: login
    descriptors:
      - key: remote_address
        rate_limit: {unit: hour, requests_per_unit: 10, name: logins}
";

/// An answer: status, header lines (lowercase names) and body.
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        header(&self.headers, name)
    }
}

/// One request to `path` with `headers`, as a proxy sends it.
async fn ask(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Answer {
    let lines: String = headers.iter().map(|(n, v)| format!("{n}: {v}\r\n")).collect();
    let (status, headers, body) = send_with_headers(addr, "GET", path, &lines).await;
    Answer {
        status,
        headers,
        body,
    }
}

fn from(client: &str) -> [(&str, &str); 1] {
    [("X-Forwarded-For", client)]
}

#[tokio::test]
async fn the_limit_passes_then_429_with_retry_after_and_the_headers() {
    let server = TestServer::start(&[("edge.yaml", RULES)], &[]).await;
    for remaining in (0..3).rev() {
        let answer = ask(server.http, "/forward-auth/edge", &from("192.0.2.1")).await;
        assert_eq!(answer.status, 200, "{}", answer.body);
        assert!(answer.body.is_empty());
        assert_eq!(
            answer.header("ratelimit-policy"),
            Some("\"per-client\";q=3;w=3600")
        );
        let current = answer.header("ratelimit").expect("RateLimit");
        assert!(
            current.starts_with(&format!("\"per-client\";r={remaining};t=")),
            "{current}"
        );
        assert_eq!(answer.header("cache-control"), Some("no-store"));
    }
    let refused = ask(server.http, "/forward-auth/edge", &from("192.0.2.1")).await;
    assert_eq!(refused.status, 429);
    let retry_after: u64 = refused
        .header("retry-after")
        .expect("Retry-After")
        .parse()
        .expect("seconds");
    assert!((1..=3600).contains(&retry_after), "{retry_after}");
    assert_eq!(refused.header("content-type"), Some("application/json"));
    assert_eq!(
        refused.body,
        format!("{{\"error\":\"rate_limited\",\"retry_after\":{retry_after}}}")
    );
    // Another client has a budget of its own.
    assert_eq!(
        ask(server.http, "/forward-auth/edge", &from("192.0.2.2"))
            .await
            .status,
        200
    );
    assert_eq!(
        server
            .metric("tollgate_forward_auth_requests_total{answer=\"refused\"}")
            .await,
        1
    );
    assert_eq!(
        server
            .metric("tollgate_forward_auth_requests_total{answer=\"allowed\"}")
            .await,
        4
    );
    server.stop().await;
}

#[tokio::test]
async fn a_client_cannot_name_its_own_address() {
    let server = TestServer::start(&[("edge.yaml", RULES)], &[]).await;
    // The proxy appends what it saw (192.0.2.9); whatever the client wrote before it is not read.
    for spoof in ["203.0.113.1", "203.0.113.2", "203.0.113.3", "203.0.113.4"] {
        let xff = format!("{spoof}, 192.0.2.9");
        let answer = ask(server.http, "/forward-auth/edge", &[("X-Forwarded-For", &xff)]).await;
        let expected = if spoof.ends_with('4') { 429 } else { 200 };
        assert_eq!(answer.status, expected, "{xff}");
    }
    server.stop().await;
}

#[tokio::test]
async fn nginx_gets_403_or_401_and_a_bad_query_is_400() {
    let server = TestServer::start(&[("edge.yaml", RULES)], &[]).await;
    for _ in 0..3 {
        ask(
            server.http,
            "/forward-auth/edge?refused_status=403",
            &from("192.0.2.1"),
        )
        .await;
    }
    let refused = ask(
        server.http,
        "/forward-auth/edge?refused_status=403",
        &from("192.0.2.1"),
    )
    .await;
    assert_eq!(refused.status, 403);
    assert!(refused.header("retry-after").is_some());
    let refused = ask(
        server.http,
        "/forward-auth/edge?refused_status=401",
        &from("192.0.2.1"),
    )
    .await;
    assert_eq!(refused.status, 401);
    for bad in ["?refused_status=500", "?domain=x", "?refused_status=403&x"] {
        let answer = ask(
            server.http,
            &format!("/forward-auth/edge{bad}"),
            &from("192.0.2.1"),
        )
        .await;
        assert_eq!(answer.status, 400, "{bad}");
        assert!(answer.body.contains("refused_status"), "{}", answer.body);
    }
    server.stop().await;
}

#[tokio::test]
async fn costs_come_from_the_named_header_and_a_path_match_makes_its_descriptor() {
    let server = TestServer::start(&[("edge.yaml", RULES)], &[]).await;
    let login = |cost: &'static str| {
        [
            ("X-Forwarded-For", "192.0.2.5"),
            ("X-Forwarded-Uri", "/auth/login?next=/"),
            ("X-Cost", cost),
        ]
    };
    // The login descriptor costs what the header says (7 + 3 of 10); the per-client one costs 1.
    assert_eq!(
        ask(server.http, "/forward-auth/edge", &login("7")).await.status,
        200
    );
    assert_eq!(
        ask(server.http, "/forward-auth/edge", &login("3")).await.status,
        200
    );
    let answer = ask(server.http, "/forward-auth/edge", &login("1")).await;
    assert_eq!(answer.status, 429);
    assert!(
        answer
            .header("ratelimit-policy")
            .is_some_and(|p| p.contains("\"logins\";q=10"))
    );
    // A garbled cost is unreadable: the domain has no failure_mode, so 400 naming the header only.
    let answer = ask(server.http, "/forward-auth/edge", &login("lots")).await;
    assert_eq!(answer.status, 400);
    assert!(
        answer.body.contains("x-cost") && !answer.body.contains("lots"),
        "{}",
        answer.body
    );
    server.stop().await;
}

#[tokio::test]
async fn an_unreadable_request_is_answered_by_the_blocks_failure_mode() {
    let rules = |mode: &str| {
        format!(
            "domain: d\nproxy:\n  {mode}\n  rate_limits: [{{actions: [{{remote_address: {{}}}}]}}]\ndescriptors:\n  - key: remote_address\n    rate_limit: {{unit: hour, requests_per_unit: 1}}\n"
        )
    };
    for (mode, status) in [
        ("failure_mode: open", 200),
        ("failure_mode: closed", 429),
        ("", 400),
    ] {
        let server = TestServer::start(&[("d.yaml", &rules(mode))], &[]).await;
        for headers in [&[][..], &[("X-Forwarded-For", "not-an-address")][..]] {
            let answer = ask(server.http, "/forward-auth/d", headers).await;
            assert_eq!(answer.status, status, "{mode} {headers:?}: {}", answer.body);
        }
        if status == 429 {
            let answer = ask(server.http, "/forward-auth/d", &[]).await;
            assert!(answer.body.contains("no_client_address"), "{}", answer.body);
            assert!(answer.header("retry-after").is_none(), "waiting does not help");
        }
        server.stop().await;
    }
}

#[tokio::test]
async fn shadow_mode_counts_and_never_refuses() {
    let rules = "domain: s\nproxy:\n  rate_limits: [{actions: [{remote_address: {}}]}]\ndescriptors:\n  - key: remote_address\n    shadow_mode: true\n    rate_limit: {unit: hour, requests_per_unit: 1}\n";
    let server = TestServer::start(&[("s.yaml", rules)], &[]).await;
    for _ in 0..4 {
        assert_eq!(
            ask(server.http, "/forward-auth/s", &from("192.0.2.1"))
                .await
                .status,
            200
        );
    }
    assert_eq!(
        server
            .metric("ratelimit_service_rate_limit_shadow_mode{domain=\"s\",key1=\"remote_address\"}")
            .await,
        3
    );
    server.stop().await;
}

#[tokio::test]
async fn an_all_or_nothing_domain_consumes_nothing_when_one_descriptor_is_refused() {
    let rules = "domain: a
all_or_nothing: true
proxy:
  rate_limits:
    - actions: [{remote_address: {}}]
    - actions: [{request_headers: {header_name: x-user, descriptor_key: user}}]
descriptors:
  - key: remote_address
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 5}
";
    let server = TestServer::start(&[("a.yaml", rules)], &[]).await;
    let as_user = |client: &'static str| [("X-Forwarded-For", client), ("X-User", "ada")];
    assert_eq!(
        ask(server.http, "/forward-auth/a", &as_user("192.0.2.1"))
            .await
            .status,
        200
    );
    // Refused by the address's limit: the user's budget is untouched, so four more pass elsewhere.
    for _ in 0..3 {
        assert_eq!(
            ask(server.http, "/forward-auth/a", &as_user("192.0.2.1"))
                .await
                .status,
            429
        );
    }
    let passed = ["192.0.2.2", "192.0.2.3", "192.0.2.4", "192.0.2.5", "192.0.2.6"];
    let mut statuses = Vec::new();
    for client in passed {
        statuses.push(ask(server.http, "/forward-auth/a", &as_user(client)).await.status);
    }
    assert_eq!(statuses, [200, 200, 200, 200, 429]);
    server.stop().await;
}

#[tokio::test]
async fn domains_without_a_block_are_404_and_a_request_without_descriptors_passes() {
    let rules =
        "domain: plain\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1}\n";
    let only_login = "domain: l\nproxy:\n  rate_limits:\n    - actions: [{header_value_match: {descriptor_value: x, headers: [{name: ':method', exact_match: POST}]}}]\ndescriptors:\n  - key: header_match\n    rate_limit: {unit: hour, requests_per_unit: 1}\n";
    let server = TestServer::start(&[("plain.yaml", rules), ("l.yaml", only_login)], &[]).await;
    for domain in ["plain", "nowhere"] {
        let answer = ask(
            server.http,
            &format!("/forward-auth/{domain}"),
            &from("192.0.2.1"),
        )
        .await;
        assert_eq!(answer.status, 404, "{domain}");
        assert!(
            !answer.body.contains(domain),
            "the domain a caller named is not echoed"
        );
    }
    for _ in 0..3 {
        let answer = ask(server.http, "/forward-auth/l", &[("X-Forwarded-Method", "GET")]).await;
        assert_eq!((answer.status, answer.header("ratelimit")), (200, None));
    }
    assert_eq!(
        server
            .metric("tollgate_forward_auth_requests_total{answer=\"not_limited\"}")
            .await,
        3
    );
    server.stop().await;
}

#[tokio::test]
async fn a_forwarded_body_is_counted_and_never_read() {
    let server = TestServer::start(&[("edge.yaml", RULES)], &[]).await;
    let mut stream = tokio::net::TcpStream::connect(server.http)
        .await
        .expect("connect");
    let request = "POST /forward-auth/edge HTTP/1.1\r\nHost: t\r\nX-Forwarded-For: 192.0.2.1\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello";
    stream.write_all(request.as_bytes()).await.expect("send");
    let mut raw = String::new();
    stream.read_to_string(&mut raw).await.expect("answer");
    assert!(raw.starts_with("HTTP/1.1 200"), "{raw}");
    assert_eq!(server.metric("tollgate_forward_auth_bodies_total").await, 1);
    server.stop().await;
}

#[tokio::test]
async fn an_oversized_forwarded_head_is_431_before_anything_is_decided() {
    let server = TestServer::start(&[("edge.yaml", RULES)], &[]).await;
    // A forwarded header past the HTTP listener's 64 KiB bound: refused as the head is read, so no
    // descriptor is made and no budget spent; the same client's next request still has all of it.
    let huge = format!("192.0.2.1, {}", "9".repeat(70 << 10));
    let mut tcp = tokio::net::TcpStream::connect(server.http)
        .await
        .expect("connect");
    let head = format!("GET /forward-auth/edge HTTP/1.1\r\nHost: t\r\nX-Forwarded-For: {huge}\r\n\r\n");
    // The server may answer and close before it has read all of a head it refuses.
    let _ = tcp.write_all(head.as_bytes()).await;
    assert_eq!(read_answer(&mut tcp).await.map(|a| a.0), Some(431));
    let total = |answer: &'static str| {
        let server = &server;
        async move {
            server
                .metric(&format!(
                    "tollgate_forward_auth_requests_total{{answer=\"{answer}\"}}"
                ))
                .await
        }
    };
    assert_eq!((total("allowed").await, total("refused").await), (0, 0));
    for _ in 0..3 {
        assert_eq!(
            ask(server.http, "/forward-auth/edge", &from("192.0.2.1"))
                .await
                .status,
            200
        );
    }
    assert_eq!(
        ask(server.http, "/forward-auth/edge", &from("192.0.2.1"))
            .await
            .status,
        429
    );
    server.stop().await;
}

#[tokio::test]
async fn with_redis_down_each_rules_failure_mode_answers_and_else_503() {
    require_redis!();
    let rules = "domain: f
proxy:
  rate_limits: [{actions: [{request_headers: {header_name: x-rule, descriptor_key: rule}}]}]
descriptors:
  - key: rule
    value: open
    rate_limit: {unit: hour, requests_per_unit: 100, failure_mode: open}
  - key: rule
    value: closed
    rate_limit: {unit: hour, requests_per_unit: 100, failure_mode: closed}
  - key: rule
    value: unset
    rate_limit: {unit: hour, requests_per_unit: 100}
";
    let redis = RedisServer::start();
    let env = [
        ("REDIS_URL", redis.url()),
        ("TOLLGATE_REDIS_DEADLINE", "200ms".to_owned()),
    ];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let server = TestServer::start(&[("f.yaml", rules)], &env).await;
    let rule = |value: &'static str| [("X-Rule", value)];
    assert_eq!(
        ask(server.http, "/forward-auth/f", &rule("unset")).await.status,
        200
    );
    drop(redis);
    for (value, status) in [("open", 200), ("closed", 429), ("unset", 503)] {
        let answer = tokio::time::timeout(
            Duration::from_secs(10),
            ask(server.http, "/forward-auth/f", &rule(value)),
        )
        .await
        .expect("answered within the deadline's reach");
        assert_eq!(answer.status, status, "{value}: {}", answer.body);
        if status == 503 {
            assert_eq!(answer.header("retry-after"), Some("1"));
            assert!(
                !answer.body.to_lowercase().contains("redis"),
                "the store's error stays inside: {}",
                answer.body
            );
        }
    }
    server.stop().await;
}
