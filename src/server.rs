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
use axum::serve::ListenerExt as _;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::metadata::{MetadataKey, MetadataValue};

use crate::api::envoy::EnvoyOptions;
use crate::api::headers::{HeaderNames, HeaderOptions};
use crate::clock::Clock;
use crate::grpc::tls::{ServerTls, TlsFiles};
use crate::grpc::{GrpcLimits, GrpcListener};
use crate::limiter::{Limiter, LimiterOptions, RefundKeys, RulesHandle};
use crate::observe::health::Health;
use crate::observe::metrics::Metrics;
use crate::proto::envoy::config::core::v3::Node;
use crate::proto::envoy::config::core::v3::node::UserAgentVersionType;
use crate::rules::reload::Reloader;
use crate::rules::xds::{Retry, XdsClient, XdsServer, XdsTls};
use crate::rules::{CompileOptions, RuleSet, ValueHasher};
use crate::settings::{ConfigType, HeaderStyle, Settings, SettingsError, without_userinfo};
use crate::store::AnyStore;
use crate::store::local_cache::LocalCache;
use crate::store::memory::MemoryStore;
use crate::store::per_second::RedisStores;
use crate::store::redis::{RedisOptions, RedisStore, RedisTarget};

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
}

impl Listeners {
    /// Binds the addresses in `settings`; port 0 picks a free port.
    pub async fn bind(settings: &Settings) -> anyhow::Result<Self> {
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
        Ok(Self {
            grpc,
            http: bind(settings.http_addr.clone(), "HTTP").await?,
            debug: bind(settings.debug_addr.clone(), "debug").await?,
            prometheus,
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
/// time ([`crate::clock::SystemClock`] in production; tests hand in a [`crate::clock::ManualClock`] to move time
/// without sleeping). Redis keeps its own clock.
pub async fn run(
    settings: Settings,
    listeners: Listeners,
    clock: Arc<dyn Clock>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    // Before anything is spawned: a certificate that does not load stops startup with nothing left
    // running.
    let tls = server_tls(&settings)?;
    let envoy = envoy_options(&settings);
    let options = CompileOptions {
        default_algorithm: settings.default_algorithm,
        split_per_second: settings.redis_persecond,
    };
    let metrics = Metrics::new();
    let addresses = (
        grpc_address(&listeners.grpc),
        listeners.http.local_addr()?,
        listeners.debug.local_addr()?,
    );
    let rules: RulesHandle = Arc::new(ArcSwapOption::empty());
    let (reporter, health_service) = tonic_health::server::health_reporter();
    let health = Health::new(reporter).await;
    let source = match settings.config_type {
        ConfigType::File => {
            let reloader = Reloader {
                dir: settings.config_dir.clone(),
                merge_domains: settings.merge_domain_config,
                options,
                interval: settings.reload_interval,
                metrics: Arc::clone(&metrics),
            };
            let version = reloader.load_into(&rules).context("cannot load the rules")?;
            health.set_rules_loaded(true).await;
            RulesSource::Files(reloader, version)
        }
        ConfigType::GrpcXdsSotw => {
            let client = xds_client(&settings, options, Arc::clone(&metrics))?;
            if settings.force_start_without_initial_config {
                rules.store(Some(Arc::new(RuleSet::compile(&[], options)?)));
                health.set_rules_loaded(true).await;
            } else {
                tracing::info!(
                    "not ready until the xDS server sends rules (FORCE_START_WITHOUT_INITIAL_CONFIG is false)"
                );
            }
            RulesSource::Xds(Box::new(client))
        }
    };

    let stop = CancellationToken::new();
    // Whatever way `run` returns (an error after the store started connecting, say), every task it
    // spawned is told to stop.
    let _stop_on_return = stop.clone().drop_guard();
    let tasks = tokio_util::task::TaskTracker::new();
    let store = build_store(&settings, Arc::clone(&clock), stop.clone())?;
    if let AnyStore::Redis(stores) = &store {
        health.set_store_reachable(false).await;
        let redis = stores.all().map(|cache| Arc::clone(cache.inner())).collect();
        tasks.spawn(watch_redis(redis, health.clone(), stop.clone()));
    }
    let mut options = limiter_options(&settings);
    if settings.stop_cache_key_increment_when_overlimit && store.is_cluster() {
        // Exact rather than racy: one script call sees every descriptor of a request.
        options.keep_domains_together = true;
        tracing::warn!(
            "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT on Redis Cluster: each domain's counters live in one \
             hash slot (keys tagged {{prefix+domain}}), so a request over one limit leaves its other \
             descriptors untouched; these keys are not envoyproxy/ratelimit's and a domain's load is on \
             one master"
        );
    }
    let limiter = Limiter::new(
        Arc::clone(&rules),
        store,
        ValueHasher::new(settings.hash_key.expose()),
        options,
    )
    .with_metrics(metrics);
    let limiter = limiter.with_local_fallback(MemoryStore::with_max_keys(
        Arc::clone(&clock),
        settings.memory_max_keys,
    ));
    let keys = refund_keys(&settings)?.or_else(RefundKeys::random);
    let limiter = Arc::new(limiter.with_refund_keys(keys, Arc::clone(&clock)));
    let origin = match source {
        RulesSource::Files(reloader, version) => {
            let origin = reloader.dir.display().to_string();
            tasks.spawn(reloader.run(Arc::clone(&rules), Some(version), stop.clone()));
            origin
        }
        RulesSource::Xds(client) => {
            let origin = format!("xds:{}", client.server.url);
            tasks.spawn(client.run(Arc::clone(&rules), health.clone(), stop.clone()));
            origin
        }
    };
    tasks.spawn(sweep(Arc::clone(&limiter), stop.clone()));
    tasks.spawn(log_offenders(Arc::clone(&limiter), stop.clone()));

    let stopped = stop.clone();
    let admin = crate::http::Admin {
        health: health.clone(),
        limiter: Arc::clone(&limiter),
        options: envoy.clone(),
        max_body_bytes: settings.max_request_bytes,
    };
    // TCP_NODELAY, as on the gRPC port: `/json` and `/v1/*` answers must not wait for a delayed ACK.
    let http_listener = listeners.http.tap_io(|tcp| {
        if let Err(error) = tcp.set_nodelay(true) {
            tracing::debug!(%error, "cannot set TCP_NODELAY on an HTTP connection");
        }
    });
    let http = axum::serve(http_listener, crate::http::admin_router(admin))
        .with_graceful_shutdown(async move { stopped.cancelled().await });
    let stopped = stop.clone();
    let debug = axum::serve(listeners.debug, crate::http::debug_router(Arc::clone(&limiter)))
        .with_graceful_shutdown(async move { stopped.cancelled().await });
    let prometheus = listeners.prometheus.map(|listener| {
        let stopped = stop.clone();
        let router = crate::http::prometheus_router(Arc::clone(&limiter), &settings.prometheus_path);
        axum::serve(listener, router).with_graceful_shutdown(async move { stopped.cancelled().await })
    });
    if let Some(tls) = &tls {
        tasks.spawn(Arc::clone(tls).watch(settings.reload_interval, stop.clone()));
    }
    let stopped = stop.clone();
    let limits = GrpcLimits {
        max_message_bytes: settings.max_request_bytes,
        max_concurrent_streams: settings.grpc_max_concurrent_streams,
        // Zero is never, as in grpc-go.
        max_connection_age: Some(settings.grpc_max_connection_age).filter(|age| !age.is_zero()),
        max_connection_age_grace: settings.grpc_max_connection_age_grace,
    };
    let grpc = crate::grpc::serve(
        listeners.grpc,
        tls,
        limiter,
        envoy,
        limits,
        health_service,
        async move { stopped.cancelled().await },
    );

    let drain = settings.drain_period;
    let trigger = stop.clone();
    tasks.spawn(async move {
        shutdown.await;
        tracing::info!(?drain, "shutting down: reporting NOT_SERVING, then draining");
        health.set_draining().await;
        tokio::time::sleep(drain).await;
        trigger.cancel();
    });
    let (grpc_addr, http_addr, debug_addr) = addresses;
    // Logged with the real ports so a caller that bound port 0 can find them; at WARN, as the Go service
    // logs its "Listening for ..." lines, so the default level (WARN) still shows where it serves.
    tracing::warn!(
        grpc = %grpc_addr, http = %http_addr, debug = %debug_addr,
        rules = %origin, "tollgate serving"
    );
    let prometheus = async move {
        match prometheus {
            Some(serving) => serving.await,
            None => Ok(()),
        }
    };
    let (grpc, http, debug, prometheus) = tokio::join!(grpc, http, debug, prometheus);
    stop.cancel();
    tasks.close();
    tasks.wait().await;
    grpc.context("gRPC server failed")?;
    http.context("HTTP server failed")?;
    debug.context("debug server failed")?;
    prometheus.context("Prometheus server failed")?;
    Ok(())
}

/// Where the rules come from, ready to follow.
enum RulesSource {
    /// The rules directory, loaded once (at this version) and polled.
    Files(Reloader, String),
    /// An xDS management server.
    Xds(Box<XdsClient>),
}

/// The xDS rules source the `CONFIG_GRPC_XDS_*` and `XDS_CLIENT_*` settings describe. TLS material is
/// read now, so a missing file stops startup naming it.
fn xds_client(
    settings: &Settings,
    options: CompileOptions,
    metrics: Arc<Metrics>,
) -> anyhow::Result<XdsClient> {
    let tls = if settings.config_grpc_xds_server_use_tls {
        if settings.config_grpc_xds_server_tls_cacert.is_empty() {
            anyhow::bail!(
                "CONFIG_GRPC_XDS_SERVER_USE_TLS needs CONFIG_GRPC_XDS_SERVER_TLS_CACERT (the system's roots are not built in)"
            );
        }
        let identity = match (
            settings.config_grpc_xds_client_tls_cert.as_str(),
            settings.config_grpc_xds_client_tls_key.as_str(),
        ) {
            ("", "") => None,
            (cert, key) if !cert.is_empty() && !key.is_empty() => {
                Some((PathBuf::from(cert), PathBuf::from(key)))
            }
            _ => anyhow::bail!(
                "CONFIG_GRPC_XDS_CLIENT_TLS_CERT and CONFIG_GRPC_XDS_CLIENT_TLS_KEY go together"
            ),
        };
        let tls = XdsTls {
            ca: PathBuf::from(&settings.config_grpc_xds_server_tls_cacert),
            identity,
            server_name: Some(settings.config_grpc_xds_server_tls_san.clone()).filter(|san| !san.is_empty()),
        };
        // Read once now, so a missing file stops startup naming it; then at every connection attempt.
        tls.load()
            .context("cannot read the xDS TLS files (CONFIG_GRPC_XDS_SERVER_TLS_CACERT, CONFIG_GRPC_XDS_CLIENT_TLS_CERT/_KEY)")?;
        Some(tls)
    } else {
        None
    };
    // Go's list forms: `k=v,k2=v2` (node metadata), `k:v,k2:v2` (headers); an entry without the
    // separator is refused, not dropped.
    let pairs =
        |name: &'static str, text: &str, separator: char| -> Result<Vec<(String, String)>, SettingsError> {
            text.split(',')
                .filter(|pair| !pair.trim().is_empty())
                .map(|pair| {
                    let (k, v) = pair
                        .split_once(separator)
                        .ok_or_else(|| SettingsError::BadValue {
                            name,
                            value: "<redacted>".into(),
                            reason: format!("an entry is not key{separator}value"),
                        })?;
                    Ok((k.trim().to_owned(), v.trim().to_owned()))
                })
                .collect()
        };
    // Header values are often tokens: errors name the key only.
    let headers = pairs(
        "config_grpc_xds_client_additional_headers",
        &settings.config_grpc_xds_client_additional_headers,
        ':',
    )?
    .into_iter()
    .map(|(key, value)| {
        let bad = |reason: &str| SettingsError::BadValue {
            name: "config_grpc_xds_client_additional_headers",
            value: "<redacted>".into(),
            reason: format!("header {key:?}: {reason}"),
        };
        let name = MetadataKey::from_bytes(key.to_ascii_lowercase().as_bytes())
            .map_err(|_| bad("not a valid ASCII metadata name"))?;
        let value =
            MetadataValue::try_from(value.as_str()).map_err(|_| bad("the value is not printable ASCII"))?;
        Ok((name, value))
    })
    .collect::<Result<Vec<_>, SettingsError>>()?;
    let metadata = pairs(
        "config_grpc_xds_node_metadata",
        &settings.config_grpc_xds_node_metadata,
        '=',
    )?
    .into_iter()
    .map(|(k, v)| {
        let value = prost_types::Value {
            kind: Some(prost_types::value::Kind::StringValue(v)),
        };
        (k, value)
    })
    .collect();
    Ok(XdsClient {
        server: XdsServer {
            url: settings.config_grpc_xds_server_url.clone(),
            tls,
            headers,
            max_message_bytes: settings.xds_client_max_msg_size_in_bytes,
        },
        node: Node {
            id: settings.config_grpc_xds_node_id.clone(),
            cluster: String::new(),
            metadata: Some(prost_types::Struct { fields: metadata }),
            user_agent_name: "tollgate".into(),
            user_agent_version_type: Some(UserAgentVersionType::UserAgentVersion(
                env!("CARGO_PKG_VERSION").into(),
            )),
        },
        retry: Retry {
            connect_interval: settings.config_grpc_xds_server_connect_retry_interval,
            backoff_initial: settings.xds_client_backoff_initial_interval,
            backoff_max: settings.xds_client_backoff_max_interval,
            random_factor: settings.xds_client_backoff_random_factor,
            jitter: settings.xds_client_backoff_jitter,
        },
        merge_domains: settings.merge_domain_config,
        options,
        metrics,
    })
}

/// How the gRPC listener is named in the log: its TCP address, or `unix:PATH`.
fn grpc_address(listener: &GrpcListener) -> String {
    match listener {
        GrpcListener::Tcp(tcp) => tcp.local_addr().map_or_else(|e| e.to_string(), |a| a.to_string()),
        GrpcListener::Unix(socket) => format!("unix:{}", socket.path().display()),
    }
}

/// The gRPC listener's TLS (`GRPC_SERVER_USE_TLS`), read from its files; `None` for plaintext.
fn server_tls(settings: &Settings) -> anyhow::Result<Option<Arc<ServerTls>>> {
    if !settings.grpc_server_use_tls {
        return Ok(None);
    }
    let optional = |value: &str| Some(value.to_owned()).filter(|v| !v.is_empty());
    let files = TlsFiles {
        cert: PathBuf::from(&settings.grpc_server_tls_cert),
        key: PathBuf::from(&settings.grpc_server_tls_key),
        client_ca: optional(&settings.grpc_client_tls_cacert).map(PathBuf::from),
        client_san: optional(&settings.grpc_client_tls_san),
    };
    let tls = ServerTls::load(files).context("cannot start TLS on the gRPC listener")?;
    tracing::info!(
        client_certificates = !settings.grpc_client_tls_cacert.is_empty(),
        "gRPC listener serves TLS"
    );
    Ok(Some(Arc::new(tls)))
}

/// The embedded store, or Redis (connecting in the background) behind the local over-limit cache.
fn build_store(
    settings: &Settings,
    clock: Arc<dyn Clock>,
    stop: CancellationToken,
) -> anyhow::Result<AnyStore> {
    let Some(target) = redis_target(settings)? else {
        tracing::info!("no REDIS_URL: counting in the embedded store (one instance only)");
        return Ok(AnyStore::Memory(MemoryStore::with_max_keys(
            clock,
            settings.memory_max_keys,
        )));
    };
    let tls = redis_tls_certificates(settings)?;
    let cached = |target, connections, connect_timeout| {
        let options = RedisOptions {
            target,
            connections,
            deadline: settings.redis_deadline,
            connect_timeout,
            expiration_jitter_max_secs: settings.expiration_jitter_max_seconds,
            tls: tls.clone(),
        };
        let redis = RedisStore::start(options, Arc::clone(&clock), stop.clone());
        LocalCache::new(redis, settings.local_cache_size_in_bytes, Arc::clone(&clock))
    };
    let main = cached(target, settings.redis_pool_size, settings.redis_connect_timeout);
    let per_second = redis_persecond_target(settings)?.map(|target| {
        tracing::info!(redis = %target, "per-second limits are counted in their own Redis (REDIS_PERSECOND)");
        cached(
            target,
            settings.redis_persecond_pool_size,
            settings.redis_persecond_connect_timeout,
        )
    });
    Ok(AnyStore::Redis(RedisStores { main, per_second }))
}

/// Shortest refund key accepted: 128 bits as hex (`openssl rand -hex 16`) or more.
const MIN_REFUND_KEY_LEN: usize = 32;

/// The fleet's refund-token keys (`TOLLGATE_REFUND_KEY`, else `TOLLGATE_REFUND_KEY_FILE`), or `None`:
/// then the limiter signs with a random key of this process, and says so.
fn refund_keys(settings: &Settings) -> anyhow::Result<Option<RefundKeys>> {
    let text = if !settings.refund_key.is_empty() {
        settings.refund_key.expose().to_owned()
    } else if !settings.refund_key_file.is_empty() {
        std::fs::read_to_string(&settings.refund_key_file).map_err(|e| SettingsError::BadValue {
            name: "refund_key_file",
            value: settings.refund_key_file.clone(),
            reason: e.to_string(),
        })?
    } else {
        tracing::warn!(
            "no TOLLGATE_REFUND_KEY or TOLLGATE_REFUND_KEY_FILE: refund tokens are signed with a random key \
             of this process, so a refund only works on the instance that issued its token"
        );
        return Ok(None);
    };
    let secrets: Vec<&str> = text
        .split([',', '\n'])
        .map(str::trim)
        .filter(|k| !k.is_empty())
        .collect();
    let Some((current, previous)) = secrets.split_first() else {
        return Err(SettingsError::BadValue {
            name: "refund_key",
            value: "<redacted>".into(),
            reason: "holds no key".into(),
        }
        .into());
    };
    if let Some(short) = secrets.iter().position(|k| k.len() < MIN_REFUND_KEY_LEN) {
        // A short key can be found offline from any one token: it would let callers forge refunds.
        return Err(SettingsError::BadValue {
            name: "refund_key",
            value: "<redacted>".into(),
            reason: format!("key {} is shorter than {MIN_REFUND_KEY_LEN} bytes", short + 1),
        }
        .into());
    }
    let previous: Vec<&[u8]> = previous.iter().map(|k| k.as_bytes()).collect();
    let keys = RefundKeys::new(current.as_bytes(), &previous)
        .context("the operating system gave no randomness for refund token ids")?;
    tracing::info!(keys = secrets.len(), "refund tokens signed with the fleet's key");
    Ok(Some(keys))
}

/// Keeps readiness in step with Redis (every Redis in use: the main one and the per-second one): a PING
/// every [`STORE_PROBE_INTERVAL`]; state changes are logged.
async fn watch_redis(redis: Vec<Arc<RedisStore>>, health: Health, stop: CancellationToken) {
    let mut ticker = tokio::time::interval(STORE_PROBE_INTERVAL);
    let mut reachable = false;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = ticker.tick() => {}
        }
        let pings = futures_util::future::join_all(redis.iter().map(|r| r.ping())).await;
        let now = pings.into_iter().all(|up| up);
        if now != reachable {
            reachable = now;
            if reachable {
                tracing::info!("Redis answers: ready");
            } else {
                tracing::warn!("Redis does not answer: not ready (rules with failure_mode still answer)");
            }
            health.set_store_reachable(reachable).await;
        }
    }
}

/// How often readiness checks that Redis answers.
const STORE_PROBE_INTERVAL: Duration = Duration::from_millis(500);

fn limiter_options(settings: &Settings) -> LimiterOptions {
    LimiterOptions {
        cache_key_prefix: settings.cache_key_prefix.clone(),
        stop_increment_when_over_limit: settings.stop_cache_key_increment_when_overlimit,
        keep_domains_together: false,
        global_shadow_mode: settings.shadow_mode,
        global_quota_mode: settings.quota_mode,
        default_algorithm: settings.default_algorithm,
        max_descriptors: settings.max_descriptors,
        near_limit_ratio: settings.near_limit_ratio,
        show_caller_values: settings.show_caller_values,
        fleet_size: settings.fleet_size,
    }
}

fn envoy_options(settings: &Settings) -> EnvoyOptions {
    EnvoyOptions {
        headers: header_options(settings),
        dynamic_metadata: settings.response_dynamic_metadata,
    }
}

/// The header styles and body to add to answers.
fn header_options(settings: &Settings) -> HeaderOptions {
    let trio = || HeaderNames {
        limit: settings.limit_limit_header.clone(),
        remaining: settings.limit_remaining_header.clone(),
        reset: settings.limit_reset_header.clone(),
    };
    let mut options = HeaderOptions {
        trio: settings.limit_response_headers_enabled.then(trio),
        raw_body: settings.raw_body,
        ..HeaderOptions::default()
    };
    for style in &settings.response_headers.0 {
        match style {
            HeaderStyle::RateLimit => options.trio = Some(trio()),
            HeaderStyle::XRateLimit => options.x_ratelimit = true,
            HeaderStyle::Ietf => options.ietf = true,
            HeaderStyle::RetryAfter => options.retry_after = true,
        }
    }
    options
}

/// Where Redis is, or `None` for the embedded store. The error names the URL without its userinfo.
pub(crate) fn redis_target(settings: &Settings) -> Result<Option<RedisTarget>, SettingsError> {
    if settings.redis_url.trim().is_empty() {
        return Ok(None);
    }
    parse_target(
        "redis_url",
        &settings.redis_url,
        &settings.redis_type,
        &settings.redis_socket_type,
        settings.redis_auth.expose(),
        settings.redis_sentinel_auth.expose(),
        settings.redis_tls,
        settings,
    )
    .map(Some)
}

/// Where the per-second Redis is (`REDIS_PERSECOND`), or `None` when per-second limits stay in the
/// main one.
pub(crate) fn redis_persecond_target(settings: &Settings) -> Result<Option<RedisTarget>, SettingsError> {
    if !settings.redis_persecond {
        return Ok(None);
    }
    parse_target(
        "redis_persecond_url",
        &settings.redis_persecond_url,
        &settings.redis_persecond_type,
        &settings.redis_persecond_socket_type,
        settings.redis_persecond_auth.expose(),
        settings.redis_persecond_sentinel_auth.expose(),
        settings.redis_persecond_tls,
        settings,
    )
    .map(Some)
}

/// One Redis location; the error names the setting and the URL without its userinfo.
#[allow(clippy::too_many_arguments)]
fn parse_target(
    name: &'static str,
    url: &str,
    kind: &str,
    socket_type: &str,
    auth: &str,
    sentinel_auth: &str,
    tls: bool,
    settings: &Settings,
) -> Result<RedisTarget, SettingsError> {
    RedisTarget::parse(
        url,
        kind,
        socket_type,
        auth,
        sentinel_auth,
        tls,
        settings.redis_tls_skip_hostname_verification,
    )
    .map_err(|e| SettingsError::BadValue {
        name,
        value: without_userinfo(url),
        reason: e.to_string(),
    })
}

/// The contents of the file a setting names; the error names the setting and the path.
fn read_setting_file(name: &'static str, path: &str) -> Result<Vec<u8>, SettingsError> {
    std::fs::read(path).map_err(|e| SettingsError::BadValue {
        name,
        value: path.into(),
        reason: e.to_string(),
    })
}

/// The certificates for TLS to Redis, read from the configured files (none configured: `None`, and the
/// system's roots verify the server).
fn redis_tls_certificates(settings: &Settings) -> Result<Option<redis::TlsCertificates>, SettingsError> {
    let read = read_setting_file;
    let root_cert = match settings.redis_tls_cacert.as_str() {
        "" => None,
        path => Some(read("redis_tls_cacert", path)?),
    };
    let client_tls = match (
        settings.redis_tls_client_cert.as_str(),
        settings.redis_tls_client_key.as_str(),
    ) {
        ("", "") => None,
        (cert, key) if !cert.is_empty() && !key.is_empty() => Some(redis::ClientTlsConfig {
            client_cert: read("redis_tls_client_cert", cert)?,
            client_key: read("redis_tls_client_key", key)?,
        }),
        _ => {
            return Err(SettingsError::BadValue {
                name: "redis_tls_client_cert",
                value: settings.redis_tls_client_cert.clone(),
                reason: "a client certificate and its key go together".into(),
            });
        }
    };
    Ok(
        (root_cert.is_some() || client_tls.is_some()).then_some(redis::TlsCertificates {
            client_tls,
            root_cert,
        }),
    )
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
