//! Where the rules come from: the rules directory and how it is followed, or the xDS management
//! server (`CONFIG_TYPE=GRPC_XDS_SOTW`) and how the client reaches it.

use std::path::PathBuf;
use std::time::Duration;

use tollgate_core::rules::file::DEFAULT_MAX_FILE_BYTES;

use super::source::{Go, Reader};
use super::{ConfigType, Origins, SettingsError};

/// The rules directory envoyproxy/ratelimit reads by default.
pub const DEFAULT_CONFIG_DIR: &str = "/srv/runtime_data/current/config";

/// The rules' source.
#[derive(Debug, Clone)]
pub struct RulesSettings {
    /// `CONFIG_TYPE`: the rules directory (`FILE`) or an xDS management server (`GRPC_XDS_SOTW`).
    pub config_type: ConfigType,
    /// The rules directory (`RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY`).
    pub config_dir: PathBuf,
    /// How often the rules directory (and the gRPC certificates) are checked for changes.
    pub reload_interval: Duration,
    /// `MERGE_DOMAIN_CONFIG`: several files (or xDS configs) may define one domain.
    pub merge_domain_config: bool,
    /// The largest rules file read; a larger one fails the load, naming this setting.
    pub rules_max_file_bytes: u64,
    /// `FORCE_START_WITHOUT_INITIAL_CONFIG`: with xDS, serve before the first rule set arrives.
    pub force_start_without_initial_config: bool,
    /// `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`: not ready until the rules define a domain.
    pub healthy_with_at_least_one_config_loaded: bool,
    /// The xDS client (`CONFIG_GRPC_XDS_*`, `XDS_CLIENT_*`), used with `GRPC_XDS_SOTW`.
    pub xds: XdsSettings,
}

/// How the xDS client reaches the management server.
#[derive(Debug, Clone)]
pub struct XdsSettings {
    /// `CONFIG_GRPC_XDS_SERVER_URL`: `host:port`.
    pub server_url: String,
    /// `CONFIG_GRPC_XDS_NODE_ID`: the node id the xDS server knows this service by.
    pub node_id: String,
    /// `CONFIG_GRPC_XDS_NODE_METADATA`: node metadata, `key=value` pairs separated by commas.
    pub node_metadata: String,
    /// `CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL`: pause between attempts to connect.
    pub connect_retry_interval: Duration,
    /// `CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS`: request metadata for the stream, `key:value` pairs
    /// separated by commas.
    pub additional_headers: String,
    /// `CONFIG_GRPC_XDS_SERVER_USE_TLS`: TLS to the xDS server.
    pub use_tls: bool,
    /// `CONFIG_GRPC_XDS_CLIENT_TLS_CERT`: PEM client certificate for the xDS server.
    pub client_tls_cert: String,
    /// `CONFIG_GRPC_XDS_CLIENT_TLS_KEY`: its key.
    pub client_tls_key: String,
    /// `CONFIG_GRPC_XDS_SERVER_TLS_CACERT`: PEM CA that signed the xDS server's certificate.
    pub server_tls_cacert: String,
    /// `CONFIG_GRPC_XDS_SERVER_TLS_SAN`: the name the server's certificate must carry (else the URL's
    /// host).
    pub server_tls_san: String,
    /// `XDS_CLIENT_BACKOFF_INITIAL_INTERVAL`: first pause before reopening a failed stream.
    pub backoff_initial_interval: Duration,
    /// `XDS_CLIENT_BACKOFF_MAX_INTERVAL`: longest pause between attempts.
    pub backoff_max_interval: Duration,
    /// `XDS_CLIENT_BACKOFF_RANDOM_FACTOR`: with jitter, each pause is spread by ± this fraction. (The
    /// Go client hands this value to its backoff as the growth multiplier, which at the default 0.5
    /// pins every pause at the initial interval; Tollgate doubles the pause after each failure, up to
    /// the maximum.)
    pub backoff_random_factor: f64,
    /// `XDS_CLIENT_BACKOFF_JITTER`: randomise each pause.
    pub backoff_jitter: bool,
    /// `XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES`: largest response accepted (0: 4 MiB, gRPC's default).
    pub max_msg_size_in_bytes: usize,
}

impl RulesSettings {
    pub(super) fn read(r: &mut Reader<'_>) -> Result<Self, SettingsError> {
        let mut rules = Self {
            config_type: r.get("config_type", Go::Same, ConfigType::File)?,
            config_dir: r.get("config_dir", Go::RuntimeDir, PathBuf::from(DEFAULT_CONFIG_DIR))?,
            reload_interval: r.get("reload_interval", Go::None, Duration::from_secs(1))?,
            merge_domain_config: r.get("merge_domain_config", Go::Same, false)?,
            rules_max_file_bytes: r.get("rules_max_file_bytes", Go::None, DEFAULT_MAX_FILE_BYTES)?,
            force_start_without_initial_config: r.get(
                "force_start_without_initial_config",
                Go::Same,
                false,
            )?,
            healthy_with_at_least_one_config_loaded: r.get(
                "healthy_with_at_least_one_config_loaded",
                Go::Same,
                false,
            )?,
            xds: XdsSettings::read(r)?,
        };
        if rules.config_type == ConfigType::GrpcXdsSotw {
            rules.xds.adjust(&mut r.warnings);
        }
        Ok(rules)
    }

    pub(super) fn validate(&self, origins: &Origins) -> Result<(), SettingsError> {
        // An interval of zero would spin (and panics in the reload task).
        if self.reload_interval.is_zero() {
            return Err(origins.bad("reload_interval", "0s", "must be longer than zero"));
        }
        if self.rules_max_file_bytes == 0 {
            return Err(origins.bad("rules_max_file_bytes", "0", "no rules file could be read"));
        }
        Ok(())
    }

    pub(super) fn unused(&self, warnings: &mut Vec<String>) {
        if self.config_type == ConfigType::File && self.xds.use_tls {
            warnings.push("ignoring CONFIG_GRPC_XDS_SERVER_USE_TLS: CONFIG_TYPE is FILE".into());
        }
        if self.config_type == ConfigType::GrpcXdsSotw
            && self.config_dir != std::path::Path::new(DEFAULT_CONFIG_DIR)
        {
            warnings.push(format!(
                "ignoring the rules directory {}: CONFIG_TYPE is GRPC_XDS_SOTW, rules come from {}",
                self.config_dir.display(),
                self.xds.server_url
            ));
        }
    }
}

impl XdsSettings {
    fn read(r: &mut Reader<'_>) -> Result<Self, SettingsError> {
        let xds = Self {
            server_url: r.get("config_grpc_xds_server_url", Go::Same, "localhost:18000".into())?,
            node_id: r.get("config_grpc_xds_node_id", Go::Same, "default".into())?,
            node_metadata: r.get("config_grpc_xds_node_metadata", Go::Same, String::new())?,
            connect_retry_interval: r.get(
                "config_grpc_xds_server_connect_retry_interval",
                Go::Same,
                Duration::from_secs(3),
            )?,
            additional_headers: r.get(
                "config_grpc_xds_client_additional_headers",
                Go::Same,
                String::new(),
            )?,
            use_tls: r.get("config_grpc_xds_server_use_tls", Go::Same, false)?,
            client_tls_cert: r.get("config_grpc_xds_client_tls_cert", Go::Same, String::new())?,
            client_tls_key: r.get("config_grpc_xds_client_tls_key", Go::Same, String::new())?,
            server_tls_cacert: r.get("config_grpc_xds_server_tls_cacert", Go::Same, String::new())?,
            server_tls_san: r.get("config_grpc_xds_server_tls_san", Go::Same, String::new())?,
            backoff_initial_interval: r.get(
                "xds_client_backoff_initial_interval",
                Go::Same,
                Duration::from_secs(10),
            )?,
            backoff_max_interval: r.get(
                "xds_client_backoff_max_interval",
                Go::Same,
                Duration::from_secs(60),
            )?,
            backoff_random_factor: r.get("xds_client_backoff_random_factor", Go::Same, 0.5)?,
            backoff_jitter: r.get("xds_client_backoff_jitter", Go::Same, true)?,
            max_msg_size_in_bytes: r.get("xds_client_max_msg_size_in_bytes", Go::Same, 0)?,
        };
        Ok(xds)
    }

    /// Values the Go service runs with but that mean nothing as written here, made to mean what they
    /// can, each with a warning: a Go deployment's settings must start Tollgate.
    fn adjust(&mut self, warnings: &mut Vec<String>) {
        let defaults = [
            (
                "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL",
                &mut self.connect_retry_interval,
                Duration::from_secs(3),
            ),
            (
                "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL",
                &mut self.backoff_initial_interval,
                Duration::from_secs(10),
            ),
        ];
        for (name, interval, default) in defaults {
            if interval.is_zero() {
                warnings.push(format!(
                    "{name}=0s would retry in a busy loop: waiting {} instead",
                    humantime::format_duration(default)
                ));
                *interval = default;
            }
        }
        if self.backoff_max_interval < self.backoff_initial_interval {
            warnings.push(format!(
                "XDS_CLIENT_BACKOFF_MAX_INTERVAL ({}) is below XDS_CLIENT_BACKOFF_INITIAL_INTERVAL ({}): every \
                 pause is the maximum",
                humantime::format_duration(self.backoff_max_interval),
                humantime::format_duration(self.backoff_initial_interval)
            ));
            self.backoff_initial_interval = self.backoff_max_interval.max(Duration::from_millis(1));
            self.backoff_max_interval = self.backoff_initial_interval;
        }
        if !(0.0..=1.0).contains(&self.backoff_random_factor) {
            warnings.push(format!(
                "XDS_CLIENT_BACKOFF_RANDOM_FACTOR={} spreads each pause by ± that fraction here (the Go client \
                 uses it as its growth factor): taken as {}",
                self.backoff_random_factor,
                self.backoff_random_factor.clamp(0.0, 1.0)
            ));
            self.backoff_random_factor = self.backoff_random_factor.clamp(0.0, 1.0);
        }
    }
}
