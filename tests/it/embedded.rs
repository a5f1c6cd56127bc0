//! The mixed deployment: Envoy asks a Tollgate server, an application decides in-process with
//! `tollgate_core::embedded`, and both spend one budget in one Redis.

use std::time::{Duration, Instant};

use tollgate::proto::rls::rate_limit_response::Code as WireCode;
use tollgate_core::embedded::{Descriptor, LimiterBuilder};
use tollgate_core::limiter::{Code, Mode};

use crate::common::redis::RedisServer;
use crate::common::{TestServer, wire_request};
use crate::require_redis;

const RULES: &str = "domain: app
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 4}
";

#[tokio::test]
async fn an_application_and_the_fleet_spend_one_budget_in_redis() {
    require_redis!();
    let redis = RedisServer::start();
    let server = TestServer::start(&[("app.yaml", RULES)], &[("REDIS_URL", &redis.url())]).await;
    let limiter = LimiterBuilder::new()
        .rules_yaml("app.yaml", RULES)
        .redis_url(redis.url())
        .build()
        .expect("builds");
    let ask = [Descriptor::new([("user", "ada")])];
    // Redis connects in the background: a peek (which counts nothing) answers once it has.
    let deadline = Instant::now() + Duration::from_secs(10);
    while limiter.check("app", &ask, 0, Mode::Peek).await.is_err() {
        assert!(
            Instant::now() < deadline,
            "the embedded limiter never reached Redis"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let envoy = server.client().await;
    let from_envoy = || {
        let request = wire_request("app", &[&[("user", "ada")]]);
        let mut envoy = envoy.clone();
        async move {
            envoy
                .should_rate_limit(request)
                .await
                .expect("answer")
                .into_inner()
        }
    };
    // Two through the server, two in the application: the budget of four is spent.
    assert_eq!(from_envoy().await.statuses[0].limit_remaining, 3);
    let verdict = limiter
        .check("app", &ask, 1, Mode::Consume)
        .await
        .expect("decides");
    assert_eq!(verdict.statuses[0].remaining, 2, "the server's hit is counted");
    assert_eq!(from_envoy().await.statuses[0].limit_remaining, 1);
    let verdict = limiter
        .check("app", &ask, 1, Mode::Consume)
        .await
        .expect("decides");
    assert_eq!((verdict.overall, verdict.statuses[0].remaining), (Code::Ok, 0));
    // Both refuse the fifth.
    assert_eq!(from_envoy().await.overall_code, WireCode::OverLimit as i32);
    let verdict = limiter
        .check("app", &ask, 1, Mode::Consume)
        .await
        .expect("decides");
    assert_eq!(verdict.overall, Code::OverLimit);
    drop(envoy);
    server.stop().await;
}
