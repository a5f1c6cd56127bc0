//! `tollgate what-if` (the binary): logs with outcomes worked out by hand across window edges, the
//! same sequence sent to a live server agreeing request by request, bad lines, logs out of order, and
//! the HTML report opened in a real headless Chromium.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;

use serde_json::Value;
use tollgate_core::clock::ManualClock;

use crate::common::{TestServer, send_with_headers, store_under_test_is_redis};

/// 2026-12-05T12:00:00Z, a whole minute.
const T0: u64 = 1_796_472_000;

/// The rules' `proxy:` block: the client address alone.
const PROXY: &str = "proxy:\n  rate_limits: [{actions: [{remote_address: {}}]}]\n";

fn rules(dir: &Path, rule: &str) {
    std::fs::create_dir_all(dir).expect("dir");
    let text =
        format!("domain: api\n{PROXY}descriptors:\n  - key: remote_address\n    rate_limit: {{{rule}}}\n");
    std::fs::write(dir.join("api.yaml"), text).expect("rules");
}

/// A work folder with `current/` and `proposed/` rules, each one rule on the client address.
fn sides(current: &str, proposed: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    rules(&dir.path().join("current"), current);
    rules(&dir.path().join("proposed"), proposed);
    dir
}

/// Replaces the proposed rules of a work folder made by [`sides`] with the file `text`.
fn proposed_rules(dir: &Path, text: &str) {
    std::fs::write(dir.join("proposed/api.yaml"), text).expect("rules");
}

/// An NGINX `combined` line for `client` at `seconds` past [`T0`].
fn nginx_line(client: &str, seconds: u64) -> String {
    let stamp = {
        let output = Command::new("date")
            .args([
                "-u",
                "-d",
                &format!("@{}", T0 + seconds),
                "+%d/%b/%Y:%H:%M:%S +0000",
            ])
            .output()
            .expect("date");
        String::from_utf8(output.stdout).expect("utf-8").trim().to_owned()
    };
    format!("{client} - - [{stamp}] \"GET /orders HTTP/1.1\" 200 12 \"-\" \"curl/8\"\n")
}

fn what_if(dir: &Path, log: &str, extra: &[&str]) -> Output {
    let path = dir.join("access.log");
    std::fs::write(&path, log).expect("log");
    Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["what-if", "--current"])
        .arg(dir.join("current"))
        .arg("--proposed")
        .arg(dir.join("proposed"))
        .args(["--format", "nginx", "--domain", "api", "--json"])
        .arg(dir.join("report.json"))
        .args(extra)
        .arg(&path)
        .env_clear()
        .output()
        .expect("run what-if")
}

/// [`what_if`], which must succeed (its standard error shown if not).
fn replayed(dir: &Path, log: &str, extra: &[&str]) -> Output {
    let output = what_if(dir, log, extra);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

fn report(dir: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("report.json")).expect("report")).expect("JSON")
}

#[test]
fn hand_worked_outcomes_across_window_edges_for_each_algorithm() {
    // One client, requests at these seconds past a minute's start, across the edges of 60 s windows.
    let times = [0, 10, 20, 30, 59, 61, 62, 63, 95, 119, 121];
    // What each proposed rule, 3 a minute, refuses of them (the current rule, 100 a minute, none):
    // - fixed window: [0, 60) holds 5 requests (2 refused), [60, 120) 5 (2), [120, 180) 1: 4;
    // - sliding log, a request's entry leaving the window 60 s after it: 30 and 59 (0, 10, 20 in the
    //   window), 61 passes (0 left at 60), 62 and 63 (10, 20, 61), 95 passes (only 61), 119 passes,
    //   121 passes (61 left at 121): 4;
    // - token bucket, one token per 20 s, 3 at most: tokens before each request 3, 2.5, 2, 1.5, 1.95,
    //   1.05, 0.1 (refused), 0.15 (refused), 1.75, 1.95, 1.05: 2;
    // - GCRA, emission interval 20 s, tolerance 40 s: the same answers, 2.
    let cases = [
        ("algorithm: fixed_window", 4, "fixed window"),
        ("algorithm: sliding_log", 4, "sliding log"),
        ("algorithm: token_bucket", 2, "token bucket"),
        ("algorithm: gcra", 2, "GCRA"),
    ];
    for (algorithm, refused, what) in cases {
        let dir = sides(
            "unit: minute, requests_per_unit: 100",
            &format!("unit: minute, requests_per_unit: 3, {algorithm}"),
        );
        let log: String = times.iter().map(|s| nginx_line("192.0.2.7", *s)).collect();
        let output = replayed(dir.path(), &log, &[]);
        let report = report(dir.path());
        assert_eq!(report["requests"], times.len() as u64, "{what}");
        assert_eq!(report["current"]["refused"], 0, "{what}");
        assert_eq!(report["proposed"]["refused"], refused, "{what}: {report:#}");
        assert_eq!(report["newly_refused"]["requests"], refused, "{what}");
        assert_eq!(report["newly_refused"]["top"][0]["client"], "192.0.2.7", "{what}");
        assert_eq!(report["rules"][0]["peak_use"]["proposed"], 1.0, "{what}");
        let text = String::from_utf8_lossy(&output.stdout);
        assert!(
            text.contains(&format!("newly refused: {refused} requests from 1 clients")),
            "{text}"
        );
    }
}

/// The sequence a live server answered, request by request, for `rule`.
async fn live(rule: &str, sequence: &[(&str, u64)]) -> Vec<bool> {
    let clock = ManualClock::new(T0 * 1_000_000);
    let dir = tempfile::tempdir().expect("tempdir");
    rules(dir.path(), rule);
    let rules_dir = tempfile::tempdir().expect("tempdir");
    std::fs::copy(dir.path().join("api.yaml"), rules_dir.path().join("api.yaml")).expect("copy");
    let server = TestServer::start_with_clock(rules_dir, &[], Arc::new(clock.clone())).await;
    server.wait_ready().await;
    let mut refused = Vec::new();
    for (client, seconds) in sequence {
        clock.set_us((T0 + seconds) * 1_000_000);
        let headers = format!("X-Forwarded-For: {client}\r\n");
        let (status, _, _) = send_with_headers(server.http, "GET", "/forward-auth/api", &headers).await;
        assert!(status == 200 || status == 429, "{status}");
        refused.push(status == 429);
    }
    server.stop().await;
    refused
}

#[tokio::test]
async fn a_replay_answers_as_the_live_service_request_by_request() {
    if store_under_test_is_redis() {
        // The live side must run on the embedded store, on the test's clock.
        return;
    }
    // Two clients, bursts across window edges, some seconds apart and some in the same second.
    let mut sequence = Vec::new();
    for (i, seconds) in [
        0, 0, 1, 5, 5, 5, 29, 30, 31, 59, 60, 60, 61, 75, 89, 90, 91, 119, 120, 121, 150, 151,
    ]
    .into_iter()
    .enumerate()
    {
        let client = if i % 3 == 0 { "192.0.2.1" } else { "192.0.2.2" };
        sequence.push((client, seconds));
    }
    for rule in [
        "unit: minute, requests_per_unit: 4, algorithm: sliding_window",
        "unit: minute, requests_per_unit: 4, algorithm: token_bucket, burst: 3",
        "unit: minute, requests_per_unit: 4, algorithm: gcra",
        "unit: minute, requests_per_unit: 4, algorithm: sliding_log",
    ] {
        let expected = live(rule, &sequence).await;
        let dir = sides(rule, rule);
        let log: String = sequence.iter().map(|(c, s)| nginx_line(c, *s)).collect();
        let trace = dir.path().join("trace.jsonl");
        replayed(dir.path(), &log, &["--trace", trace.to_str().expect("path")]);
        let replayed: Vec<bool> = std::fs::read_to_string(&trace)
            .expect("trace")
            .lines()
            .map(|line| serde_json::from_str::<Value>(line).expect("JSON")["current"] == "refused")
            .collect();
        assert_eq!(replayed, expected, "{rule}");
        assert!(
            expected.iter().any(|r| *r) && expected.iter().any(|r| !*r),
            "{rule}: the sequence tests nothing"
        );
    }
}

#[test]
fn bad_lines_are_counted_and_strict_stops_at_the_first() {
    let dir = sides(
        "unit: minute, requests_per_unit: 100",
        "unit: minute, requests_per_unit: 1",
    );
    let log = format!(
        "{}garbage\n{}192.0.2.1 - - [yesterday] \"GET / HTTP/1.1\" 200 1 \"-\" \"-\"\n",
        nginx_line("192.0.2.1", 0),
        nginx_line("192.0.2.1", 1)
    );
    let output = replayed(dir.path(), &log, &[]);
    let report = report(dir.path());
    assert_eq!(
        (report["requests"].as_u64(), report["input"]["bad_lines"].as_u64()),
        (Some(2), Some(2))
    );
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        text.contains("2 lines not read (first: line 2: not NGINX's combined format"),
        "{text}"
    );
    let output = what_if(dir.path(), &log, &["--strict"]);
    assert!(!output.status.success());
    let error = String::from_utf8_lossy(&output.stderr);
    assert!(error.contains("line 2: not NGINX's combined format"), "{error}");
    assert!(
        !error.contains("garbage"),
        "the line's text stays out of messages: {error}"
    );
}

#[test]
fn a_log_out_of_order_is_sorted_within_the_window_and_refused_beyond_it() {
    let dir = sides(
        "unit: minute, requests_per_unit: 100",
        "unit: minute, requests_per_unit: 2, algorithm: fixed_window",
    );
    // Sorted, the second minute holds three requests: one refused. Shuffled by 5 s, the same.
    let sorted: String = [50, 55, 60, 61, 62]
        .iter()
        .map(|s| nginx_line("192.0.2.1", *s))
        .collect();
    let shuffled: String = [55, 50, 62, 60, 61]
        .iter()
        .map(|s| nginx_line("192.0.2.1", *s))
        .collect();
    for log in [&sorted, &shuffled] {
        replayed(dir.path(), log, &[]);
        assert_eq!(report(dir.path())["proposed"]["refused"], 1);
    }
    // 80 is replayed once 90 is read (5 s on); 61 then comes 19 s too late.
    let late: String = [50, 80, 90, 61]
        .iter()
        .map(|s| nginx_line("192.0.2.1", *s))
        .collect();
    let output = what_if(dir.path(), &late, &["--reorder-window", "5s"]);
    assert!(!output.status.success());
    let error = String::from_utf8_lossy(&output.stderr);
    assert!(
        error.contains("line 4: 19.000 s earlier than a line already replayed"),
        "{error}"
    );
}

#[test]
fn an_access_log_needs_a_domain_with_a_proxy_block_on_both_sides() {
    let dir = sides(
        "unit: minute, requests_per_unit: 100",
        "unit: minute, requests_per_unit: 1",
    );
    // The proposed rules without their proxy: block.
    proposed_rules(
        dir.path(),
        "domain: api\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: minute, requests_per_unit: 1}\n",
    );
    let output = what_if(dir.path(), &nginx_line("192.0.2.1", 0), &[]);
    assert!(!output.status.success());
    let error = String::from_utf8_lossy(&output.stderr);
    assert!(error.contains("domain 'api' has no proxy: block"), "{error}");
}

#[test]
fn each_side_makes_descriptors_with_its_own_proxy_block() {
    // The same limit, 2 a minute; the proposed proxy: block counts every client in one budget. Both
    // sides' blocks equal is the usual case (descriptors made once for both); here they differ.
    let dir = sides(
        "unit: minute, requests_per_unit: 2",
        "unit: minute, requests_per_unit: 2",
    );
    proposed_rules(
        dir.path(),
        "domain: api\nproxy:\n  rate_limits: [{actions: [{generic_key: {descriptor_value: everyone}}]}]\n\
         descriptors:\n  - key: generic_key\n    value: everyone\n    rate_limit: {unit: minute, requests_per_unit: 2}\n",
    );
    let log: String = ["192.0.2.1", "192.0.2.2", "192.0.2.3"]
        .iter()
        .flat_map(|client| [nginx_line(client, 1), nginx_line(client, 2)])
        .collect();
    replayed(dir.path(), &log, &[]);
    let report = report(dir.path());
    // Per client, two each pass; in one budget, the first two of six pass.
    assert_eq!(report["current"]["refused"], 0, "{report:#}");
    assert_eq!(report["proposed"]["refused"], 4, "{report:#}");
    assert_eq!(report["newly_refused"]["requests"], 4, "{report:#}");
}

/// Chromium from Debian's package, if installed (`scripts/test.sh` installs it); required with
/// `TOLLGATE_REQUIRE_CHROMIUM=1`.
fn chromium() -> Option<PathBuf> {
    let found = ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.exists());
    if found.is_none() {
        let required = std::env::var("TOLLGATE_REQUIRE_CHROMIUM").is_ok_and(|v| v == "1");
        assert!(
            !required,
            "chromium is not installed and TOLLGATE_REQUIRE_CHROMIUM=1"
        );
        eprintln!("skipping: chromium is not installed");
    }
    found
}

#[test]
fn the_html_report_renders_its_chart_in_a_real_browser() {
    let Some(chromium) = chromium() else {
        return;
    };
    let dir = sides(
        "unit: minute, requests_per_unit: 3",
        "unit: minute, requests_per_unit: 1, name: tight",
    );
    let log: String = (0..120)
        .map(|s| nginx_line(if s % 2 == 0 { "192.0.2.1" } else { "192.0.2.<b>" }, s))
        .collect();
    let log = log.replace("192.0.2.<b>", "192.0.2.2");
    let html = dir.path().join("report.html");
    replayed(dir.path(), &log, &["--html", html.to_str().expect("path")]);
    let profile = tempfile::tempdir().expect("profile");
    let dom = Command::new(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--dump-dom",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(format!("file://{}", html.display()))
        .output()
        .expect("run chromium");
    let dom = String::from_utf8_lossy(&dom.stdout);
    assert!(
        dom.contains("<svg id=\"refusals\""),
        "no chart in the rendered page: {dom:.2000}"
    );
    let series = dom.matches("<polyline class=\"series\"").count();
    assert_eq!(series, 2, "one line per rule and side that refused: {dom:.3000}");
    assert!(
        dom.contains("data-rule=\"api.remote_address (tight)\""),
        "{dom:.3000}"
    );
    assert!(
        dom.contains("<table id=\"clients\">") && dom.contains("192.0.2.1"),
        "{dom:.3000}"
    );
}

/// A server records what it decided (`TOLLGATE_DECISION_LOG`), hashed values hashed; the replay of
/// that log with the same rules refuses what the server refused.
#[tokio::test]
async fn the_decision_log_replays_what_the_server_decided() {
    if store_under_test_is_redis() {
        return;
    }
    let rules = "domain: app\ndescriptors:\n  - key: user\n    hash: true\n    rate_limit: {unit: hour, requests_per_unit: 2}\n  - key: plan\n    rate_limit: {unit: hour, requests_per_unit: 100}\n";
    let work = tempfile::tempdir().expect("tempdir");
    let log = work.path().join("decisions.jsonl");
    let env = [("TOLLGATE_DECISION_LOG", log.to_str().expect("path"))];
    let server = TestServer::start(&[("app.yaml", rules)], &env).await;
    let mut client = server.client().await;
    let mut refused = 0;
    for user in ["ada", "ada", "ada", "bob", "ada"] {
        let request = crate::common::wire_request("app", &[&[("user", user)], &[("plan", "gold")]]);
        let answer = client
            .should_rate_limit(request)
            .await
            .expect("answer")
            .into_inner();
        refused += u64::from(answer.overall_code == 2);
    }
    assert_eq!(refused, 2);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let text = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.lines().count() == 5 {
            break text;
        }
        assert!(std::time::Instant::now() < deadline, "the log holds {text:?}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    server.stop().await;
    assert!(
        !text.contains("ada") && !text.contains("bob"),
        "hashed values stay hashed: {text}"
    );
    assert!(text.contains("\"value\":\"gold\""), "{text}");
    let first: Value = serde_json::from_str(text.lines().next().expect("a line")).expect("JSON");
    assert_eq!(first["domain"], "app");
    for side in ["current", "proposed"] {
        let dir = work.path().join(side);
        std::fs::create_dir_all(&dir).expect("dir");
        std::fs::write(dir.join("app.yaml"), rules).expect("rules");
    }
    let output = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["what-if", "--format", "decisions", "--current"])
        .arg(work.path().join("current"))
        .arg("--proposed")
        .arg(work.path().join("proposed"))
        .arg("--json")
        .arg(work.path().join("report.json"))
        .arg(&log)
        .env_clear()
        .output()
        .expect("run what-if");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report = report(work.path());
    assert_eq!(
        (report["requests"].as_u64(), report["current"]["refused"].as_u64()),
        (Some(5), Some(2))
    );
}
