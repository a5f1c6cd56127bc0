//! When the answer cannot be had: Envoy's `failure_mode_deny` with Tollgate stopped (open lets the
//! request through, closed refuses it with 500), and each rule's `failure_mode` with Tollgate's Redis
//! stopped, seen through Envoy (open: 200, closed: 429, local: counted in Tollgate until refused, no
//! failure mode: Tollgate fails the call and Envoy's `failure_mode_deny` answers 500). Envoy's own
//! counts of each outcome match Tollgate's.

use serde_json::json;

use crate::common::redis::RedisServer;
use crate::harness::bootstrap::{rate_limit_filter, request_header, route};
use crate::harness::client::Client;
use crate::harness::envoy::Envoy;
use crate::harness::envoy_in_front;
use crate::harness::tollgate::Tollgate;
use crate::{require_envoy, require_redis};

const RULES: &str = r#"
domain: fm
descriptors:
  - key: mode
    value: open
    rate_limit: {unit: minute, requests_per_unit: 100, failure_mode: open}
  - key: mode
    value: closed
    rate_limit: {unit: minute, requests_per_unit: 100, failure_mode: closed}
  - key: mode
    value: local
    rate_limit: {unit: minute, requests_per_unit: 2, failure_mode: local}
  - key: mode
    value: unset
    rate_limit: {unit: minute, requests_per_unit: 100}
"#;

/// An Envoy asking `tollgate` for `(mode)` from the `x-mode` header, with this `failure_mode_deny`.
async fn envoy(tollgate: &Tollgate, deny: bool) -> (Envoy, Client) {
    let actions = json!([{"actions": [request_header("x-mode", "mode")]}]);
    let filter = rate_limit_filter("fm", json!({"failure_mode_deny": deny}));
    let (envoy, client) = envoy_in_front(
        tollgate,
        vec![filter],
        vec![route("/", "app", actions)],
        json!({}),
    )
    .await;
    (envoy, client)
}

#[tokio::test]
async fn with_tollgate_stopped_failure_mode_deny_decides() {
    require_envoy!();
    let tollgate = Tollgate::start(&[("fm.yaml", RULES)], &[]).await;
    let (open_envoy, open) = envoy(&tollgate, false).await;
    let (closed_envoy, closed) = envoy(&tollgate, true).await;
    let mode = [("x-mode", "unset")];
    assert_eq!(open.get("/", &mode).await.status, 200);
    assert_eq!(closed.get("/", &mode).await.status, 200);
    drop(tollgate);
    assert_eq!(open.get("/", &mode).await.status, 200);
    assert_eq!(closed.get("/", &mode).await.status, 500);
    for (envoy, allowed) in [(&open_envoy, 1), (&closed_envoy, 0)] {
        assert_eq!(envoy.wait_stat("cluster.app.ratelimit.error", 1).await, 1);
        assert_eq!(
            envoy.stat("cluster.app.ratelimit.failure_mode_allowed").await,
            allowed
        );
        assert_eq!(envoy.stat("cluster.app.ratelimit.ok").await, 1);
    }
}

#[tokio::test]
async fn with_redis_stopped_each_rules_failure_mode_answers() {
    require_envoy!();
    require_redis!();
    let mut redis = RedisServer::start();
    // A debug build's Redis call on a busy machine may take longer than the default 20 ms deadline,
    // which would answer by failure mode while Redis is up.
    let env = [
        ("REDIS_URL", redis.url()),
        ("TOLLGATE_REDIS_DEADLINE", "2s".to_owned()),
    ];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let tollgate = Tollgate::start(&[("fm.yaml", RULES)], &env).await;
    tollgate.wait_ready().await;
    let (envoy, client) = envoy(&tollgate, true).await;
    let status = |mode: &'static str| {
        let client = client.clone();
        async move { client.get("/", &[("x-mode", mode)]).await.status }
    };
    assert_eq!(status("open").await, 200);
    assert_eq!(redis.cli(&["DBSIZE"]).trim(), "1", "counted in Redis");

    redis.kill();
    assert_eq!(status("open").await, 200);
    assert_eq!(status("closed").await, 429);
    // Counted in Tollgate at the limit divided by the fleet (one replica here): 2.
    let local = [
        status("local").await,
        status("local").await,
        status("local").await,
    ];
    assert_eq!(local, [200, 200, 429]);
    // No failure mode: Tollgate fails the call (UNAVAILABLE) and Envoy's failure_mode_deny refuses.
    assert_eq!(status("unset").await, 500);

    // Envoy counted what Tollgate answered.
    assert_eq!(envoy.wait_stat("cluster.app.ratelimit.ok", 4).await, 4);
    assert_eq!(envoy.stat("cluster.app.ratelimit.over_limit").await, 2);
    assert_eq!(envoy.stat("cluster.app.ratelimit.error").await, 1);
    assert_eq!(envoy.stat("cluster.app.ratelimit.failure_mode_allowed").await, 0);
    assert_eq!(tollgate.metric("tollgate_failure_mode_allowed_total").await, 1);
    assert_eq!(tollgate.metric("tollgate_failure_mode_denied_total").await, 1);
    assert_eq!(tollgate.metric("tollgate_failure_mode_local_total").await, 3);

    // Redis back: decisions are counted there again.
    redis.restart();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    while redis.cli(&["DBSIZE"]).trim() == "0" {
        assert_eq!(status("open").await, 200);
        assert!(
            std::time::Instant::now() < deadline,
            "Tollgate never counted in Redis again"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}
