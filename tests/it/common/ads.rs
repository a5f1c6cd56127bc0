//! A real xDS management server inside the tests: tonic's generated Aggregated Discovery Service on a
//! free port, serving the rule sets a test pushes (State of the World) and recording every request it
//! receives, so tests can read the ACKs and NACKs.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prost::Message as _;
use tokio::sync::{Notify, mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tollgate::proto::rls_config::RateLimitConfig;
use tollgate::proto::xds::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use tollgate::proto::xds::{DiscoveryRequest, DiscoveryResponse};
use tollgate::xds::RATE_LIMIT_CONFIG_TYPE;
use tonic::metadata::MetadataMap;
use tonic::transport::{Identity, Server, ServerTlsConfig};

/// What the server sends: a version and its resources.
type Snapshot = Option<(String, Vec<prost_types::Any>)>;

/// What outlives one server process: the snapshot and what clients sent.
#[derive(Default)]
pub struct AdsState {
    snapshot: Mutex<Snapshot>,
    changed: Notify,
    requests: Mutex<Vec<DiscoveryRequest>>,
    received: Notify,
    /// The metadata of every stream opened.
    pub streams: Mutex<Vec<MetadataMap>>,
}

/// A running management server.
pub struct AdsServer {
    pub addr: SocketAddr,
    pub state: Arc<AdsState>,
    /// Ends every open stream (tonic keeps serving open connections after its task is gone).
    streams: CancellationToken,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl AdsServer {
    /// On a free loopback port, plaintext.
    pub async fn start() -> Self {
        Self::start_at("127.0.0.1:0".parse().expect("addr"), Arc::default(), None).await
    }

    /// On `addr` (a restart reuses the port and the state), with TLS when `tls` is given.
    pub async fn start_at(addr: SocketAddr, state: Arc<AdsState>, tls: Option<ServerTlsConfig>) -> Self {
        let listener = tokio::net::TcpListener::bind(addr).await.expect("bind ADS");
        let addr = listener.local_addr().expect("addr");
        let (stop, stopped) = oneshot::channel::<()>();
        let streams = CancellationToken::new();
        let service = AggregatedDiscoveryServiceServer::new(Ads {
            state: Arc::clone(&state),
            stopped: streams.clone(),
        });
        let mut server = Server::builder();
        if let Some(tls) = tls {
            server = server.tls_config(tls).expect("ADS TLS");
        }
        let task = tokio::spawn(async move {
            server
                .add_service(service)
                .serve_with_incoming_shutdown(
                    tokio_stream::wrappers::TcpListenerStream::new(listener),
                    async move {
                        let _ = stopped.await;
                    },
                )
                .await
                .expect("ADS serves");
        });
        Self {
            addr,
            state,
            streams,
            stop: Some(stop),
            task,
        }
    }

    /// Serves these rule sets as `version` from now on.
    pub fn push(&self, version: &str, configs: &[RateLimitConfig]) {
        let resources = configs
            .iter()
            .map(|config| prost_types::Any {
                type_url: RATE_LIMIT_CONFIG_TYPE.into(),
                value: config.encode_to_vec(),
            })
            .collect();
        self.push_raw(version, resources);
    }

    /// Serves these resources, as they are, as `version`.
    pub fn push_raw(&self, version: &str, resources: Vec<prost_types::Any>) {
        *self.state.snapshot.lock().expect("lock") = Some((version.to_owned(), resources));
        self.state.changed.notify_waiters();
    }

    /// The first request received that satisfies `wanted`, waiting up to 10 s.
    pub async fn request(&self, wanted: impl Fn(&DiscoveryRequest) -> bool) -> DiscoveryRequest {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let received = self.state.received.notified();
            if let Some(found) = self
                .state
                .requests
                .lock()
                .expect("lock")
                .iter()
                .find(|r| wanted(r))
            {
                return found.clone();
            }
            let seen = self.state.requests.lock().expect("lock").clone();
            assert!(
                tokio::time::timeout_at(deadline, received).await.is_ok(),
                "no such request; received {seen:#?}"
            );
        }
    }

    /// The ACK of `version`.
    pub async fn ack(&self, version: &str) -> DiscoveryRequest {
        self.request(|r| {
            r.version_info == version && !r.response_nonce.is_empty() && r.error_detail.is_none()
        })
        .await
    }

    /// Stops serving (dropping every stream) and returns the state, for a restart.
    pub async fn stop(mut self) -> Arc<AdsState> {
        self.streams.cancel();
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = (&mut self.task).await;
        self.state
    }
}

struct Ads {
    state: Arc<AdsState>,
    stopped: CancellationToken,
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for Ads {
    type StreamAggregatedResourcesStream =
        Pin<Box<dyn tokio_stream::Stream<Item = Result<DiscoveryResponse, tonic::Status>> + Send>>;

    async fn stream_aggregated_resources(
        &self,
        request: tonic::Request<tonic::Streaming<DiscoveryRequest>>,
    ) -> Result<tonic::Response<Self::StreamAggregatedResourcesStream>, tonic::Status> {
        let state = Arc::clone(&self.state);
        let stopped = self.stopped.clone();
        state
            .streams
            .lock()
            .expect("lock")
            .push(request.metadata().clone());
        let mut inbound = request.into_inner();
        let (responses, outbound) = mpsc::channel(4);
        tokio::spawn(async move {
            let record = |request: DiscoveryRequest| {
                state.requests.lock().expect("lock").push(request);
                state.received.notify_waiters();
            };
            // State of the World: nothing is sent before the client subscribes.
            match inbound.message().await {
                Ok(Some(first)) => record(first),
                _ => return,
            }
            let mut nonce = 0u64;
            let mut sent: Option<String> = None;
            loop {
                let changed = state.changed.notified();
                let snapshot = state.snapshot.lock().expect("lock").clone();
                if let Some((version, resources)) = snapshot
                    && sent.as_deref() != Some(version.as_str())
                {
                    nonce += 1;
                    let response = DiscoveryResponse {
                        version_info: version.clone(),
                        resources,
                        canary: false,
                        type_url: RATE_LIMIT_CONFIG_TYPE.into(),
                        nonce: nonce.to_string(),
                    };
                    if responses.send(Ok(response)).await.is_err() {
                        return;
                    }
                    sent = Some(version);
                }
                tokio::select! {
                    _ = stopped.cancelled() => return,
                    _ = changed => {}
                    message = inbound.message() => match message {
                        Ok(Some(request)) => record(request),
                        _ => return,
                    },
                }
            }
        });
        Ok(tonic::Response::new(Box::pin(ReceiverStream::new(outbound))))
    }
}

/// A server identity for [`AdsServer::start_at`] with TLS.
pub fn tls(cert: &str, key: &str, client_ca: Option<&str>) -> ServerTlsConfig {
    let mut tls = ServerTlsConfig::new().identity(Identity::from_pem(cert, key));
    if let Some(ca) = client_ca {
        tls = tls.client_ca_root(tonic::transport::Certificate::from_pem(ca));
    }
    tls
}
