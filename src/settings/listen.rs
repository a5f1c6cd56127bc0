//! How the server listens: its three listeners (and the Go service's Prometheus one), the gRPC
//! transport's TLS and bounds, the runtime's threads and the drain at shutdown.

use std::time::Duration;

use super::source::{Go, Reader};
use super::{Origins, SettingsError};

/// Default for [`ListenSettings::max_request_bytes`]: Envoy's requests are a few hundred bytes, and the
/// native API's largest legitimate calls (thousands of descriptors) stay well below.
pub const DEFAULT_MAX_REQUEST_BYTES: usize = 1 << 20;

/// Default for [`ListenSettings::grpc_max_concurrent_streams`]: far above what Envoy multiplexes on one
/// connection under load, low enough that one client cannot make the server hold unbounded state.
pub const DEFAULT_MAX_CONCURRENT_STREAMS: u32 = 1024;

/// Default for [`ListenSettings::http_max_header_bytes`]: a browser's headers with its cookies, sent on
/// by a proxy asking for forward authentication, fit well within it (browsers cap a cookie at 4 KiB,
/// and Envoy's own default bound on a request's headers is 60 KiB).
const DEFAULT_HTTP_MAX_HEADER_BYTES: usize = 64 << 10;

/// Descriptors kept out of the connection caps' shares of the open-file limit: listeners, Redis
/// connections, rule files, logs.
pub const RESERVED_FILES: usize = 64;

/// The listeners and their transport.
#[derive(Debug, Clone)]
pub struct ListenSettings {
    /// gRPC listener (`GRPC_HOST:GRPC_PORT`).
    pub grpc_addr: String,
    /// HTTP listener (`HOST:PORT`): `/healthcheck`, `/json`, `/metrics`, `/v1/*`.
    pub http_addr: String,
    /// Debug listener (`DEBUG_HOST:DEBUG_PORT`): `/rlconfig`, `/metrics`, `/top`, `/config`.
    pub debug_addr: String,
    /// A listener of its own for the native API's `/v1/*`, which then leaves the HTTP port; empty: the
    /// native API is on the HTTP port.
    pub native_http_addr: String,
    /// `GRPC_UDS`: serve gRPC on this unix socket instead of `grpc_addr`.
    pub grpc_uds: String,
    /// `GRPC_MAX_CONNECTION_AGE`: a gRPC connection older than this is sent GOAWAY, so clients
    /// reconnect and spread over replicas added since (zero: never).
    pub grpc_max_connection_age: Duration,
    /// `GRPC_MAX_CONNECTION_AGE_GRACE`: how long calls in flight may finish after that GOAWAY.
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
    /// HTTP/2 streams one gRPC connection may have open at once.
    pub grpc_max_concurrent_streams: u32,
    /// Largest gRPC request message, in bytes; a larger one is refused with `RESOURCE_EXHAUSTED` before
    /// it is decoded. Also the largest HTTP request body (`/json`, `/v1/*`), refused with 413.
    pub max_request_bytes: usize,
    /// `USE_PROMETHEUS`: also serve the metrics on `prometheus_addr` at `prometheus_path`, where the Go
    /// service serves them (they are always on the HTTP and debug ports' `/metrics`).
    pub use_prometheus: bool,
    /// `PROMETHEUS_ADDR`: `host:port` or `:port`.
    pub prometheus_addr: String,
    /// `PROMETHEUS_PATH`.
    pub prometheus_path: String,
    /// Most connections the gRPC listener holds at once; 0: derived from the open-file limit (see
    /// [`ListenSettings::connection_caps`]).
    pub max_connections: usize,
    /// Most connections the HTTP listener (and the debug one, and Prometheus') holds at once; 0:
    /// derived from the open-file limit.
    pub http_max_connections: usize,
    /// Most TLS handshakes in progress on the gRPC listener from one client address.
    pub tls_handshakes_per_client: usize,
    /// Longest a request may take to arrive whole once it started (a gRPC message, HTTP headers and
    /// body), and a new gRPC connection to send its first bytes.
    pub read_timeout: Duration,
    /// Longest a connection's writes may make no progress (a peer that does not read its answers)
    /// before it is closed.
    pub write_timeout: Duration,
    /// Largest HTTP request head (request line and headers) read, in bytes; a larger one is answered
    /// 431. Also bounds what an HTTP connection's pipelined requests may make the server buffer.
    pub http_max_header_bytes: usize,
    /// How long a gRPC connection may send no request before it is back on probation: at the
    /// listener's cap it then gives way to a new connection from its own address (see
    /// `crate::connections`).
    pub idle_connection_probation: Duration,
    /// Bytes of unfinished requests the whole process may hold; 0: 64 × `max_request_bytes`.
    pub max_request_bytes_in_flight: usize,
    /// Bytes of unfinished requests one connection may hold; 0: 4 × `max_request_bytes`.
    pub max_connection_bytes_in_flight: usize,
    /// Runtime worker threads; 0 means one per CPU minus one, at least one (see
    /// [`ListenSettings::workers`]).
    pub worker_threads: usize,
    /// Whether the allocator may back the heap with transparent huge pages (Linux; off unless set, see
    /// [`crate::huge_pages`]).
    pub transparent_huge_pages: bool,
    /// How long the server keeps answering after SIGTERM while health reports NOT_SERVING.
    pub drain_period: Duration,
}

impl ListenSettings {
    pub(super) fn read(r: &mut Reader<'_>) -> Result<Self, SettingsError> {
        let mut listen = Self {
            grpc_addr: r.get(
                "grpc_addr",
                Go::HostPort("GRPC_HOST", "GRPC_PORT"),
                "0.0.0.0:8081".into(),
            )?,
            http_addr: r.get("http_addr", Go::HostPort("HOST", "PORT"), "0.0.0.0:8080".into())?,
            debug_addr: r.get(
                "debug_addr",
                Go::HostPort("DEBUG_HOST", "DEBUG_PORT"),
                "0.0.0.0:6070".into(),
            )?,
            native_http_addr: r.get("native_http_addr", Go::None, String::new())?,
            grpc_uds: r.get("grpc_uds", Go::Same, String::new())?,
            grpc_max_connection_age: r.get(
                "grpc_max_connection_age",
                Go::Same,
                Duration::from_secs(24 * 3600),
            )?,
            grpc_max_connection_age_grace: r.get(
                "grpc_max_connection_age_grace",
                Go::Same,
                Duration::from_secs(3600),
            )?,
            grpc_server_use_tls: r.get("grpc_server_use_tls", Go::Same, false)?,
            grpc_server_tls_cert: r.get("grpc_server_tls_cert", Go::Same, String::new())?,
            grpc_server_tls_key: r.get("grpc_server_tls_key", Go::Same, String::new())?,
            grpc_client_tls_cacert: r.get("grpc_client_tls_cacert", Go::Same, String::new())?,
            grpc_client_tls_san: r.get("grpc_client_tls_san", Go::Same, String::new())?,
            grpc_max_concurrent_streams: r.get(
                "grpc_max_concurrent_streams",
                Go::None,
                DEFAULT_MAX_CONCURRENT_STREAMS,
            )?,
            max_request_bytes: r.get("max_request_bytes", Go::None, DEFAULT_MAX_REQUEST_BYTES)?,
            use_prometheus: r.get("use_prometheus", Go::Same, false)?,
            prometheus_addr: r.get("prometheus_addr", Go::Same, ":9090".into())?,
            prometheus_path: r.get("prometheus_path", Go::Same, "/metrics".into())?,
            max_connections: r.get("max_connections", Go::None, 0)?,
            http_max_connections: r.get("http_max_connections", Go::None, 0)?,
            tls_handshakes_per_client: r.get("tls_handshakes_per_client", Go::None, 8)?,
            read_timeout: r.get("read_timeout", Go::None, Duration::from_secs(10))?,
            write_timeout: r.get("write_timeout", Go::None, Duration::from_secs(10))?,
            http_max_header_bytes: r.get("http_max_header_bytes", Go::None, DEFAULT_HTTP_MAX_HEADER_BYTES)?,
            idle_connection_probation: r.get(
                "idle_connection_probation",
                Go::None,
                Duration::from_secs(60),
            )?,
            max_request_bytes_in_flight: r.get("max_request_bytes_in_flight", Go::None, 0)?,
            max_connection_bytes_in_flight: r.get("max_connection_bytes_in_flight", Go::None, 0)?,
            worker_threads: r.get("worker_threads", Go::None, 0)?,
            transparent_huge_pages: r.get("transparent_huge_pages", Go::None, false)?,
            drain_period: r.get("drain_period", Go::None, Duration::ZERO)?,
        };
        // The Go service serves whatever path it is given; a path is what an HTTP request can ask for.
        if !listen.prometheus_path.starts_with('/') {
            r.warnings.push(format!(
                "PROMETHEUS_PATH={:?} does not start with /: serving the metrics at /{}",
                listen.prometheus_path, listen.prometheus_path
            ));
            listen.prometheus_path.insert(0, '/');
        }
        Ok(listen)
    }

    /// What would otherwise fail at the first connection, or silently serve less security than
    /// asked for.
    pub(super) fn validate(&self, origins: &Origins) -> Result<(), SettingsError> {
        if self.grpc_server_use_tls
            && (self.grpc_server_tls_cert.is_empty() || self.grpc_server_tls_key.is_empty())
        {
            return Err(origins.bad(
                "grpc_server_tls_cert",
                &self.grpc_server_tls_cert,
                "GRPC_SERVER_USE_TLS needs GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY",
            ));
        }
        for (key, value) in [
            ("max_request_bytes", self.max_request_bytes as u64),
            ("http_max_header_bytes", self.http_max_header_bytes as u64),
            (
                "grpc_max_concurrent_streams",
                u64::from(self.grpc_max_concurrent_streams),
            ),
        ] {
            if value == 0 {
                return Err(origins.bad(key, "0", "a limit of zero would refuse every request"));
            }
        }
        if self.tls_handshakes_per_client == 0 {
            return Err(origins.bad(
                "tls_handshakes_per_client",
                "0",
                "a limit of zero would refuse every TLS client",
            ));
        }
        if self.idle_connection_probation.is_zero() {
            return Err(origins.bad(
                "idle_connection_probation",
                "0s",
                "every connection would give way to the next",
            ));
        }
        if self.read_timeout.is_zero() {
            return Err(origins.bad("read_timeout", "0s", "every request would time out"));
        }
        if self.write_timeout.is_zero() {
            return Err(origins.bad("write_timeout", "0s", "every answer would time out"));
        }
        // A budget below one whole request would refuse the largest request allowed.
        for (key, value) in [
            ("max_request_bytes_in_flight", self.max_request_bytes_in_flight),
            (
                "max_connection_bytes_in_flight",
                self.max_connection_bytes_in_flight,
            ),
        ] {
            if value != 0 && value < self.max_request_bytes {
                return Err(origins.bad(
                    key,
                    &value.to_string(),
                    "smaller than max_request_bytes, so the largest request allowed would be refused",
                ));
            }
        }
        Ok(())
    }

    /// Bytes of unfinished requests the process, and one connection, may hold (the settings, or their
    /// defaults: 64 and 4 of the largest requests).
    pub fn bytes_in_flight(&self) -> (usize, usize) {
        let or = |value: usize, requests: usize| match value {
            0 => self.max_request_bytes.saturating_mul(requests),
            set => set,
        };
        (
            or(self.max_request_bytes_in_flight, 64),
            or(self.max_connection_bytes_in_flight, 4),
        )
    }

    /// Most connections the gRPC listener, and each HTTP listener, hold at once: the settings, or
    /// shares of the open-file limit `open_files` (`None`: unknown, taken as 1,024) after
    /// [`RESERVED_FILES`]: half for gRPC, an eighth for each HTTP listener (HTTP, debug, Prometheus'),
    /// the rest left to Redis connections, rule files and the unexpected. With the common limit of 1,024
    /// that is 480 gRPC connections and 120 on each HTTP listener.
    pub fn connection_caps(&self, open_files: Option<u64>) -> (usize, usize) {
        let files = usize::try_from(open_files.unwrap_or(1024)).unwrap_or(usize::MAX);
        let spare = files.saturating_sub(RESERVED_FILES).max(16);
        let or = |value: usize, share: usize| if value == 0 { spare / share } else { value };
        (or(self.max_connections, 2), or(self.http_max_connections, 8))
    }

    /// Settings given that nothing reads, as warnings (the Go service ignores them the same way).
    pub(super) fn unused(&self, warnings: &mut Vec<String>) {
        if !self.grpc_server_use_tls {
            for (name, value) in [
                ("GRPC_SERVER_TLS_CERT", &self.grpc_server_tls_cert),
                ("GRPC_SERVER_TLS_KEY", &self.grpc_server_tls_key),
            ] {
                if !value.is_empty() {
                    warnings.push(format!(
                        "ignoring {name}: GRPC_SERVER_USE_TLS is false, gRPC is plaintext"
                    ));
                }
            }
            // The Go service ignores them too; said loudly, since an operator who sets them believes
            // only certified clients can connect.
            for (name, value) in [
                ("GRPC_CLIENT_TLS_CACERT", &self.grpc_client_tls_cacert),
                ("GRPC_CLIENT_TLS_SAN", &self.grpc_client_tls_san),
            ] {
                if !value.is_empty() {
                    warnings.push(format!(
                        "ignoring {name}: GRPC_SERVER_USE_TLS is false, so gRPC is plaintext and ANY client may \
                         connect; set GRPC_SERVER_USE_TLS=true to require client certificates"
                    ));
                }
            }
        }
    }

    /// The number of runtime worker threads. By default one CPU is left to the rest of the host (Envoy,
    /// Redis, the kernel's network stack): measured on a 2-core host shared with Redis and the load,
    /// one worker answered 29,700 decisions/s at a p99 of 4.4 ms where two answered 26,300 at 41 ms,
    /// because two busy workers mostly wake and preempt each other.
    pub fn workers(&self) -> usize {
        if self.worker_threads > 0 {
            return self.worker_threads;
        }
        default_workers()
    }
}

/// The runtime worker threads when `WORKER_THREADS` is 0: the CPUs but one, at least one.
pub fn default_workers() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get().saturating_sub(1).max(1))
}
