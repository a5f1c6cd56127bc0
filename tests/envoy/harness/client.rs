//! A downstream client of Envoy: HTTP/1.1 over kept-alive connections from a chosen loopback address
//! (Linux answers all of 127.0.0.0/8), so a test can be several callers as Envoy's `remote_address`
//! sees them. Every exchange is bounded.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request};
use http_body_util::{BodyExt as _, Full};
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

/// Longest one exchange through Envoy may take.
const EXCHANGE: Duration = Duration::from_secs(15);

/// What Envoy answered.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: String,
}

impl Reply {
    /// A response header as text, if present.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// A client of one Envoy listener.
#[derive(Clone)]
pub struct Client {
    inner: HyperClient<HttpConnector, Full<Bytes>>,
    envoy: SocketAddr,
}

impl Client {
    /// From 127.0.0.1.
    pub fn new(envoy: SocketAddr) -> Self {
        Self::from_address(envoy, IpAddr::from([127, 0, 0, 1]))
    }

    /// From `source`, a loopback address.
    pub fn from_address(envoy: SocketAddr, source: IpAddr) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_local_address(Some(source));
        connector.set_nodelay(true);
        Self {
            inner: HyperClient::builder(TokioExecutor::new()).build(connector),
            envoy,
        }
    }

    /// `GET path` with these request headers.
    pub async fn get(&self, path: &str, headers: &[(&str, &str)]) -> Reply {
        self.send("GET", path, headers).await
    }

    /// One request without a body.
    pub async fn send(&self, method: &str, path: &str, headers: &[(&str, &str)]) -> Reply {
        self.try_send(method, path, headers)
            .await
            .unwrap_or_else(|error| panic!("{method} {path} through Envoy: {error}"))
    }

    /// One request; a transport failure is returned.
    pub async fn try_send(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
    ) -> Result<Reply, String> {
        let mut request = Request::builder()
            .method(method)
            .uri(format!("http://{}{path}", self.envoy));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let request = request.body(Full::new(Bytes::new())).map_err(|e| e.to_string())?;
        let exchange = async {
            let response = self.inner.request(request).await.map_err(|e| format!("{e:?}"))?;
            let (parts, body) = response.into_parts();
            let body = body.collect().await.map_err(|e| e.to_string())?.to_bytes();
            Ok(Reply {
                status: parts.status.as_u16(),
                headers: parts.headers,
                body: String::from_utf8_lossy(&body).into_owned(),
            })
        };
        tokio::time::timeout(EXCHANGE, exchange)
            .await
            .map_err(|_| format!("no answer within {EXCHANGE:?}"))?
    }

    /// The statuses of `n` requests in a row.
    pub async fn statuses(&self, path: &str, headers: &[(&str, &str)], n: usize) -> Vec<u16> {
        let mut statuses = Vec::with_capacity(n);
        for _ in 0..n {
            statuses.push(self.get(path, headers).await.status);
        }
        statuses
    }

    /// Sends the same request until Envoy refuses one with 429, at most `bound` times, and returns how
    /// many were let through before it (each must be a 200) and the refusal.
    pub async fn admitted_until_429(
        &self,
        path: &str,
        headers: &[(&str, &str)],
        bound: usize,
    ) -> (usize, Reply) {
        for admitted in 0..bound {
            let reply = self.get(path, headers).await;
            match reply.status {
                200 => {}
                429 => return (admitted, reply),
                other => panic!("{path} {headers:?}: {other} after {admitted} admitted: {reply:?}"),
            }
        }
        panic!("{path} {headers:?}: no 429 within {bound} requests");
    }
}
