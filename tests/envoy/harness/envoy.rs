//! A real Envoy process: started from a bootstrap written into a temporary directory, its admin port
//! and listeners on free loopback ports (port 0, read back from the admin API), killed on drop.
//!
//! The binary is `TOLLGATE_ENVOY` (`scripts/test.sh` installs the pinned one with
//! `scripts/install-envoy.sh` and runs these tests in a pass of their own). Without it every test
//! skips, saying so on the terminal, unless `TOLLGATE_REQUIRE_ENVOY=1`, which fails them instead, as
//! `TOLLGATE_REQUIRE_REDIS` does for Redis. An `envoy` on the PATH is not picked up by itself, so that
//! `cargo test` (the test command's first pass) never runs these twice.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::Value;
use tempfile::TempDir;

use super::client::Client;
use crate::common::Guard;

/// How long Envoy may take to load its bootstrap and initialise its clusters.
const STARTUP: Duration = Duration::from_secs(30);

/// The Envoy binary, or `None` (after saying so once) when there is none and none is required.
pub fn binary() -> Option<PathBuf> {
    static FOUND: OnceLock<Option<PathBuf>> = OnceLock::new();
    FOUND
        .get_or_init(|| {
            let required = std::env::var("TOLLGATE_REQUIRE_ENVOY").is_ok_and(|v| v == "1");
            let Some(candidate) = std::env::var_os("TOLLGATE_ENVOY").map(PathBuf::from) else {
                assert!(!required, "TOLLGATE_REQUIRE_ENVOY=1 but TOLLGATE_ENVOY is not set");
                // Straight to the terminal, past the test harness' capture: a skip must be seen.
                let _ = writeln!(
                    std::io::stderr(),
                    "\ntests/envoy: SKIPPED, TOLLGATE_ENVOY is not set. scripts/test.sh runs them in a pass of \
                     their own; to run them here: TOLLGATE_ENVOY=$(scripts/install-envoy.sh) cargo test --test envoy\n"
                );
                return None;
            };
            let runs = Command::new(&candidate)
                .arg("--version")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            // Set but broken is a mistake, required or not.
            assert!(runs, "TOLLGATE_ENVOY={} does not run", candidate.display());
            Some(candidate)
        })
        .clone()
}

/// Skips the calling test (returns early) when Envoy is not available and not required.
#[macro_export]
macro_rules! require_envoy {
    () => {
        if $crate::harness::envoy::binary().is_none() {
            return;
        }
    };
}

/// A running Envoy.
pub struct Envoy {
    _child: Guard,
    /// The admin listener's client.
    client: Client,
    dir: TempDir,
}

impl Envoy {
    /// Starts Envoy with this bootstrap (JSON; `@DIR@` stands for the directory it runs in) and waits
    /// until it is ready (every cluster initialised, listeners bound).
    pub async fn start(bootstrap: &Value) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("bootstrap.json");
        let text = serde_json::to_string_pretty(bootstrap).expect("JSON");
        let text = text.replace("@DIR@", &dir.path().to_string_lossy());
        std::fs::write(&path, text).expect("write bootstrap");
        Self::start_file(&path, dir).await
    }

    /// Starts Envoy with a bootstrap file as it is (YAML or JSON, by its extension); `dir` holds
    /// whatever the file refers to and lives as long as the process.
    pub async fn start_file(bootstrap: &Path, dir: TempDir) -> Self {
        let binary = binary().expect("an Envoy binary (require_envoy! first)");
        let admin_file = dir.path().join("admin-address");
        let log = dir.path().join("envoy.log");
        let child = Command::new(binary)
            .arg("-c")
            .arg(bootstrap)
            // Several Envoys run at once: no shared memory between them.
            .arg("--disable-hot-restart")
            .arg("--admin-address-path")
            .arg(&admin_file)
            .args(["--concurrency", "1", "--log-level", "info", "--log-path"])
            .arg(&log)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn envoy");
        let mut child = Guard(child);
        let deadline = Instant::now() + STARTUP;
        let admin = loop {
            if let Ok(text) = std::fs::read_to_string(&admin_file)
                && let Ok(addr) = text.trim().parse::<SocketAddr>()
            {
                break addr;
            }
            check_alive(&mut child, &log, deadline);
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let client = Client::new(admin);
        loop {
            if let Ok(reply) = client.try_send("GET", "/ready", &[]).await
                && reply.body.trim() == "LIVE"
            {
                break;
            }
            check_alive(&mut child, &log, deadline);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Self {
            _child: child,
            client,
            dir,
        }
    }

    /// The body of an admin endpoint.
    pub async fn admin_get(&self, path: &str) -> String {
        let reply = self.client.get(path, &[]).await;
        assert_eq!(reply.status, 200, "admin {path}: {reply:?}");
        reply.body
    }

    /// The address a listener is bound to.
    pub async fn listener(&self, name: &str) -> SocketAddr {
        let body = self.admin_get("/listeners?format=json").await;
        let listeners: Value = serde_json::from_str(&body).expect("listeners JSON");
        let found = listeners["listener_statuses"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|l| l["name"] == name)
            .unwrap_or_else(|| panic!("no listener {name}: {body}"));
        let socket = &found["local_address"]["socket_address"];
        let ip = socket["address"].as_str().expect("address");
        let port = socket["port_value"].as_u64().expect("port");
        // A listener on every interface is reached on loopback.
        let ip = if ip == "0.0.0.0" { "127.0.0.1" } else { ip };
        format!("{ip}:{port}").parse().expect("listener address")
    }

    /// Every counter and gauge, by name.
    pub async fn stats(&self) -> BTreeMap<String, u64> {
        let body = self.admin_get("/stats").await;
        body.lines()
            .filter_map(|line| {
                let (name, value) = line.split_once(": ")?;
                Some((name.to_owned(), value.trim().parse().ok()?))
            })
            .collect()
    }

    /// One counter or gauge; 0 when Envoy has not created it (it creates some on first use).
    pub async fn stat(&self, name: &str) -> u64 {
        self.stats().await.get(name).copied().unwrap_or(0)
    }

    /// The health flags of each host of `cluster`, as `/clusters` lists them (`healthy`, or the
    /// failures, such as `/failed_active_hc`).
    pub async fn hosts(&self, cluster: &str) -> BTreeMap<String, String> {
        let body = self.admin_get("/clusters").await;
        let prefix = format!("{cluster}::");
        body.lines()
            .filter_map(|line| {
                let rest = line.strip_prefix(&prefix)?;
                let (host, flags) = rest.split_once("::health_flags::")?;
                Some((host.to_owned(), flags.to_owned()))
            })
            .collect()
    }

    /// Waits until Envoy's active health check sees `host` of `cluster` as healthy (`true`) or not.
    pub async fn wait_health(&self, cluster: &str, host: SocketAddr, healthy: bool, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let hosts = self.hosts(cluster).await;
            if hosts
                .get(&host.to_string())
                .is_some_and(|flags| (flags == "healthy") == healthy)
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{cluster}: {host} not {} within {within:?}: {hosts:?}",
                if healthy { "healthy" } else { "unhealthy" }
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until a counter reaches `at_least` (Envoy updates some counters after the response, on
    /// the stream's end).
    pub async fn wait_stat(&self, name: &str, at_least: u64) -> u64 {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let value = self.stat(name).await;
            if value >= at_least {
                return value;
            }
            assert!(
                Instant::now() < deadline,
                "{name} stayed at {value}, below {at_least}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Envoy's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("envoy.log")).unwrap_or_default()
    }
}

/// Fails the test, with Envoy's log, if Envoy exited or the startup bound passed.
fn check_alive(child: &mut Guard, log: &Path, deadline: Instant) {
    let exited = child.0.try_wait().expect("try_wait");
    if exited.is_some() || Instant::now() >= deadline {
        let log = std::fs::read_to_string(log).unwrap_or_default();
        panic!(
            "Envoy did not become ready (exit: {exited:?}); its log:\n{}",
            shown(&log)
        );
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "Envoy's log, warnings and the last lines:\n{}",
                shown(&self.log())
            );
        }
    }
}

/// What of Envoy's log helps with a failure: its warnings and errors, and its last 30 lines (not the
/// inventory of extensions it starts with).
fn shown(log: &str) -> String {
    let lines: Vec<&str> = log
        .lines()
        .filter(|line| !line.contains("server.cc:467]"))
        .collect();
    let tail = lines.len().saturating_sub(30);
    lines
        .iter()
        .enumerate()
        .filter(|(at, line)| *at >= tail || !line.contains("][info]["))
        .map(|(_, line)| *line)
        .collect::<Vec<_>>()
        .join("\n")
}
