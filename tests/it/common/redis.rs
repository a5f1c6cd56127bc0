//! Real `redis-server` processes for tests: one per test on a free loopback port, or a local 3-master
//! cluster. Never a mock. Stopped (killed and reaped) on drop.
//!
//! When `TOLLGATE_REQUIRE_REDIS=1` (set by `scripts/test.sh`), a missing `redis-server` fails the
//! test instead of skipping it, so a broken install cannot turn the suite silently green.

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tempfile::TempDir;
use tokio_util::sync::CancellationToken;
use tollgate_core::clock::SystemClock;
use tollgate_core::store::redis::{RedisOptions, RedisStore, RedisTarget};

/// Whether `redis-server` can be run here. Panics if it cannot but the run requires it.
pub fn redis_available() -> bool {
    let found = Command::new("redis-server")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_ok();
    if !found && std::env::var("TOLLGATE_REQUIRE_REDIS").is_ok_and(|v| v == "1") {
        panic!("TOLLGATE_REQUIRE_REDIS=1 but redis-server is not installed (scripts/test.sh installs it)");
    }
    if !found {
        eprintln!("skipping: redis-server is not installed");
    }
    found
}

/// Skips the calling test (returns early) when Redis is not available and not required.
#[macro_export]
macro_rules! require_redis {
    () => {
        if !$crate::common::redis::redis_available() {
            return;
        }
    };
}

/// A free loopback port (bound and released; the small race is retried by the callers).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// One `redis-server` process.
pub struct RedisServer {
    pub port: u16,
    dir: TempDir,
    extra: Vec<String>,
    child: Option<Child>,
}

impl RedisServer {
    /// Starts a standalone server on a free port.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Starts a server with extra `redis-server` arguments (e.g. `--cluster-enabled yes`).
    pub fn start_with(extra: &[&str]) -> Self {
        for _ in 0..5 {
            let mut server = Self {
                port: free_port(),
                dir: tempfile::tempdir().expect("tempdir"),
                extra: extra.iter().map(|s| s.to_string()).collect(),
                child: None,
            };
            if server.spawn() {
                return server;
            }
        }
        panic!("could not start redis-server after 5 attempts");
    }

    fn spawn(&mut self) -> bool {
        let mut command = Command::new("redis-server");
        command
            .args([
                "--port",
                &self.port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .args(["--dir", &self.dir.path().to_string_lossy()])
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let Ok(child) = command.spawn() else { return false };
        self.child = Some(child);
        if wait_for_pong(self.port, Duration::from_secs(5)) {
            return true;
        }
        self.kill();
        false
    }

    /// `host:port`, envoyproxy/ratelimit's `REDIS_URL` form.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// A `redis://` URL.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The server's working directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Kills the server (SIGKILL), as a crash would.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops the server without closing anything (SIGSTOP), as a frozen host would: connections stay
    /// open, what is sent to it waits in its sockets, and runs once it is [`RedisServer::resume`]d.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Lets a [`RedisServer::pause`]d server run again (SIGCONT).
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().expect("the server runs").id().to_string();
        let status = std::process::Command::new("kill")
            .args([signal, &pid])
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill {signal} {pid}");
    }

    /// Starts the server again on the same port (after [`RedisServer::kill`]).
    pub fn restart(&mut self) {
        self.kill();
        let deadline = Instant::now() + Duration::from_secs(5);
        while !self.spawn() {
            assert!(
                Instant::now() < deadline,
                "redis-server did not restart on port {}",
                self.port
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Runs `redis-cli -p PORT ARGS...` and returns its stdout.
    pub fn cli(&self, args: &[&str]) -> String {
        cli(self.port, args)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Runs `redis-cli` against a port.
pub fn cli(port: u16, args: &[&str]) -> String {
    let output = Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(args)
        .output()
        .expect("redis-cli runs");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn wait_for_pong(port: u16, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if cli(port, &["PING"]).trim() == "PONG" {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// Total calls of each command since start, from `INFO commandstats` (`fcall` → count).
pub fn command_calls(port: u16) -> std::collections::HashMap<String, u64> {
    cli(port, &["INFO", "commandstats"])
        .lines()
        .filter_map(|line| {
            let rest = line.strip_prefix("cmdstat_")?;
            let (name, stats) = rest.split_once(':')?;
            let calls = stats
                .split(',')
                .find_map(|kv| kv.strip_prefix("calls="))?
                .parse()
                .ok()?;
            Some((name.to_owned(), calls))
        })
        .collect()
}

/// A [`RedisStore`] on `url` (`kind` as `REDIS_TYPE`), once it answers. Cancel the token to stop its
/// background connector.
pub async fn connected_store(url: &str, kind: &str) -> (Arc<RedisStore>, CancellationToken) {
    let target = RedisTarget::parse(url, kind, "", "", "", false, false).expect("Redis target");
    let options = RedisOptions {
        target,
        connections: 1,
        deadline: Duration::from_secs(2),
        connect_timeout: Duration::from_secs(2),
        tls: None,
        expiration_jitter_max_secs: 0,
        pipeline_fixed_windows: true,
        pipeline_window: Duration::ZERO,
        pipeline_limit: 0,
        traces: false,
    };
    let stop = CancellationToken::new();
    let store = RedisStore::start(options, Arc::new(SystemClock), stop.clone());
    let deadline = Instant::now() + Duration::from_secs(15);
    while !store.ping().await {
        assert!(Instant::now() < deadline, "never connected to {url}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (store, stop)
}

/// A local Redis Cluster of three masters, every slot assigned, each master with `replicas` replicas.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Three masters, no replicas.
    pub fn start() -> Self {
        Self::start_with_replicas(0)
    }

    /// Three masters with `replicas` replicas each (a master killed is replaced by its replica).
    pub fn start_with_replicas(replicas: usize) -> Self {
        let nodes: Vec<RedisServer> = (0..3 * (1 + replicas))
            .map(|_| RedisServer::start_with(&["--cluster-enabled", "yes", "--cluster-node-timeout", "2000"]))
            .collect();
        let mut args: Vec<String> = vec!["--cluster".into(), "create".into()];
        args.extend(nodes.iter().map(RedisServer::addr));
        args.extend([
            "--cluster-replicas".into(),
            replicas.to_string(),
            "--cluster-yes".into(),
        ]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let output = Command::new("redis-cli")
            .args(&args)
            .output()
            .expect("redis-cli --cluster create");
        assert!(
            output.status.success(),
            "cluster create failed: {}",
            String::from_utf8_lossy(&output.stdout)
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        for node in &nodes {
            while !node.cli(&["CLUSTER", "INFO"]).contains("cluster_state:ok") {
                assert!(Instant::now() < deadline, "cluster never became ok");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        // A replica that never synced cannot take over from its master.
        for node in &nodes {
            while node.cli(&["ROLE"]).lines().next() == Some("slave")
                && !node
                    .cli(&["INFO", "replication"])
                    .contains("master_link_status:up")
            {
                assert!(Instant::now() < deadline, "a replica never synced");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Self { nodes }
    }

    /// Ports of the nodes that are masters now (a dead node is not asked).
    pub fn master_ports(&self) -> Vec<u16> {
        self.nodes
            .iter()
            .filter(|node| node.child.is_some())
            .filter(|node| node.cli(&["ROLE"]).lines().next() == Some("master"))
            .map(|node| node.port)
            .collect()
    }

    /// Seed addresses, comma-separated (envoyproxy/ratelimit's cluster `REDIS_URL` form).
    pub fn addrs(&self) -> String {
        self.nodes
            .iter()
            .map(RedisServer::addr)
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// The PEM files a TLS sentinel setup serves with.
pub struct SentinelTls {
    pub cert: String,
    pub key: String,
    pub ca: String,
}

/// A master, one replica and one sentinel (quorum 1) watching them as `mymaster`, with failover
/// timings short enough for a test.
pub struct RedisSentinel {
    pub master: RedisServer,
    pub replica: RedisServer,
    /// The sentinel's own `requirepass`, if any.
    pub password: Option<String>,
    pub port: u16,
    /// The sentinel's TLS port, with [`RedisSentinel::start_tls`].
    pub tls_port: Option<u16>,
    _dir: TempDir,
    child: Child,
}

impl RedisSentinel {
    pub fn start() -> Self {
        Self::start_with_password(None)
    }

    /// A sentinel that requires `password` from its clients (`requirepass` in sentinel.conf).
    pub fn start_with_password(password: Option<&str>) -> Self {
        Self::start_full(password, None)
    }

    /// Master, replica and sentinel each also serving TLS with `tls` (certificate, key, CA files),
    /// replicating and monitoring over TLS: the sentinel names the master's TLS port.
    pub fn start_tls(tls: &SentinelTls) -> Self {
        Self::start_full(None, Some(tls))
    }

    fn start_full(password: Option<&str>, tls: Option<&SentinelTls>) -> Self {
        let tls_args = |port: u16| -> Vec<String> {
            let Some(tls) = tls else { return Vec::new() };
            [
                "--tls-port",
                &port.to_string(),
                "--tls-cert-file",
                &tls.cert,
                "--tls-key-file",
                &tls.key,
                "--tls-ca-cert-file",
                &tls.ca,
                "--tls-auth-clients",
                "no",
                "--tls-replication",
                "yes",
            ]
            .map(str::to_owned)
            .to_vec()
        };
        let master_tls = free_port();
        let master_args = tls_args(master_tls);
        let master_args: Vec<&str> = master_args.iter().map(String::as_str).collect();
        let master = RedisServer::start_with(&master_args);
        // Over TLS the replica and the sentinel reach the master on its TLS port.
        let master_port = if tls.is_some() { master_tls } else { master.port };
        let mut replica_args = vec![
            "--replicaof".to_owned(),
            "127.0.0.1".to_owned(),
            master_port.to_string(),
        ];
        replica_args.extend(tls_args(free_port()));
        let replica_args: Vec<&str> = replica_args.iter().map(String::as_str).collect();
        let replica = RedisServer::start_with(&replica_args);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !replica
            .cli(&["INFO", "replication"])
            .contains("master_link_status:up")
        {
            assert!(Instant::now() < deadline, "the replica never synced");
            std::thread::sleep(Duration::from_millis(50));
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let port = free_port();
        let tls_port = free_port();
        let conf = dir.path().join("sentinel.conf");
        let tls_conf = tls_args(tls_port)
            .chunks(2)
            .map(|pair| format!("{} {}\n", pair[0].trim_start_matches("--"), pair[1]))
            .collect::<String>();
        std::fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\ndir {}\nsentinel monitor mymaster 127.0.0.1 {master_port} 1\n\
                 sentinel down-after-milliseconds mymaster 500\nsentinel failover-timeout mymaster 2000\n{}{tls_conf}",
                dir.path().display(),
                password.map(|p| format!("requirepass {p}\n")).unwrap_or_default()
            ),
        )
        .expect("sentinel.conf");
        let child = Command::new("redis-server")
            .arg(&conf)
            .arg("--sentinel")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server --sentinel");
        let sentinel = Self {
            master,
            replica,
            password: password.map(str::to_owned),
            port,
            tls_port: tls.map(|_| tls_port),
            _dir: dir,
            child,
        };
        while sentinel.master_port() != Some(master_port) {
            assert!(Instant::now() < deadline, "the sentinel never saw the master");
            std::thread::sleep(Duration::from_millis(50));
        }
        sentinel
    }

    /// The sentinel `REDIS_URL` through its TLS port (with [`RedisSentinel::start_tls`]).
    pub fn tls_url(&self) -> String {
        format!("mymaster,127.0.0.1:{}", self.tls_port.expect("a TLS sentinel"))
    }

    /// envoyproxy/ratelimit's sentinel `REDIS_URL`: `master_name,sentinel_host:port`.
    pub fn url(&self) -> String {
        format!("mymaster,127.0.0.1:{}", self.port)
    }

    /// The master's port as the sentinel reports it now.
    pub fn master_port(&self) -> Option<u16> {
        let mut args = Vec::new();
        if let Some(password) = &self.password {
            args.extend(["--no-auth-warning", "-a", password.as_str()]);
        }
        args.extend(["SENTINEL", "get-master-addr-by-name", "mymaster"]);
        let reply = cli(self.port, &args);
        reply.lines().nth(1)?.trim().parse().ok()
    }
}

impl Drop for RedisSentinel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
