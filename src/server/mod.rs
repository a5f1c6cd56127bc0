//! Startup and shutdown: binds nothing itself (the caller hands in bound listeners, so tests use port 0),
//! loads the rules, wires the store, limiter and front ends, and owns the shutdown order:
//! flip health to NOT_SERVING, keep answering for the drain period, stop accepting, finish in-flight
//! calls.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use arc_swap::ArcSwapOption;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::grpc::GrpcListener;
use crate::observe::decision_log::DecisionLog;
use crate::observe::health::{Health, HealthPolicy};
use crate::server_counters::ServerCounters;
use crate::settings::{DecisionSettings, ListenSettings, Settings, TelemetrySettings};
use tollgate_core::clock::Clock;
use tollgate_core::limiter::{Limiter, RefundKeys, RulesHandle};
use tollgate_core::observe::metrics::Metrics;
use tollgate_core::rules::ValueHasher;
use tollgate_core::store::AnyStore;
use tollgate_core::store::memory::MemoryStore;

pub(crate) mod options;
mod rules_source;
mod store;

use options::{
    envoy_options, go_series, limiter_options, refund_keys, request_budget, server_tls, statsd_options,
    transport_limits,
};
use rules_source::RulesSource;
use store::{build_store, pinged};

/// How often the embedded store drops state that can no longer affect a decision.
const SWEEP_INTERVAL: Duration = Duration::from_secs(5);

/// The bound listeners.
#[derive(Debug)]
pub struct Listeners {
    /// gRPC (Envoy RLS, health, reflection): TCP, or a unix socket with `GRPC_UDS`.
    pub grpc: GrpcListener,
    /// HTTP admin (`/healthcheck`).
    pub http: TcpListener,
    /// Debug (`/rlconfig`).
    pub debug: TcpListener,
    /// The Go service's metrics listener, with `USE_PROMETHEUS`.
    pub prometheus: Option<TcpListener>,
    /// The native API's own listener, with `TOLLGATE_NATIVE_HTTP_ADDR`.
    pub native_http: Option<TcpListener>,
}

impl Listeners {
    /// Binds the addresses in `settings`; port 0 picks a free port.
    pub async fn bind(settings: &ListenSettings) -> anyhow::Result<Self> {
        let bind = |addr: String, what: &'static str| async move {
            TcpListener::bind(&addr)
                .await
                .with_context(|| format!("cannot bind the {what} listener to {addr}"))
        };
        let grpc = if settings.grpc_uds.is_empty() {
            GrpcListener::Tcp(bind(settings.grpc_addr.clone(), "gRPC").await?)
        } else {
            let path = PathBuf::from(&settings.grpc_uds);
            GrpcListener::bind_unix(path.clone())
                .with_context(|| format!("cannot bind the gRPC unix socket {}", path.display()))?
        };
        let prometheus = match settings.use_prometheus {
            // Go's `:9090` means every interface.
            true => Some(bind(listen_addr(&settings.prometheus_addr), "Prometheus").await?),
            false => None,
        };
        let native_http = match settings.native_http_addr.as_str() {
            "" => None,
            addr => Some(bind(addr.to_owned(), "native API").await?),
        };
        Ok(Self {
            grpc,
            http: bind(settings.http_addr.clone(), "HTTP").await?,
            debug: bind(settings.debug_addr.clone(), "debug").await?,
            prometheus,
            native_http,
        })
    }
}

/// A Go listen address (`:9090`, `host:9090`) as one Tokio binds.
fn listen_addr(addr: &str) -> String {
    match addr.strip_prefix(':') {
        Some(port) => format!("0.0.0.0:{port}"),
        None => addr.to_owned(),
    }
}

/// Runs the service until `shutdown` completes, then drains and returns. Fails at startup if the rules
/// do not load (naming the file and the reason). `clock` is the embedded store's and the local cache's
/// time ([`tollgate_core::clock::SystemClock`] in production; tests hand in a
/// [`tollgate_core::clock::ManualClock`] to move time without sleeping). Redis keeps its own clock.
///
/// Startup builds each part once from its settings section: TLS, health and metrics; the rules'
/// source; the store; the limiter; then the listeners' servers.
pub async fn run(
    settings: Settings,
    listeners: Listeners,
    clock: Arc<dyn Clock>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    // The core frees replaced rules; giving the memory back is the allocator's business, and ours.
    tollgate_core::rules::reload::after_rules_freed(crate::allocator::return_freed_memory_soon);
    let compile = options::compile_options(&settings);
    let Settings {
        listen,
        rules: rules_settings,
        store: store_settings,
        decisions,
        answers,
        telemetry,
        stats,
        origins,
        ..
    } = settings;
    // Before anything is spawned: a certificate that does not load stops startup with nothing left
    // running.
    let tls = server_tls(&listen)?;
    let go_series = go_series(&stats)?;
    let metrics = Metrics::new();
    let counters = ServerCounters::new();
    let (reporter, health_service) = tonic_health::server::health_reporter();
    let policy = HealthPolicy {
        needs_a_domain: rules_settings.healthy_with_at_least_one_config_loaded,
        follows_redis: store_settings.redis_health_check_active_connection,
    };
    let health = Health::new(reporter, policy).await;
    let rules: RulesHandle = Arc::new(ArcSwapOption::empty());
    let source = RulesSource::open(&rules_settings, compile, &metrics, &rules, &health).await?;

    let stop = CancellationToken::new();
    // Whatever way `run` returns (an error after the store started connecting, say), every task it
    // spawned is told to stop.
    let _stop_on_return = stop.clone().drop_guard();
    let tasks = TaskTracker::new();
    let store = build_store(&store_settings, &origins, Arc::clone(&clock), stop.clone())?;
    let redis = pinged(&store);
    if redis.is_empty() {
        counters.set_store_up("embedded", true);
    } else {
        health.expect_store().await;
    }
    tasks.spawn(crate::observe::health::watch(
        health.clone(),
        Arc::clone(&rules),
        redis,
        Arc::clone(&counters),
        stop.clone(),
    ));
    let fallback = MemoryStore::with_max_keys(Arc::clone(&clock), store_settings.memory_max_keys);
    let store_name = store.to_string();
    let limiter = build_limiter(&decisions, &telemetry, store, fallback, &rules, metrics, &clock)?;
    let limiter = with_decision_log(limiter, &telemetry, Arc::clone(&counters))?;
    let origin = source.follow(&tasks, &rules, &health, &stop);
    tasks.spawn(sweep(Arc::clone(&limiter), stop.clone()));
    if stats.statsd() || stats.dog_statsd() {
        let options = statsd_options(&stats);
        let metrics = Arc::clone(limiter.metrics());
        let reader = Arc::clone(&limiter);
        let store = Box::new(move || reader.store_counters());
        let counters = Arc::clone(&counters);
        tasks.spawn(crate::observe::statsd::run(
            options,
            metrics,
            counters,
            store,
            stop.clone(),
        ));
    }
    tasks.spawn(log_offenders(Arc::clone(&limiter), stop.clone()));
    if let Some(tls) = &tls {
        tasks.spawn(Arc::clone(tls).watch(rules_settings.reload_interval, stop.clone()));
    }

    let addresses = (
        grpc_address(&listeners.grpc),
        listeners.http.local_addr()?,
        listeners.debug.local_addr()?,
        listeners
            .native_http
            .as_ref()
            .map(TcpListener::local_addr)
            .transpose()?,
    );
    let envoy = envoy_options(&answers);
    let exposition = crate::http::Exposition {
        limiter: Arc::clone(&limiter),
        counters: Arc::clone(&counters),
        go: go_series.clone(),
    };
    let admin = crate::http::Admin {
        health: health.clone(),
        limiter: Arc::clone(&limiter),
        counters: Arc::clone(&counters),
        options: envoy.clone(),
        max_body_bytes: listen.max_request_bytes,
        with_native: listeners.native_http.is_none(),
        go: go_series.clone(),
    };
    let budget = request_budget(&listen, Arc::clone(&counters));
    let (grpc_limits, http_limits) = transport_limits(&listen, &budget, &counters);
    let serve_http = |listener, router, what| {
        let (limits, counters) = (http_limits.clone(), Arc::clone(&counters));
        crate::http::serve(listener, router, limits, what, counters, stop.clone())
    };
    let http = serve_http(
        listeners.http,
        crate::http::admin_router(admin),
        "HTTP (TOLLGATE_HTTP_MAX_CONNECTIONS)",
    );
    let debug = serve_http(
        listeners.debug,
        crate::http::debug_router(exposition.clone()),
        "debug (TOLLGATE_HTTP_MAX_CONNECTIONS)",
    );
    let prometheus = listeners.prometheus.map(|listener| {
        let router = crate::http::prometheus_router(exposition.clone(), &listen.prometheus_path);
        serve_http(listener, router, "Prometheus (TOLLGATE_HTTP_MAX_CONNECTIONS)")
    });
    let native_http = listeners.native_http.map(|listener| {
        let router = crate::http::native_router(&limiter, &envoy, listen.max_request_bytes);
        serve_http(listener, router, "native API (TOLLGATE_HTTP_MAX_CONNECTIONS)")
    });
    let stopped = stop.clone();
    let grpc = crate::grpc::serve(
        listeners.grpc,
        tls,
        limiter,
        envoy,
        grpc_limits,
        health_service,
        async move { stopped.cancelled().await },
    );

    let drain = listen.drain_period;
    let trigger = stop.clone();
    tasks.spawn(async move {
        shutdown.await;
        tracing::info!(?drain, "shutting down: reporting NOT_SERVING, then draining");
        health.set_draining().await;
        tokio::time::sleep(drain).await;
        trigger.cancel();
    });
    let (grpc_addr, http_addr, debug_addr, native_addr) = addresses;
    let native_addr = native_addr.map_or_else(|| "the HTTP port".to_owned(), |addr| addr.to_string());
    // Logged with the real ports so a caller that bound port 0 can find them; at WARN, as the Go service
    // logs its "Listening for ..." lines, so the default level (WARN) still shows where it serves.
    tracing::warn!(
        grpc = %grpc_addr, http = %http_addr, debug = %debug_addr, native_http = %native_addr,
        rules = %origin, store = %store_name, "tollgate serving"
    );
    let optional = |serving: Option<_>| async move {
        if let Some(serving) = serving {
            serving.await;
        }
    };
    let (grpc, http, debug, prometheus, native_http) =
        tokio::join!(grpc, http, debug, optional(prometheus), optional(native_http));
    stop.cancel();
    tasks.close();
    tasks.wait().await;
    let ((), (), (), ()) = (http, debug, prometheus, native_http);
    grpc.context("gRPC server failed")
}

/// The limiter over `store` and `rules`: its options, the store `failure_mode: local` counts in while
/// `store` fails, and the fleet's refund keys (tokens dated by `clock`). The decision log is added by
/// [`with_decision_log`].
fn build_limiter(
    decisions: &DecisionSettings,
    telemetry: &TelemetrySettings,
    store: AnyStore,
    fallback: MemoryStore,
    rules: &RulesHandle,
    metrics: Arc<Metrics>,
    clock: &Arc<dyn Clock>,
) -> anyhow::Result<Limiter<AnyStore>> {
    let mut options = limiter_options(decisions, telemetry);
    if decisions.stop_cache_key_increment_when_overlimit && store.is_cluster() {
        // Exact rather than racy: one script call sees every descriptor of a request.
        options.keep_domains_together = true;
        tracing::warn!(
            "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT on Redis Cluster: each domain's counters live in one \
             hash slot (keys tagged {{prefix+domain}}), so a request over one limit leaves its other \
             descriptors untouched; these keys are not envoyproxy/ratelimit's and a domain's load is on \
             one master"
        );
    }
    let keys = refund_keys(decisions)?.or_else(RefundKeys::random);
    let limiter = Limiter::new(
        Arc::clone(rules),
        store,
        ValueHasher::new(decisions.hash_key.expose()),
        options,
    )
    .with_metrics(metrics)
    .with_local_fallback(fallback)
    .with_refund_keys(keys, Arc::clone(clock));
    Ok(limiter)
}

/// `limiter`, recording its decisions in the decision log when `telemetry` asks for one (what it writes
/// and drops counted in `counters`).
fn with_decision_log(
    limiter: Limiter<AnyStore>,
    telemetry: &TelemetrySettings,
    counters: Arc<ServerCounters>,
) -> anyhow::Result<Arc<Limiter<AnyStore>>> {
    let limiter = match DecisionLog::start(telemetry, counters)? {
        Some(log) => {
            tracing::info!(path = %telemetry.decision_log, "recording decisions (TOLLGATE_DECISION_LOG)");
            limiter.with_recorder(log)
        }
        None => limiter,
    };
    Ok(Arc::new(limiter))
}

/// How the gRPC listener is named in the log: its TCP address, or `unix:PATH`.
fn grpc_address(listener: &GrpcListener) -> String {
    match listener {
        GrpcListener::Tcp(tcp) => tcp.local_addr().map_or_else(|e| e.to_string(), |a| a.to_string()),
        GrpcListener::Unix(socket) => format!("unix:{}", socket.path().display()),
    }
}

/// Sweeps the embedded stores (see [`Limiter::sweep`]) every [`SWEEP_INTERVAL`] off the runtime's threads (one shard locked at a
/// time, so no request waits on more than one shard's sweep), and says once a minute when the key cap
/// made it evict.
async fn sweep(limiter: Arc<Limiter<AnyStore>>, stop: CancellationToken) {
    let mut ticker = tokio::time::interval(SWEEP_INTERVAL);
    let (mut reported, mut last_report) = (0, tokio::time::Instant::now());
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = ticker.tick() => {}
        }
        let swept = Arc::clone(&limiter);
        let Ok(dropped) = tokio::task::spawn_blocking(move || swept.sweep()).await else {
            continue;
        };
        tracing::trace!(dropped, "swept expired state");
        let evictions = limiter.store_counters().memory_evictions;
        if evictions > reported && last_report.elapsed() >= EVICTION_LOG_INTERVAL {
            tracing::warn!(
                evicted = evictions - reported,
                "the embedded store is full (TOLLGATE_MEMORY_MAX_KEYS): live keys were evicted"
            );
            (reported, last_report) = (evictions, tokio::time::Instant::now());
        }
    }
}

/// Evictions are logged at most this often.
const EVICTION_LOG_INTERVAL: Duration = Duration::from_secs(60);

/// How often the heaviest callers are summarised in the log.
const OFFENDER_LOG_INTERVAL: Duration = Duration::from_secs(60);

/// Logs the three heaviest callers of every domain once a minute, when there are any, so a spike of
/// refusals is visible in the logs as well as at `/top`.
async fn log_offenders(limiter: Arc<Limiter<AnyStore>>, stop: CancellationToken) {
    let mut ticker = tokio::time::interval(OFFENDER_LOG_INTERVAL);
    ticker.tick().await;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = ticker.tick() => {}
        }
        for (domain, offenders) in limiter.offenders().top(3) {
            let summary: Vec<String> = offenders
                .iter()
                .map(|o| format!("{}={}", o.key, o.count))
                .collect();
            tracing::info!(%domain, top = %summary.join(" "), "top offenders (refused or near the limit)");
        }
    }
}

/// Completes on SIGTERM or Ctrl-C (in a container the first signal is SIGTERM). The SIGTERM handler is
/// installed by this call, not when the future is first polled: the server announces it is serving
/// before that poll may happen (always, on a current-thread runtime), and a SIGTERM in between would
/// otherwise kill the process without draining. Call it inside the runtime.
pub fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    let term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate());
    async move {
        #[cfg(unix)]
        match term {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(error) => {
                tracing::warn!(%error, "cannot listen for SIGTERM; only Ctrl-C stops the server");
                let _ = tokio::signal::ctrl_c().await;
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
