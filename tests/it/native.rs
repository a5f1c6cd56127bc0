//! The native API (`tollgate.v1.RateLimiter` and `POST /v1/*`) end to end over real sockets: costs,
//! peeks, per-call all-or-nothing, refunds (also racing with checks), concurrency leases (expiry after a
//! client dies, 64 concurrent acquirers), failure modes and malformed requests. The same bodies run on
//! the Redis store in `scripts/test.sh`'s second pass (`TOLLGATE_TEST_STORE=redis`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::task::JoinSet;
use tollgate::proto::native::rate_limiter_client::RateLimiterClient;
use tollgate::proto::native::{
    AcquireRequest, CheckRequest, CheckResponse, Descriptor, Entry, Mode, RefundRequest, RefundResponse,
    ReleaseRequest,
};
use tollgate_core::clock::{Clock as _, ManualClock};
use tonic::transport::Channel;

use crate::common::{TestServer, http, store_under_test_is_redis};

const RULES: &str = r#"
domain: app
descriptors:
  - key: tokens
    rate_limit: {name: ai-tokens, unit: hour, requests_per_unit: 1000, algorithm: token_bucket}
  - key: gcra
    rate_limit: {unit: hour, requests_per_unit: 100, algorithm: gcra}
  - key: sliding
    rate_limit: {unit: hour, requests_per_unit: 100, algorithm: sliding_window}
  - key: log
    rate_limit: {unit: hour, requests_per_unit: 100, algorithm: sliding_log}
  - key: fixed
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: exports
    rate_limit: {unit: day, requests_per_unit: 3}
  - key: otp
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: shadowed
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: shadowed_bucket
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1, algorithm: token_bucket}
  - key: free
    rate_limit: {unlimited: true}
  - key: export_job
    concurrency: {max_in_flight: 3, lease_ttl: 30s}
  - key: short_job
    concurrency: {max_in_flight: 2, lease_ttl: 400ms}
  - key: busy
    concurrency: {max_in_flight: 5, lease_ttl: 10s}
"#;

async fn start() -> (TestServer, RateLimiterClient<Channel>) {
    let server = TestServer::start(&[("app.yaml", RULES)], &[]).await;
    let client = RateLimiterClient::new(server.channel().await);
    (server, client)
}

/// A server whose embedded store and refund tokens read a manual clock (Redis keeps its own).
async fn start_with_manual_clock() -> (TestServer, RateLimiterClient<Channel>, ManualClock) {
    let clock = ManualClock::new(tollgate_core::clock::SystemClock.now_us());
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("app.yaml"), RULES).expect("write rules");
    let server = TestServer::start_with_clock(dir, &[], Arc::new(clock.clone())).await;
    server.wait_ready().await;
    let client = RateLimiterClient::new(server.channel().await);
    (server, client, clock)
}

fn desc(key: &str, value: &str) -> Descriptor {
    Descriptor {
        entries: vec![Entry {
            key: key.to_owned(),
            value: value.to_owned(),
        }],
        cost: None,
    }
}

fn check_request(descriptors: Vec<Descriptor>, cost: u64, mode: Mode) -> CheckRequest {
    CheckRequest {
        domain: "app".to_owned(),
        descriptors,
        cost,
        mode: mode as i32,
    }
}

async fn check(
    client: &mut RateLimiterClient<Channel>,
    d: Descriptor,
    cost: u64,
    mode: Mode,
) -> CheckResponse {
    client
        .check(check_request(vec![d], cost, mode))
        .await
        .expect("check")
        .into_inner()
}

/// Refunds with `token`; what is left after it.
async fn refund(client: &mut RateLimiterClient<Channel>, token: &str, d: Descriptor, cost: u64) -> u64 {
    try_refund(client, token, d, cost).await.expect("refund").results[0].remaining
}

async fn try_refund(
    client: &mut RateLimiterClient<Channel>,
    token: &str,
    d: Descriptor,
    cost: u64,
) -> Result<RefundResponse, tonic::Status> {
    let request = RefundRequest {
        domain: "app".to_owned(),
        descriptors: vec![d],
        cost,
        refund_token: token.to_owned(),
    };
    client.refund(request).await.map(tonic::Response::into_inner)
}

/// A consuming check that must pass; its refund token.
async fn consume(client: &mut RateLimiterClient<Channel>, d: Descriptor, cost: u64) -> String {
    let answer = check(client, d, cost, Mode::Consume).await;
    assert!(answer.allowed, "{answer:?}");
    assert!(
        !answer.refund_token.is_empty(),
        "a check that consumed carries a token"
    );
    answer.refund_token
}

fn secs(d: Option<&prost_types::Duration>) -> f64 {
    let d = d.expect("a duration");
    d.seconds as f64 + f64::from(d.nanos) / 1e9
}

#[tokio::test]
async fn check_consumes_the_cost_and_reports_the_limit_and_exact_hints() {
    let (server, mut client) = start().await;
    let first = check(&mut client, desc("tokens", "u1"), 700, Mode::Consume).await;
    assert!(first.allowed);
    let result = &first.results[0];
    assert_eq!(result.remaining, 300);
    let limit = result.limit.as_ref().expect("a limit");
    assert_eq!(
        (limit.rule.as_str(), limit.name.as_str(), limit.algorithm.as_str()),
        ("app.tokens", "ai-tokens", "token_bucket")
    );
    assert_eq!(
        (limit.requests_per_unit, limit.unit.as_str(), limit.burst),
        (1000, "HOUR", 1000)
    );
    assert_eq!(secs(limit.window.as_ref()), 3600.0);
    // 700 tokens at 1000 an hour refill in 2520 s.
    let reset = secs(result.reset_after.as_ref());
    assert!((2519.0..=2520.0).contains(&reset), "{reset}");
    assert!(result.retry_after.is_none());

    let refused = check(&mut client, desc("tokens", "u1"), 400, Mode::Consume).await;
    assert!(!refused.allowed);
    // 100 more tokens take 360 s to refill.
    let retry = secs(refused.retry_after.as_ref());
    assert!((359.0..=360.0).contains(&retry), "{retry}");
    assert_eq!(refused.results[0].remaining, 0);
    // Descriptor-level costs override the request's.
    let mut cheap = desc("tokens", "u1");
    cheap.cost = Some(300);
    let rest = client
        .check(check_request(vec![cheap], 999, Mode::Consume))
        .await
        .expect("check")
        .into_inner();
    assert!(rest.allowed, "{rest:?}");
    assert_eq!(rest.results[0].remaining, 0);
    server.stop().await;
}

#[tokio::test]
async fn peek_consumes_nothing_and_says_what_a_cost_would_get() {
    let (server, mut client) = start().await;
    check(&mut client, desc("exports", "acme"), 1, Mode::Consume).await;
    for _ in 0..3 {
        let peek = check(&mut client, desc("exports", "acme"), 1, Mode::Peek).await;
        assert!(peek.allowed);
        assert_eq!(peek.results[0].remaining, 1, "as if one more export were made");
    }
    let too_big = check(&mut client, desc("exports", "acme"), 3, Mode::Peek).await;
    assert!(!too_big.allowed);
    assert!(too_big.retry_after.is_some());
    // Still two exports left after all those peeks.
    assert!(
        check(&mut client, desc("exports", "acme"), 2, Mode::Consume)
            .await
            .allowed
    );
    assert!(
        !check(&mut client, desc("exports", "acme"), 1, Mode::Consume)
            .await
            .allowed
    );
    server.stop().await;
}

#[tokio::test]
async fn all_or_nothing_per_call_consumes_nothing_when_one_descriptor_refuses() {
    let (server, mut client) = start().await;
    // Spend the phone's OTP budget.
    assert!(
        check(&mut client, desc("otp", "5550100"), 5, Mode::Consume)
            .await
            .allowed
    );
    let both = vec![desc("exports", "acme"), desc("otp", "5550100")];
    let refused = client
        .check(check_request(both.clone(), 1, Mode::AllOrNothing))
        .await
        .expect("check")
        .into_inner();
    assert!(!refused.allowed);
    assert!(refused.results[0].allowed && !refused.results[1].allowed);
    // The export was not consumed: all three are left.
    assert_eq!(
        check(&mut client, desc("exports", "acme"), 3, Mode::Peek)
            .await
            .results[0]
            .remaining,
        0
    );
    assert!(
        check(&mut client, desc("exports", "acme"), 3, Mode::Peek)
            .await
            .allowed
    );
    // In the default mode the same call consumes the export.
    client
        .check(check_request(both, 1, Mode::Consume))
        .await
        .expect("check");
    assert!(
        !check(&mut client, desc("exports", "acme"), 3, Mode::Peek)
            .await
            .allowed
    );
    server.stop().await;
}

#[tokio::test]
async fn shadow_unlimited_and_unmatched_descriptors_are_reported_as_such() {
    let (server, mut client) = start().await;
    check(&mut client, desc("shadowed", "x"), 1, Mode::Consume).await;
    let shadow = check(&mut client, desc("shadowed", "x"), 1, Mode::Consume).await;
    assert!(shadow.allowed, "shadow rules never refuse");
    assert!(shadow.results[0].shadow);
    assert!(shadow.results[0].retry_after.is_some(), "but say they would have");
    let free = check(&mut client, desc("free", "x"), 1, Mode::Consume).await;
    assert!(free.allowed && free.results[0].unlimited && free.results[0].limit.is_none());
    let unmatched = check(&mut client, desc("nothing", "x"), 1, Mode::Consume).await;
    assert!(unmatched.allowed && !unmatched.results[0].unlimited && unmatched.results[0].limit.is_none());
    server.stop().await;
}

#[tokio::test]
async fn refund_gives_back_what_a_failed_request_consumed() {
    let (server, mut client) = start().await;
    for key in ["tokens", "gcra", "sliding", "log", "fixed"] {
        let limit = if key == "tokens" { 1000 } else { 100 };
        let d = || desc(key, "refund-me");
        let token = consume(&mut client, d(), limit).await;
        // (Not refused first: a refused fixed-window request still counts, as in envoyproxy/ratelimit.)
        let after = refund(&mut client, &token, d(), 10).await;
        assert!((10..=11).contains(&after), "{key}: {after} left after the refund");
        let token = consume(&mut client, d(), 10).await;
        assert!(!check(&mut client, d(), 2, Mode::Consume).await.allowed, "{key}");
        // A refund gives back at most what its check consumed (10), whatever it asks for. (On a fixed
        // window the refused check of 2 counted.)
        let capped = refund(&mut client, &token, d(), 10 * limit).await;
        let expected = if key == "fixed" { 8 } else { 10 };
        assert!(
            (expected..=expected + 1).contains(&capped),
            "{key}: {capped} left"
        );
    }
    server.stop().await;
}

/// Only a genuine token restores budget, exactly once, for its own domain and descriptors, while it
/// lives; a forged, missing, replayed, foreign or expired one is PERMISSION_DENIED and changes nothing.
#[tokio::test]
async fn refund_tokens_restore_only_what_was_consumed_once() {
    // A manual clock: the token's expiry passes without waiting (the limiter dates tokens by it).
    let (server, mut client, clock) = start_with_manual_clock().await;
    let d = || desc("tokens", "owner");
    let token = consume(&mut client, d(), 600).await;
    let peek = check(&mut client, d(), 0, Mode::Peek).await;
    assert!(peek.refund_token.is_empty(), "a peek consumed nothing");
    assert_eq!(peek.results[0].remaining, 400);
    let denied = |r: Result<RefundResponse, tonic::Status>| {
        let status = r.expect_err("refused");
        assert_eq!(status.code(), tonic::Code::PermissionDenied, "{status:?}");
        status.message().to_owned()
    };
    // Missing, garbage, and a real token with one character changed.
    denied(try_refund(&mut client, "", d(), 1).await);
    denied(try_refund(&mut client, "not-a-token", d(), 1).await);
    let mut forged = token.clone().into_bytes();
    let at = forged.len() / 2;
    forged[at] = if forged[at] == b'A' { b'B' } else { b'A' };
    denied(try_refund(&mut client, &String::from_utf8(forged).expect("ascii"), d(), 1).await);
    // Someone else's descriptor, or another domain, with this token.
    denied(try_refund(&mut client, &token, desc("tokens", "victim"), 1).await);
    let mut other_domain = RefundRequest {
        domain: "elsewhere".into(),
        descriptors: vec![d()],
        cost: 1,
        refund_token: token.clone(),
    };
    let status = client
        .refund(other_domain.clone())
        .await
        .expect_err("other domain");
    assert_eq!(status.code(), tonic::Code::PermissionDenied);
    // No domain is a malformed request, refused before the token is read.
    other_domain.domain = String::new();
    assert_eq!(
        client.refund(other_domain).await.expect_err("no domain").code(),
        tonic::Code::InvalidArgument
    );
    assert_eq!(
        check(&mut client, d(), 0, Mode::Peek).await.results[0].remaining,
        400,
        "nothing changed"
    );
    // The genuine one: a partial refund, once.
    assert_eq!(refund(&mut client, &token, d(), 100).await, 500);
    let replay = denied(try_refund(&mut client, &token, d(), 100).await);
    assert!(replay.contains("already used"), "{replay}");
    denied(try_refund(&mut client, &token, d(), 0).await);
    assert_eq!(
        check(&mut client, d(), 0, Mode::Peek).await.results[0].remaining,
        500
    );
    // A refused check earns no token.
    let refused = check(&mut client, d(), 501, Mode::Consume).await;
    assert!(!refused.allowed && refused.refund_token.is_empty(), "{refused:?}");
    // Cost 0 gives back all the token granted; an expired token gives back nothing.
    let all = consume(&mut client, d(), 50).await;
    let late = consume(&mut client, d(), 50).await;
    assert_eq!(refund(&mut client, &all, d(), 0).await, 450);
    clock.advance_us(4 * 3_600_000_000);
    let expired = denied(try_refund(&mut client, &late, d(), 0).await);
    assert!(expired.contains("expired"), "{expired}");
    server.stop().await;
}

/// A token grants only what each descriptor consumed: a shadow-mode descriptor refused inside an
/// allowed check consumed nothing and gets nothing back, and one descriptor asked twice gets back
/// both of its costs.
#[tokio::test]
async fn refund_tokens_grant_what_each_descriptor_consumed() {
    let (server, mut client) = start().await;
    let request = |descriptors: Vec<Descriptor>, cost| check_request(descriptors, cost, Mode::Consume);
    // The shadow bucket is empty, so the check below is allowed while that descriptor is refused.
    check(&mut client, desc("shadowed_bucket", "s"), 1, Mode::Consume).await;
    let both = vec![desc("tokens", "s"), desc("shadowed_bucket", "s")];
    let answer = client
        .check(request(both.clone(), 1))
        .await
        .expect("check")
        .into_inner();
    assert!(
        answer.allowed && answer.results[1].retry_after.is_some(),
        "shadow: refused, reported allowed: {answer:?}"
    );
    let refund_all = |descriptors: Vec<Descriptor>, token: String| RefundRequest {
        domain: "app".to_owned(),
        descriptors,
        cost: 0,
        refund_token: token,
    };
    client
        .refund(refund_all(both, answer.refund_token))
        .await
        .expect("refund");
    assert_eq!(
        check(&mut client, desc("tokens", "s"), 0, Mode::Peek)
            .await
            .results[0]
            .remaining,
        1000
    );
    assert_eq!(
        check(&mut client, desc("shadowed_bucket", "s"), 0, Mode::Peek)
            .await
            .results[0]
            .remaining,
        0,
        "nothing given back to a descriptor that consumed nothing"
    );
    // One descriptor twice: 20 consumed, 20 given back, and the token is then used up.
    let twice = vec![desc("tokens", "twice"), desc("tokens", "twice")];
    let answer = client
        .check(request(twice.clone(), 10))
        .await
        .expect("check")
        .into_inner();
    assert_eq!(answer.results[1].remaining, 980);
    let token = answer.refund_token;
    client
        .refund(refund_all(twice.clone(), token.clone()))
        .await
        .expect("both places refunded");
    assert_eq!(
        check(&mut client, desc("tokens", "twice"), 0, Mode::Peek)
            .await
            .results[0]
            .remaining,
        1000
    );
    let replay = client
        .refund(refund_all(twice, token))
        .await
        .expect_err("used up");
    assert_eq!(replay.code(), tonic::Code::PermissionDenied);
    server.stop().await;
}

/// A token for a fixed window expires with the window it was consumed from: in the next window the
/// units are gone with their window, and a refund would hand them to the new one.
#[tokio::test]
async fn a_fixed_window_token_ends_with_its_window() {
    let (server, mut client, clock) = start_with_manual_clock().await;
    let d = || desc("fixed", "windowed");
    let token = consume(&mut client, d(), 10).await;
    let hour = 3_600_000_000;
    clock.advance_us(hour - clock.now_us() % hour);
    let status = try_refund(&mut client, &token, d(), 0)
        .await
        .expect_err("expired");
    assert_eq!(status.code(), tonic::Code::PermissionDenied);
    assert!(status.message().contains("expired"), "{status:?}");
    server.stop().await;
}

/// 64 callers check (cost 1) and refund a third of what they got: the units admitted minus the units
/// refunded never exceed the limit, and the refunds really were usable again.
#[tokio::test]
async fn refunds_racing_with_checks_never_admit_more_than_the_limit() {
    let (server, client) = start().await;
    for key in ["fixed", "sliding", "log", "tokens", "gcra"] {
        let limit: u64 = if key == "tokens" { 1000 } else { 100 };
        let admitted = Arc::new(AtomicU64::new(0));
        let refunded = Arc::new(AtomicU64::new(0));
        let mut tasks = JoinSet::new();
        for caller in 0..64u64 {
            let mut client = client.clone();
            let (admitted, refunded) = (Arc::clone(&admitted), Arc::clone(&refunded));
            tasks.spawn(async move {
                let mut refused_in_a_row = 0;
                let mut n = caller;
                while refused_in_a_row < 3 {
                    n += 1;
                    let answer = check(&mut client, desc(key, "race"), 1, Mode::Consume).await;
                    if answer.allowed {
                        refused_in_a_row = 0;
                        admitted.fetch_add(1, Ordering::SeqCst);
                        if n % 3 == 0 {
                            refund(&mut client, &answer.refund_token, desc(key, "race"), 1).await;
                            refunded.fetch_add(1, Ordering::SeqCst);
                        }
                    } else {
                        refused_in_a_row += 1;
                    }
                }
            });
        }
        while let Some(done) = tasks.join_next().await {
            done.expect("caller");
        }
        let (admitted, refunded) = (admitted.load(Ordering::SeqCst), refunded.load(Ordering::SeqCst));
        // Token bucket and GCRA refill about one unit every 3.6 s (36 s for the window algorithms'
        // none): allow one.
        let refill = u64::from(matches!(key, "tokens" | "gcra"));
        assert!(
            admitted - refunded <= limit + refill,
            "{key}: {admitted} admitted - {refunded} refunded > {limit}"
        );
        assert!(
            admitted > limit,
            "{key}: refunds were reused ({admitted} admitted)"
        );
    }
    server.stop().await;
}

fn acquire_request(key: &str, value: &str, lease_id: &str) -> AcquireRequest {
    AcquireRequest {
        domain: "app".to_owned(),
        descriptors: vec![desc(key, value)],
        lease_id: lease_id.to_owned(),
        ttl: None,
    }
}

fn release_request(key: &str, value: &str, lease_id: &str) -> ReleaseRequest {
    ReleaseRequest {
        domain: "app".to_owned(),
        descriptors: vec![desc(key, value)],
        lease_id: lease_id.to_owned(),
    }
}

#[tokio::test]
async fn leases_cap_work_in_flight_and_release_frees_a_slot() {
    let (server, mut client) = start().await;
    let mut ids = Vec::new();
    for held in 1..=3u64 {
        let lease = client
            .acquire(acquire_request("export_job", "acme", ""))
            .await
            .expect("acquire")
            .into_inner();
        assert!(lease.acquired);
        assert_eq!(lease.lease_id.len(), 32);
        assert_eq!(secs(lease.ttl.as_ref()), 30.0);
        let result = &lease.results[0];
        assert_eq!(
            (result.rule.as_str(), result.max_in_flight, result.in_flight),
            ("app.export_job", 3, held)
        );
        ids.push(lease.lease_id);
    }
    let refused = client
        .acquire(acquire_request("export_job", "acme", ""))
        .await
        .expect("acquire")
        .into_inner();
    assert!(!refused.acquired);
    assert!(
        refused.lease_id.is_empty(),
        "a refused lease holds nothing to renew or release"
    );
    let retry = secs(refused.retry_after.as_ref());
    assert!(
        (29.0..=30.0).contains(&retry),
        "the oldest lease expires in {retry} s"
    );
    // Another tenant has its own slots.
    assert!(
        client
            .acquire(acquire_request("export_job", "other", ""))
            .await
            .expect("acquire")
            .into_inner()
            .acquired
    );

    let released = client
        .release(release_request("export_job", "acme", &ids[0]))
        .await
        .expect("release")
        .into_inner();
    assert!(released.results[0].released);
    assert_eq!(released.results[0].in_flight, 2);
    let again = client
        .release(release_request("export_job", "acme", &ids[0]))
        .await
        .expect("release")
        .into_inner();
    assert!(!again.results[0].released, "a lease is released once");
    // An id the server did not mint holds nothing: it renews nothing and takes nothing.
    let error = client
        .acquire(acquire_request("export_job", "acme", "mine"))
        .await
        .expect_err("no such lease");
    assert_eq!(error.code(), tonic::Code::NotFound, "{error:?}");
    let fresh = client
        .acquire(acquire_request("export_job", "acme", ""))
        .await
        .expect("acquire")
        .into_inner();
    assert!(fresh.acquired && fresh.results[0].in_flight == 3, "{fresh:?}");
    // Acquiring under the lease's own id renews it instead of taking another slot.
    let renewed = client
        .acquire(acquire_request("export_job", "acme", &fresh.lease_id))
        .await
        .expect("acquire")
        .into_inner();
    assert!(renewed.acquired);
    assert_eq!(
        (renewed.lease_id.as_str(), renewed.results[0].in_flight),
        (fresh.lease_id.as_str(), 3)
    );
    // Released, it is gone: a renewal is refused and frees nothing else.
    client
        .release(release_request("export_job", "acme", &fresh.lease_id))
        .await
        .expect("release");
    let error = client
        .acquire(acquire_request("export_job", "acme", &fresh.lease_id))
        .await
        .expect_err("released lease");
    assert_eq!(error.code(), tonic::Code::NotFound);
    // Descriptors without a concurrency rule need no slot.
    let plain = client
        .acquire(acquire_request("tokens", "u1", ""))
        .await
        .expect("acquire")
        .into_inner();
    assert!(plain.acquired && plain.results[0].rule.is_empty());
    server.stop().await;
}

#[tokio::test]
async fn a_lease_whose_client_died_expires_after_its_ttl() {
    // On the embedded store the server reads a manual clock, so the TTL passes without waiting; Redis
    // keeps its own clock, and there the test waits it out.
    let (server, mut client, clock) = start_with_manual_clock().await;
    {
        // This client takes both slots and vanishes without releasing.
        let mut doomed = RateLimiterClient::new(server.channel().await);
        for _ in 0..2 {
            let lease = doomed
                .acquire(acquire_request("short_job", "j", ""))
                .await
                .expect("acquire");
            assert!(lease.into_inner().acquired);
        }
    }
    let blocked = client
        .acquire(acquire_request("short_job", "j", ""))
        .await
        .expect("acquire")
        .into_inner();
    assert!(!blocked.acquired);
    assert!(secs(blocked.retry_after.as_ref()) <= 0.4);
    if store_under_test_is_redis() {
        tokio::time::sleep(Duration::from_millis(450)).await;
    } else {
        clock.advance_us(450_000);
    }
    let freed = client
        .acquire(acquire_request("short_job", "j", ""))
        .await
        .expect("acquire")
        .into_inner();
    assert!(freed.acquired, "{freed:?}");
    assert_eq!(freed.results[0].in_flight, 1, "both dead leases are gone");
    // A shorter TTL may be asked for; a longer one is capped by the rule.
    let mut long = acquire_request("short_job", "k", "");
    long.ttl = Some(prost_types::Duration {
        seconds: 60,
        nanos: 0,
    });
    let capped = client.acquire(long).await.expect("acquire").into_inner();
    assert_eq!(secs(capped.ttl.as_ref()), 0.4);
    server.stop().await;
}

/// 64 callers compete for 5 slots: never more than 5 leases held at once, and the cap is reached.
#[tokio::test]
async fn sixty_four_concurrent_acquirers_never_hold_more_than_max_in_flight() {
    let (server, client) = start().await;
    let holding = Arc::new(AtomicU64::new(0));
    let most = Arc::new(AtomicU64::new(0));
    let mut tasks = JoinSet::new();
    for _ in 0..64 {
        let mut client = client.clone();
        let (holding, most) = (Arc::clone(&holding), Arc::clone(&most));
        tasks.spawn(async move {
            for _ in 0..10 {
                let lease = client
                    .acquire(acquire_request("busy", "pool", ""))
                    .await
                    .expect("acquire")
                    .into_inner();
                if !lease.acquired {
                    continue;
                }
                let now = holding.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(2)).await;
                holding.fetch_sub(1, Ordering::SeqCst);
                let released = client
                    .release(release_request("busy", "pool", &lease.lease_id))
                    .await
                    .expect("release")
                    .into_inner();
                assert!(released.results[0].released);
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("caller");
    }
    // How many leases the callers held at once depends on how the scheduler interleaved them (a busy
    // host may never run five at the same moment); that none held more than five does not.
    let most = most.load(Ordering::SeqCst);
    assert!((1..=5).contains(&most), "{most} held at once");
    // Every slot was released: five can be held again, and the sixth is refused.
    let mut client = client.clone();
    for held in 0..6 {
        let lease = client
            .acquire(acquire_request("busy", "pool", ""))
            .await
            .expect("acquire")
            .into_inner();
        assert_eq!(lease.acquired, held < 5, "lease {}", held + 1);
    }
    server.stop().await;
}

/// For an application a domain no rules define is a typo that would silently disable its limits: every
/// native call names it (`NOT_FOUND`, HTTP 404), where Envoy's API answers OK as envoyproxy/ratelimit.
#[tokio::test]
async fn an_unknown_domain_is_not_found_on_the_native_api_and_ok_for_envoy() {
    let (server, mut client) = start().await;
    let typo = CheckRequest {
        domain: "ap".into(),
        ..check_request(vec![desc("tokens", "u")], 1, Mode::Consume)
    };
    let error = client.check(typo).await.expect_err("unknown domain");
    assert_eq!(error.code(), tonic::Code::NotFound);
    assert!(
        error.message().contains("unknown domain 'ap'"),
        "{}",
        error.message()
    );
    let acquire = AcquireRequest {
        domain: "ap".into(),
        ..acquire_request("busy", "pool", "")
    };
    let error = client.acquire(acquire).await.expect_err("unknown domain");
    assert_eq!(error.code(), tonic::Code::NotFound);
    let (status, body) = http(
        server.http,
        "POST",
        "/v1/check",
        r#"{"domain":"ap","descriptors":[{"entries":[{"key":"tokens","value":"u"}]}]}"#,
    )
    .await;
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("unknown domain 'ap'"), "{body}");
    let mut envoy = server.client().await;
    let answer = envoy
        .should_rate_limit(crate::common::wire_request("ap", &[&[("tokens", "u")]]))
        .await
        .expect("Envoy's API answers")
        .into_inner();
    assert_eq!(answer.overall_code, 1, "OK, as envoyproxy/ratelimit");
    server.stop().await;
}

#[tokio::test]
async fn malformed_native_requests_get_invalid_argument() {
    let (server, mut client) = start().await;
    let empty_domain = CheckRequest {
        domain: String::new(),
        ..check_request(vec![desc("tokens", "u")], 1, Mode::Consume)
    };
    let error = client.check(empty_domain).await.expect_err("empty domain");
    assert_eq!(error.code(), tonic::Code::InvalidArgument);
    let mut bad_mode = check_request(vec![desc("tokens", "u")], 1, Mode::Consume);
    bad_mode.mode = 7;
    let error = client.check(bad_mode).await.expect_err("unknown mode");
    assert_eq!(error.code(), tonic::Code::InvalidArgument);
    assert!(error.message().contains("unknown mode 7"), "{}", error.message());
    let error = client
        .check(check_request(vec![], 1, Mode::Consume))
        .await
        .expect_err("no descriptors");
    assert_eq!(error.code(), tonic::Code::InvalidArgument);
    let long_id = "x".repeat(129);
    let error = client
        .acquire(acquire_request("busy", "p", &long_id))
        .await
        .expect_err("long id");
    assert_eq!(error.code(), tonic::Code::InvalidArgument);
    let error = client
        .release(release_request("busy", "p", ""))
        .await
        .expect_err("no id");
    assert_eq!(error.code(), tonic::Code::InvalidArgument);
    let mut negative = acquire_request("busy", "p", "");
    negative.ttl = Some(prost_types::Duration {
        seconds: -1,
        nanos: 0,
    });
    let error = client.acquire(negative).await.expect_err("negative ttl");
    assert_eq!(error.code(), tonic::Code::InvalidArgument);
    server.stop().await;
}

fn header<'a>(response: &'a str, name: &str) -> Option<&'a str> {
    response.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        key.eq_ignore_ascii_case(name).then(|| value.trim())
    })
}

/// A raw HTTP exchange that keeps the headers: (status, head, body).
async fn http_with_head(server: &TestServer, path: &str, body: &str) -> (u16, String, serde_json::Value) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::TcpStream::connect(server.http)
        .await
        .expect("connect");
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.expect("write");
    let mut raw = String::new();
    stream.read_to_string(&mut raw).await.expect("read");
    let (head, body) = raw.split_once("\r\n\r\n").expect("a response");
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("a status");
    let json = serde_json::from_str(body).unwrap_or(serde_json::Value::Null);
    (status, head.to_owned(), json)
}

#[tokio::test]
async fn the_json_api_speaks_the_same_calls_with_429_and_retry_after() {
    // The Retry-After header style too: it must follow the same rule as the 429's own Retry-After.
    let server = TestServer::start(
        &[("app.yaml", RULES)],
        &[("TOLLGATE_RESPONSE_HEADERS", "ietf,retry-after")],
    )
    .await;
    let otp = r#"{"domain":"app","descriptors":[{"entries":[{"key":"otp","value":"5550111"}]}],"cost":4}"#;
    let (status, head, body) = http_with_head(&server, "/v1/check", otp).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["results"][0]["remaining"], 1);
    assert_eq!(body["results"][0]["limit"]["window"], "3600s");
    assert!(header(&head, "RateLimit-Policy").is_some(), "{head}");
    let (status, head, body) = http_with_head(&server, "/v1/check", otp).await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["allowed"], false);
    let retry: u64 = header(&head, "Retry-After")
        .and_then(|v| v.parse().ok())
        .expect("Retry-After");
    // A fixed window: the hint is the time to the window's end.
    assert!((1..=3600).contains(&retry), "{retry}");
    // A cost above the limit can never pass: 429 with no Retry-After, and nothing consumed.
    let absurd = r#"{"domain":"app","descriptors":[{"entries":[{"key":"otp","value":"5550122"}]}],"cost":6}"#;
    let (status, head, body) = http_with_head(&server, "/v1/check", absurd).await;
    assert_eq!(status, 429, "{body}");
    assert!(header(&head, "Retry-After").is_none(), "{head}");
    let untouched =
        r#"{"domain":"app","descriptors":[{"entries":[{"key":"otp","value":"5550122"}]}],"mode":"peek"}"#;
    let (_, _, body) = http_with_head(&server, "/v1/check", untouched).await;
    assert_eq!(body["results"][0]["remaining"].as_u64(), Some(5), "{body}");

    let peek =
        r#"{"domain":"app","descriptors":[{"entries":[{"key":"otp","value":"5550111"}]}],"mode":"peek"}"#;
    let (status, _, body) = http_with_head(&server, "/v1/check", peek).await;
    assert_eq!((status, body["results"][0]["remaining"].as_u64()), (200, Some(0)));
    let tokens = r#"{"domain":"app","descriptors":[{"entries":[{"key":"tokens","value":"j"}]}],"cost":10}"#;
    let (_, _, checked) = http_with_head(&server, "/v1/check", tokens).await;
    let token = checked["refund_token"].as_str().expect("a refund token");
    let refund = format!(
        r#"{{"domain":"app","descriptors":[{{"entries":[{{"key":"tokens","value":"j"}}]}}],"refund_token":"{token}"}}"#
    );
    let (status, _, body) = http_with_head(&server, "/v1/refund", &refund).await;
    assert_eq!(
        (status, body["results"][0]["remaining"].as_u64()),
        (200, Some(1000)),
        "{body}"
    );
    let (status, _, body) = http_with_head(&server, "/v1/refund", &refund).await;
    assert_eq!(status, 403, "a token refunds once: {body}");
    let (status, _, body) = http_with_head(&server, "/v1/refund", tokens).await;
    assert_eq!(status, 403, "no token, no refund: {body}");

    let job =
        r#"{"domain":"app","descriptors":[{"entries":[{"key":"short_job","value":"h"}]}],"ttl":"200ms"}"#;
    let (status, _, first) = http_with_head(&server, "/v1/acquire", job).await;
    assert_eq!(
        (status, &first["ttl"]),
        (200, &serde_json::json!("0.2s")),
        "{first}"
    );
    http_with_head(&server, "/v1/acquire", job).await;
    let (status, head, body) = http_with_head(&server, "/v1/acquire", job).await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(header(&head, "Retry-After"), Some("1"));
    let release = format!(
        r#"{{"domain":"app","descriptors":[{{"entries":[{{"key":"short_job","value":"h"}}]}}],"lease_id":{}}}"#,
        first["lease_id"]
    );
    let (status, _, body) = http_with_head(&server, "/v1/release", &release).await;
    assert_eq!(
        (status, &body["results"][0]["released"]),
        (200, &serde_json::json!(true)),
        "{body}"
    );

    for (path, bad) in [
        ("/v1/check", "not json"),
        (
            "/v1/check",
            r#"{"domain":"app","descriptors":[],"mode":"sometimes"}"#,
        ),
        ("/v1/check", r#"{"domain":"","descriptors":[{"entries":[]}]}"#),
        (
            "/v1/acquire",
            r#"{"domain":"app","descriptors":[{"entries":[]}],"ttl":"soon"}"#,
        ),
        (
            "/v1/check",
            r#"{"domain":"app","descriptors":[{"entries":[]}],"extra":1}"#,
        ),
    ] {
        let (status, body) = http(server.http, "POST", path, bad).await;
        assert_eq!(status, 400, "{bad}: {body}");
        assert!(body.contains("\"error\""), "{body}");
    }
    server.stop().await;
}

/// With the store unreachable, each concurrency rule's failure_mode answers; without one the call fails
/// with UNAVAILABLE, as rate limits do.
#[tokio::test]
async fn lease_failure_modes_answer_when_the_store_is_down() {
    let rules = r#"
domain: app
descriptors:
  - key: open_job
    concurrency: {max_in_flight: 1, failure_mode: open}
  - key: closed_job
    concurrency: {max_in_flight: 1, failure_mode: closed}
  - key: plain_job
    concurrency: {max_in_flight: 1}
"#;
    let dead = format!("127.0.0.1:{}", crate::common::redis::free_port());
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("app.yaml"), rules).expect("write rules");
    let env = [("REDIS_URL", dead.as_str()), ("TOLLGATE_REDIS_DEADLINE", "50ms")];
    let server = TestServer::start_unready(dir, &env).await;
    let mut client = RateLimiterClient::new(server.channel().await);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let open = loop {
        // The rules load in the background; until then the answer is UNAVAILABLE ("no configuration").
        match client.acquire(acquire_request("open_job", "a", "")).await {
            Ok(answer) => break answer.into_inner(),
            Err(_) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await
            }
            Err(error) => panic!("no answer from failure_mode: {error}"),
        }
    };
    assert!(open.acquired && open.results[0].failure_mode_applied, "{open:?}");
    let closed = client
        .acquire(acquire_request("closed_job", "a", ""))
        .await
        .expect("acquire")
        .into_inner();
    assert!(
        !closed.acquired && closed.results[0].failure_mode_applied,
        "{closed:?}"
    );
    assert_eq!(secs(closed.retry_after.as_ref()), 1.0);
    let error = client
        .acquire(acquire_request("plain_job", "a", ""))
        .await
        .expect_err("no failure mode");
    assert_eq!(error.code(), tonic::Code::Unavailable);
    let error = client
        .release(release_request("open_job", "a", "x"))
        .await
        .expect_err("release needs the store");
    assert_eq!(error.code(), tonic::Code::Unavailable);
    server.stop().await;
}

/// Native calls count in the same metrics as Envoy's: requests, and the rule's hits (consuming checks
/// and acquires; peeks and refunds are not hits).
#[tokio::test]
async fn native_calls_count_in_the_same_metrics() {
    let (server, mut client) = start().await;
    let token = consume(&mut client, desc("otp", "m"), 1).await;
    check(&mut client, desc("otp", "m"), 5, Mode::Consume).await;
    check(&mut client, desc("otp", "m"), 1, Mode::Peek).await;
    refund(&mut client, &token, desc("otp", "m"), 1).await;
    for _ in 0..7 {
        client
            .acquire(acquire_request("busy", "m", ""))
            .await
            .expect("acquire");
    }
    let (status, text) = http(server.debug, "GET", "/metrics", "").await;
    assert_eq!(status, 200);
    for expected in [
        "ratelimit_service_rate_limit_total_hits{domain=\"app\",key1=\"otp\"} 6",
        // The refused 5 crossed the limit of 5 with 4 units of room, one above the threshold (4):
        // split as the Go service splits it.
        "ratelimit_service_rate_limit_over_limit{domain=\"app\",key1=\"otp\"} 1",
        "ratelimit_service_rate_limit_near_limit{domain=\"app\",key1=\"otp\"} 1",
        "ratelimit_service_rate_limit_total_hits{domain=\"app\",key1=\"busy\"} 7",
        "ratelimit_service_rate_limit_over_limit{domain=\"app\",key1=\"busy\"} 2",
        // Each call under its own method: three checks (a peek among them), a refund, seven acquires.
        "ratelimit_service_total_requests{grpc_method=\"Check\"} 3",
        "ratelimit_service_total_requests{grpc_method=\"Refund\"} 1",
        "ratelimit_service_total_requests{grpc_method=\"Acquire\"} 7",
        "ratelimit_service_total_requests{grpc_method=\"ShouldRateLimit\"} 0",
        "ratelimit_service_response_time_seconds_count{grpc_method=\"Acquire\"} 7",
    ] {
        assert!(text.contains(expected), "{expected} in\n{text}");
    }
    server.stop().await;
}

/// Absurd costs and sizes get answers, not panics: a cost no limit can admit is refused with no retry
/// hint and the budget untouched on every algorithm (a fixed window included, unlike Envoy's path),
/// a refund of u64::MAX is capped, and a request with too many descriptors is refused.
#[tokio::test]
async fn absurd_costs_and_sizes_are_answered() {
    let (server, mut client) = start().await;
    for key in ["tokens", "gcra", "sliding", "log", "fixed"] {
        let limit = if key == "tokens" { 1000 } else { 100 };
        for cost in [u64::MAX, limit + 1] {
            let huge = check(&mut client, desc(key, "huge"), cost, Mode::Consume).await;
            assert!(!huge.allowed, "{key}");
            assert!(
                huge.retry_after.is_none(),
                "{key}: waiting will not help: {huge:?}"
            );
            assert!(
                huge.results[0].retry_after.is_none() && huge.results[0].remaining == 0,
                "{key}"
            );
        }
        // Nothing was consumed, on this descriptor or on another one of the same call.
        let mut absurd = desc(key, "huge");
        absurd.cost = Some(u64::MAX);
        let mut one = desc("otp", key);
        one.cost = Some(1);
        let both = check_request(vec![absurd, one], 1, Mode::Consume);
        let refused = client.check(both).await.expect("check").into_inner();
        assert!(
            !refused.allowed && refused.results[1].allowed,
            "{key}: {refused:?}"
        );
        let peek = check(&mut client, desc(key, "huge"), 1, Mode::Peek).await;
        assert!(peek.allowed, "{key}");
        assert_eq!(
            peek.results[0].remaining,
            limit - 1,
            "{key}: the absurd cost consumed"
        );
        let otp = check(&mut client, desc("otp", key), 0, Mode::Peek).await;
        assert_eq!(
            otp.results[0].remaining, 5,
            "{key}: the other descriptor consumed"
        );
        let token = consume(&mut client, desc(key, "huge"), 1).await;
        let refunded = refund(&mut client, &token, desc(key, "huge"), u64::MAX).await;
        assert_eq!(
            refunded, limit,
            "{key}: a refund of u64::MAX gives back the 1 consumed"
        );
    }
    let many: Vec<Descriptor> = (0..16_385).map(|i| desc("tokens", &i.to_string())).collect();
    let error = client
        .check(check_request(many.clone(), 1, Mode::Consume))
        .await
        .expect_err("too many descriptors");
    assert_eq!(error.code(), tonic::Code::InvalidArgument);
    let acquire = AcquireRequest {
        descriptors: many,
        ..acquire_request("busy", "x", "")
    };
    let error = client.acquire(acquire).await.expect_err("too many descriptors");
    assert_eq!(error.code(), tonic::Code::InvalidArgument);
    server.stop().await;
}

/// With `TOLLGATE_NATIVE_HTTP_ADDR`, `/v1/*` moves to a listener of its own: whoever may scrape the HTTP
/// port's `/metrics` can no longer spend budgets there (Envoy's `/json` stays, as the Go service has it).
#[tokio::test]
async fn the_native_api_can_have_a_listener_of_its_own() {
    let env = [("TOLLGATE_NATIVE_HTTP_ADDR", "127.0.0.1:0")];
    let server = TestServer::start(&[("app.yaml", RULES)], &env).await;
    let native = server.native_http.expect("a native listener");
    let check = r#"{"domain":"app","descriptors":[{"entries":[{"key":"tokens","value":"u"}]}]}"#;
    let (status, body) = http(native, "POST", "/v1/check", check).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(http(server.http, "POST", "/v1/check", check).await.0, 404);
    assert_eq!(http(native, "GET", "/metrics", "").await.0, 404);
    let json = r#"{"domain":"app","descriptors":[{"entries":[{"key":"tokens","value":"u"}]}]}"#;
    assert_eq!(http(server.http, "POST", "/json", json).await.0, 200);
    server.stop().await;
}
