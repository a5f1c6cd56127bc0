//! Service settings, layered (later wins): built-in defaults, an optional YAML settings file,
//! envoyproxy/ratelimit's environment variables (so an existing deployment's environment carries over),
//! `TOLLGATE_*` environment variables, command-line flags.
//!
//! Go names honoured: `GRPC_HOST`/`GRPC_PORT`, `HOST`/`PORT`, `DEBUG_HOST`/`DEBUG_PORT`,
//! `RUNTIME_ROOT`/`RUNTIME_SUBDIRECTORY`/`RUNTIME_APPDIRECTORY` (rules in `ROOT/SUBDIRECTORY/APPDIRECTORY`),
//! `SHADOW_MODE`, `QUOTA_MODE`, `RESPONSE_DYNAMIC_METADATA`, `LIMIT_RESPONSE_HEADERS_ENABLED`,
//! `LIMIT_LIMIT_HEADER`, `LIMIT_REMAINING_HEADER`, `LIMIT_RESET_HEADER`, `MERGE_DOMAIN_CONFIG`,
//! `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`, `CACHE_KEY_PREFIX`, `LOG_LEVEL`, `LOG_FORMAT`.
//! Native names are the field names upper-cased with a `TOLLGATE_` prefix (`TOLLGATE_GRPC_ADDR`...).
//!
//! Settings are a leaf: typed values (an [`Algorithm`], a [`LogFormat`], [`HeaderStyle`]s, [`Secret`]s),
//! checked once when loaded; nothing here knows the store or the listeners. The server turns them into
//! its parts' options in one place ([`crate::server`]).

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use config::{Config, Environment, File, FileFormat};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use tollgate_core::algorithm::Algorithm;
use tollgate_core::store::redis::without_userinfo;

mod go_env;

use go_env::{GoEnvironment, go_warnings};

/// Every setting of `tollgate serve`.
#[derive(Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    /// gRPC listener (`GRPC_HOST:GRPC_PORT`), default `0.0.0.0:8081`.
    pub grpc_addr: String,
    /// HTTP listener (`HOST:PORT`), default `0.0.0.0:8080`.
    pub http_addr: String,
    /// Debug listener (`DEBUG_HOST:DEBUG_PORT`), default `0.0.0.0:6070`.
    pub debug_addr: String,
    /// Directory of rules files, default `/srv/runtime_data/current/config` (envoyproxy/ratelimit's).
    pub config_dir: PathBuf,
    /// How often the rules directory is checked for changes.
    #[serde(with = "humantime_serde")]
    pub reload_interval: Duration,
    /// `MERGE_DOMAIN_CONFIG`: several files may define one domain.
    pub merge_domain_config: bool,
    /// `SHADOW_MODE`: never answer OVER_LIMIT overall.
    pub shadow_mode: bool,
    /// `QUOTA_MODE`: every descriptor is in quota mode.
    pub quota_mode: bool,
    /// `RESPONSE_DYNAMIC_METADATA`.
    pub response_dynamic_metadata: bool,
    /// `LIMIT_RESPONSE_HEADERS_ENABLED`.
    pub limit_response_headers_enabled: bool,
    /// `LIMIT_LIMIT_HEADER`.
    pub limit_limit_header: String,
    /// `LIMIT_REMAINING_HEADER`.
    pub limit_remaining_header: String,
    /// `LIMIT_RESET_HEADER`.
    pub limit_reset_header: String,
    /// `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`.
    pub stop_cache_key_increment_when_overlimit: bool,
    /// `CACHE_KEY_PREFIX`.
    pub cache_key_prefix: String,
    /// `LOG_LEVEL`: error, warn (the default, as the Go service), info, debug, trace (any case), or a
    /// tracing filter directive.
    pub log_level: String,
    /// `LOG_FORMAT`: `text` or `json`.
    #[serde(with = "as_text")]
    pub log_format: LogFormat,
    /// Algorithm of rules and overrides that do not name one.
    #[serde(with = "as_text")]
    pub default_algorithm: Algorithm,
    /// Secret for hashing descriptor values (`hash: true`); every replica must share it.
    pub hash_key: Secret,
    /// Requests with more descriptors are refused with INVALID_ARGUMENT.
    pub max_descriptors: usize,
    /// How long the server keeps answering after SIGTERM while health reports NOT_SERVING.
    #[serde(with = "humantime_serde")]
    pub drain_period: Duration,
    /// `BACKEND_TYPE`: `redis` (the only remote store; used when `redis_url` is set).
    pub backend_type: String,
    /// `REDIS_URL`: empty means the embedded in-memory store. See [`tollgate_core::store::redis::RedisTarget`].
    pub redis_url: String,
    /// `REDIS_TYPE`: `single`, `cluster` (or `sentinel`, refused for now).
    pub redis_type: String,
    /// `REDIS_SOCKET_TYPE`: `tcp` or `unix`.
    pub redis_socket_type: String,
    /// `REDIS_AUTH`: `password` or `user:password`.
    pub redis_auth: Secret,
    /// `REDIS_SENTINEL_AUTH`: the sentinels' own `password` or `user:password`.
    pub redis_sentinel_auth: Secret,
    /// `REDIS_TLS`: connect to Redis over TLS (also implied by a `rediss://` URL).
    pub redis_tls: bool,
    /// `REDIS_TLS_CACERT`: PEM file of the CA that signed Redis' certificate (else the system's roots).
    pub redis_tls_cacert: String,
    /// `REDIS_TLS_CLIENT_CERT`: PEM client certificate, for Redis servers that verify clients.
    pub redis_tls_client_cert: String,
    /// `REDIS_TLS_CLIENT_KEY`: PEM key of the client certificate.
    pub redis_tls_client_key: String,
    /// `REDIS_TLS_SKIP_HOSTNAME_VERIFICATION`: accept a certificate issued for another name.
    pub redis_tls_skip_hostname_verification: bool,
    /// `REDIS_POOL_SIZE`: multiplexed connections to a single node, used round-robin.
    pub redis_pool_size: usize,
    /// `REDIS_PERSECOND`: count per-second limits in a second Redis (`redis_persecond_*`), as the Go
    /// service does.
    pub redis_persecond: bool,
    /// `REDIS_PERSECOND_URL`: the per-second Redis, in the forms of `redis_url`.
    pub redis_persecond_url: String,
    /// `REDIS_PERSECOND_TYPE`: `single`, `cluster` or `sentinel`.
    pub redis_persecond_type: String,
    /// `REDIS_PERSECOND_SOCKET_TYPE`: `tcp` or `unix`.
    pub redis_persecond_socket_type: String,
    /// `REDIS_PERSECOND_AUTH`: `password` or `user:password`.
    pub redis_persecond_auth: Secret,
    /// `REDIS_PERSECOND_SENTINEL_AUTH`: the per-second sentinels' own password.
    pub redis_persecond_sentinel_auth: Secret,
    /// `REDIS_PERSECOND_TLS`: TLS to the per-second Redis (with the `REDIS_TLS_*` certificates).
    pub redis_persecond_tls: bool,
    /// `REDIS_PERSECOND_POOL_SIZE`: multiplexed connections to a per-second node.
    pub redis_persecond_pool_size: usize,
    /// `REDIS_PERSECOND_TIMEOUT`: longest a connection attempt to it takes.
    #[serde(with = "humantime_serde")]
    pub redis_persecond_connect_timeout: Duration,
    /// `REDIS_PERSECOND_PIPELINE_WINDOW`: `redis_pipeline_window` for the per-second Redis.
    #[serde(with = "humantime_serde")]
    pub redis_persecond_pipeline_window: Duration,
    /// `REDIS_PERSECOND_PIPELINE_LIMIT`: `redis_pipeline_limit` for the per-second Redis.
    pub redis_persecond_pipeline_limit: usize,
    /// Longest a decision waits for Redis before the rule's failure mode applies.
    #[serde(with = "humantime_serde")]
    pub redis_deadline: Duration,
    /// `REDIS_TIMEOUT`: longest a connection attempt takes.
    #[serde(with = "humantime_serde")]
    pub redis_connect_timeout: Duration,
    /// `EXPIRATION_JITTER_MAX_SECONDS`.
    pub expiration_jitter_max_seconds: u64,
    /// `REDIS_PIPELINE_WINDOW`: how long a coalesced Redis call waits, from its first request's
    /// arrival, for more requests to join it. Zero (the default) sends a call as soon as a call slot is
    /// free: calls then grow with the load alone. A window trades that much latency for fewer calls, so
    /// less Redis CPU per decision at moderate load. Must be shorter than `redis_deadline`.
    #[serde(with = "humantime_serde")]
    pub redis_pipeline_window: Duration,
    /// `REDIS_PIPELINE_LIMIT`: a coalesced call is sent once it carries this many items (descriptor
    /// limits), window or not. Zero: the built-in bound alone (512).
    pub redis_pipeline_limit: usize,
    /// Decide requests made only of fixed-window counters with pipelined `INCRBY` + `EXPIRE` (the Go
    /// service's commands) instead of the batch script: the same answers and keys for a fraction of
    /// Redis' CPU. Off sends every request through the script.
    pub redis_pipeline_fixed_windows: bool,
    /// `LOCAL_CACHE_SIZE_IN_BYTES`: the over-limit cache in front of Redis (0 turns it off).
    pub local_cache_size_in_bytes: usize,
    /// `NEAR_LIMIT_RATIO`: allowed hits above this fraction of a limit count as `near_limit`.
    pub near_limit_ratio: f64,
    /// Header styles to add, comma-separated: `ratelimit` (the trio, as `LIMIT_RESPONSE_HEADERS_ENABLED`),
    /// `x-ratelimit`, `ietf`, `retry-after`.
    #[serde(with = "as_text")]
    pub response_headers: HeaderStyles,
    /// A JSON body for 429 answers: `{"error":"rate_limited","retry_after":N}`.
    pub raw_body: bool,
    /// `TRACING_ENABLED`: export OpenTelemetry spans over OTLP/gRPC (`OTEL_EXPORTER_OTLP_*` apply).
    pub tracing_enabled: bool,
    /// `TRACING_SERVICE_NAME`.
    pub tracing_service_name: String,
    /// `TRACING_SERVICE_NAMESPACE`: `service.namespace` on spans (empty: not set).
    pub tracing_service_namespace: String,
    /// `TRACING_SERVICE_INSTANCE_ID`: `service.instance.id` on spans (empty: not set).
    pub tracing_service_instance_id: String,
    /// `TRACING_SAMPLING_RATE`: fraction of new traces kept (a sampled parent is always followed).
    pub tracing_sampling_rate: f64,
    /// `OTEL_TRACES_SAMPLER`: OpenTelemetry's sampler names; when set it replaces the default
    /// (parent-based, at `TRACING_SAMPLING_RATE`).
    #[serde(with = "as_text")]
    pub otel_traces_sampler: TraceSampler,
    /// `OTEL_TRACES_SAMPLER_ARG`: the ratio of the `*traceidratio` samplers, 0 to 1.
    pub otel_traces_sampler_arg: f64,
    /// `TRACING_EXPORTER_PROTOCOL`: only `grpc` is built in.
    pub tracing_exporter_protocol: String,
    /// `TOLLGATE_MEMORY_MAX_KEYS`: most entries the embedded store holds; beyond, consuming requests
    /// evict the entries that least affect decisions (counted in `tollgate_memory_evictions_total`).
    pub memory_max_keys: usize,
    /// `TOLLGATE_FLEET_SIZE`: how many replicas share the limits. While the store is unreachable, a
    /// rule with `failure_mode: local` counts in this instance at its limit divided by this.
    pub fleet_size: u32,
    /// Largest gRPC request message, in bytes; a larger one is refused with `RESOURCE_EXHAUSTED` before
    /// it is decoded. Also the largest HTTP request body (`/json`, `/v1/*`), refused with 413.
    pub max_request_bytes: usize,
    /// HTTP/2 streams one gRPC connection may have open at once.
    pub grpc_max_concurrent_streams: u32,
    /// `TOLLGATE_REFUND_KEY`: the secret that signs refund tokens, shared by every replica so a token
    /// verifies on any of them. Several keys separated by commas or newlines: the first signs, all
    /// verify (rotation: put the new key first, drop the old one once its tokens have expired).
    pub refund_key: Secret,
    /// `TOLLGATE_REFUND_KEY_FILE`: a file holding the refund keys (as [`Settings::refund_key`]; a
    /// Kubernetes Secret mounted as a file). Used when `refund_key` is empty.
    pub refund_key_file: String,
    /// `/top` and the denial log show callers' raw descriptor values (IP addresses, user ids) instead of
    /// their hashes. Off by default: those are personal data.
    pub show_caller_values: bool,
    /// What loading noticed and did not refuse (ignored variables and the like), to be logged once the
    /// logger runs: settings are read before it starts.
    #[serde(skip)]
    pub warnings: Vec<String>,
    /// Runtime worker threads; 0 means one per CPU minus one, at least one (see [`Settings::workers`]).
    pub worker_threads: usize,
    /// `GRPC_UDS`: serve gRPC on this unix socket instead of `grpc_addr`.
    pub grpc_uds: String,
    /// `GRPC_MAX_CONNECTION_AGE`: a gRPC connection older than this is sent GOAWAY, so clients
    /// reconnect and spread over replicas added since (default 24h, as the Go service).
    #[serde(with = "humantime_serde")]
    pub grpc_max_connection_age: Duration,
    /// `GRPC_MAX_CONNECTION_AGE_GRACE`: how long calls in flight may finish after that GOAWAY.
    #[serde(with = "humantime_serde")]
    pub grpc_max_connection_age_grace: Duration,
    /// `GRPC_SERVER_USE_TLS`: serve gRPC over TLS with `grpc_server_tls_cert` and `_key`.
    pub grpc_server_use_tls: bool,
    /// `GRPC_SERVER_TLS_CERT`: PEM certificate chain of the gRPC listener (re-read when it changes).
    pub grpc_server_tls_cert: String,
    /// `GRPC_SERVER_TLS_KEY`: PEM private key of that certificate.
    pub grpc_server_tls_key: String,
    /// `GRPC_CLIENT_TLS_CACERT`: require client certificates signed by this CA (mTLS).
    pub grpc_client_tls_cacert: String,
    /// `GRPC_CLIENT_TLS_SAN`: require this DNS name or IP address in the client certificate.
    pub grpc_client_tls_san: String,
    /// `CONFIG_TYPE`: where rules come from, `FILE` (the rules directory) or `GRPC_XDS_SOTW` (an xDS
    /// management server, as Envoy Gateway runs it).
    #[serde(with = "as_text")]
    pub config_type: ConfigType,
    /// `FORCE_START_WITHOUT_INITIAL_CONFIG`: with xDS, serve at once with no rules instead of staying
    /// not ready until the first rule set arrives.
    pub force_start_without_initial_config: bool,
    /// `CONFIG_GRPC_XDS_SERVER_URL`: the xDS management server, `host:port`.
    pub config_grpc_xds_server_url: String,
    /// `CONFIG_GRPC_XDS_NODE_ID`: the node id the xDS server knows this service by.
    pub config_grpc_xds_node_id: String,
    /// `CONFIG_GRPC_XDS_NODE_METADATA`: node metadata, `key=value` pairs separated by commas.
    pub config_grpc_xds_node_metadata: String,
    /// `CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL`: pause between attempts to connect.
    #[serde(with = "humantime_serde")]
    pub config_grpc_xds_server_connect_retry_interval: Duration,
    /// `CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS`: request metadata for the xDS stream, `key:value`
    /// pairs separated by commas.
    pub config_grpc_xds_client_additional_headers: String,
    /// `CONFIG_GRPC_XDS_SERVER_USE_TLS`: TLS to the xDS server.
    pub config_grpc_xds_server_use_tls: bool,
    /// `CONFIG_GRPC_XDS_CLIENT_TLS_CERT`: PEM client certificate for the xDS server.
    pub config_grpc_xds_client_tls_cert: String,
    /// `CONFIG_GRPC_XDS_CLIENT_TLS_KEY`: its key.
    pub config_grpc_xds_client_tls_key: String,
    /// `CONFIG_GRPC_XDS_SERVER_TLS_CACERT`: PEM CA that signed the xDS server's certificate.
    pub config_grpc_xds_server_tls_cacert: String,
    /// `CONFIG_GRPC_XDS_SERVER_TLS_SAN`: the name the xDS server's certificate must carry (else the
    /// host of the server URL).
    pub config_grpc_xds_server_tls_san: String,
    /// `XDS_CLIENT_BACKOFF_INITIAL_INTERVAL`: first pause before reopening a failed xDS stream.
    #[serde(with = "humantime_serde")]
    pub xds_client_backoff_initial_interval: Duration,
    /// `XDS_CLIENT_BACKOFF_MAX_INTERVAL`: longest pause between attempts.
    #[serde(with = "humantime_serde")]
    pub xds_client_backoff_max_interval: Duration,
    /// `XDS_CLIENT_BACKOFF_RANDOM_FACTOR`: with `xds_client_backoff_jitter`, each pause is spread by
    /// ± this fraction. (The Go client hands this value to its backoff as the growth multiplier, which
    /// at the default 0.5 pins every pause at the initial interval; Tollgate doubles the pause after
    /// each failure, up to the maximum.)
    pub xds_client_backoff_random_factor: f64,
    /// `XDS_CLIENT_BACKOFF_JITTER`: randomise each pause.
    pub xds_client_backoff_jitter: bool,
    /// `XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES`: largest xDS response accepted (0: 4 MiB, gRPC's default).
    pub xds_client_max_msg_size_in_bytes: usize,
    /// `USE_PROMETHEUS`: also serve the metrics on `prometheus_addr` at `prometheus_path`, where the Go
    /// service serves them (they are always on the HTTP and debug ports' `/metrics`).
    pub use_prometheus: bool,
    /// `PROMETHEUS_ADDR`: `host:port` or `:port` (default `:9090`).
    pub prometheus_addr: String,
    /// `PROMETHEUS_PATH`: default `/metrics`.
    pub prometheus_path: String,
}

/// `CONFIG_TYPE`: where the rules come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ConfigType {
    /// The rules directory, polled for changes.
    #[default]
    File,
    /// An xDS management server, State of the World over ADS.
    GrpcXdsSotw,
}

impl FromStr for ConfigType {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.to_ascii_uppercase().as_str() {
            "FILE" => Ok(ConfigType::File),
            "GRPC_XDS_SOTW" => Ok(ConfigType::GrpcXdsSotw),
            _ => Err(format!("config type '{text}': expected FILE or GRPC_XDS_SOTW")),
        }
    }
}

impl fmt::Display for ConfigType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ConfigType::File => "FILE",
            ConfigType::GrpcXdsSotw => "GRPC_XDS_SOTW",
        })
    }
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settings")
            .field("grpc_addr", &self.grpc_addr)
            .field("http_addr", &self.http_addr)
            .field("debug_addr", &self.debug_addr)
            .field("config_dir", &self.config_dir)
            .field("default_algorithm", &self.default_algorithm)
            .field("hash_key", &self.hash_key)
            .field("redis_url", &without_userinfo(&self.redis_url))
            .field("redis_type", &self.redis_type)
            .field("redis_auth", &self.redis_auth)
            .field(
                "redis_persecond_url",
                &without_userinfo(&self.redis_persecond_url),
            )
            .field("redis_persecond_auth", &self.redis_persecond_auth)
            .field("redis_sentinel_auth", &self.redis_sentinel_auth)
            .field("refund_key", &self.refund_key)
            .finish_non_exhaustive()
    }
}

/// A password, key or token. `Debug` and `Display` never show it, and it serializes as an empty string:
/// settings are serialized only to seed the layered loader with the defaults (where every secret is
/// empty), so a secret can never leave the process through a serialized copy either.
#[derive(Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// A secret holding `value`.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The secret itself, for the one place that uses it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether no secret is set.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_empty() {
            "<unset>"
        } else {
            "<redacted>"
        })
    }
}

impl Serialize for Secret {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str("")
    }
}

/// `LOG_FORMAT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// Human-readable lines (colours on a terminal).
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

impl FromStr for LogFormat {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.to_ascii_lowercase().as_str() {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            _ => Err(format!("log format '{text}': expected text or json")),
        }
    }
}

impl fmt::Display for LogFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        })
    }
}

/// `OTEL_TRACES_SAMPLER`: which new traces are kept, and whether a caller's decision is followed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TraceSampler {
    /// Not set: follow the caller, keep `TRACING_SAMPLING_RATE` of new traces.
    #[default]
    Default,
    /// `always_on`: every request, whatever the caller decided.
    AlwaysOn,
    /// `always_off`: none.
    AlwaysOff,
    /// `traceidratio`: `OTEL_TRACES_SAMPLER_ARG` of all requests, whatever the caller decided.
    TraceIdRatio,
    /// `parentbased_always_on`: follow the caller, keep every new trace.
    ParentBasedAlwaysOn,
    /// `parentbased_always_off`: follow the caller, keep no new trace.
    ParentBasedAlwaysOff,
    /// `parentbased_traceidratio`: follow the caller, keep `OTEL_TRACES_SAMPLER_ARG` of new traces.
    ParentBasedTraceIdRatio,
}

impl TraceSampler {
    const NAMES: [(TraceSampler, &'static str); 7] = [
        (TraceSampler::Default, ""),
        (TraceSampler::AlwaysOn, "always_on"),
        (TraceSampler::AlwaysOff, "always_off"),
        (TraceSampler::TraceIdRatio, "traceidratio"),
        (TraceSampler::ParentBasedAlwaysOn, "parentbased_always_on"),
        (TraceSampler::ParentBasedAlwaysOff, "parentbased_always_off"),
        (TraceSampler::ParentBasedTraceIdRatio, "parentbased_traceidratio"),
    ];

    /// (fraction of traces kept, whether a caller's decision is followed), given the sampler's argument
    /// and `TRACING_SAMPLING_RATE`.
    pub fn sampling(self, arg: f64, tracing_sampling_rate: f64) -> (f64, bool) {
        match self {
            TraceSampler::Default => (tracing_sampling_rate, true),
            TraceSampler::AlwaysOn => (1.0, false),
            TraceSampler::AlwaysOff => (0.0, false),
            TraceSampler::TraceIdRatio => (arg, false),
            TraceSampler::ParentBasedAlwaysOn => (1.0, true),
            TraceSampler::ParentBasedAlwaysOff => (0.0, true),
            TraceSampler::ParentBasedTraceIdRatio => (arg, true),
        }
    }
}

impl FromStr for TraceSampler {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let lower = text.trim().to_ascii_lowercase();
        Self::NAMES
            .iter()
            .find(|(_, name)| *name == lower)
            .map(|(sampler, _)| *sampler)
            .ok_or_else(|| {
                format!(
                    "sampler '{text}': expected always_on, always_off, traceidratio, parentbased_always_on, \
                     parentbased_always_off or parentbased_traceidratio (jaeger_remote and xray are not built in)"
                )
            })
    }
}

impl fmt::Display for TraceSampler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = Self::NAMES
            .iter()
            .find(|(sampler, _)| sampler == self)
            .map_or("", |(_, name)| name);
        f.write_str(name)
    }
}

/// One style of rate-limit response headers (`TOLLGATE_RESPONSE_HEADERS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeaderStyle {
    /// `RateLimit-Limit` / `-Remaining` / `-Reset` (as `LIMIT_RESPONSE_HEADERS_ENABLED`).
    RateLimit,
    /// `X-RateLimit-Limit` / `-Remaining` / `-Reset`.
    XRateLimit,
    /// The IETF draft's `RateLimit` and `RateLimit-Policy` fields.
    Ietf,
    /// `Retry-After` on refusals.
    RetryAfter,
}

impl HeaderStyle {
    fn name(self) -> &'static str {
        match self {
            HeaderStyle::RateLimit => "ratelimit",
            HeaderStyle::XRateLimit => "x-ratelimit",
            HeaderStyle::Ietf => "ietf",
            HeaderStyle::RetryAfter => "retry-after",
        }
    }
}

/// The header styles asked for, in the order given.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HeaderStyles(pub Vec<HeaderStyle>);

impl FromStr for HeaderStyles {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let styles = [
            HeaderStyle::RateLimit,
            HeaderStyle::XRateLimit,
            HeaderStyle::Ietf,
            HeaderStyle::RetryAfter,
        ];
        text.split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|name| {
                let lower = name.to_ascii_lowercase();
                styles.into_iter().find(|s| s.name() == lower).ok_or_else(|| {
                    format!("header style '{name}': expected ratelimit, x-ratelimit, ietf or retry-after")
                })
            })
            .collect::<Result<_, _>>()
            .map(HeaderStyles)
    }
}

impl fmt::Display for HeaderStyles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.0.iter().map(|s| s.name()).collect();
        f.write_str(&names.join(","))
    }
}

/// Serde through the text form (`FromStr` / `Display`), so a typed setting reads from and writes to
/// the same string a settings file or an environment variable holds.
mod as_text {
    use super::*;

    pub(super) fn serialize<T: fmt::Display, S: Serializer>(
        value: &T,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        serializer.collect_str(value)
    }

    pub(super) fn deserialize<'de, T, D>(deserializer: D) -> Result<T, D::Error>
    where
        T: FromStr,
        T::Err: fmt::Display,
        D: Deserializer<'de>,
    {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            grpc_addr: "0.0.0.0:8081".into(),
            http_addr: "0.0.0.0:8080".into(),
            debug_addr: "0.0.0.0:6070".into(),
            config_dir: PathBuf::from("/srv/runtime_data/current/config"),
            reload_interval: Duration::from_secs(1),
            merge_domain_config: false,
            shadow_mode: false,
            quota_mode: false,
            response_dynamic_metadata: false,
            limit_response_headers_enabled: false,
            limit_limit_header: "RateLimit-Limit".into(),
            limit_remaining_header: "RateLimit-Remaining".into(),
            limit_reset_header: "RateLimit-Reset".into(),
            stop_cache_key_increment_when_overlimit: false,
            cache_key_prefix: String::new(),
            log_level: "warn".into(),
            log_format: LogFormat::Text,
            default_algorithm: Algorithm::FixedWindow,
            hash_key: Secret::default(),
            max_descriptors: tollgate_core::limiter::DEFAULT_MAX_DESCRIPTORS,
            drain_period: Duration::from_secs(0),
            backend_type: "redis".into(),
            redis_url: String::new(),
            redis_type: "single".into(),
            redis_socket_type: "tcp".into(),
            redis_auth: Secret::default(),
            redis_sentinel_auth: Secret::default(),
            redis_tls: false,
            redis_tls_cacert: String::new(),
            redis_tls_client_cert: String::new(),
            redis_tls_client_key: String::new(),
            redis_tls_skip_hostname_verification: false,
            redis_pool_size: DEFAULT_REDIS_CONNECTIONS,
            redis_persecond: false,
            redis_persecond_url: String::new(),
            redis_persecond_type: "single".into(),
            redis_persecond_socket_type: "tcp".into(),
            redis_persecond_auth: Secret::default(),
            redis_persecond_sentinel_auth: Secret::default(),
            redis_persecond_tls: false,
            redis_persecond_pool_size: DEFAULT_REDIS_CONNECTIONS,
            redis_persecond_connect_timeout: Duration::from_secs(1),
            redis_persecond_pipeline_window: Duration::ZERO,
            redis_persecond_pipeline_limit: 0,
            redis_deadline: DEFAULT_REDIS_DEADLINE,
            redis_connect_timeout: Duration::from_secs(1),
            expiration_jitter_max_seconds: 300,
            redis_pipeline_window: Duration::ZERO,
            redis_pipeline_limit: 0,
            redis_pipeline_fixed_windows: true,
            local_cache_size_in_bytes: DEFAULT_LOCAL_CACHE_BYTES,
            near_limit_ratio: 0.8,
            response_headers: HeaderStyles::default(),
            raw_body: false,
            tracing_enabled: false,
            tracing_service_name: "tollgate".into(),
            tracing_service_namespace: String::new(),
            tracing_service_instance_id: String::new(),
            tracing_sampling_rate: 1.0,
            otel_traces_sampler: TraceSampler::Default,
            otel_traces_sampler_arg: 1.0,
            tracing_exporter_protocol: "grpc".into(),
            memory_max_keys: tollgate_core::store::memory::DEFAULT_MAX_KEYS,
            fleet_size: 1,
            max_request_bytes: DEFAULT_MAX_REQUEST_BYTES,
            grpc_max_concurrent_streams: DEFAULT_MAX_CONCURRENT_STREAMS,
            refund_key: Secret::default(),
            refund_key_file: String::new(),
            show_caller_values: false,
            warnings: Vec::new(),
            worker_threads: 0,
            grpc_uds: String::new(),
            grpc_max_connection_age: Duration::from_secs(24 * 3600),
            grpc_max_connection_age_grace: Duration::from_secs(3600),
            grpc_server_use_tls: false,
            grpc_server_tls_cert: String::new(),
            grpc_server_tls_key: String::new(),
            grpc_client_tls_cacert: String::new(),
            grpc_client_tls_san: String::new(),
            config_type: ConfigType::File,
            force_start_without_initial_config: false,
            config_grpc_xds_server_url: "localhost:18000".into(),
            config_grpc_xds_node_id: "default".into(),
            config_grpc_xds_node_metadata: String::new(),
            config_grpc_xds_server_connect_retry_interval: Duration::from_secs(3),
            config_grpc_xds_client_additional_headers: String::new(),
            config_grpc_xds_server_use_tls: false,
            config_grpc_xds_client_tls_cert: String::new(),
            config_grpc_xds_client_tls_key: String::new(),
            config_grpc_xds_server_tls_cacert: String::new(),
            config_grpc_xds_server_tls_san: String::new(),
            xds_client_backoff_initial_interval: Duration::from_secs(10),
            xds_client_backoff_max_interval: Duration::from_secs(60),
            xds_client_backoff_random_factor: 0.5,
            xds_client_backoff_jitter: true,
            xds_client_max_msg_size_in_bytes: 0,
            use_prometheus: false,
            prometheus_addr: ":9090".into(),
            prometheus_path: "/metrics".into(),
        }
    }
}

/// Default per-call Redis deadline: Envoy's default rate-limit timeout, so a stuck Redis is answered by
/// the rules' failure mode instead of Envoy timing out blind. Not shorter: on a busy 2-core host a
/// healthy Redis call can wait several milliseconds for CPU, and measured at 10 ms such waits turned
/// into false failures (a script that ran, reported as failed).
pub const DEFAULT_REDIS_DEADLINE: Duration = Duration::from_millis(20);

/// Default number of multiplexed connections to one Redis node. Each carries many requests in
/// flight; two keep one slow reply from stalling everything behind it on one socket.
pub const DEFAULT_REDIS_CONNECTIONS: usize = 2;

/// Default for [`Settings::max_request_bytes`]: Envoy's requests are a few hundred bytes, and the
/// native API's largest legitimate calls (thousands of descriptors) stay well below.
pub const DEFAULT_MAX_REQUEST_BYTES: usize = 1 << 20;

/// Default for [`Settings::grpc_max_concurrent_streams`]: far above what Envoy multiplexes on one
/// connection under load, low enough that one client cannot make the server hold unbounded state.
pub const DEFAULT_MAX_CONCURRENT_STREAMS: u32 = 1024;

/// Default over-limit cache budget (envoyproxy/ratelimit's is 0, off): about 25,000 blocked keys.
pub const DEFAULT_LOCAL_CACHE_BYTES: usize = 4 << 20;

/// Why settings could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    /// A source could not be read or a value has the wrong type.
    #[error("invalid settings: {0}")]
    Invalid(#[from] config::ConfigError),
    /// A value parsed but makes no sense.
    #[error("invalid setting {name}={value:?}: {reason}")]
    BadValue {
        /// The setting's name.
        name: &'static str,
        /// The value given.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
}

impl Settings {
    /// Reads settings from `file` (optional), the process environment and `flags` (field name → value).
    pub fn load(file: Option<&Path>, flags: &[(&str, String)]) -> Result<Self, SettingsError> {
        let env: HashMap<String, String> = std::env::vars().collect();
        Self::load_from(file, &env, flags)
    }

    /// [`Settings::load`] with an explicit environment, for tests.
    pub fn load_from(
        file: Option<&Path>,
        env: &HashMap<String, String>,
        flags: &[(&str, String)],
    ) -> Result<Self, SettingsError> {
        let defaults = Config::try_from(&Settings::default())?;
        let mut builder = Config::builder().add_source(defaults);
        if let Some(file) = file {
            builder = builder.add_source(File::from(file).format(FileFormat::Yaml).required(true));
        }
        let mut warnings = Vec::new();
        go_warnings(env, &mut warnings);
        builder = builder
            .add_source(GoEnvironment::from(env, &mut warnings)?)
            .add_source(
                Environment::with_prefix("TOLLGATE")
                    .source(Some(native_env(env, &mut warnings)))
                    .try_parsing(true),
            );
        for (name, value) in flags {
            builder = builder.set_override(*name, value.as_str())?;
        }
        let mut settings: Settings = builder.build()?.try_deserialize()?;
        settings.validate()?;
        warnings.extend(settings.unused());
        settings.warnings = warnings;
        Ok(settings)
    }

    fn validate(&self) -> Result<(), SettingsError> {
        if !self.backend_type.eq_ignore_ascii_case("redis") {
            return Err(SettingsError::BadValue {
                name: "backend_type",
                value: self.backend_type.clone(),
                reason: "only redis is supported (memcache is not)".into(),
            });
        }
        // A zero here would fail every request or spin (an interval of zero panics in the reload task);
        // the drain period may be zero (no drain).
        for (name, value) in [
            ("redis_deadline", self.redis_deadline),
            ("redis_connect_timeout", self.redis_connect_timeout),
            (
                "redis_persecond_connect_timeout",
                self.redis_persecond_connect_timeout,
            ),
            ("reload_interval", self.reload_interval),
        ] {
            if value.is_zero() {
                return Err(SettingsError::BadValue {
                    name,
                    value: "0s".into(),
                    reason: "must be longer than zero".into(),
                });
            }
        }
        // A window as long as the deadline would answer every coalesced request by its failure mode.
        for (name, window) in [
            ("redis_pipeline_window", self.redis_pipeline_window),
            (
                "redis_persecond_pipeline_window",
                self.redis_persecond_pipeline_window,
            ),
        ] {
            if window >= self.redis_deadline {
                return Err(SettingsError::BadValue {
                    name,
                    value: humantime::format_duration(window).to_string(),
                    reason: format!(
                        "must be shorter than redis_deadline ({}), or requests would wait out their deadline gathering",
                        humantime::format_duration(self.redis_deadline)
                    ),
                });
            }
        }
        for (name, value) in [
            ("max_request_bytes", self.max_request_bytes as u64),
            ("memory_max_keys", self.memory_max_keys as u64),
            (
                "grpc_max_concurrent_streams",
                u64::from(self.grpc_max_concurrent_streams),
            ),
        ] {
            if value == 0 {
                return Err(SettingsError::BadValue {
                    name,
                    value: "0".into(),
                    reason: "a limit of zero would refuse every request".into(),
                });
            }
        }
        if self.fleet_size == 0 {
            return Err(SettingsError::BadValue {
                name: "fleet_size",
                value: "0".into(),
                reason: "a fleet has at least one replica".into(),
            });
        }
        self.validate_transport()?;
        if !(0.0..=1.0).contains(&self.otel_traces_sampler_arg) {
            return Err(SettingsError::BadValue {
                name: "otel_traces_sampler_arg",
                value: self.otel_traces_sampler_arg.to_string(),
                reason: "a ratio between 0 and 1".into(),
            });
        }
        if !self.tracing_exporter_protocol.eq_ignore_ascii_case("grpc") {
            return Err(SettingsError::BadValue {
                name: "tracing_exporter_protocol",
                value: self.tracing_exporter_protocol.clone(),
                reason: "only grpc (OTLP/gRPC) is built in".into(),
            });
        }
        Ok(())
    }

    /// The gRPC listener's TLS, the xDS client's intervals and the Prometheus path: what would
    /// otherwise fail at the first connection, or silently serve less security than asked for.
    fn validate_transport(&self) -> Result<(), SettingsError> {
        let bad = |name: &'static str, value: &str, reason: &str| {
            Err(SettingsError::BadValue {
                name,
                value: value.to_owned(),
                reason: reason.to_owned(),
            })
        };
        if self.grpc_server_use_tls
            && (self.grpc_server_tls_cert.is_empty() || self.grpc_server_tls_key.is_empty())
        {
            return bad(
                "grpc_server_tls_cert",
                &self.grpc_server_tls_cert,
                "GRPC_SERVER_USE_TLS needs GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY",
            );
        }
        // Client certificates asked for on a plaintext listener would be ignored: any client could
        // connect while the operator believes only certified ones can.
        if !self.grpc_server_use_tls {
            for (name, value) in [
                ("grpc_client_tls_cacert", &self.grpc_client_tls_cacert),
                ("grpc_client_tls_san", &self.grpc_client_tls_san),
            ] {
                if !value.is_empty() {
                    return bad(name, value, "client certificates need GRPC_SERVER_USE_TLS=true");
                }
            }
        }
        if self.config_type == ConfigType::GrpcXdsSotw {
            for (name, value) in [
                (
                    "config_grpc_xds_server_connect_retry_interval",
                    self.config_grpc_xds_server_connect_retry_interval,
                ),
                (
                    "xds_client_backoff_initial_interval",
                    self.xds_client_backoff_initial_interval,
                ),
            ] {
                if value.is_zero() {
                    return bad(name, "0s", "must be longer than zero");
                }
            }
            if self.xds_client_backoff_max_interval < self.xds_client_backoff_initial_interval {
                return bad(
                    "xds_client_backoff_max_interval",
                    &humantime::format_duration(self.xds_client_backoff_max_interval).to_string(),
                    "must be at least XDS_CLIENT_BACKOFF_INITIAL_INTERVAL",
                );
            }
            if !(0.0..=1.0).contains(&self.xds_client_backoff_random_factor) {
                return bad(
                    "xds_client_backoff_random_factor",
                    &self.xds_client_backoff_random_factor.to_string(),
                    "must be between 0 and 1",
                );
            }
        }
        if self.redis_persecond {
            if self.redis_url.trim().is_empty() || self.redis_persecond_url.trim().is_empty() {
                return bad(
                    "redis_persecond_url",
                    &self.redis_persecond_url,
                    "REDIS_PERSECOND needs both REDIS_URL and REDIS_PERSECOND_URL",
                );
            }
            // That setting settles every request across its descriptors, which two Redis cannot do in
            // one step: refused rather than applied on half of a request.
            if self.stop_cache_key_increment_when_overlimit {
                return bad(
                    "stop_cache_key_increment_when_overlimit",
                    "true",
                    "cannot be exact with REDIS_PERSECOND (a request's counters would be in two Redis)",
                );
            }
        }
        if self.use_prometheus && !self.prometheus_path.starts_with('/') {
            return bad("prometheus_path", &self.prometheus_path, "must start with /");
        }
        Ok(())
    }

    /// Settings given that nothing reads in this configuration, as warnings (the Go service ignores
    /// them the same way; Tollgate says so).
    fn unused(&self) -> Vec<String> {
        let mut unused = Vec::new();
        if !self.grpc_server_use_tls {
            for (name, value) in [
                ("GRPC_SERVER_TLS_CERT", &self.grpc_server_tls_cert),
                ("GRPC_SERVER_TLS_KEY", &self.grpc_server_tls_key),
            ] {
                if !value.is_empty() {
                    unused.push(format!(
                        "ignoring {name}: GRPC_SERVER_USE_TLS is false, gRPC is plaintext"
                    ));
                }
            }
        }
        if !self.redis_persecond && !self.redis_persecond_url.is_empty() {
            unused.push(
                "ignoring REDIS_PERSECOND_URL: REDIS_PERSECOND is false, every limit is in REDIS_URL".into(),
            );
        }
        if self.config_type == ConfigType::File && self.config_grpc_xds_server_use_tls {
            unused.push("ignoring CONFIG_GRPC_XDS_SERVER_USE_TLS: CONFIG_TYPE is FILE".into());
        }
        if self.config_type == ConfigType::GrpcXdsSotw && self.config_dir != Settings::default().config_dir {
            unused.push(format!(
                "ignoring the rules directory {}: CONFIG_TYPE is GRPC_XDS_SOTW, rules come from {}",
                self.config_dir.display(),
                self.config_grpc_xds_server_url
            ));
        }
        unused
    }

    /// The number of runtime worker threads. By default one CPU is left to the rest of the host (Envoy,
    /// Redis, the kernel's network stack): measured on a 2-core host shared with Redis and the load,
    /// one worker answered 29,700 decisions/s at a p99 of 4.4 ms where two answered 26,300 at 41 ms,
    /// because two busy workers mostly wake and preempt each other.
    pub fn workers(&self) -> usize {
        if self.worker_threads > 0 {
            return self.worker_threads;
        }
        std::thread::available_parallelism().map_or(1, |n| n.get().saturating_sub(1).max(1))
    }
}

/// The `TOLLGATE_*` variables that name a setting. Others are skipped with a warning rather than
/// refused: Kubernetes injects `TOLLGATE_PORT`, `TOLLGATE_SERVICE_HOST`… into every pod of a namespace
/// with a Service named `tollgate`, and that must not stop the server from starting. (A settings file,
/// written on purpose, still refuses unknown keys.)
fn native_env(env: &HashMap<String, String>, warnings: &mut Vec<String>) -> HashMap<String, String> {
    let known: Vec<String> = match serde_json::to_value(Settings::default()) {
        Ok(serde_json::Value::Object(fields)) => fields
            .keys()
            .map(|k| format!("TOLLGATE_{}", k.to_uppercase()))
            .collect(),
        _ => Vec::new(),
    };
    let mut names: Vec<&String> = env
        .keys()
        .filter(|k| k.starts_with("TOLLGATE_") && k.as_str() != SETTINGS_FILE_ENV)
        .collect();
    names.sort();
    let mut native = HashMap::new();
    for name in names {
        if known.contains(name) {
            native.insert(name.clone(), env[name].clone());
        } else {
            warnings.push(format!("ignoring {name}: not a Tollgate setting"));
        }
    }
    native
}

/// Environment variable naming the settings file (read by the command line, not a setting itself).
pub const SETTINGS_FILE_ENV: &str = "TOLLGATE_SETTINGS_FILE";

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn defaults_match_envoyproxy_ratelimit_ports() {
        let s = Settings::load_from(None, &env(&[]), &[]).expect("defaults load");
        assert_eq!(s.grpc_addr, "0.0.0.0:8081");
        assert_eq!(s.http_addr, "0.0.0.0:8080");
        assert_eq!(s.debug_addr, "0.0.0.0:6070");
        assert_eq!(s.config_dir, PathBuf::from("/srv/runtime_data/current/config"));
        assert_eq!(s.limit_remaining_header, "RateLimit-Remaining");
    }

    #[test]
    fn go_names_are_honoured() {
        let s = Settings::load_from(
            None,
            &env(&[
                ("GRPC_PORT", "9000"),
                ("HOST", "127.0.0.1"),
                ("RUNTIME_ROOT", "/data"),
                ("RUNTIME_SUBDIRECTORY", "ratelimit"),
                ("SHADOW_MODE", "T"),
                ("CACHE_KEY_PREFIX", "pre:"),
                ("LIMIT_RESPONSE_HEADERS_ENABLED", "1"),
                ("REDIS_SENTINEL_AUTH", "sentinel-secret"),
            ]),
            &[],
        )
        .expect("loads");
        assert_eq!(s.redis_sentinel_auth.expose(), "sentinel-secret");
        assert!(
            !format!("{s:?}").contains("sentinel-secret"),
            "secrets are redacted"
        );
        assert_eq!(s.grpc_addr, "0.0.0.0:9000");
        assert_eq!(s.http_addr, "127.0.0.1:8080");
        assert_eq!(s.config_dir, PathBuf::from("/data/ratelimit/config"));
        assert!(s.shadow_mode);
        assert!(s.limit_response_headers_enabled);
        assert_eq!(s.cache_key_prefix, "pre:");
    }

    #[test]
    fn native_names_beat_go_names_and_flags_beat_both() {
        let e = env(&[
            ("GRPC_PORT", "9000"),
            ("TOLLGATE_GRPC_ADDR", "127.0.0.1:9001"),
            ("TOLLGATE_SHADOW_MODE", "true"),
        ]);
        let s = Settings::load_from(None, &e, &[]).expect("loads");
        assert_eq!(s.grpc_addr, "127.0.0.1:9001");
        assert!(s.shadow_mode);
        let s = Settings::load_from(None, &e, &[("grpc_addr", "127.0.0.1:0".into())]).expect("loads");
        assert_eq!(s.grpc_addr, "127.0.0.1:0");
    }

    #[test]
    fn kubernetes_service_link_variables_do_not_stop_startup() {
        let e = env(&[
            ("TOLLGATE_PORT", "tcp://10.0.0.7:8081"),
            ("TOLLGATE_SERVICE_HOST", "10.0.0.7"),
            ("TOLLGATE_PORT_8081_TCP_ADDR", "10.0.0.7"),
            ("GRPC_PORT", "tcp://10.0.0.8:8081"),
            ("TOLLGATE_SHADOW_MODE", "true"),
        ]);
        let s = Settings::load_from(None, &e, &[]).expect("service links are ignored");
        assert_eq!(s.grpc_addr, "0.0.0.0:8081", "a tcp:// GRPC_PORT is not a port");
        assert!(s.shadow_mode, "real settings still apply");
    }

    #[test]
    fn bad_values_are_named() {
        let err = Settings::load_from(None, &env(&[("SHADOW_MODE", "maybe")]), &[]).expect_err("rejects");
        assert!(err.to_string().contains("SHADOW_MODE"), "{err}");
        let err = Settings::load_from(None, &env(&[("TOLLGATE_DEFAULT_ALGORITHM", "leaky")]), &[])
            .expect_err("rejects");
        assert!(err.to_string().contains("leaky"), "{err}");
    }

    #[test]
    fn settings_file_layers_under_the_environment() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("settings.yaml");
        std::fs::write(
            &file,
            "grpc_addr: 127.0.0.1:7000\ndefault_algorithm: token_bucket\n",
        )
        .expect("write");
        let s = Settings::load_from(Some(&file), &env(&[]), &[]).expect("loads");
        assert_eq!(s.grpc_addr, "127.0.0.1:7000");
        assert_eq!(s.default_algorithm, Algorithm::TokenBucket);
        let s = Settings::load_from(Some(&file), &env(&[("GRPC_PORT", "7001")]), &[]).expect("loads");
        assert_eq!(s.grpc_addr, "0.0.0.0:7001");
    }

    #[test]
    fn secrets_never_print() {
        let s = Settings::load_from(
            None,
            &env(&[
                (
                    "REDIS_URL",
                    "redis://admin:hunter2@redis:6379,user:pw2@other:6379",
                ),
                ("REDIS_AUTH", "hunter3"),
                ("TOLLGATE_HASH_KEY", "hunter4"),
            ]),
            &[],
        )
        .expect("loads");
        let shown = format!("{s:?} {} {}", s.redis_auth, s.hash_key);
        for secret in ["hunter2", "pw2", "hunter3", "hunter4"] {
            assert!(!shown.contains(secret), "{secret} in {shown}");
        }
        assert!(shown.contains("redis://***@redis:6379,***@other:6379"), "{shown}");
        assert_eq!(s.hash_key.expose(), "hunter4");
        let serialized = serde_json::to_string(&s).expect("serializes");
        assert!(!serialized.contains("hunter3") && !serialized.contains("hunter4"));
    }

    #[test]
    fn typed_values_are_read_once_and_refused_by_name() {
        let s = Settings::load_from(
            None,
            &env(&[
                ("LOG_FORMAT", "JSON"),
                ("TOLLGATE_RESPONSE_HEADERS", "ietf, Retry-After"),
            ]),
            &[],
        )
        .expect("loads");
        assert_eq!(s.log_format, LogFormat::Json);
        assert_eq!(
            s.response_headers,
            HeaderStyles(vec![HeaderStyle::Ietf, HeaderStyle::RetryAfter])
        );
        let err = Settings::load_from(None, &env(&[("TOLLGATE_RESPONSE_HEADERS", "x-custom")]), &[])
            .expect_err("unknown style");
        assert!(err.to_string().contains("x-custom"), "{err}");
        let err = Settings::load_from(None, &env(&[("LOG_FORMAT", "xml")]), &[]).expect_err("bad format");
        assert!(err.to_string().contains("xml"), "{err}");
    }

    #[test]
    fn zero_durations_are_refused_by_name() {
        for name in [
            "TOLLGATE_RELOAD_INTERVAL",
            "TOLLGATE_REDIS_DEADLINE",
            "TOLLGATE_REDIS_CONNECT_TIMEOUT",
            "TOLLGATE_REDIS_PERSECOND_CONNECT_TIMEOUT",
        ] {
            let err = Settings::load_from(None, &env(&[(name, "0s")]), &[]).expect_err(name);
            let setting = name.trim_start_matches("TOLLGATE_").to_ascii_lowercase();
            assert!(err.to_string().contains(&setting), "{name}: {err}");
        }
        let err = Settings::load_from(None, &env(&[("TOLLGATE_RELOAD_INTERVAL", "-1s")]), &[]);
        assert!(err.is_err(), "negative durations do not parse");
        let ok = Settings::load_from(None, &env(&[("TOLLGATE_DRAIN_PERIOD", "0s")]), &[]);
        assert!(ok.is_ok(), "no drain is a choice");
    }

    #[test]
    fn unimplemented_go_settings_are_refused_or_warned_never_silent() {
        for (pairs, name) in [
            (&[("GRPC_SERVER_USE_TLS", "true")][..], "grpc_server_tls_cert"),
            (
                &[("GRPC_CLIENT_TLS_CACERT", "/ca.pem")][..],
                "grpc_client_tls_cacert",
            ),
            (&[("CONFIG_TYPE", "GRPC_XDS_DELTA")][..], "GRPC_XDS_DELTA"),
            (&[("BACKEND_TYPE", "memcache")][..], "backend_type"),
            (
                &[("USE_PROMETHEUS", "true"), ("PROMETHEUS_PATH", "metrics")][..],
                "prometheus_path",
            ),
            (
                &[
                    ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
                    ("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "1s"),
                ][..],
                "xds_client_backoff_max_interval",
            ),
        ] {
            let err = Settings::load_from(None, &env(pairs), &[]).expect_err(name);
            assert!(err.to_string().contains(name), "{err}");
        }
        let s = Settings::load_from(
            None,
            &env(&[
                ("USE_STATSD", "true"),
                ("REDIS_PERSECOND_URL", "r2:6379"),
                ("TOLLGATE_NOT_A_SETTING", "x"),
                ("GRPC_PORT", "tcp://10.0.0.1:8081"),
                ("GRPC_SERVER_TLS_CA_CERT", "/certs/ca.crt"),
                ("GRPC_SERVER_TLS_CERT", "/certs/tls.crt"),
                ("MEMCACHE_HOST_PORT", "mc:11211"),
            ]),
            &[],
        )
        .expect("loads");
        for expected in [
            "USE_STATSD",
            "REDIS_PERSECOND_URL",
            "TOLLGATE_NOT_A_SETTING",
            "GRPC_PORT",
            "GRPC_SERVER_TLS_CA_CERT: envoyproxy/ratelimit does not read it",
            "GRPC_SERVER_TLS_CERT: GRPC_SERVER_USE_TLS is false",
            "MEMCACHE_HOST_PORT",
        ] {
            assert!(
                s.warnings.iter().any(|w| w.contains(expected)),
                "{expected} not in {:?}",
                s.warnings
            );
        }
    }

    #[test]
    fn go_pipeline_window_and_limit_are_honoured_and_a_window_must_fit_the_deadline() {
        let s = Settings::load_from(
            None,
            &env(&[
                ("REDIS_PIPELINE_WINDOW", "150us"),
                ("REDIS_PIPELINE_LIMIT", "8"),
                ("REDIS_PERSECOND_PIPELINE_LIMIT", "4"),
            ]),
            &[],
        )
        .expect("loads");
        assert_eq!(s.redis_pipeline_window, Duration::from_micros(150));
        assert_eq!(s.redis_pipeline_limit, 8);
        assert_eq!(s.redis_persecond_pipeline_window, Duration::ZERO);
        assert_eq!(s.redis_persecond_pipeline_limit, 4);
        assert!(
            !s.warnings.iter().any(|w| w.contains("PIPELINE")),
            "{:?}",
            s.warnings
        );
        for name in ["REDIS_PIPELINE_WINDOW", "REDIS_PERSECOND_PIPELINE_WINDOW"] {
            // The deadline is 20 ms by default.
            let err = Settings::load_from(None, &env(&[(name, "20ms")]), &[]).expect_err(name);
            assert!(err.to_string().contains("shorter than redis_deadline"), "{err}");
        }
    }

    #[test]
    fn the_per_second_redis_is_read_and_refused_where_it_cannot_be_exact() {
        let base = [
            ("REDIS_URL", "main:6379"),
            ("REDIS_PERSECOND", "true"),
            ("REDIS_PERSECOND_URL", "persecond:6379"),
            ("REDIS_PERSECOND_TYPE", "cluster"),
            ("REDIS_PERSECOND_AUTH", "second-secret"),
            ("REDIS_PERSECOND_POOL_SIZE", "4"),
            ("REDIS_PERSECOND_PIPELINE_WINDOW", "150us"),
        ];
        let s = Settings::load_from(None, &env(&base), &[]).expect("loads");
        assert!(s.redis_persecond);
        assert_eq!(s.redis_persecond_type, "cluster");
        assert_eq!(s.redis_persecond_pool_size, 4);
        assert_eq!(s.redis_persecond_auth.expose(), "second-secret");
        assert!(!format!("{s:?}").contains("second-secret"));
        assert_eq!(s.redis_persecond_pipeline_window, Duration::from_micros(150));
        let err = Settings::load_from(None, &env(&base[1..2]), &[]).expect_err("no URLs");
        assert!(err.to_string().contains("REDIS_PERSECOND_URL"), "{err}");
        let mut stop = base.to_vec();
        stop.push(("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "true"));
        let err = Settings::load_from(None, &env(&stop), &[]).expect_err("not exact");
        assert!(
            err.to_string()
                .contains("stop_cache_key_increment_when_overlimit"),
            "{err}"
        );
    }

    #[test]
    fn opentelemetry_samplers_are_read_and_refused_by_name() {
        let s = Settings::load_from(
            None,
            &env(&[
                ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
                ("OTEL_TRACES_SAMPLER_ARG", "0.25"),
            ]),
            &[],
        )
        .expect("loads");
        assert_eq!(s.otel_traces_sampler, TraceSampler::ParentBasedTraceIdRatio);
        assert_eq!(
            s.otel_traces_sampler.sampling(s.otel_traces_sampler_arg, 0.5),
            (0.25, true)
        );
        assert_eq!(TraceSampler::AlwaysOff.sampling(0.25, 0.5), (0.0, false));
        assert_eq!(
            TraceSampler::Default.sampling(0.25, 0.5),
            (0.5, true),
            "TRACING_SAMPLING_RATE"
        );
        let err = Settings::load_from(None, &env(&[("OTEL_TRACES_SAMPLER", "jaeger_remote")]), &[])
            .expect_err("not built in");
        assert!(err.to_string().contains("jaeger_remote"), "{err}");
        let err =
            Settings::load_from(None, &env(&[("OTEL_TRACES_SAMPLER_ARG", "2")]), &[]).expect_err("ratio");
        assert!(err.to_string().contains("otel_traces_sampler_arg"), "{err}");
    }

    #[test]
    fn envoy_gateway_transport_settings_are_honoured() {
        let s = Settings::load_from(
            None,
            &env(&[
                ("GRPC_SERVER_USE_TLS", "true"),
                ("GRPC_SERVER_TLS_CERT", "/certs/tls.crt"),
                ("GRPC_SERVER_TLS_KEY", "/certs/tls.key"),
                ("GRPC_CLIENT_TLS_CACERT", "/certs/ca.crt"),
                ("GRPC_MAX_CONNECTION_AGE", "2h"),
                ("GRPC_UDS", "/tmp/rl.sock"),
                ("CONFIG_TYPE", "grpc_xds_sotw"),
                ("CONFIG_GRPC_XDS_SERVER_URL", "envoy-gateway:18001"),
                ("XDS_CLIENT_BACKOFF_JITTER", "false"),
                ("USE_PROMETHEUS", "true"),
                ("PROMETHEUS_ADDR", ":19001"),
            ]),
            &[],
        )
        .expect("loads");
        assert!(s.grpc_server_use_tls);
        assert_eq!(s.grpc_client_tls_cacert, "/certs/ca.crt");
        assert_eq!(s.grpc_max_connection_age, Duration::from_secs(7200));
        assert_eq!(s.grpc_max_connection_age_grace, Duration::from_secs(3600));
        assert_eq!(s.grpc_uds, "/tmp/rl.sock");
        assert_eq!(s.config_type, ConfigType::GrpcXdsSotw);
        assert_eq!(s.config_grpc_xds_server_url, "envoy-gateway:18001");
        assert!(!s.xds_client_backoff_jitter);
        assert!(s.use_prometheus);
        assert_eq!(s.prometheus_addr, ":19001");
    }
}
