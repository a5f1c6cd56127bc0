//! `tollgate bench`: a load generator for any Envoy RLS server (Tollgate or another), so throughput and
//! latency are measured end to end, over real sockets, the way Envoy calls; or, with `--api native`,
//! through Tollgate's own `tollgate.v1.RateLimiter/Check`, the way applications call.
//!
//! Closed loop (the default): `concurrency` workers each keep one request in flight, spread over
//! `connections` HTTP/2 connections: the server's maximum rate at that concurrency. Open loop
//! (`--rate N`, [`pacer`]): requests are due at N per second whether or not earlier ones were answered,
//! and each latency is measured from when its request was due, so time spent queued behind a slow
//! server shows (no coordinated omission): the latency at a given offered load, for capacity planning.
//! Latencies go into HDR histograms (µs, 3 significant digits): constant memory at any duration.
//!
//! Each request carries one descriptor per `-d` template, with `{i}` replaced by a key index cycling
//! through `keys` distinct values, so the store sees realistic key churn.
//!
//! With `--redis-url`, the run also reports what it cost that Redis (`redis_cost`). `--api redis-floor`
//! skips the rate limiter and sends envoyproxy/ratelimit's fixed-window commands straight to Redis
//! (`INCRBY` + `EXPIRE` per descriptor, pipelined per request): the Redis cost no fixed-window limiter
//! can go below, measured the same way.

pub(crate) mod ads;
pub(crate) mod noop;
mod pacer;
mod redis_cost;

use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use tonic::transport::Channel;

use self::pacer::Pacer;
use self::redis_cost::{RedisCost, RedisSnapshot};

use crate::proto::descriptor::RateLimitDescriptor;
use crate::proto::native;
use crate::proto::native::rate_limiter_client::RateLimiterClient;
use crate::proto::rls::RateLimitRequest;
use crate::proto::rls::rate_limit_response::Code;
use crate::proto::rls::rate_limit_service_client::RateLimitServiceClient;

/// What to send and for how long.
#[derive(Debug, Clone)]
pub(crate) struct LoadPlan {
    /// Server address, e.g. `http://127.0.0.1:8081`.
    pub(crate) addr: String,
    /// Domain of every request.
    pub(crate) domain: String,
    /// Descriptor templates: entries whose keys and values may contain `{i}`.
    pub(crate) descriptors: Vec<Template>,
    /// Distinct values substituted for `{i}`.
    pub(crate) keys: u64,
    /// Requests in flight at once.
    pub(crate) concurrency: usize,
    /// HTTP/2 connections shared by the workers.
    pub(crate) connections: usize,
    /// How long to send.
    pub(crate) duration: Duration,
    /// Open loop: requests due per second (`None`: closed loop, each worker sends back to back).
    pub(crate) rate: Option<u64>,
    /// The Redis behind the server, to count the commands the run cost (optional).
    pub(crate) redis_url: Option<String>,
    /// Which API to call.
    pub(crate) api: Api,
    /// TLS to the server (an `https://` address), with a client certificate for mTLS when it has one.
    pub(crate) tls: Option<tonic::transport::ClientTlsConfig>,
}

/// The API a load run calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Api {
    /// Envoy's `ShouldRateLimit`.
    Envoy,
    /// `tollgate.v1.RateLimiter/Check` (consuming; each allowed answer carries a refund token).
    Native,
    /// No rate limiter: `INCRBY` + `EXPIRE` per descriptor, pipelined per request, straight to
    /// `--redis-url`, as envoyproxy/ratelimit counts a fixed window.
    RedisFloor,
}

/// A client of one API (clones share the connection).
#[derive(Clone)]
enum Caller {
    Envoy(RateLimitServiceClient<Channel>),
    Native(RateLimiterClient<Channel>),
    RedisFloor(redis::aio::MultiplexedConnection),
}

/// One request, built before it is timed.
enum Call {
    Envoy(RateLimitRequest),
    Native(native::CheckRequest),
    /// The keys of one request's counters.
    Redis(Vec<String>),
}

impl Caller {
    /// The request for key index `key`, in this caller's API.
    fn build(&self, domain: &str, templates: &[Template], key: u64) -> Call {
        let index = key.to_string();
        let entries = |template: &Template| substitute(template, &index);
        match self {
            Caller::Envoy(_) => Call::Envoy(RateLimitRequest {
                domain: domain.to_owned(),
                descriptors: templates
                    .iter()
                    .map(|t| RateLimitDescriptor::from_entries(entries(t)))
                    .collect(),
                hits_addend: 0,
            }),
            Caller::Native(_) => Call::Native(native::CheckRequest {
                domain: domain.to_owned(),
                descriptors: templates
                    .iter()
                    .map(|t| native::Descriptor::from_entries(entries(t)))
                    .collect(),
                cost: 1,
                mode: native::Mode::Consume as i32,
            }),
            // envoyproxy/ratelimit's key shape: domain, then key_value per entry, then the window
            // (a fixed suffix here: the floor's cost does not depend on the window).
            Caller::RedisFloor(_) => Call::Redis(
                templates
                    .iter()
                    .map(|t| {
                        let mut key = domain.to_owned();
                        for (k, v) in entries(t) {
                            key.push('_');
                            key.push_str(&k);
                            key.push('_');
                            key.push_str(&v);
                        }
                        key.push_str("_60");
                        key
                    })
                    .collect(),
            ),
        }
    }

    /// Sends one request; whether it was over the limit.
    async fn send(&mut self, call: Call) -> Result<bool, tonic::Status> {
        match (self, call) {
            (Caller::Envoy(client), Call::Envoy(request)) => {
                let response = client.should_rate_limit(request).await?;
                Ok(response.into_inner().overall_code == Code::OverLimit as i32)
            }
            (Caller::Native(client), Call::Native(request)) => {
                Ok(!client.check(request).await?.into_inner().allowed)
            }
            (Caller::RedisFloor(conn), Call::Redis(keys)) => {
                let mut pipe = redis::pipe();
                for key in &keys {
                    pipe.cmd("INCRBY").arg(key).arg(1).ignore();
                    pipe.cmd("EXPIRE").arg(key).arg(60).ignore();
                }
                pipe.query_async::<()>(conn)
                    .await
                    .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
                Ok(false)
            }
            _ => Err(tonic::Status::internal("a request built for the other API")),
        }
    }
}

/// A template's entries with `{i}` replaced by `index`.
fn substitute(template: &Template, index: &str) -> Vec<(String, String)> {
    template
        .iter()
        .map(|(k, v)| (k.replace("{i}", index), v.replace("{i}", index)))
        .collect()
}

/// What the run measured.
#[derive(Debug, Clone, Default)]
pub(crate) struct LoadReport {
    /// Answered requests.
    pub(crate) requests: u64,
    /// Requests answered OVER_LIMIT.
    pub(crate) over_limit: u64,
    /// Requests that failed (transport error or gRPC status).
    pub(crate) errors: u64,
    /// Open loop: requests due during the run that no worker could send before it ended (every worker
    /// was waiting for an answer: the offered rate is above what the server answers at this
    /// concurrency).
    pub(crate) unsent: u64,
    /// Open loop: the offered rate, requests per second.
    pub(crate) rate: Option<u64>,
    /// Wall time of the run.
    pub(crate) elapsed: Duration,
    /// Latency percentiles (p50, p90, p99, p99.9, max).
    pub(crate) latency: [Duration; 5],
    /// What the run cost the Redis at `--redis-url`, when given.
    pub(crate) redis: Option<RedisCost>,
}

impl std::fmt::Display for LoadReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let per_second = self.requests as f64 / self.elapsed.as_secs_f64().max(f64::EPSILON);
        let [p50, p90, p99, p999, max] = self.latency;
        writeln!(
            f,
            "requests:    {} in {:.2?} ({per_second:.0} decisions/s)",
            self.requests, self.elapsed
        )?;
        if let Some(rate) = self.rate {
            writeln!(
                f,
                "offered:     {rate}/s (open loop; latency from each request's due time), unsent {}",
                self.unsent
            )?;
        }
        writeln!(f, "over limit:  {}", self.over_limit)?;
        writeln!(f, "errors:      {}", self.errors)?;
        write!(
            f,
            "latency:     p50 {p50:.2?}  p90 {p90:.2?}  p99 {p99:.2?}  p99.9 {p999:.2?}  max {max:.2?}"
        )?;
        if let Some(cost) = &self.redis {
            write!(f, "\n{cost}")?;
        }
        Ok(())
    }
}

/// Runs the plan and reports.
pub(crate) async fn run(plan: LoadPlan) -> anyhow::Result<LoadReport> {
    let templates = plan.descriptors;
    let callers = callers(
        &plan.addr,
        plan.api,
        plan.tls.as_ref(),
        plan.redis_url.as_deref(),
        plan.connections,
    )
    .await?;
    let redis_before = match &plan.redis_url {
        Some(url) => Some(RedisSnapshot::take(url).await?),
        None => None,
    };
    // Allocated before the clock starts: hundreds of workers zeroing their histograms would otherwise
    // stall the first requests of an open loop, which then count as queueing.
    let histograms: Vec<_> = (0..plan.concurrency.max(1))
        .map(|_| latency_histogram())
        .collect();
    let start = Instant::now();
    let deadline = start + plan.duration;
    let pacer = plan.rate.map(|rate| Pacer::start(rate, start, deadline));
    let workers: Vec<_> = (0..plan.concurrency.max(1))
        .zip(histograms)
        .map(|(worker, latencies)| {
            let client = callers[worker % callers.len()].clone();
            let (templates, domain) = (templates.clone(), plan.domain.clone());
            let stride = plan.concurrency.max(1) as u64;
            let keys = Keys {
                next: worker as u64,
                stride,
                count: plan.keys.max(1),
            };
            tokio::spawn(work(
                client,
                domain,
                templates,
                keys,
                latencies,
                deadline,
                pacer.clone(),
            ))
        })
        .collect();
    let mut report = LoadReport {
        rate: plan.rate,
        ..LoadReport::default()
    };
    let mut latencies = latency_histogram();
    for worker in workers {
        let (counts, samples) = worker.await?;
        report.requests += counts.answered;
        report.over_limit += counts.over;
        report.errors += counts.errors;
        latencies.add(&samples)?;
    }
    report.elapsed = start.elapsed();
    if let Some(pacer) = pacer {
        report.unsent = pacer.unsent();
    }
    if let (Some(url), Some(before)) = (&plan.redis_url, redis_before) {
        let mut cost = RedisSnapshot::take(url).await?.since(&before);
        cost.decisions = report.requests;
        report.redis = Some(cost);
    }
    report.latency =
        [0.5, 0.9, 0.99, 0.999, 1.0].map(|q| Duration::from_micros(latencies.value_at_quantile(q)));
    Ok(report)
}

/// Latencies in µs, from 1 µs to a minute (longer ones count as a minute), to 3 significant digits
/// (0.1 %): about 140 KB.
fn latency_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid bounds")
}

/// The key indexes one worker cycles through: `next`, `next + stride`, ... modulo `count`.
struct Keys {
    next: u64,
    stride: u64,
    count: u64,
}

/// What one worker counted.
#[derive(Debug, Default)]
struct Counts {
    answered: u64,
    over: u64,
    errors: u64,
}

/// One descriptor's entries; `{i}` in a key or value is replaced by the key index (in a key, to reach
/// many rules: Envoy Gateway names its top-level descriptors after routes).
pub(crate) type Template = Vec<(String, String)>;

/// One worker until the deadline: closed loop, requests back to back, each timed from its send;
/// open loop, the next request due from `pacer`, timed from when it was due.
async fn work(
    mut client: Caller,
    domain: String,
    templates: Vec<Template>,
    mut keys: Keys,
    mut latencies: Histogram<u64>,
    deadline: Instant,
    pacer: Option<Pacer>,
) -> (Counts, Histogram<u64>) {
    let mut counts = Counts::default();
    while Instant::now() < deadline {
        let call = client.build(&domain, &templates, keys.next % keys.count);
        keys.next += keys.stride;
        let started = match &pacer {
            None => Instant::now(),
            Some(pacer) => match pacer.next_due(deadline).await {
                Some(due) => due,
                None => break,
            },
        };
        let answer = client.send(call).await;
        match answer {
            Ok(over_limit) => {
                let micros = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
                latencies.saturating_record(micros.max(1));
                counts.answered += 1;
                counts.over += u64::from(over_limit);
            }
            Err(_) => counts.errors += 1,
        }
    }
    (counts, latencies)
}

/// One caller per connection: a gRPC channel to the server in the plan's API, or a Redis connection for
/// the floor.
async fn callers(
    addr: &str,
    api: Api,
    tls: Option<&tonic::transport::ClientTlsConfig>,
    redis_url: Option<&str>,
    connections: usize,
) -> anyhow::Result<Vec<Caller>> {
    let mut callers = Vec::with_capacity(connections.max(1));
    for _ in 0..connections.max(1) {
        let caller = if api == Api::RedisFloor {
            let url = redis_url.ok_or_else(|| anyhow::anyhow!("--api redis-floor needs --redis-url"))?;
            Caller::RedisFloor(
                redis::Client::open(url)?
                    .get_multiplexed_async_connection()
                    .await?,
            )
        } else {
            let mut endpoint = Channel::from_shared(addr.to_owned())?;
            if let Some(tls) = tls {
                endpoint = endpoint.tls_config(tls.clone())?;
            }
            let channel = endpoint.connect().await?;
            match api {
                Api::Native => Caller::Native(RateLimiterClient::new(channel)),
                _ => Caller::Envoy(RateLimitServiceClient::new(channel)),
            }
        };
        callers.push(caller);
    }
    Ok(callers)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_substitute_the_key_index() {
        let template = vec![
            ("user".to_owned(), "u-{i}".to_owned()),
            ("path".to_owned(), "/x".to_owned()),
        ];
        assert_eq!(
            substitute(&template, "42"),
            [
                ("user".to_owned(), "u-42".to_owned()),
                ("path".to_owned(), "/x".to_owned())
            ]
        );
    }
}
