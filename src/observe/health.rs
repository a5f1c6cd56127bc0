//! Health as the load balancer and Kubernetes see it.
//!
//! Two audiences, two answers:
//! - **liveness** (`grpc.health.v1` service `""`): the process works and is not shutting down. It
//!   depends neither on the store nor on rules having arrived over xDS, so a Redis or management-server
//!   outage cannot trigger a restart storm.
//! - **readiness** (services `ratelimit` and `envoy.service.ratelimit.v3.RateLimitService`, and HTTP
//!   `/healthcheck` as in envoyproxy/ratelimit): additionally a rule set is loaded and the store answers.
//!
//! On SIGTERM both flip to NOT_SERVING first, then the server keeps answering for the drain period.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

/// gRPC service names that report readiness.
pub const READINESS_SERVICES: [&str; 2] = ["ratelimit", "envoy.service.ratelimit.v3.RateLimitService"];

/// Shared health state; cheap to clone.
#[derive(Debug, Clone)]
pub struct Health {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    reporter: HealthReporter,
    rules_loaded: AtomicBool,
    store_reachable: AtomicBool,
    draining: AtomicBool,
}

impl Health {
    /// Starts NOT_SERVING for readiness until rules load.
    pub async fn new(reporter: HealthReporter) -> Self {
        let health = Self {
            inner: Arc::new(Inner {
                reporter,
                rules_loaded: AtomicBool::new(false),
                store_reachable: AtomicBool::new(true),
                draining: AtomicBool::new(false),
            }),
        };
        health.publish().await;
        health
    }

    /// Records whether a rule set is loaded.
    pub async fn set_rules_loaded(&self, loaded: bool) {
        self.inner.rules_loaded.store(loaded, Ordering::SeqCst);
        self.publish().await;
    }

    /// Records whether the store answers.
    pub async fn set_store_reachable(&self, reachable: bool) {
        self.inner.store_reachable.store(reachable, Ordering::SeqCst);
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

    /// Readiness: live, rules loaded and the store answers.
    pub fn is_ready(&self) -> bool {
        self.is_live()
            && self.inner.rules_loaded.load(Ordering::SeqCst)
            && self.inner.store_reachable.load(Ordering::SeqCst)
    }

    async fn publish(&self) {
        let status = |up: bool| {
            if up {
                ServingStatus::Serving
            } else {
                ServingStatus::NotServing
            }
        };
        self.inner
            .reporter
            .set_service_status("", status(self.is_live()))
            .await;
        for service in READINESS_SERVICES {
            self.inner
                .reporter
                .set_service_status(service, status(self.is_ready()))
                .await;
        }
    }
}
