//! How to talk to Redis: [`RedisOptions`] and their defaults (envoyproxy/ratelimit's, where it has
//! one).

use std::time::Duration;

use super::RedisTarget;
use super::link::LinkOptions;

/// Default per-call deadline: Envoy's default rate-limit timeout, so a stuck Redis is answered by the
/// rules' failure mode instead of Envoy timing out blind. Not shorter: on a busy 2-core host a healthy
/// Redis call can wait several milliseconds for CPU, and measured at 10 ms such waits turned into
/// false failures (a script that ran, reported as failed).
pub const DEFAULT_DEADLINE: Duration = Duration::from_millis(20);

/// Default number of multiplexed connections to one Redis node. Each carries many requests in
/// flight; two keep one slow reply from stalling everything behind it on one socket.
pub const DEFAULT_CONNECTIONS: usize = 2;

/// Default longest connection attempt (envoyproxy/ratelimit's `REDIS_TIMEOUT`).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// Default most extra TTL on fixed-window keys (envoyproxy/ratelimit's
/// `EXPIRATION_JITTER_MAX_SECONDS`).
pub const DEFAULT_EXPIRATION_JITTER_SECS: u64 = 300;

/// How to talk to Redis.
#[derive(Debug, Clone)]
pub struct RedisOptions {
    /// Where Redis is.
    pub target: RedisTarget,
    /// Multiplexed connections to a single node, used round-robin (`REDIS_POOL_SIZE`).
    pub connections: usize,
    /// Longest a decision may wait for Redis; then the call fails with [`crate::store::StoreError::Timeout`].
    pub deadline: Duration,
    /// Longest a connection attempt may take.
    pub connect_timeout: Duration,
    /// Certificates for TLS (a private CA, a client certificate); `None` trusts the system's roots.
    /// Whether TLS is used at all is in the target (`REDIS_TLS`, `rediss://`).
    pub tls: Option<redis::TlsCertificates>,
    /// Fixed-window keys expire after their window plus up to this much (`EXPIRATION_JITTER_MAX_SECONDS`),
    /// spreading expirations as envoyproxy/ratelimit does.
    pub expiration_jitter_max_secs: u64,
    /// Decide requests made only of fixed-window counters with pipelined `INCRBY` + `EXPIRE` instead of
    /// the script (`src/store/redis/pipeline.rs`; `TOLLGATE_REDIS_PIPELINE_FIXED_WINDOWS`, on by default).
    pub pipeline_fixed_windows: bool,
    /// How long a coalesced call waits, from its first request's arrival, for more requests to join it
    /// (`REDIS_PIPELINE_WINDOW`); zero sends it as soon as a call slot is free.
    pub pipeline_window: Duration,
    /// A coalesced call is sent once it carries this many items (`REDIS_PIPELINE_LIMIT`); zero: the
    /// built-in bound alone.
    pub pipeline_limit: usize,
    /// Spans are exported (the server's `TRACING_ENABLED`): a traced request's Redis call then gets a
    /// span of its own, and goes through the script, whose call is that span. Off, no span is made.
    pub traces: bool,
}

impl RedisOptions {
    /// The defaults (the Go service's, where it has one) for `target`: two connections per node, a
    /// 20 ms deadline, 1 s connection attempts, fixed windows pipelined, no gathering window, no
    /// traces.
    pub fn new(target: RedisTarget) -> Self {
        Self {
            target,
            connections: DEFAULT_CONNECTIONS,
            deadline: DEFAULT_DEADLINE,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            tls: None,
            expiration_jitter_max_secs: DEFAULT_EXPIRATION_JITTER_SECS,
            pipeline_fixed_windows: true,
            pipeline_window: Duration::ZERO,
            pipeline_limit: 0,
            traces: false,
        }
    }

    /// The options that say how to reach Redis, for the store's [`super::RedisLink`].
    pub(super) fn link(&self) -> LinkOptions {
        LinkOptions {
            target: self.target.clone(),
            connections: self.connections,
            deadline: self.deadline,
            connect_timeout: self.connect_timeout,
            tls: self.tls.clone(),
        }
    }
}
