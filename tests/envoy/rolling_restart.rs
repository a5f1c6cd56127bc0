//! A rolling restart of two Tollgate replicas (on one Redis) behind one Envoy cluster, under steady
//! load: each replica in turn gets SIGTERM, drains (NOT_SERVING at once, which Envoy's health check sees
//! and stops sending it calls; answering what still comes for `DRAIN_PERIOD`; then GOAWAY, the calls in
//! flight finished, exit 0), and starts again on its port. Not one request may fail, and not one may be
//! let through by Envoy's failure mode (it is open here, so any failed call would show as one), and
//! Redis must hold exactly the count of the requests Envoy let through.
//!
//! The one timing assumption is the deployment's own: the drain period (4 s) is longer than Envoy
//! takes to see NOT_SERVING (a health check every 100 ms, one failure enough); the test fails plainly
//! if Envoy has not seen it within 3 s.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;

use crate::common::redis::RedisServer;
use crate::harness::bootstrap::{
    bootstrap, health_check, rate_limit_filter, request_header, route, tollgate_cluster,
};
use crate::harness::client::Client;
use crate::harness::envoy::Envoy;
use crate::harness::tollgate::Tollgate;
use crate::{require_envoy, require_redis};

const RULES: &str = r#"
domain: roll
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1000000}
"#;

/// What the load saw: answers by status, and transport failures.
#[derive(Default)]
struct Seen {
    statuses: BTreeMap<u16, u64>,
    failures: Vec<String>,
}

/// Callers sending requests one after another, a few milliseconds apart, until stopped.
struct Load {
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Seen>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    fn start(client: &Client, callers: usize) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(Seen::default()));
        let tasks = (0..callers)
            .map(|caller| {
                let (client, stop, seen) = (client.clone(), Arc::clone(&stop), Arc::clone(&seen));
                tokio::spawn(async move {
                    let user = format!("user-{caller}");
                    while !stop.load(Ordering::Relaxed) {
                        let answer = client.try_send("GET", "/", &[("x-user", &user)]).await;
                        {
                            let mut seen = seen.lock().expect("lock");
                            match answer {
                                Ok(reply) => *seen.statuses.entry(reply.status).or_default() += 1,
                                Err(error) => seen.failures.push(error),
                            }
                        }
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                })
            })
            .collect();
        Self { stop, seen, tasks }
    }

    /// How many answers so far.
    fn answered(&self) -> u64 {
        self.seen.lock().expect("lock").statuses.values().sum()
    }

    /// Waits until `more` requests were answered after now.
    async fn wait_for(&self, more: u64) {
        let target = self.answered() + more;
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while self.answered() < target {
            assert!(std::time::Instant::now() < deadline, "the load stalled");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn stop(self) -> Seen {
        self.stop.store(true, Ordering::Relaxed);
        for task in self.tasks {
            task.await.expect("caller");
        }
        Arc::try_unwrap(self.seen)
            .ok()
            .expect("callers done")
            .into_inner()
            .expect("lock")
    }
}

#[tokio::test]
async fn a_rolling_restart_under_load_fails_no_request_and_lets_none_through_unchecked() {
    require_envoy!();
    require_redis!();
    let redis = RedisServer::start();
    let url = redis.url();
    let env = [
        ("REDIS_URL", url.as_str()),
        ("TOLLGATE_DRAIN_PERIOD", "4s"),
        // A debug build's Redis call on a busy machine may take longer than the default 20 ms.
        ("TOLLGATE_REDIS_DEADLINE", "2s"),
        ("LOG_LEVEL", "info"),
    ];
    let rules = tempfile::tempdir().expect("tempdir");
    std::fs::write(rules.path().join("roll.yaml"), RULES).expect("write rules");
    let mut replicas = Vec::new();
    for _ in 0..2 {
        let replica = Tollgate::start_in(rules.path(), "127.0.0.1:0", &env).await;
        replica.wait_ready().await;
        replicas.push(replica);
    }
    let hosts: Vec<_> = replicas.iter().map(Tollgate::grpc).collect();
    let envoy = Envoy::start(&bootstrap(
        vec![rate_limit_filter("roll", json!({"failure_mode_deny": false}))],
        vec![route(
            "/",
            "app",
            json!([{"actions": [request_header("x-user", "user")]}]),
        )],
        &[("app", "upstream\n")],
        vec![tollgate_cluster(&hosts, health_check("0.1s"))],
    ))
    .await;
    for host in &hosts {
        envoy
            .wait_health("tollgate", *host, true, Duration::from_secs(10))
            .await;
    }
    let load = Load::start(&Client::new(envoy.listener("ingress").await), 4);
    load.wait_for(100).await;

    for (at, host) in hosts.iter().copied().enumerate() {
        let replica = replicas.remove(at);
        replica.served.signal_term();
        // Envoy sees NOT_SERVING and stops sending calls there, well within the drain period.
        envoy
            .wait_health("tollgate", host, false, Duration::from_secs(3))
            .await;
        load.wait_for(50).await;
        let (code, log) = replica.served.wait_exit_logged().await;
        assert_eq!(code, Some(0), "a clean exit after the drain");
        assert!(
            log.iter()
                .any(|l| l.contains("reporting NOT_SERVING, then draining")),
            "{log:?}"
        );
        load.wait_for(50).await;
        let restarted = Tollgate::start_in(rules.path(), &host.to_string(), &env).await;
        envoy
            .wait_health("tollgate", host, true, Duration::from_secs(10))
            .await;
        replicas.insert(at, restarted);
        load.wait_for(100).await;
    }
    let seen = load.stop().await;

    assert!(seen.failures.is_empty(), "requests failed: {:?}", seen.failures);
    let ok = seen.statuses.get(&200).copied().unwrap_or(0);
    assert_eq!(
        seen.statuses,
        BTreeMap::from([(200, ok)]),
        "every request answered 200"
    );
    assert_eq!(envoy.wait_stat("cluster.app.ratelimit.ok", ok).await, ok);
    assert_eq!(envoy.stat("cluster.app.ratelimit.error").await, 0);
    assert_eq!(envoy.stat("cluster.app.ratelimit.failure_mode_allowed").await, 0);
    // Every request Envoy let through was counted in Redis once: none lost, none twice.
    let counted: u64 = redis
        .cli(&["--no-raw", "KEYS", "*"])
        .lines()
        .filter_map(|line| {
            line.split_once(") ")
                .map(|(_, key)| key.trim_matches('"').to_owned())
        })
        .map(|key| {
            redis
                .cli(&["GET", &key])
                .trim()
                .parse::<u64>()
                .expect("a counter")
        })
        .sum();
    assert_eq!(counted, ok);
}
