//! `tollgate xds-serve`: a management server that pushes one rules directory over xDS, State of the
//! World, as [`crate::rules_as_xds::configs`] converts it. It exists so that the same rules can be
//! measured loaded from a file and pushed over xDS (`scripts/bench/bench-xds-scale.sh`), and to try
//! `CONFIG_TYPE=GRPC_XDS_SOTW` without Envoy Gateway. It serves one version, read at start, and
//! prints each ACK and NACK it receives.

use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;

use anyhow::Context as _;
use prost::Message as _;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status, Streaming};

use crate::proto::xds::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use crate::proto::xds::{DiscoveryRequest, DiscoveryResponse};
use crate::xds::RATE_LIMIT_CONFIG_TYPE;

/// The version every client is sent.
const VERSION: &str = "1";

/// Serves the files of `dir` on `addr` until the process is stopped.
pub(crate) async fn serve(addr: SocketAddr, dir: &Path) -> anyhow::Result<()> {
    let configs = crate::rules_as_xds::configs(dir).with_context(|| {
        format!(
            "{} has a file that is not YAML with envoyproxy/ratelimit's fields only",
            dir.display()
        )
    })?;
    let resources: Arc<[prost_types::Any]> = configs
        .iter()
        .map(|config| prost_types::Any {
            type_url: RATE_LIMIT_CONFIG_TYPE.into(),
            value: config.encode_to_vec(),
        })
        .collect();
    let bytes: usize = resources.iter().map(|r| r.value.len()).sum();
    let incoming = TcpIncoming::bind(addr)?;
    println!(
        "tollgate xds-serve: {} configs, {bytes} bytes, on {}",
        resources.len(),
        incoming.local_addr()?
    );
    tonic::transport::Server::builder()
        .add_service(AggregatedDiscoveryServiceServer::new(Ads { resources }))
        .serve_with_incoming(incoming)
        .await?;
    Ok(())
}

/// Sends every stream the one version, once it subscribes.
struct Ads {
    resources: Arc<[prost_types::Any]>,
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for Ads {
    type StreamAggregatedResourcesStream =
        Pin<Box<dyn tokio_stream::Stream<Item = Result<DiscoveryResponse, Status>> + Send>>;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        let mut inbound = request.into_inner();
        let resources = Arc::clone(&self.resources);
        let (responses, outbound) = mpsc::channel(1);
        tokio::spawn(async move {
            // State of the World: nothing is sent before the client subscribes.
            let Ok(Some(_)) = inbound.message().await else {
                return;
            };
            let response = DiscoveryResponse {
                version_info: VERSION.into(),
                resources: resources.to_vec(),
                canary: false,
                type_url: RATE_LIMIT_CONFIG_TYPE.into(),
                nonce: VERSION.into(),
            };
            if responses.send(Ok(response)).await.is_err() {
                return;
            }
            while let Ok(Some(answer)) = inbound.message().await {
                match answer.error_detail {
                    Some(error) => println!("NACK {}: {}", answer.response_nonce, error.message),
                    None => println!("ACK {}", answer.version_info),
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(outbound))))
    }
}
