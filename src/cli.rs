//! The `tollgate` command line: `serve`, `check-config`, `query`, `bench`, `healthcheck`, `noop-serve`,
//! `xds-serve`, `what-if`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use crate::proto::descriptor::RateLimitDescriptor;
use crate::proto::rls::RateLimitRequest;
use crate::proto::rls::rate_limit_service_client::RateLimitServiceClient;
use crate::settings::{SETTINGS_FILE_ENV, Settings};
use tollgate_core::observe::metrics::Metrics;
use tollgate_core::rules::reload::load_rules;

/// Tollgate: a rate-limit decision service speaking Envoy's rate limit protocol.
#[derive(Debug, Parser)]
#[command(name = "tollgate", version, about)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the service.
    Serve(ServeArgs),
    /// Validate a rules directory; exits non-zero naming the file and the reason.
    CheckConfig(CheckConfigArgs),
    /// Send one ShouldRateLimit request and print the answer as JSON. Exit code: 0 OK, 1 OVER_LIMIT,
    /// 2 error.
    Query(QueryArgs),
    /// Load-test an Envoy RLS server: decisions/s and latency percentiles.
    Bench(BenchArgs),
    /// Ask a running server's gRPC health service; exit 0 when SERVING (for Docker's HEALTHCHECK in an
    /// image without a shell or curl).
    Healthcheck(HealthcheckArgs),
    /// Serve Envoy's RateLimitService answering OK to everything and deciding nothing: the floor a rate
    /// limit server is measured against (scripts/bench/bench-floor.sh).
    NoopServe(NoopServeArgs),
    /// Serve a rules directory over xDS (an Aggregated Discovery Service, State of the World), as a
    /// management server would push it: for `CONFIG_TYPE=GRPC_XDS_SOTW` without Envoy Gateway, and for
    /// scripts/bench/bench-xds-scale.sh.
    XdsServe(XdsServeArgs),
    /// Replay an access log (Envoy's, NGINX's) or Tollgate's decision log against the rules in force
    /// and a proposed set, on a simulated clock, and report whom the change would refuse
    /// (docs/what-if.md).
    WhatIf(WhatIfArgs),
}

#[derive(Debug, Args)]
struct WhatIfArgs {
    /// The rules in force: a rules directory.
    #[arg(long)]
    current: PathBuf,
    /// The proposed rules: another rules directory.
    #[arg(long)]
    proposed: PathBuf,
    /// The logs' format: `envoy` (Envoy's default text format), `nginx` (NGINX's combined), `json`
    /// (one object per line: Envoy's json_format, NGINX's escape=json), `decisions` (Tollgate's
    /// decision log).
    #[arg(long, value_enum)]
    format: crate::what_if::LogFormat,
    /// The domain an access log's requests are decided in (its rules' `proxy:` block makes their
    /// descriptors); a decision log names its own.
    #[arg(long)]
    domain: Option<String>,
    /// JSON logs: where a part of the request is, `part=name` (parts: time, method, path, host,
    /// client, xff, header:NAME); repeatable.
    #[arg(long = "field", value_name = "PART=NAME")]
    fields: Vec<String>,
    /// How far out of time order the log may be: lines are replayed sorted within this window, and
    /// one earlier than that stops the replay.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    reorder_window: std::time::Duration,
    /// Stop at the first line that cannot be read, instead of counting it and going on.
    #[arg(long)]
    strict: bool,
    /// Also write the report as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Also write the report as one self-contained HTML page to this file.
    #[arg(long)]
    html: Option<PathBuf>,
    /// Write one JSON line per request replayed (its line, time, and both answers) to this file.
    #[arg(long)]
    trace: Option<PathBuf>,
    /// Most counters each side keeps (evictions are reported: the replay then under-counts).
    #[arg(long, default_value_t = 10_000_000)]
    max_keys: usize,
    /// A settings file, as `serve` reads one (the settings that change decisions apply: SHADOW_MODE,
    /// TOLLGATE_DEFAULT_ALGORITHM, MERGE_DOMAIN_CONFIG…; the environment's apply too).
    #[arg(long, env = SETTINGS_FILE_ENV)]
    settings: Option<PathBuf>,
    /// The logs, replayed as one, in this order (`-`: standard input).
    #[arg(required = true)]
    logs: Vec<PathBuf>,
}

#[derive(Debug, Args)]
struct HealthcheckArgs {
    /// The server's gRPC address: `host:port` (as the `tollgate serving` line prints it) or a URL,
    /// `http://host:port` or `https://host:port`.
    #[arg(long, default_value = "127.0.0.1:8081", value_parser = grpc_url)]
    addr: String,
    /// The service to ask about: `ratelimit` (readiness, the default) or `""` (liveness).
    #[arg(long, default_value = "ratelimit")]
    service: String,
    /// Give up after this long.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    timeout: std::time::Duration,
}

/// Where to send requests and what they carry (`query` and `bench`).
#[derive(Debug, Args)]
struct Target {
    /// The server's gRPC address: `host:port` (as the `tollgate serving` line prints it) or a URL,
    /// `http://host:port` or `https://host:port`.
    #[arg(long, default_value = "127.0.0.1:8081", value_parser = grpc_url)]
    addr: String,
    /// The rate limit domain.
    #[arg(long)]
    domain: String,
    /// A descriptor as `key=value[,key=value...]`; repeat for several descriptors. In `bench`, `{i}` in a
    /// key or value becomes the key index.
    #[arg(long = "descriptor", short = 'd', required = true, value_parser = parse_descriptor)]
    descriptors: Vec<Descriptor>,
}

/// One descriptor's entries from the command line.
#[derive(Debug, Clone)]
struct Descriptor(Vec<(String, String)>);

fn parse_descriptor(text: &str) -> Result<Descriptor, String> {
    text.split(',')
        .map(|pair| {
            let (key, value) = pair
                .split_once('=')
                .ok_or_else(|| format!("descriptor entry {pair:?} is not key=value"))?;
            Ok((key.to_owned(), value.to_owned()))
        })
        .collect::<Result<_, _>>()
        .map(Descriptor)
}

#[derive(Debug, Args)]
struct NoopServeArgs {
    /// The gRPC listener's address (port 0: any free port; the bound address is printed).
    #[arg(long, default_value = "127.0.0.1:8081")]
    grpc_addr: std::net::SocketAddr,
    /// Also answer proxies' `/forward-auth/{domain}` with 200 on this address, on the HTTP stack `serve`
    /// uses (port 0: any free port; the bound address is printed).
    #[arg(long)]
    http_addr: Option<std::net::SocketAddr>,
}

#[derive(Debug, Args)]
struct XdsServeArgs {
    /// The directory whose `*.yaml` files are served, one `RateLimitConfig` each (envoyproxy/ratelimit's
    /// fields only: the proto has no others).
    #[arg(long)]
    config_dir: std::path::PathBuf,
    /// The listener's address (port 0: any free port; the bound address is printed).
    #[arg(long, default_value = "127.0.0.1:18000")]
    addr: std::net::SocketAddr,
}

#[derive(Debug, Args)]
struct BenchArgs {
    #[command(flatten)]
    target: Target,
    /// Distinct values of `{i}`.
    #[arg(long, default_value_t = 10_000)]
    keys: u64,
    /// Requests in flight.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// HTTP/2 connections.
    #[arg(long, default_value_t = 4)]
    connections: usize,
    /// How long to run (e.g. 10s).
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    duration: std::time::Duration,
    /// Open loop: send this many requests per second whatever the answers' pace, timing each from when
    /// it was due (queueing shows); `--concurrency` caps requests in flight. Without it: closed loop,
    /// each of `--concurrency` callers sends its next request when the last is answered.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    rate: Option<u64>,
    /// The server's Redis (`redis://host:port`), to report what the run cost it: process CPU and each
    /// command's calls and time per decision (and the target of `--api redis-floor`).
    #[arg(long)]
    redis_url: Option<String>,
    /// Which API to load: Envoy's ShouldRateLimit, Tollgate's native Check, or (redis-floor) no rate
    /// limiter at all, INCRBY + EXPIRE straight to --redis-url, the Go service's fixed-window cost.
    #[arg(long, value_enum, default_value = "envoy")]
    api: crate::loadgen::Api,
    /// TLS: the PEM CA that signed the server's certificate (use an `https://` address).
    #[arg(long)]
    tls_ca: Option<PathBuf>,
    /// mTLS: a PEM client certificate (with `--tls-key`).
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// mTLS: the client certificate's PEM key.
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// TLS: the name the server's certificate must carry (default: the address's host).
    #[arg(long)]
    tls_domain: Option<String>,
}

/// The bench's TLS options as a client configuration (`None`: plaintext).
fn bench_tls(args: &BenchArgs) -> anyhow::Result<Option<tonic::transport::ClientTlsConfig>> {
    use anyhow::Context as _;
    use tonic::transport::{Certificate, ClientTlsConfig, Identity};
    let Some(ca) = &args.tls_ca else {
        anyhow::ensure!(args.tls_cert.is_none(), "--tls-cert needs --tls-ca");
        return Ok(None);
    };
    let read =
        |path: &PathBuf| std::fs::read(path).with_context(|| format!("cannot read {}", path.display()));
    let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read(ca)?));
    if let (Some(cert), Some(key)) = (&args.tls_cert, &args.tls_key) {
        tls = tls.identity(Identity::from_pem(read(cert)?, read(key)?));
    }
    if let Some(domain) = &args.tls_domain {
        tls = tls.domain_name(domain.clone());
    }
    Ok(Some(tls))
}

#[derive(Debug, Args)]
struct ServeArgs {
    /// Directory of rules files (else RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY).
    #[arg(long)]
    config_dir: Option<PathBuf>,
    /// gRPC listen address (default 0.0.0.0:8081; port 0 picks a free port).
    #[arg(long)]
    grpc_addr: Option<String>,
    /// HTTP listen address (default 0.0.0.0:8080).
    #[arg(long)]
    http_addr: Option<String>,
    /// Debug listen address (default 0.0.0.0:6070).
    #[arg(long)]
    debug_addr: Option<String>,
    /// Optional YAML settings file (lowest precedence after the defaults).
    #[arg(long, env = SETTINGS_FILE_ENV)]
    settings: Option<PathBuf>,
}

#[derive(Debug, Args)]
struct CheckConfigArgs {
    /// The rules directory.
    dir: PathBuf,
    /// Allow one domain across several files (as `MERGE_DOMAIN_CONFIG=true`).
    #[arg(long)]
    merge_domains: bool,
    /// A settings file, as `serve` takes (the environment applies too).
    #[arg(long, env = SETTINGS_FILE_ENV)]
    settings: Option<PathBuf>,
}

#[derive(Debug, Args)]
struct QueryArgs {
    #[command(flatten)]
    target: Target,
    /// Request-level hits_addend (0 means 1).
    #[arg(long, default_value_t = 0)]
    hits: u32,
}

/// The command line of the binary when invoked as `ratelimit` (envoyproxy/ratelimit's name, which Envoy
/// Gateway runs as `/bin/ratelimit` with no arguments): `serve`, driven by the environment.
#[derive(Debug, Parser)]
#[command(
    name = "ratelimit",
    version,
    about = "Tollgate, serving as envoyproxy/ratelimit's /bin/ratelimit"
)]
struct RatelimitCli {
    #[command(flatten)]
    serve: ServeArgs,
}

/// Whether the binary was invoked under envoyproxy/ratelimit's name (a link or copy named `ratelimit`).
fn invoked_as_ratelimit() -> bool {
    std::env::args_os()
        .next()
        .and_then(|arg0| {
            std::path::Path::new(&arg0)
                .file_name()
                .map(|name| name == "ratelimit")
        })
        .unwrap_or(false)
}

/// Parses the command line and runs the command.
pub fn main() -> ExitCode {
    if invoked_as_ratelimit() {
        return report(serve(RatelimitCli::parse().serve));
    }
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => report(serve(args)),
        Command::CheckConfig(args) => check_config(args),
        Command::Query(args) => query(args),
        Command::Bench(args) => report(bench(args)),
        Command::Healthcheck(args) => healthcheck(args),
        Command::NoopServe(args) => report(noop_serve(args)),
        Command::XdsServe(args) => report(xds_serve(args)),
        Command::WhatIf(args) => report(what_if(args)),
    }
}

fn report(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("tollgate: {}", describe(&error));
            ExitCode::FAILURE
        }
    }
}

/// An error and its causes on one line, each said once: libraries often repeat their cause in their own
/// message (`invalid URL: scheme is missing: scheme is missing`), and an OS error read twice helps no
/// one.
fn describe(error: &anyhow::Error) -> String {
    let mut said = String::new();
    for cause in error.chain().map(ToString::to_string) {
        if said.contains(&cause) {
            continue;
        }
        if !said.is_empty() {
            said.push_str(": ");
        }
        said.push_str(&cause);
    }
    said
}

/// A gRPC server's address as tonic takes it: `host:port` gets `http://` (the scheme the `tollgate
/// serving` line leaves out), a URL is kept.
fn grpc_url(address: &str) -> Result<String, String> {
    let address = address.trim();
    let url = if address.contains("://") {
        address.to_owned()
    } else {
        format!("http://{address}")
    };
    url.parse::<tonic::transport::Uri>()
        .map_err(|error| format!("{address:?} is not host:port or a URL ({error})"))?;
    Ok(url)
}

fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let mut flags = Vec::new();
    if let Some(dir) = args.config_dir {
        flags.push(("config_dir", dir.to_string_lossy().into_owned()));
    }
    for (name, value) in [
        ("grpc_addr", args.grpc_addr),
        ("http_addr", args.http_addr),
        ("debug_addr", args.debug_addr),
    ] {
        if let Some(value) = value {
            flags.push((name, value));
        }
    }
    let mut settings = Settings::load(args.settings.as_deref(), &flags)?;
    settings
        .warnings
        .extend(crate::huge_pages::apply(settings.listen.transparent_huge_pages));
    let runtime = runtime(settings.listen.workers())?;
    let _context = runtime.enter();
    let traces = crate::observe::telemetry::TraceSettings::from_settings(&settings.telemetry)?;
    let telemetry = crate::observe::telemetry::init(
        &settings.telemetry.log_level,
        settings.telemetry.log_format,
        traces.as_ref(),
    )?;
    // Read before the logger started: said now, so they reach the log.
    for warning in &settings.warnings {
        tracing::warn!("{warning}");
    }
    runtime.block_on(async {
        let served = async {
            let listeners = crate::server::Listeners::bind(&settings.listen).await?;
            let clock = std::sync::Arc::new(tollgate_core::clock::SystemClock);
            crate::server::run(settings, listeners, clock, crate::server::shutdown_signal()).await
        };
        let result = served.await;
        telemetry.shutdown().await;
        result
    })
}

/// The runtime a server runs on, with `workers` worker threads.
fn runtime(workers: usize) -> std::io::Result<tokio::runtime::Runtime> {
    match workers {
        // One worker: tokio's current-thread scheduler does the same work with no cross-thread wakeups
        // or work-stealing queues. Measured with Redis on a shared 2-core host: 31,100 decisions/s at a
        // p99 of 3.7 ms, against 30,000 at 4.4 ms on a one-worker multi-thread runtime.
        1 => tokio::runtime::Builder::new_current_thread().enable_all().build(),
        workers => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers)
            .enable_all()
            .build(),
    }
}

/// The no-op server, on the runtime `serve` would pick by default on this machine.
fn noop_serve(args: NoopServeArgs) -> anyhow::Result<()> {
    runtime(crate::settings::default_workers())?
        .block_on(crate::loadgen::noop::serve(args.grpc_addr, args.http_addr))
}

/// The replay of a log against two rule sets.
fn what_if(args: WhatIfArgs) -> anyhow::Result<()> {
    let settings = Settings::load(args.settings.as_deref(), &[])?;
    let what_if = crate::what_if::WhatIf {
        current: args.current,
        proposed: args.proposed,
        format: args.format,
        domain: args.domain,
        fields: args.fields,
        reorder_window: args.reorder_window,
        strict: args.strict,
        json: args.json,
        html: args.html,
        trace: args.trace,
        max_keys: args.max_keys,
        logs: args.logs,
    };
    crate::what_if::run(what_if, &settings)
}

/// The management server, on a small runtime (it serves a handful of clients).
fn xds_serve(args: XdsServeArgs) -> anyhow::Result<()> {
    runtime(1)?.block_on(crate::loadgen::ads::serve(args.addr, &args.config_dir))
}

fn bench(args: BenchArgs) -> anyhow::Result<()> {
    let tls = bench_tls(&args)?;
    let plan = crate::loadgen::LoadPlan {
        addr: args.target.addr,
        domain: args.target.domain,
        descriptors: args.target.descriptors.into_iter().map(|d| d.0).collect(),
        keys: args.keys,
        concurrency: args.concurrency,
        connections: args.connections,
        duration: args.duration,
        rate: args.rate,
        redis_url: args.redis_url,
        api: args.api,
        tls,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let report = runtime.block_on(crate::loadgen::run(plan))?;
    println!("{report}");
    Ok(())
}

fn healthcheck(args: HealthcheckArgs) -> ExitCode {
    use tonic_health::pb::health_check_response::ServingStatus;
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("tollgate: {error}");
            return ExitCode::FAILURE;
        }
    };
    let check = async {
        let channel = tonic::transport::Channel::from_shared(args.addr.clone())?
            .connect()
            .await?;
        let mut client = tonic_health::pb::health_client::HealthClient::new(channel);
        let request = tonic_health::pb::HealthCheckRequest {
            service: args.service.clone(),
        };
        anyhow::Ok(client.check(request).await?.into_inner().status)
    };
    match runtime.block_on(async { tokio::time::timeout(args.timeout, check).await }) {
        Ok(Ok(status)) if status == ServingStatus::Serving as i32 => {
            println!("SERVING");
            ExitCode::SUCCESS
        }
        Ok(Ok(status)) => {
            let name = ServingStatus::try_from(status).map_or("UNKNOWN", |s| s.as_str_name());
            eprintln!("tollgate: {} is {name}", args.service);
            ExitCode::FAILURE
        }
        Ok(Err(error)) => {
            eprintln!("tollgate: {}", describe(&error));
            ExitCode::FAILURE
        }
        Err(_) => {
            eprintln!("tollgate: no answer within {:?}", args.timeout);
            ExitCode::FAILURE
        }
    }
}

/// Checks the rules as `serve` would load them, with the settings `serve` would read (the default
/// algorithm, `MERGE_DOMAIN_CONFIG`), and refuses a malformed setting or Redis address as `serve`
/// does. Files a pod mounts (certificates, the refund key) are not read: a deploy hook lacks them.
fn check_config(args: CheckConfigArgs) -> ExitCode {
    // Loading checks every value, the Redis addresses among them.
    let settings = match Settings::load(args.settings.as_deref(), &[]) {
        Ok(settings) => settings,
        Err(error) => {
            eprintln!("tollgate: {error}");
            return ExitCode::FAILURE;
        }
    };
    if let Some(warning) = crate::huge_pages::apply(settings.listen.transparent_huge_pages) {
        eprintln!("tollgate: warning: {warning}");
    }
    match load_rules(
        &args.dir,
        args.merge_domains || settings.rules.merge_domain_config,
        crate::server::options::compile_options(&settings),
        &Metrics::default(),
    ) {
        Ok(rules) => {
            println!("{}: OK ({} domains)", args.dir.display(), rules.len());
            if rules.is_empty() {
                eprintln!(
                    "tollgate: warning: {} holds no rules file (*.yaml, *.yml): served, it would limit nothing",
                    args.dir.display()
                );
            }
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("{error}");
            ExitCode::FAILURE
        }
    }
}

fn query(args: QueryArgs) -> ExitCode {
    let descriptors = args
        .target
        .descriptors
        .into_iter()
        .map(|d| RateLimitDescriptor::from_entries(d.0))
        .collect();
    let request = RateLimitRequest {
        domain: args.target.domain,
        descriptors,
        hits_addend: args.hits,
    };
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("tollgate: {error}");
            return ExitCode::from(2);
        }
    };
    let result = runtime.block_on(async {
        let mut client = RateLimitServiceClient::connect(args.target.addr).await?;
        anyhow::Ok(client.should_rate_limit(request).await?.into_inner())
    });
    match result {
        Ok(response) => {
            println!("{}", crate::api::json::response_to_json(&response));
            let over =
                response.overall_code == crate::proto::rls::rate_limit_response::Code::OverLimit as i32;
            if over {
                ExitCode::from(1)
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(error) => {
            eprintln!("tollgate: {}", describe(&error));
            ExitCode::from(2)
        }
    }
}
