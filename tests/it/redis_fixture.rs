//! The Redis fixtures themselves work: a standalone server restarts on its port, a cluster covers every
//! slot. (If these fail, every Redis test after them is meaningless.)

use crate::common::redis::{RedisCluster, RedisServer, command_calls};
use crate::require_redis;

#[test]
fn standalone_server_answers_and_restarts_on_its_port() {
    require_redis!();
    let mut server = RedisServer::start();
    assert_eq!(server.cli(&["SET", "k", "v"]).trim(), "OK");
    server.restart();
    assert_eq!(server.cli(&["PING"]).trim(), "PONG");
    assert_eq!(
        server.cli(&["GET", "k"]).trim(),
        "",
        "no persistence: a restart loses state"
    );
    assert!(command_calls(server.port).contains_key("ping"));
}

#[test]
fn cluster_of_three_masters_covers_every_slot() {
    require_redis!();
    let cluster = RedisCluster::start();
    let info = cluster.nodes[0].cli(&["CLUSTER", "INFO"]);
    assert!(info.contains("cluster_slots_assigned:16384"), "{info}");
    assert_eq!(cluster.addrs().split(',').count(), 3);
}
