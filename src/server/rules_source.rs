//! Where the rules come from (`CONFIG_TYPE`): the rules directory, or the xDS management server the
//! `CONFIG_GRPC_XDS_*` and `XDS_CLIENT_*` settings describe.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;

use tonic::metadata::{MetadataKey, MetadataValue};

use crate::proto::envoy::config::core::v3::Node;
use crate::proto::envoy::config::core::v3::node::UserAgentVersionType;
use crate::settings::{Settings, SettingsError};
use crate::xds::{Retry, XdsClient, XdsServer, XdsTls};
use tollgate_core::observe::metrics::Metrics;
use tollgate_core::rules::CompileOptions;
use tollgate_core::rules::reload::Reloader;

/// Where the rules come from, ready to follow.
pub(super) enum RulesSource {
    /// The rules directory, loaded once (at this version) and polled.
    Files(Reloader, String),
    /// An xDS management server.
    Xds(Box<XdsClient>),
}

/// The xDS rules source the `CONFIG_GRPC_XDS_*` and `XDS_CLIENT_*` settings describe. TLS material is
/// read now, so a missing file stops startup naming it.
pub(super) fn xds_client(
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
