//! Rules reload while serving: every way a rules directory changes is picked up within about a second,
//! and a broken update keeps the previous rules.

use std::path::Path;
use std::time::Duration;

use tollgate::proto::rls::rate_limit_response::Code;

use crate::common::{TestServer, wire_request};

fn rules(limit: u32) -> String {
    format!(
        "domain: live\ndescriptors:\n  - key: k\n    rate_limit: {{unit: hour, requests_per_unit: {limit}}}\n"
    )
}

/// The limit the server currently applies to a fresh key, or `None` when no rule matches.
async fn current_limit(server: &TestServer, probe: &str) -> Option<u32> {
    let mut client = server.client().await;
    let response = client
        .should_rate_limit(wire_request("live", &[&[("k", probe)]]))
        .await
        .expect("answer");
    let status = &response.into_inner().statuses[0];
    status.current_limit.as_ref().map(|l| l.requests_per_unit)
}

/// Polls until the server applies `expected` (bounded: reloads are polled every 100 ms in tests).
async fn wait_for_limit(server: &TestServer, expected: Option<u32>) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let mut probe = 0;
    loop {
        probe += 1;
        if current_limit(server, &format!("probe-{probe}")).await == expected {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "limit never became {expected:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn in_place_write_and_delete_are_picked_up() {
    let server = TestServer::start(&[("live.yaml", &rules(5))], &[]).await;
    wait_for_limit(&server, Some(5)).await;
    std::fs::write(server.dir.path().join("live.yaml"), rules(7)).expect("rewrite");
    wait_for_limit(&server, Some(7)).await;
    std::fs::remove_file(server.dir.path().join("live.yaml")).expect("delete");
    wait_for_limit(&server, None).await;
    server.stop().await;
}

#[tokio::test]
async fn broken_update_keeps_the_previous_rules_until_fixed() {
    let server = TestServer::start(&[("live.yaml", &rules(5))], &[]).await;
    let path = server.dir.path().join("live.yaml");
    std::fs::write(
        &path,
        "domain: live\ndescriptors:\n  - key: k\n    ratelimit: {}\n",
    )
    .expect("break");
    // Give the reloader several polls to (wrongly) drop the rules.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(current_limit(&server, "after-broken").await, Some(5));
    std::fs::write(&path, rules(9)).expect("fix");
    wait_for_limit(&server, Some(9)).await;
    server.stop().await;
}

/// Lays out a directory the way the kubelet mounts a ConfigMap volume.
fn configmap_version(dir: &Path, version: &str, text: &str) {
    let data = dir.join(version);
    std::fs::create_dir(&data).expect("version dir");
    std::fs::write(data.join("live.yaml"), text).expect("write");
    // The kubelet swaps `..data` atomically: a new symlink renamed over the old one.
    let tmp = dir.join("..data_tmp");
    std::os::unix::fs::symlink(version, &tmp).expect("symlink");
    std::fs::rename(&tmp, dir.join("..data")).expect("swap");
}

#[tokio::test]
async fn kubernetes_configmap_symlink_swap_is_picked_up() {
    let dir = tempfile::tempdir().expect("tempdir");
    configmap_version(dir.path(), "..2026_11_29_12_00_00.1", &rules(5));
    std::os::unix::fs::symlink("..data/live.yaml", dir.path().join("live.yaml")).expect("visible link");
    let server = TestServer::start_in(dir, &[]).await;
    // The domain is loaded once, through the visible link, not again through `..data`.
    wait_for_limit(&server, Some(5)).await;
    configmap_version(server.dir.path(), "..2026_11_29_12_05_00.2", &rules(8));
    wait_for_limit(&server, Some(8)).await;
    server.stop().await;
}

#[tokio::test]
async fn counters_survive_a_reload() {
    let server = TestServer::start(&[("live.yaml", &rules(2))], &[]).await;
    let mut client = server.client().await;
    for _ in 0..2 {
        client
            .should_rate_limit(wire_request("live", &[&[("k", "same")]]))
            .await
            .expect("answer");
    }
    std::fs::write(server.dir.path().join("live.yaml"), rules(3)).expect("raise the limit");
    wait_for_limit(&server, Some(3)).await;
    // Two of three already used in this window.
    let response = client
        .should_rate_limit(wire_request("live", &[&[("k", "same")]]))
        .await
        .expect("answer");
    let response = response.into_inner();
    assert_eq!(response.overall_code, Code::Ok as i32);
    assert_eq!(response.statuses[0].limit_remaining, 0);
    server.stop().await;
}
