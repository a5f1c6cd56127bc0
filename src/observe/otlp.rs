//! Where spans go: the OTLP exporter for `TRACING_EXPORTER_PROTOCOL` (`http`, the Go service's
//! default, or `grpc`), its endpoint as OpenTelemetry's variables give it, and what happens when an
//! export fails (logged once at warn, then at most once a minute; every failure counted in
//! `tollgate_trace_export_failures_total`).
//!
//! The endpoint follows the OTLP exporter specification, as the Go service's SDK reads it:
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` as it is, else `OTEL_EXPORTER_OTLP_ENDPOINT` (with `/v1/traces`
//! appended over HTTP), else `localhost:4318/v1/traces` (HTTP) or `localhost:4317` (gRPC). The SDK
//! reads the headers (`OTEL_EXPORTER_OTLP_HEADERS`, `…_TRACES_HEADERS`) itself; the timeout
//! (`OTEL_EXPORTER_OTLP_TIMEOUT`, `…_TRACES_TIMEOUT`, in milliseconds, 10 s by default) bounds each
//! HTTP export. Only plain `http://` endpoints are built in, for either protocol.
//!
//! OTLP/HTTP goes through a client of its own: the SDK's batch processor exports from a thread of its
//! own, where an HTTP client bound to Tokio's reactor cannot run, so each request is handed to the
//! server's runtime and its answer awaited.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use opentelemetry_http::{HttpClient, HttpError, Request, Response};
use opentelemetry_otlp::{Protocol, WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SpanData, SpanExporter};

pub use crate::settings::OtlpProtocol;

/// Longest an OTLP/HTTP export may take when `OTEL_EXPORTER_OTLP_TIMEOUT` does not say.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// Largest collector answer read.
const MAX_ANSWER_BYTES: usize = 1 << 20;

/// How often a failing exporter is logged after its first failure.
const FAILURE_LOG_INTERVAL: Duration = Duration::from_secs(60);

/// Failed exports so far (`tollgate_trace_export_failures_total`).
static FAILURES: AtomicU64 = AtomicU64::new(0);

/// When a failed export was last logged.
static LOGGED: Mutex<Option<Instant>> = Mutex::new(None);

/// Failed exports so far.
pub fn export_failures() -> u64 {
    FAILURES.load(Ordering::Relaxed)
}

/// The trace endpoint for `protocol` that `env` (OpenTelemetry's variables) gives, with the reason
/// when it cannot be used.
pub fn endpoint(protocol: OtlpProtocol, env: impl Fn(&str) -> Option<String>) -> Result<String, String> {
    let given = |name: &str| env(name).filter(|v| !v.trim().is_empty());
    let endpoint = match (
        given("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
        given("OTEL_EXPORTER_OTLP_ENDPOINT"),
    ) {
        (Some(traces), _) => traces,
        (None, Some(base)) if protocol == OtlpProtocol::Http => {
            format!("{}/v1/traces", base.trim_end_matches('/'))
        }
        (None, Some(base)) => base,
        (None, None) if protocol == OtlpProtocol::Http => "http://localhost:4318/v1/traces".into(),
        (None, None) => "http://localhost:4317".into(),
    };
    if !endpoint.starts_with("http://") {
        return Err(format!(
            "the OTLP endpoint {endpoint:?} is not http://: TLS to the collector is not built in (send to a local \
             collector or an agent in plain HTTP)"
        ));
    }
    endpoint
        .parse::<http::Uri>()
        .map_err(|error| format!("the OTLP endpoint {endpoint:?} is not a URL: {error}"))?;
    Ok(endpoint)
}

/// The exporter for `protocol` to `endpoint`, reporting its failures. Call inside the runtime that will
/// carry its requests.
pub fn exporter(protocol: OtlpProtocol, endpoint: &str) -> anyhow::Result<Reported> {
    let exporter = match protocol {
        OtlpProtocol::Grpc => opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(endpoint)
            .build()?,
        OtlpProtocol::Http => opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(endpoint)
            .with_http_client(RuntimeClient::new(timeout(|name| std::env::var(name).ok())))
            .build()?,
    };
    Ok(Reported {
        inner: exporter,
        endpoint: endpoint.to_owned(),
        protocol,
    })
}

/// `OTEL_EXPORTER_OTLP_TRACES_TIMEOUT`, else `OTEL_EXPORTER_OTLP_TIMEOUT` (milliseconds), else 10 s.
fn timeout(env: impl Fn(&str) -> Option<String>) -> Duration {
    ["OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT"]
        .iter()
        .find_map(|name| env(name)?.trim().parse::<u64>().ok())
        .map_or(DEFAULT_TIMEOUT, Duration::from_millis)
}

/// An exporter that says when it fails.
#[derive(Debug)]
pub struct Reported {
    inner: opentelemetry_otlp::SpanExporter,
    endpoint: String,
    protocol: OtlpProtocol,
}

impl SpanExporter for Reported {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let spans = batch.len();
        let result = self.inner.export(batch).await;
        if let Err(error) = &result {
            self.failed(spans, error);
        }
        result
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &opentelemetry_sdk::Resource) {
        self.inner.set_resource(resource);
    }
}

impl Reported {
    /// Counts a failed export and logs it: the first at once, then at most once a minute.
    fn failed(&self, spans: usize, error: &impl std::fmt::Display) {
        let failures = FAILURES.fetch_add(1, Ordering::Relaxed) + 1;
        let mut logged = LOGGED.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if logged.is_none_or(|at| at.elapsed() >= FAILURE_LOG_INTERVAL) {
            *logged = Some(Instant::now());
            tracing::warn!(
                endpoint = %self.endpoint, protocol = self.protocol.name(), spans, failures, %error,
                "exporting traces failed (failures are counted in tollgate_trace_export_failures_total)"
            );
        }
    }
}

/// An HTTP client whose requests run on the server's Tokio runtime, whatever thread asks.
#[derive(Debug, Clone)]
struct RuntimeClient {
    runtime: tokio::runtime::Handle,
    client: Client<HttpConnector, Full<Bytes>>,
    timeout: Duration,
}

impl RuntimeClient {
    fn new(timeout: Duration) -> Self {
        Self {
            runtime: tokio::runtime::Handle::current(),
            client: Client::builder(TokioExecutor::new()).build_http(),
            timeout,
        }
    }
}

#[async_trait::async_trait]
impl HttpClient for RuntimeClient {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let (client, timeout) = (self.client.clone(), self.timeout);
        let (parts, body) = request.into_parts();
        let request = Request::from_parts(parts, Full::new(body));
        let sent = self.runtime.spawn(async move {
            let answer = tokio::time::timeout(timeout, client.request(request))
                .await
                .map_err(|_| format!("no answer within {timeout:?}"))??;
            let (parts, body) = answer.into_parts();
            let body = Limited::new(body, MAX_ANSWER_BYTES).collect().await?.to_bytes();
            Ok::<_, HttpError>(Response::from_parts(parts, body))
        });
        sent.await?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |name| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    #[test]
    fn the_endpoint_follows_the_otlp_specification() {
        let http = OtlpProtocol::Http;
        let base = env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/")]);
        assert_eq!(
            endpoint(http, base).as_deref(),
            Ok("http://collector:4318/v1/traces")
        );
        let both = env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"),
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://traces:9999/custom"),
        ]);
        assert_eq!(endpoint(http, both).as_deref(), Ok("http://traces:9999/custom"));
        assert_eq!(
            endpoint(http, env(&[])).as_deref(),
            Ok("http://localhost:4318/v1/traces")
        );
        let grpc = env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317")]);
        assert_eq!(
            endpoint(OtlpProtocol::Grpc, grpc).as_deref(),
            Ok("http://collector:4317")
        );
        assert_eq!(
            endpoint(OtlpProtocol::Grpc, env(&[])).as_deref(),
            Ok("http://localhost:4317")
        );
        let tls = env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "https://collector:4318")]);
        assert!(endpoint(http, tls).is_err_and(|e| e.contains("TLS")));
    }

    #[test]
    fn the_export_timeout_reads_opentelemetrys_variables() {
        assert_eq!(timeout(env(&[])), DEFAULT_TIMEOUT);
        assert_eq!(
            timeout(env(&[("OTEL_EXPORTER_OTLP_TIMEOUT", "2500")])),
            Duration::from_millis(2500)
        );
        let both = env(&[
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "2500"),
            ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "700"),
        ]);
        assert_eq!(timeout(both), Duration::from_millis(700));
    }
}
