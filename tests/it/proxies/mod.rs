//! NGINX, Caddy and HAProxy in front of a real Tollgate (the `tollgate` binary, on both stores), each
//! configured by its file in `examples/` with only its ports (and, for the fail-closed twin, the
//! documented lines) changed, and a small application behind it. Each proxy runs the same scenario
//! ([`scenario`]): the limit and no more, clients apart, a forged `X-Forwarded-For`, a body that stays
//! with the application, shadow mode, Tollgate killed (fail open and fail closed) and back.
//!
//! The proxies come from Debian's packages, which `scripts/test.sh` installs; without them these
//! tests skip, loudly, unless `TOLLGATE_REQUIRE_PROXIES=1` makes a missing proxy a failure.

mod caddy;
mod haproxy;
mod nginx;

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use tempfile::TempDir;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::common::Guard;
use crate::common::redis::{RedisServer, free_port};

/// Whether `binary` can run here: if not, the test skips, unless `TOLLGATE_REQUIRE_PROXIES=1`.
fn proxy_available(binary: &str) -> bool {
    let found = Command::new(binary)
        .arg("-v")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    if !found {
        let required = std::env::var("TOLLGATE_REQUIRE_PROXIES").is_ok_and(|v| v == "1");
        assert!(
            !required,
            "{binary} is not installed and TOLLGATE_REQUIRE_PROXIES=1 (scripts/test.sh installs it)"
        );
        eprintln!("skipping: {binary} is not installed");
    }
    found
}

/// The rules the proxies are tested with: five requests an hour per client address, and a
/// per-user rule in shadow mode that would refuse from the second request.
const RULES: &str = "domain: api
proxy:
  rate_limits:
    - actions: [{remote_address: {}}]
    - actions: [{request_headers: {header_name: x-user-id, descriptor_key: user_id}}]
descriptors:
  - key: remote_address
    rate_limit: {name: per-client, unit: hour, requests_per_unit: 5}
  - key: user_id
    shadow_mode: true
    rate_limit: {name: per-user, unit: hour, requests_per_unit: 1}
";
const LIMIT: usize = 5;

/// A `tollgate serve` process on fixed ports, so that it can be killed and started again where the
/// proxies expect it.
struct Tollgate {
    http: u16,
    debug: u16,
    dir: TempDir,
    redis: Option<String>,
    process: Option<Guard>,
}

impl Tollgate {
    async fn start(redis: Option<String>) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("api.yaml"), RULES).expect("rules");
        let mut tollgate = Self {
            http: free_port(),
            debug: free_port(),
            dir,
            redis,
            process: None,
        };
        tollgate.run().await;
        tollgate
    }

    /// Starts the process and waits until `/healthcheck` answers 200.
    async fn run(&mut self) {
        let mut command = Command::new(env!("CARGO_BIN_EXE_tollgate"));
        command
            .args(["serve", "--config-dir"])
            .arg(self.dir.path())
            .args(["--grpc-addr", "127.0.0.1:0"])
            .args(["--http-addr", &format!("127.0.0.1:{}", self.http)])
            .args(["--debug-addr", &format!("127.0.0.1:{}", self.debug)])
            .env_remove("REDIS_URL")
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if let Some(url) = &self.redis {
            // The machine is shared with other tests: a store call late by more than the 20 ms
            // default would be answered by the failure mode, which is not what is tested here.
            command.env("REDIS_URL", url).env("TOLLGATE_REDIS_DEADLINE", "2s");
        }
        self.process = Some(Guard(command.spawn().expect("start tollgate")));
        let deadline = Instant::now() + Duration::from_secs(20);
        while crate::common::try_http(self.addr(), "GET", "/healthcheck", "")
            .await
            .map(|(s, _)| s)
            != Some(200)
        {
            assert!(Instant::now() < deadline, "tollgate never became ready");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Kills the process at once: to a proxy, Tollgate is gone.
    fn kill(&mut self) {
        self.process = None;
    }

    fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.http))
    }

    /// A counter of the process's `/metrics` (0 when absent).
    async fn metric(&self, name: &str) -> u64 {
        let debug = SocketAddr::from((Ipv4Addr::LOCALHOST, self.debug));
        let (_, text) = crate::common::http(debug, "GET", "/metrics", "").await;
        text.lines()
            .find_map(|line| line.strip_prefix(name)?.trim().parse().ok())
            .unwrap_or(0)
    }
}

/// What the application behind the proxy saw of one request.
#[derive(Debug, Clone)]
struct Seen {
    body_len: usize,
    /// The `RateLimit-Policy` field the proxy passed on from Tollgate, if any.
    policy: Option<String>,
}

/// The application: answers 200 `app` to everything and records what it saw.
async fn application() -> (u16, Arc<Mutex<Vec<Seen>>>) {
    let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let record = Arc::clone(&seen);
    let router = Router::new()
        .fallback(move |headers: HeaderMap, body: Bytes| {
            let record = Arc::clone(&record);
            async move {
                let policy = headers
                    .get("ratelimit-policy")
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned);
                let seen = Seen {
                    body_len: body.len(),
                    policy,
                };
                record.lock().expect("record").push(seen);
                (StatusCode::OK, "app")
            }
        })
        .layer(axum::extract::DefaultBodyLimit::disable());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move { axum::serve(listener, router).await });
    (port, seen)
}

/// A proxy process, killed when dropped.
struct Proxy {
    port: u16,
    _process: Guard,
    _dir: TempDir,
}

impl Proxy {
    /// Starts `command` (run in `dir`, which holds its configuration) and waits until `port` accepts.
    async fn start(mut command: Command, port: u16, dir: TempDir) -> Self {
        let process = Guard(
            command
                .current_dir(dir.path())
                .stdout(Stdio::null())
                .stderr(Stdio::from(
                    std::fs::File::create(dir.path().join("proxy.log")).expect("log"),
                ))
                .spawn()
                .expect("start the proxy"),
        );
        let deadline = Instant::now() + Duration::from_secs(20);
        while tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_err() {
            let log = std::fs::read_to_string(dir.path().join("proxy.log")).unwrap_or_default();
            assert!(
                Instant::now() < deadline,
                "the proxy never listened on {port}: {log}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Self {
            port,
            _process: process,
            _dir: dir,
        }
    }
}

/// An example file's text with `replacements` made, each of which must be found (so the examples
/// cannot drift from what the tests change).
fn example(path: &str, replacements: &[(&str, String)]) -> String {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    let mut text = std::fs::read_to_string(&file).expect("example");
    for (from, to) in replacements {
        assert!(text.contains(from), "{path} no longer holds {from:?}");
        text = text.replace(from, to);
    }
    text
}

/// Writes `text` as `name` in `dir`; returns its path.
fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write");
    path
}

/// An answer through a proxy.
#[derive(Debug)]
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        crate::common::header(&self.headers, name)
    }
}

/// One request to the proxy on `port` from the loopback address `client` (127.0.0.x: Linux answers
/// the whole 127/8, so each test client has an address of its own), with `headers` and `body`.
async fn request(port: u16, client: Ipv4Addr, method: &str, headers: &[(&str, &str)], body: &[u8]) -> Answer {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .bind(SocketAddr::from((client, 0)))
        .expect("bind the client's address");
    let mut stream = socket
        .connect(SocketAddr::from((Ipv4Addr::LOCALHOST, port)))
        .await
        .expect("connect to the proxy");
    let mut head = format!(
        "{method} /orders?page=1 HTTP/1.1\r\nHost: shop.example\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).await.expect("send");
    stream.write_all(body).await.expect("send the body");
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.expect("answer");
    let raw = String::from_utf8_lossy(&raw);
    let head = raw.split("\r\n\r\n").next().unwrap_or_default();
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {raw:?}"));
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Answer { status, headers }
}

fn client(n: u8) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, 0, n)
}

/// Where the scenario runs: the example's proxy (fail open) and its fail-closed twin, both in front of
/// `tollgate`, with `app` behind them.
struct Setup {
    open: Proxy,
    closed: Proxy,
    /// What the fail-closed proxy answers while Tollgate is gone.
    closed_status: u16,
    /// Whether the proxy hands the client the `RateLimit` fields of an allowed request (NGINX and
    /// HAProxy do; Caddy, like Traefik, copies them into the request to the application).
    fields_to_client: bool,
    tollgate: Tollgate,
    seen: Arc<Mutex<Vec<Seen>>>,
}

/// The scenario every proxy runs.
async fn scenario(mut setup: Setup) {
    let port = setup.open.port;
    // The limit passes, then every request gets 429 with Retry-After.
    let mut passed = 0;
    for _ in 0..LIMIT + 3 {
        let answer = request(port, client(2), "GET", &[], b"").await;
        match answer.status {
            200 => {
                passed += 1;
                if setup.fields_to_client {
                    let policy = answer.header("ratelimit-policy");
                    assert_eq!(policy, Some("\"per-client\";q=5;w=3600"), "{answer:?}");
                }
            }
            429 => {
                let retry: u64 = answer
                    .header("retry-after")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                assert!((1..=3600).contains(&retry), "Retry-After in {answer:?}");
            }
            other => panic!("unexpected {other}: {answer:?}"),
        }
    }
    assert_eq!(passed, LIMIT, "exactly the limit passes");
    if !setup.fields_to_client {
        let seen = setup.seen.lock().expect("seen").clone();
        assert!(
            seen.iter()
                .all(|s| s.policy.as_deref() == Some("\"per-client\";q=5;w=3600")),
            "{seen:?}"
        );
    }
    // Another client has its own budget; the first cannot get a fresh one by naming an address.
    assert_eq!(request(port, client(3), "GET", &[], b"").await.status, 200);
    for forged in ["203.0.113.9", "127.0.0.3", "unknown"] {
        let answer = request(port, client(2), "GET", &[("X-Forwarded-For", forged)], b"").await;
        assert_eq!(answer.status, 429, "X-Forwarded-For: {forged}");
    }
    // A body goes to the application whole and never to Tollgate.
    let body = vec![b'x'; 256 * 1024];
    let before = setup.seen.lock().expect("seen").len();
    assert_eq!(request(port, client(4), "POST", &[], &body).await.status, 200);
    let seen = setup.seen.lock().expect("seen").clone();
    assert_eq!(seen.get(before).map(|s| s.body_len), Some(body.len()));
    assert_eq!(
        setup.tollgate.metric("tollgate_forward_auth_bodies_total").await,
        0
    );
    // Shadow mode counts and never refuses: one user, its limit 1, from fresh addresses.
    for n in 10..14 {
        let answer = request(port, client(n), "GET", &[("X-User-Id", "ada")], b"").await;
        assert_eq!(answer.status, 200, "shadow mode refused: {answer:?}");
    }
    let shadowed = "ratelimit_service_rate_limit_shadow_mode{domain=\"api\",key1=\"user_id\"}";
    assert_eq!(setup.tollgate.metric(shadowed).await, 3);
    // Tollgate gone: the example lets requests through, its twin answers its failure status.
    setup.tollgate.kill();
    assert_eq!(
        request(port, client(20), "GET", &[], b"").await.status,
        200,
        "fail open"
    );
    let closed = request(setup.closed.port, client(21), "GET", &[], b"").await;
    assert_eq!(closed.status, setup.closed_status, "fail closed: {closed:?}");
    // Back: both proxies ask it again at once. (The proxies' own windows are 0 for NGINX, whose
    // upstream says max_fails=0, and 500 ms for Caddy's fail_duration: the margin above that is for
    // a busy machine; a proxy that kept Tollgate out for its default 10 s would fail.)
    setup.tollgate.run().await;
    let back = Instant::now();
    for proxy in [&setup.open, &setup.closed] {
        let asked = "ratelimit_service_total_requests{grpc_method=\"ForwardAuth\"}";
        let before = setup.tollgate.metric(asked).await;
        loop {
            let answer = request(proxy.port, client(30), "GET", &[], b"").await;
            if setup.tollgate.metric(asked).await > before {
                assert_eq!(answer.status, 200);
                break;
            }
            assert!(
                back.elapsed() < Duration::from_secs(3),
                "Tollgate not asked again after its restart"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// How a proxy answers, beside what every proxy does.
struct Traits {
    /// What the fail-closed configuration answers while Tollgate is gone.
    closed_status: u16,
    /// Whether the `RateLimit` fields of an allowed request reach the client.
    fields_to_client: bool,
}

/// Runs the scenario with the proxy `binary`, started by `start(tollgate_port, app_port, fail_open)`,
/// on the embedded store and on Redis; skips when the proxy is not installed.
async fn run<F, Fut>(binary: &str, traits: Traits, start: F)
where
    F: Fn(u16, u16, bool) -> Fut,
    Fut: std::future::Future<Output = Proxy>,
{
    if !proxy_available(binary) {
        return;
    }
    let redis = crate::common::redis::redis_available().then(RedisServer::start);
    for url in [None, redis.as_ref().map(RedisServer::url)] {
        let (app, seen) = application().await;
        let tollgate = Tollgate::start(url).await;
        scenario(Setup {
            open: start(tollgate.http, app, true).await,
            closed: start(tollgate.http, app, false).await,
            closed_status: traits.closed_status,
            fields_to_client: traits.fields_to_client,
            tollgate,
            seen,
        })
        .await;
    }
}
