//! Rules over xDS (`CONFIG_TYPE=GRPC_XDS_SOTW`), as Envoy Gateway delivers them: Tollgate is an
//! Aggregated Discovery Service client, State of the World, for the type
//! [`RATE_LIMIT_CONFIG_TYPE`].
//!
//! Each response carries every `RateLimitConfig` and replaces the whole rule set. It is validated as
//! rules files are (`config.rs`: same checks, same messages, the config's name where a
//! file name would be) and compiled; a set that loads is ACKed with the response's version and
//! nonce, one that does not is NACKed with the reason in `error_detail` while the previous rules stay.
//! A broken stream is reopened after a backoff, asking for the last version ACKed, so the server can
//! tell a reconnect from a fresh start.
//!
//! Connecting follows the Go client: retry every `CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL`
//! (±50 %) until the server answers. A stream that fails waits `XDS_CLIENT_BACKOFF_INITIAL_INTERVAL`,
//! doubled after each failure up to `XDS_CLIENT_BACKOFF_MAX_INTERVAL`, spread by ±
//! `XDS_CLIENT_BACKOFF_RANDOM_FACTOR` when `XDS_CLIENT_BACKOFF_JITTER` is on; a stream that delivered
//! a response starts the backoff over.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::metadata::{Ascii, MetadataKey, MetadataValue};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::observe::health::Health;
use crate::proto::envoy::config::core::v3::Node;
use crate::proto::google::rpc::Status;
use crate::proto::xds::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use crate::proto::xds::{DiscoveryRequest, DiscoveryResponse};
use config::load_encoded;
use tollgate_core::observe::metrics::Metrics;
use tollgate_core::rules::reload::install;
use tollgate_core::rules::{CompileOptions, RuleSet, RulesHandle};

mod config;

/// The xDS type URL of envoyproxy/ratelimit's rule sets.
pub const RATE_LIMIT_CONFIG_TYPE: &str = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig";

/// gRPC's default largest message, used when `XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES` is 0.
const DEFAULT_MAX_MESSAGE_BYTES: usize = 4 << 20;

/// HTTP/2 pings on the stream, and how long one may go unanswered before the stream is reopened.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// `google.rpc.Code.INVALID_ARGUMENT`, the code of a NACK's `error_detail`.
const INVALID_ARGUMENT: i32 = 3;

/// Where the management server is and how to reach it.
#[derive(Debug, Clone)]
pub struct XdsServer {
    /// `CONFIG_GRPC_XDS_SERVER_URL`: `host:port` (or a full `http(s)://` URI).
    pub url: String,
    /// TLS to the server (`CONFIG_GRPC_XDS_SERVER_USE_TLS` and its certificates), or plaintext.
    pub tls: Option<XdsTls>,
    /// `CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS`: metadata sent with the stream (checked at startup).
    pub headers: Vec<(MetadataKey<Ascii>, MetadataValue<Ascii>)>,
    /// `XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES` (0: gRPC's default 4 MiB).
    pub max_message_bytes: usize,
}

/// TLS to the management server. The files are read at every connection attempt: Envoy Gateway
/// rotates the certificates it mounts, and a reconnect after a rotation must present the new ones.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XdsTls {
    /// `CONFIG_GRPC_XDS_SERVER_TLS_CACERT`: the CA of the server's certificate (PEM).
    pub ca: PathBuf,
    /// `CONFIG_GRPC_XDS_CLIENT_TLS_CERT` and `_KEY`: a client certificate and its key (PEM), for mTLS.
    pub identity: Option<(PathBuf, PathBuf)>,
    /// `CONFIG_GRPC_XDS_SERVER_TLS_SAN`: the name the server's certificate must carry (else the URL's
    /// host).
    pub server_name: Option<String>,
}

/// A TLS file that could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsFileError {
    /// It could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// It holds no PEM of the kind expected.
    #[error("{path}: {reason}")]
    Pem {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
}

impl XdsTls {
    /// Reads the files into a client configuration, checking that each holds PEM of its kind (tonic
    /// would only find out when connecting, and then retry forever).
    pub fn load(&self) -> Result<ClientTlsConfig, TlsFileError> {
        let read = |path: &PathBuf| {
            std::fs::read(path).map_err(|source| TlsFileError::Read {
                path: path.clone(),
                source,
            })
        };
        let pem = |path: &PathBuf| {
            let path = path.clone();
            move |reason| TlsFileError::Pem { path, reason }
        };
        let ca = read(&self.ca)?;
        crate::pem::certificates(&ca).map_err(pem(&self.ca))?;
        let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca));
        if let Some((cert_path, key_path)) = &self.identity {
            let (cert, key) = (read(cert_path)?, read(key_path)?);
            crate::pem::certificates(&cert).map_err(pem(cert_path))?;
            crate::pem::private_key(&key).map_err(pem(key_path))?;
            tls = tls.identity(Identity::from_pem(cert, key));
        }
        if let Some(name) = &self.server_name {
            tls = tls.domain_name(name.clone());
        }
        Ok(tls)
    }
}

/// How long to wait between attempts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Retry {
    /// `CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL`.
    pub connect_interval: Duration,
    /// `XDS_CLIENT_BACKOFF_INITIAL_INTERVAL`.
    pub backoff_initial: Duration,
    /// `XDS_CLIENT_BACKOFF_MAX_INTERVAL`.
    pub backoff_max: Duration,
    /// `XDS_CLIENT_BACKOFF_RANDOM_FACTOR`: the spread of each pause, 0 to 1.
    pub random_factor: f64,
    /// `XDS_CLIENT_BACKOFF_JITTER`.
    pub jitter: bool,
}

/// The xDS rules source.
#[derive(Debug, Clone)]
pub struct XdsClient {
    /// The management server.
    pub server: XdsServer,
    /// This service as the server knows it (`CONFIG_GRPC_XDS_NODE_ID`, `_NODE_METADATA`).
    pub node: Node,
    /// Pauses between attempts.
    pub retry: Retry,
    /// `MERGE_DOMAIN_CONFIG`.
    pub merge_domains: bool,
    /// How rules compile.
    pub options: CompileOptions,
    /// Where rule counters live and loads are counted.
    pub metrics: Arc<Metrics>,
}

/// Why a connection attempt failed.
#[derive(Debug, thiserror::Error)]
enum ConnectError {
    #[error(transparent)]
    Tls(TlsFileError),
    #[error(transparent)]
    Transport(#[from] tonic::transport::Error),
}

/// Why a stream ended.
#[derive(Debug, thiserror::Error)]
enum StreamError {
    #[error("cannot open the stream: {0}")]
    Open(tonic::Status),
    #[error("the stream failed: {0}")]
    Broken(tonic::Status),
    #[error("the server closed the stream")]
    Closed,
}

impl XdsClient {
    /// Follows the management server until `stop`: installs every rule set that loads into `rules`,
    /// and marks `health` loaded at the first.
    pub async fn run(self, rules: RulesHandle, health: Health, stop: CancellationToken) {
        let mut version = String::new();
        let mut backoff = Backoff::new(self.retry);
        loop {
            let Some(channel) = self.connect(&stop).await else {
                return;
            };
            let mut session = Session {
                client: &self,
                rules: &rules,
                health: &health,
                version: &mut version,
                delivered: false,
            };
            let result = tokio::select! {
                _ = stop.cancelled() => return,
                ended = session.stream(channel) => ended,
            };
            if session.delivered {
                backoff.reset();
            }
            let pause = backoff.next_pause();
            match result {
                StreamError::Closed => tracing::info!(?pause, "xDS server closed the stream; reopening"),
                error => tracing::error!(%error, ?pause, "xDS stream lost; reopening"),
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(pause) => {}
            }
        }
    }

    /// A channel to the server, retried until it connects (`None` once `stop` is cancelled).
    async fn connect(&self, stop: &CancellationToken) -> Option<Channel> {
        loop {
            let attempt = async {
                let uri = if self.server.url.contains("://") {
                    self.server.url.clone()
                } else {
                    let scheme = if self.server.tls.is_some() {
                        "https"
                    } else {
                        "http"
                    };
                    format!("{scheme}://{}", self.server.url)
                };
                let mut endpoint = Endpoint::from_shared(uri)?
                    .connect_timeout(self.retry.connect_interval.max(Duration::from_secs(1)))
                    // The stream idles between pushes: without pings a management server that vanished
                    // without a reset would leave the rules frozen, unnoticed.
                    .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
                    .keep_alive_timeout(KEEPALIVE_TIMEOUT)
                    .keep_alive_while_idle(true);
                if let Some(tls) = &self.server.tls {
                    endpoint = endpoint.tls_config(tls.load().map_err(ConnectError::Tls)?)?;
                }
                Ok::<_, ConnectError>(endpoint.connect().await?)
            };
            let failed = tokio::select! {
                _ = stop.cancelled() => return None,
                connected = attempt => match connected {
                    Ok(channel) => {
                        tracing::info!(server = %self.server.url, "connected to the xDS server");
                        return Some(channel);
                    }
                    Err(error) => error,
                },
            };
            let pause = spread(self.retry.connect_interval, 0.5);
            tracing::warn!(server = %self.server.url, error = %error_chain(&failed), ?pause, "cannot reach the xDS server");
            tokio::select! {
                _ = stop.cancelled() => return None,
                _ = tokio::time::sleep(pause) => {}
            }
        }
    }

    /// A request for the rule sets: ACK when `nonce` is set and `error` is not, NACK with `error`.
    fn request(&self, version: &str, nonce: &str, error: Option<String>) -> DiscoveryRequest {
        DiscoveryRequest {
            version_info: version.to_owned(),
            node: Some(self.node.clone()),
            resource_names: Vec::new(),
            type_url: RATE_LIMIT_CONFIG_TYPE.to_owned(),
            response_nonce: nonce.to_owned(),
            error_detail: error.map(|message| Status {
                code: INVALID_ARGUMENT,
                message,
                details: Vec::new(),
            }),
        }
    }
}

/// Validates and compiles a response's rule sets (`type_url`, `resources`), consuming them: each resource
/// is freed once decoded, each decoded set once converted, so the copies of a large set are never all
/// whole.
fn compile(
    type_url: &str,
    resources: Vec<prost_types::Any>,
    merge_domains: bool,
    options: CompileOptions,
    metrics: &Metrics,
) -> Result<RuleSet, String> {
    if type_url != RATE_LIMIT_CONFIG_TYPE {
        return Err(format!("unexpected resource type {type_url:?}"));
    }
    if let Some(any) = resources
        .iter()
        .find(|any| any.type_url != RATE_LIMIT_CONFIG_TYPE)
    {
        return Err(format!("unexpected resource type {:?}", any.type_url));
    }
    let configs = resources.into_iter().map(|any| bytes::Bytes::from(any.value));
    let domains = load_encoded(configs, merge_domains)?;
    RuleSet::compile_with_metrics(domains, options, metrics).map_err(|e| e.to_string())
}

/// One ADS stream.
struct Session<'a> {
    client: &'a XdsClient,
    rules: &'a RulesHandle,
    health: &'a Health,
    /// The last version ACKed, kept across streams.
    version: &'a mut String,
    /// Whether this stream brought a response (then the backoff starts over).
    delivered: bool,
}

impl Session<'_> {
    /// Subscribes and applies responses until the stream ends; returns why (`delivered` says whether
    /// any response arrived).
    async fn stream(&mut self, channel: Channel) -> StreamError {
        let server = &self.client.server;
        let max = match server.max_message_bytes {
            0 => DEFAULT_MAX_MESSAGE_BYTES,
            n => n,
        };
        let mut ads = AggregatedDiscoveryServiceClient::new(channel).max_decoding_message_size(max);
        // Room for the subscription and one answer: the server waits for each ACK before sending more.
        let (requests, outgoing) = mpsc::channel(2);
        let _ = requests.try_send(self.client.request(self.version, "", None));
        let mut call = tonic::Request::new(ReceiverStream::new(outgoing));
        for (key, value) in &server.headers {
            call.metadata_mut().insert(key.clone(), value.clone());
        }
        let mut responses = match ads.stream_aggregated_resources(call).await {
            Ok(responses) => responses.into_inner(),
            Err(status) => return StreamError::Open(status),
        };
        loop {
            let response = match responses.message().await {
                Ok(Some(response)) => response,
                Ok(None) => return StreamError::Closed,
                Err(status) => return StreamError::Broken(status),
            };
            self.delivered = true;
            let answer = self.apply(response).await;
            if requests.send(answer).await.is_err() {
                return StreamError::Closed;
            }
        }
    }

    /// Installs the response's rules and returns the ACK, or keeps the current rules and returns a
    /// NACK.
    async fn apply(&mut self, mut response: DiscoveryResponse) -> DiscoveryRequest {
        let client = self.client;
        let type_url = std::mem::take(&mut response.type_url);
        let resources = std::mem::take(&mut response.resources);
        let (merge_domains, options, metrics) =
            (client.merge_domains, client.options, Arc::clone(&client.metrics));
        // 100,000 routes take a second or more to compile: not on a thread that answers requests.
        let compiled = tokio::task::spawn_blocking(move || {
            compile(&type_url, resources, merge_domains, options, &metrics)
        })
        .await
        .unwrap_or_else(|e| Err(format!("compiling the rules failed: {e}")));
        match compiled {
            Ok(set) => {
                let source = format!("xds:{}", client.server.url);
                let domains = set.len();
                install(set, &response.version_info, &source, &client.metrics, self.rules);
                self.health.set_rules(domains).await;
                self.version.clone_from(&response.version_info);
                client.request(self.version, &response.nonce, None)
            }
            Err(error) => {
                client.metrics.config_load_error.add(1);
                tracing::error!(version = %response.version_info, %error, "xDS rules rejected (NACK); keeping the previous rules");
                client.request(self.version, &response.nonce, Some(error))
            }
        }
    }
}

/// Exponential backoff between streams.
#[derive(Debug)]
struct Backoff {
    retry: Retry,
    next: Duration,
}

impl Backoff {
    fn new(retry: Retry) -> Self {
        Self {
            retry,
            next: retry.backoff_initial,
        }
    }

    fn reset(&mut self) {
        self.next = self.retry.backoff_initial;
    }

    fn next_pause(&mut self) -> Duration {
        let base = self.next.min(self.retry.backoff_max);
        self.next = base.saturating_mul(2).min(self.retry.backoff_max);
        if self.retry.jitter {
            spread(base, self.retry.random_factor)
        } else {
            base
        }
    }
}

/// `base` times a random factor in `[1 - spread, 1 + spread]`.
fn spread(base: Duration, spread: f64) -> Duration {
    let unit = getrandom::u64().map_or(0.5, |r| (r >> 11) as f64 / (1u64 << 53) as f64);
    // Saturating: an absurd interval in the settings must not panic here.
    Duration::try_from_secs_f64(base.as_secs_f64() * (1.0 + spread * (2.0 * unit - 1.0)))
        .unwrap_or(Duration::MAX)
}

/// An error with its causes, for a log line (tonic's transport errors hide the reason in the source).
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_the_maximum_and_starts_over_after_a_delivery() {
        let retry = Retry {
            connect_interval: Duration::from_secs(3),
            backoff_initial: Duration::from_secs(10),
            backoff_max: Duration::from_secs(60),
            random_factor: 0.5,
            jitter: false,
        };
        let mut backoff = Backoff::new(retry);
        let pauses: Vec<u64> = (0..5).map(|_| backoff.next_pause().as_secs()).collect();
        assert_eq!(pauses, [10, 20, 40, 60, 60]);
        backoff.reset();
        assert_eq!(backoff.next_pause().as_secs(), 10);

        let mut jittered = Backoff::new(Retry {
            jitter: true,
            ..retry
        });
        for _ in 0..50 {
            let pause = jittered.next_pause();
            jittered.reset();
            assert!(
                (Duration::from_secs(5)..=Duration::from_secs(15)).contains(&pause),
                "{pause:?}"
            );
        }
    }
}
