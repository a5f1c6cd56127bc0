//! The Redis link alone, over a real `redis-server`: it connects (also when Redis comes late), answers
//! a `PING` and counts its pool, with no script loaded and no decision made.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use tollgate_core::clock::SystemClock;
use tollgate_core::store::redis::RedisLink;
use tollgate_core::store::redis::RedisTarget;
use tollgate_core::store::redis::link::LinkOptions;

use crate::common::redis::{RedisServer, command_calls};
use crate::require_redis;

fn options(addr: &str, connections: usize) -> LinkOptions {
    LinkOptions {
        target: RedisTarget::parse(addr, "single", "tcp", "", "", false, false).expect("Redis target"),
        connections,
        deadline: Duration::from_secs(2),
        connect_timeout: Duration::from_secs(2),
        tls: None,
    }
}

/// Pings until the link answers, for at most 15 s.
async fn wait_for_pong(link: &RedisLink) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !link.ping().await {
        assert!(Instant::now() < deadline, "the link never answered a PING");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_link_pings_redis_and_counts_its_pool_without_a_script() {
    require_redis!();
    let redis = RedisServer::start();
    let stop = CancellationToken::new();
    let link = RedisLink::start(options(&redis.addr(), 3), Arc::new(SystemClock), stop.clone());
    wait_for_pong(&link).await;
    let counters = link.pool_counters().expect("a single node has pool counters");
    assert_eq!((counters.active, counters.total, counters.closed), (3, 3, 0));
    assert_eq!(link.stalled_connections(), 0);
    assert!(!link.is_cluster());
    let calls = command_calls(redis.port);
    assert!(calls.get("ping").copied().unwrap_or(0) >= 1, "{calls:?}");
    for script_command in ["function|load", "fcall", "evalsha", "eval", "script|load"] {
        assert!(
            !calls.contains_key(script_command),
            "the link sent {script_command}: {calls:?}"
        );
    }
    let functions = redis.cli(&["FUNCTION", "LIST"]);
    assert!(functions.trim().is_empty(), "no library loaded: {functions}");
    stop.cancel();
}

#[tokio::test]
async fn a_link_to_nothing_is_not_connected_then_connects_when_redis_comes() {
    require_redis!();
    let mut redis = RedisServer::start();
    let addr = redis.addr();
    redis.kill();
    let stop = CancellationToken::new();
    let link = RedisLink::start(options(&addr, 1), Arc::new(SystemClock), stop.clone());
    assert!(!link.ping().await, "no Redis: no PONG");
    assert_eq!(
        link.pool_counters().map(|c| (c.active, c.total)),
        Some((0, 0)),
        "not connected yet: an empty pool"
    );
    redis.restart();
    wait_for_pong(&link).await;
    stop.cancel();
}
