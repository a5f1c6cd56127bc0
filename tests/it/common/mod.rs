//! Shared fixtures: a limiter over the embedded store with a manual clock, a real server on port-0
//! listeners, request builders.

#![allow(dead_code)]

pub mod ads;
pub mod certs;
pub mod envoy_gateway;
pub mod fault_proxy;
pub mod process;
pub mod redis;
#[cfg(target_os = "linux")]
pub mod sockets;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use arc_swap::ArcSwapOption;
use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tollgate::proto::descriptor::RateLimitDescriptor;
use tollgate::proto::descriptor::rate_limit_descriptor::RateLimitOverride;
use tollgate::proto::rls::RateLimitRequest;
use tollgate::proto::rls::rate_limit_response::DescriptorStatus as WireStatus;
use tollgate::proto::rls::rate_limit_service_client::RateLimitServiceClient;
use tollgate::server::{Listeners, run};
use tollgate::settings::Settings;
use tollgate_core::algorithm::Algorithm;
use tollgate_core::clock::{Clock, ManualClock, SystemClock};
use tollgate_core::limiter::{
    Code, DescriptorStatus, LimitOverride, Limiter, LimiterError, LimiterOptions, RequestDescriptor, Verdict,
};
use tollgate_core::rules::file::parse_file;
use tollgate_core::rules::{CompileOptions, RuleSet, ValueHasher};
use tollgate_core::store::memory::MemoryStore;
use tonic::transport::Channel;

/// 2026-11-29T12:00:00Z: an exact hour, so window arithmetic in tests is easy to follow.
pub const T0_US: u64 = 1_764_417_600 * 1_000_000;

/// A descriptor for limiter-level tests.
#[derive(Debug, Clone, Default)]
pub struct Desc {
    pub entries: Vec<(String, String)>,
    pub limit: Option<LimitOverride>,
    pub hits: Option<u64>,
}

impl RequestDescriptor for Desc {
    type Entry = (String, String);
    fn entries(&self) -> &[(String, String)] {
        &self.entries
    }
    fn limit_override(&self) -> Option<LimitOverride> {
        self.limit
    }
    fn hits_addend(&self) -> Option<u64> {
        self.hits
    }
}

/// A descriptor from `[("key", "value"), ...]`.
pub fn d(entries: &[(&str, &str)]) -> Desc {
    Desc {
        entries: entries
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..Desc::default()
    }
}

/// A limiter over the embedded store with a manual clock, from rules files given as text.
pub struct Harness {
    pub limiter: Limiter<MemoryStore>,
    pub clock: ManualClock,
}

impl Harness {
    pub fn new(files: &[&str]) -> Self {
        Self::with_options(files, LimiterOptions::default())
    }

    pub fn with_options(files: &[&str], options: LimiterOptions) -> Self {
        let clock = ManualClock::new(T0_US);
        let store = MemoryStore::new(Arc::new(clock.clone()));
        let rules = rules(files, options.default_algorithm);
        let handle = Arc::new(ArcSwapOption::from_pointee(rules));
        Self {
            limiter: Limiter::new(handle, store, ValueHasher::new("test"), options),
            clock,
        }
    }

    pub async fn check(&self, domain: &str, descriptors: &[Desc]) -> Verdict {
        self.try_check(domain, descriptors, 0)
            .await
            .expect("request decided")
    }

    pub async fn try_check(
        &self,
        domain: &str,
        descriptors: &[Desc],
        hits: u32,
    ) -> Result<Verdict, LimiterError> {
        self.limiter.should_rate_limit(domain, descriptors, hits).await
    }

    /// Checks one descriptor `n` times and returns how many were allowed.
    pub async fn admitted(&self, domain: &str, descriptor: &Desc, n: usize) -> usize {
        let mut ok = 0;
        for _ in 0..n {
            if self.check(domain, std::slice::from_ref(descriptor)).await.overall == Code::Ok {
                ok += 1;
            }
        }
        ok
    }

    pub fn advance_secs(&self, secs: u64) {
        self.clock.advance_us(secs * 1_000_000);
    }
}

/// Whether the suites take their rules over xDS (`TOLLGATE_TEST_RULES=xds`): each test's files, pushed
/// by a management server in the test process wherever they have an xDS form
/// ([`tollgate::rules_as_xds::configs`]).
pub fn rules_over_xds() -> bool {
    std::env::var("TOLLGATE_TEST_RULES").is_ok_and(|v| v == "xds")
}

/// Compiles rules files given as text (named `test-N.yaml`).
pub fn rules(files: &[&str], default_algorithm: Algorithm) -> RuleSet {
    let domains: Vec<_> = files
        .iter()
        .enumerate()
        .map(|(i, text)| parse_file(&format!("test-{i}.yaml"), text).expect("valid rules"))
        .collect();
    RuleSet::compile(
        domains,
        CompileOptions {
            default_algorithm,
            ..CompileOptions::default()
        },
    )
    .expect("rules compile")
}

/// Shorthand assertions on a status.
/// Checks a status as Envoy sees it (see [`envoy`]).
pub fn assert_status(status: &DescriptorStatus, code: Code, remaining: u32, limit: Option<u32>) {
    let wire = envoy(status);
    assert_eq!(status.code, code, "code of {status:?}");
    assert_eq!(wire.limit_remaining, remaining, "remaining of {status:?}");
    assert_eq!(
        wire.current_limit.as_ref().map(|l| l.requests_per_unit),
        limit,
        "limit of {status:?}"
    );
    assert_eq!(
        wire.duration_until_reset.is_some(),
        limit.is_some(),
        "reset presence of {status:?}"
    );
}

/// A limiter status in Envoy's encoding (`u32` counts, whole seconds), as envoyproxy/ratelimit's
/// behaviours are stated in it.
pub fn envoy(status: &DescriptorStatus) -> WireStatus {
    tollgate::api::envoy::wire_status(status)
}

/// Envoy's `duration_until_reset` of a status, in whole seconds.
pub fn duration_until_reset(status: &DescriptorStatus) -> Option<std::time::Duration> {
    let seconds = envoy(status).duration_until_reset?.seconds;
    Some(std::time::Duration::from_secs(
        u64::try_from(seconds).expect("not negative"),
    ))
}

/// A child process that is killed and reaped when dropped, whatever happened to the test.
pub struct Guard(pub std::process::Child);

impl Drop for Guard {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
        }
        let _ = self.0.wait();
    }
}

/// A real server on port-0 listeners over a temporary rules directory.
pub struct TestServer {
    /// The server's own Redis when the suite runs with `TOLLGATE_TEST_STORE=redis`.
    pub redis: Option<redis::RedisServer>,
    /// The management server pushing the rules, under `TOLLGATE_TEST_RULES=xds`.
    pub ads: Option<ads::AdsServer>,
    pub grpc: SocketAddr,
    pub http: SocketAddr,
    /// The native API's own listener, when `TOLLGATE_NATIVE_HTTP_ADDR` is set.
    pub native_http: Option<SocketAddr>,
    pub debug: SocketAddr,
    pub dir: TempDir,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<anyhow::Result<()>>,
}

impl TestServer {
    /// Starts a server with the given rules files (name, text) and Go-style environment.
    pub async fn start(files: &[(&str, &str)], env: &[(&str, &str)]) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        for (name, text) in files {
            std::fs::write(dir.path().join(name), text).expect("write rules");
        }
        Self::start_in(dir, env).await
    }

    pub async fn start_in(dir: TempDir, env: &[(&str, &str)]) -> Self {
        let server = Self::start_unready(dir, env).await;
        server.wait_ready().await;
        server
    }

    /// Starts a server without waiting for readiness (for tests of startup while Redis is down).
    pub async fn start_unready(dir: TempDir, env: &[(&str, &str)]) -> Self {
        Self::start_with_clock(dir, env, Arc::new(SystemClock)).await
    }

    /// Starts a server whose embedded store reads `clock` (Redis keeps its own), without waiting for
    /// readiness.
    pub async fn start_with_clock(dir: TempDir, env: &[(&str, &str)], clock: Arc<dyn Clock>) -> Self {
        let mut env: HashMap<String, String> =
            env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let redis = store_under_test_is_redis().then(|| {
            let server = redis::RedisServer::start();
            env.entry("REDIS_URL".into()).or_insert_with(|| server.url());
            env.entry("TOLLGATE_REDIS_DEADLINE".into())
                .or_insert_with(|| "2s".into());
            server
        });
        // `TOLLGATE_TEST_RULES=xds`: the same rules, pushed by a management server in the test process.
        // A test that names its own config source (the xds suite runs its own management server) keeps
        // it: overriding its server's address would leave it waiting for rules that never come.
        let own_source = env.contains_key("CONFIG_TYPE");
        let pushed = rules_over_xds() && !own_source;
        let ads = match pushed.then(|| tollgate::rules_as_xds::configs(dir.path())) {
            Some(Some(configs)) => {
                let ads = ads::AdsServer::start().await;
                ads.push("1", &configs);
                env.insert("CONFIG_TYPE".into(), "GRPC_XDS_SOTW".into());
                env.insert("CONFIG_GRPC_XDS_SERVER_URL".into(), ads.addr.to_string());
                Some(ads)
            }
            _ => None,
        };
        let flags = [
            ("config_dir", dir.path().to_string_lossy().into_owned()),
            ("grpc_addr", "127.0.0.1:0".to_owned()),
            ("http_addr", "127.0.0.1:0".to_owned()),
            ("debug_addr", "127.0.0.1:0".to_owned()),
            ("reload_interval", "100ms".to_owned()),
        ];
        let settings = Settings::load_from(None, &env, &flags).expect("settings");
        let listeners = Listeners::bind(&settings.listen).await.expect("bind");
        // On a unix socket (`GRPC_UDS`) there is no TCP address; tests of that socket use its path.
        let grpc = listeners
            .grpc
            .tcp_addr()
            .unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0)));
        let http = listeners.http.local_addr().expect("addr");
        let debug = listeners.debug.local_addr().expect("addr");
        let native_http = listeners
            .native_http
            .as_ref()
            .map(|l| l.local_addr().expect("addr"));
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(run(settings, listeners, clock, async move {
            let _ = stopped.await;
        }));
        Self {
            redis,
            ads,
            grpc,
            http,
            native_http,
            debug,
            dir,
            stop: Some(stop),
            task,
        }
    }

    /// Waits until the server has loaded its rules and answers `/healthcheck` with 200.
    pub async fn wait_ready(&self) {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            assert!(!self.task.is_finished(), "the server stopped during startup");
            let attempt = try_http(self.http, "GET", "/healthcheck", "");
            if let Ok(Some((200, _))) = tokio::time::timeout(std::time::Duration::from_secs(1), attempt).await
            {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the server never became ready"
            );
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }

    pub async fn client(&self) -> RateLimitServiceClient<Channel> {
        RateLimitServiceClient::new(self.channel().await)
    }

    pub async fn channel(&self) -> Channel {
        Channel::from_shared(format!("http://{}", self.grpc))
            .expect("uri")
            .connect()
            .await
            .expect("connect")
    }

    /// A counter or gauge from the debug port's `/metrics` (the debug port, so it can be read while
    /// a test holds the HTTP port's connections).
    pub async fn metric(&self, name: &str) -> u64 {
        let (_, text) = http(self.debug, "GET", "/metrics", "").await;
        text.lines()
            .find_map(|line| line.strip_prefix(name)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("{name} in /metrics"))
    }

    /// Stops the server and waits for it to finish; fails the test if it failed.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        (&mut self.task)
            .await
            .expect("server task")
            .expect("server ran cleanly");
    }
}

/// Whether the wire-level suites run against Redis (`TOLLGATE_TEST_STORE=redis`, set by
/// `scripts/test.sh` for a second pass) instead of the embedded store: one test body, both stores.
pub fn store_under_test_is_redis() -> bool {
    std::env::var("TOLLGATE_TEST_STORE").is_ok_and(|v| v == "redis")
}

/// A minimal HTTP/1.1 request over a raw socket; returns (status, body).
pub async fn http(addr: SocketAddr, method: &str, path: &str, body: &str) -> (u16, String) {
    try_http(addr, method, path, body).await.expect("HTTP exchange")
}

/// [`http`], or `None` if the exchange failed.
pub async fn try_http(addr: SocketAddr, method: &str, path: &str, body: &str) -> Option<(u16, String)> {
    let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await.ok()?;
    let status = response.split_whitespace().nth(1).and_then(|s| s.parse().ok())?;
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Some((status, body))
}

/// Sends a request with extra header lines (each ending in CRLF); returns (status, lower-cased headers,
/// body).
pub async fn send_with_headers(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &str,
) -> (u16, Vec<(String, String)>, String) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: app\r\nConnection: close\r\nContent-Length: 0\r\n{headers}\r\n"
    );
    stream.write_all(request.as_bytes()).await.expect("write");
    let mut text = String::new();
    stream.read_to_string(&mut text).await.expect("read");
    let (head, body) = text.split_once("\r\n\r\n").expect("a response");
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .expect("status");
    let headers = lines
        .filter_map(|l| {
            l.split_once(": ")
                .map(|(k, v)| (k.to_ascii_lowercase(), v.to_owned()))
        })
        .collect();
    (status, headers, body.to_owned())
}

/// The value of header `name` (lower-case) among an answer's headers.
pub fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

/// A TCP connection to `addr` from the loopback address `from`, with its receive buffer shrunk to
/// `receive` bytes when given.
pub async fn connect_from(
    addr: SocketAddr,
    from: [u8; 4],
    receive: Option<u32>,
) -> std::io::Result<tokio::net::TcpStream> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    if let Some(bytes) = receive {
        socket.set_recv_buffer_size(bytes)?;
    }
    socket.bind(SocketAddr::from((from, 0)))?;
    socket.connect(addr).await
}

/// Reads one HTTP/1.1 answer (its head and a `Content-Length` body): status and body, or `None` if the
/// connection closed first.
pub async fn read_answer(tcp: &mut tokio::net::TcpStream) -> Option<(u16, String)> {
    let mut data = Vec::new();
    let mut buffer = [0u8; 16384];
    loop {
        if let Some(end) = data.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&data[..end]).into_owned();
            let length = head
                .lines()
                .filter_map(|line| line.split_once(':'))
                .find(|(name, _)| name.eq_ignore_ascii_case("content-length"))
                .and_then(|(_, value)| value.trim().parse::<usize>().ok())
                .unwrap_or(0);
            let body = end + 4;
            if data.len() >= body + length {
                let status = head.split_whitespace().nth(1)?.parse().ok()?;
                return Some((
                    status,
                    String::from_utf8_lossy(&data[body..body + length]).into_owned(),
                ));
            }
        }
        let read = tokio::time::timeout(std::time::Duration::from_secs(20), tcp.read(&mut buffer))
            .await
            .ok()?
            .ok()?;
        if read == 0 {
            return None;
        }
        data.extend_from_slice(&buffer[..read]);
    }
}

/// A wire request with one descriptor per entry list.
pub fn wire_request(domain: &str, descriptors: &[&[(&str, &str)]]) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_owned(),
        descriptors: descriptors
            .iter()
            .map(|entries| wire_descriptor(entries))
            .collect(),
        hits_addend: 0,
    }
}

pub fn wire_descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor::from_entries(entries.iter().copied())
}

pub fn wire_override(requests_per_unit: u32, unit: i32) -> Option<RateLimitOverride> {
    Some(RateLimitOverride {
        requests_per_unit,
        unit,
    })
}
