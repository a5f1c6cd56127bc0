//! `tollgate serve` (the debug binary cargo built) over a rules directory of the test's, as a child
//! process on free loopback ports (or the gRPC port a restart reuses), with its metrics at hand.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::common::http;
use crate::common::process::{Served, serve_args_at};

/// A running `tollgate serve` and the rules it serves.
pub struct Tollgate {
    pub served: Served,
    /// The rules directory, when it is the test's own.
    _owned: Option<TempDir>,
}

impl Tollgate {
    /// Serves these rules files (name, text) with this environment, every port free.
    pub async fn start(files: &[(&str, &str)], env: &[(&str, &str)]) -> Self {
        let rules = tempfile::tempdir().expect("tempdir");
        for (name, text) in files {
            std::fs::write(rules.path().join(name), text).expect("write rules");
        }
        let mut tollgate = Self::start_in(rules.path(), "127.0.0.1:0", env).await;
        tollgate._owned = Some(rules);
        tollgate
    }

    /// Serves the rules in `dir` with gRPC on `grpc` (a restart passes the address it had).
    pub async fn start_in(dir: &Path, grpc: &str, env: &[(&str, &str)]) -> Self {
        let dir = dir.to_string_lossy().into_owned();
        let served = Served::start(&serve_args_at(&dir, grpc), env).await;
        Self { served, _owned: None }
    }

    /// The gRPC address Envoy is to call.
    pub fn grpc(&self) -> SocketAddr {
        self.served.grpc
    }

    /// The sum of every sample of `name` in `/metrics` (all label sets), 0 when there is none.
    pub async fn metric(&self, name: &str) -> u64 {
        let (_, text) = http(self.served.debug, "GET", "/metrics", "").await;
        metric_sum(&text, name)
    }

    /// Waits until `/healthcheck` answers 200 (rules loaded, the store answered once).
    pub async fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(15);
        while http(self.served.http, "GET", "/healthcheck", "").await.0 != 200 {
            assert!(Instant::now() < deadline, "Tollgate never became ready");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The log lines so far.
    pub fn log(&mut self) -> Vec<String> {
        self.served.log.extend(self.served.stderr.try_iter());
        self.served.log.clone()
    }
}

/// The sum of every sample of the metric `name` (`name 3` or `name{labels} 3`) in a Prometheus text.
pub fn metric_sum(text: &str, name: &str) -> u64 {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let rest = line.strip_prefix(name)?;
            let value = match rest.as_bytes().first() {
                Some(b'{') => rest.rsplit_once('}')?.1,
                Some(b' ') => rest,
                _ => return None,
            };
            value.trim().parse::<f64>().ok()
        })
        .sum::<f64>() as u64
}
