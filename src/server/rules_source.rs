//! Where the rules come from (`CONFIG_TYPE`): the rules directory, or the xDS management server the
//! `CONFIG_GRPC_XDS_*` and `XDS_CLIENT_*` settings describe.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;

use tonic::metadata::{MetadataKey, MetadataValue};

use crate::observe::health::Health;
use crate::proto::envoy::config::core::v3::Node;
use crate::proto::envoy::config::core::v3::node::UserAgentVersionType;
use crate::settings::{ConfigType, RulesSettings, SettingsError};
use crate::xds::{Retry, XdsClient, XdsServer, XdsTls};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tollgate_core::observe::metrics::Metrics;
use tollgate_core::rules::reload::Reloader;
use tollgate_core::rules::{CompileOptions, RulesHandle};

/// Where the rules come from, ready to follow.
pub(super) enum RulesSource {
    /// The rules directory, loaded once (at this version) and polled.
    Files(Reloader, String),
    /// An xDS management server.
    Xds(Box<XdsClient>),
}

impl RulesSource {
    /// Opens the source `settings` name: the rules directory is loaded into `rules` now (a broken rule
    /// set stops startup, naming the file and the reason); the xDS client is built and its TLS files
    /// read, and with `FORCE_START_WITHOUT_INITIAL_CONFIG` the service is ready before any rules
    /// arrive. `health` learns when rules are there.
    pub(super) async fn open(
        settings: &RulesSettings,
        options: CompileOptions,
        metrics: &Arc<Metrics>,
        rules: &RulesHandle,
        health: &Health,
    ) -> anyhow::Result<Self> {
        match settings.config_type {
            ConfigType::File => {
                let reloader = Reloader {
                    dir: settings.config_dir.clone(),
                    merge_domains: settings.merge_domain_config,
                    options,
                    interval: settings.reload_interval,
                    metrics: Arc::clone(metrics),
                };
                let version = reloader.load_into(rules).context("cannot load the rules")?;
                let domains = rules.load().as_ref().map_or(0, |set| set.len());
                health.set_rules(domains).await;
                Ok(RulesSource::Files(reloader, version))
            }
            ConfigType::GrpcXdsSotw => {
                let client = xds_client(settings, options, Arc::clone(metrics))?;
                if settings.force_start_without_initial_config {
                    // Ready without rules, as the Go service; until the first set arrives every request
                    // gets its error ("no rate limit configuration loaded"), so an Envoy that fails
                    // closed denies rather than passing everything.
                    health.set_rules(0).await;
                } else {
                    tracing::info!(
                        "not ready until the xDS server sends rules (FORCE_START_WITHOUT_INITIAL_CONFIG is false)"
                    );
                }
                Ok(RulesSource::Xds(Box::new(client)))
            }
        }
    }

    /// Follows the source in a task of `tasks` until `stop`: the directory polled, or the xDS stream.
    /// Returns how the source is named in the log.
    pub(super) fn follow(
        self,
        tasks: &TaskTracker,
        rules: &RulesHandle,
        health: &Health,
        stop: &CancellationToken,
    ) -> String {
        match self {
            RulesSource::Files(reloader, version) => {
                let origin = reloader.dir.display().to_string();
                tasks.spawn(reloader.run(Arc::clone(rules), Some(version), stop.clone()));
                origin
            }
            RulesSource::Xds(client) => {
                let origin = format!("xds:{}", client.server.url);
                tasks.spawn(client.run(Arc::clone(rules), health.clone(), stop.clone()));
                origin
            }
        }
    }
}

/// The xDS rules source the `CONFIG_GRPC_XDS_*` and `XDS_CLIENT_*` settings describe. TLS material is
/// read now, so a missing file stops startup naming it.
fn xds_client(
    settings: &RulesSettings,
    options: CompileOptions,
    metrics: Arc<Metrics>,
) -> anyhow::Result<XdsClient> {
    let xds = &settings.xds;
    let tls = if xds.use_tls {
        if xds.server_tls_cacert.is_empty() {
            anyhow::bail!(
                "CONFIG_GRPC_XDS_SERVER_USE_TLS needs CONFIG_GRPC_XDS_SERVER_TLS_CACERT (the system's roots are not built in)"
            );
        }
        let identity = match (xds.client_tls_cert.as_str(), xds.client_tls_key.as_str()) {
            ("", "") => None,
            (cert, key) if !cert.is_empty() && !key.is_empty() => {
                Some((PathBuf::from(cert), PathBuf::from(key)))
            }
            _ => anyhow::bail!(
                "CONFIG_GRPC_XDS_CLIENT_TLS_CERT and CONFIG_GRPC_XDS_CLIENT_TLS_KEY go together"
            ),
        };
        let tls = XdsTls {
            ca: PathBuf::from(&xds.server_tls_cacert),
            identity,
            server_name: Some(xds.server_tls_san.clone()).filter(|san| !san.is_empty()),
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
                            name: name.into(),
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
        &xds.additional_headers,
        ':',
    )?
    .into_iter()
    .map(|(key, value)| {
        let bad = |reason: &str| SettingsError::BadValue {
            name: "config_grpc_xds_client_additional_headers".into(),
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
    let metadata = pairs("config_grpc_xds_node_metadata", &xds.node_metadata, '=')?
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
            url: xds.server_url.clone(),
            tls,
            headers,
            max_message_bytes: xds.max_msg_size_in_bytes,
        },
        node: Node {
            id: xds.node_id.clone(),
            cluster: String::new(),
            metadata: Some(prost_types::Struct { fields: metadata }),
            user_agent_name: "tollgate".into(),
            user_agent_version_type: Some(UserAgentVersionType::UserAgentVersion(
                env!("CARGO_PKG_VERSION").into(),
            )),
        },
        retry: Retry {
            connect_interval: xds.connect_retry_interval,
            backoff_initial: xds.backoff_initial_interval,
            backoff_max: xds.backoff_max_interval,
            random_factor: xds.backoff_random_factor,
            jitter: xds.backoff_jitter,
        },
        merge_domains: settings.merge_domain_config,
        options,
        metrics,
    })
}
