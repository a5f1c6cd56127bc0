//! Health as the load balancer and Kubernetes see it, with envoyproxy/ratelimit's component model, so a
//! Redis outage fails no worse than it does with the Go service.
//!
//! - **liveness** (`grpc.health.v1` service `""`): the process works and is not shutting down. It
//!   depends neither on the store nor on rules, so no outage can trigger a restart storm.
//! - **readiness** (services `ratelimit` and `envoy.service.ratelimit.v3.RateLimitService`, and HTTP
//!   `/healthcheck` as in envoyproxy/ratelimit): live, and each component healthy:
//!   - *rules*: a rule set is loaded (with `FORCE_START_WITHOUT_INITIAL_CONFIG`, from the start); with
//!     `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`, one that defines at least one domain, as the Go
//!     service's `config` component;
//!   - *redis*: the first connection to Redis has succeeded (a process that never reached Redis is not
//!     ready). After that a Redis failure changes readiness only with
//!     `REDIS_HEALTH_CHECK_ACTIVE_CONNECTION=true`, as in the Go service: then readiness follows
//!     whether Redis answers. By default a Redis outage leaves every replica ready, and each rule's
//!     `failure_mode` answers: taking every replica out of the Service at once would leave Envoy to its
//!     own `failure_mode_deny` instead.
//! - **readiness with the store** (HTTP `/readyz`, gRPC service `tollgate.store`): readiness, and the
//!   store answers now, whatever `REDIS_HEALTH_CHECK_ACTIVE_CONNECTION` says: for operators who want
//!   Kubernetes to drain replicas during a store outage.
//!
//! On SIGTERM every answer flips to NOT_SERVING first, then the server keeps answering for the drain
//! period. [`watch`] keeps the rules and store components current.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tollgate_core::rules::RulesHandle;
use tollgate_core::store::redis::RedisStore;
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

use crate::server_counters::ServerCounters;

/// gRPC service names that report readiness.
pub const READINESS_SERVICES: [&str; 2] = ["ratelimit", "envoy.service.ratelimit.v3.RateLimitService"];

/// gRPC service name that reports readiness with the store answering (as HTTP `/readyz`).
pub const STORE_READINESS_SERVICE: &str = "tollgate.store";

/// How often [`watch`] looks at the rules and pings the store.
const WATCH_INTERVAL: Duration = Duration::from_millis(500);

/// What readiness requires beyond a loaded rule set (envoyproxy/ratelimit's settings of the same
/// names).
#[derive(Debug, Clone, Copy, Default)]
pub struct HealthPolicy {
    /// `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`: the rule set must define a domain.
    pub needs_a_domain: bool,
    /// `REDIS_HEALTH_CHECK_ACTIVE_CONNECTION`: after the first connection, readiness follows whether
    /// Redis answers.
    pub follows_redis: bool,
}

/// Shared health state; cheap to clone.
#[derive(Debug, Clone)]
pub struct Health {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    reporter: HealthReporter,
    policy: HealthPolicy,
    rules_loaded: AtomicBool,
    domain_loaded: AtomicBool,
    store_connected_once: AtomicBool,
    store_answers: AtomicBool,
    draining: AtomicBool,
}

impl Health {
    /// Starts NOT_SERVING for readiness until rules load; the store counts as healthy (the embedded
    /// store) until [`Health::expect_store`] says it must be reached first.
    pub async fn new(reporter: HealthReporter, policy: HealthPolicy) -> Self {
        let health = Self {
            inner: Arc::new(Inner {
                reporter,
                policy,
                rules_loaded: AtomicBool::new(false),
                domain_loaded: AtomicBool::new(false),
                store_connected_once: AtomicBool::new(true),
                store_answers: AtomicBool::new(true),
                draining: AtomicBool::new(false),
            }),
        };
        health.publish().await;
        health
    }

    /// The store is remote (Redis): not ready until it has answered once.
    pub async fn expect_store(&self) {
        self.inner.store_connected_once.store(false, Ordering::SeqCst);
        self.inner.store_answers.store(false, Ordering::SeqCst);
        self.publish().await;
    }

    /// Records that a rule set is loaded (`domains` of them), or that the service runs without one
    /// (force-started, with no domain).
    pub async fn set_rules(&self, domains: usize) {
        self.inner.rules_loaded.store(true, Ordering::SeqCst);
        self.inner.domain_loaded.store(domains > 0, Ordering::SeqCst);
        self.publish().await;
    }

    /// Records whether the store answers now.
    pub async fn set_store_answers(&self, answers: bool) {
        if answers {
            self.inner.store_connected_once.store(true, Ordering::SeqCst);
        }
        self.inner.store_answers.store(answers, Ordering::SeqCst);
        self.publish().await;
    }

    /// Shutdown has begun: report NOT_SERVING from now on.
    pub async fn set_draining(&self) {
        self.inner.draining.store(true, Ordering::SeqCst);
        self.publish().await;
    }

    /// Liveness: not draining.
    pub fn is_live(&self) -> bool {
        !self.inner.draining.load(Ordering::SeqCst)
    }

    /// Readiness: live, and the rules and store components healthy (see the module's comment).
    pub fn is_ready(&self) -> bool {
        let inner = &self.inner;
        let rules = inner.rules_loaded.load(Ordering::SeqCst)
            && (!inner.policy.needs_a_domain || inner.domain_loaded.load(Ordering::SeqCst));
        let store = inner.store_connected_once.load(Ordering::SeqCst)
            && (!inner.policy.follows_redis || inner.store_answers.load(Ordering::SeqCst));
        self.is_live() && rules && store
    }

    /// Readiness, and the store answers now.
    pub fn is_ready_with_store(&self) -> bool {
        self.is_ready() && self.inner.store_answers.load(Ordering::SeqCst)
    }

    async fn publish(&self) {
        let status = |up: bool| {
            if up {
                ServingStatus::Serving
            } else {
                ServingStatus::NotServing
            }
        };
        let reporter = &self.inner.reporter;
        reporter.set_service_status("", status(self.is_live())).await;
        for service in READINESS_SERVICES {
            reporter
                .set_service_status(service, status(self.is_ready()))
                .await;
        }
        reporter
            .set_service_status(STORE_READINESS_SERVICE, status(self.is_ready_with_store()))
            .await;
    }
}

/// The Redis stores to ping, named as `tollgate_store_up` labels them (`redis`, `redis_persecond`).
pub type Pinged = Vec<(&'static str, Arc<RedisStore>)>;

/// Keeps the rules and store components current until `stop`: twice a second it reads how
/// many domains `rules` holds and pings each Redis, and records what changed in `health` and
/// `tollgate_store_up`, logging store state changes.
pub async fn watch(
    health: Health,
    rules: RulesHandle,
    redis: Pinged,
    counters: Arc<ServerCounters>,
    stop: CancellationToken,
) {
    let mut ticker = tokio::time::interval(WATCH_INTERVAL);
    let mut domains = None;
    let mut answering = None;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = ticker.tick() => {}
        }
        let now = rules.load().as_ref().map(|set| set.len());
        if now.is_some() && now != domains {
            domains = now;
            health.set_rules(now.unwrap_or(0)).await;
        }
        if redis.is_empty() {
            continue;
        }
        let pings = futures_util::future::join_all(redis.iter().map(|(_, store)| store.ping())).await;
        for ((name, _), up) in redis.iter().zip(&pings) {
            counters.set_store_up(name, *up);
        }
        let up = pings.iter().all(|up| *up);
        if answering != Some(up) {
            match (answering, up) {
                (_, true) => tracing::info!("Redis answers"),
                (None, false) => tracing::warn!("Redis does not answer yet: not ready until it does"),
                (Some(_), false) if health.inner.policy.follows_redis => tracing::warn!(
                    "Redis does not answer: not ready (REDIS_HEALTH_CHECK_ACTIVE_CONNECTION); rules with a \
                     failure_mode answer meanwhile"
                ),
                (Some(_), false) => tracing::warn!(
                    "Redis does not answer: rules with a failure_mode answer; still ready (see /readyz and \
                     REDIS_HEALTH_CHECK_ACTIVE_CONNECTION to take replicas out of the Service instead)"
                ),
            }
            answering = Some(up);
            health.set_store_answers(up).await;
        }
    }
}
