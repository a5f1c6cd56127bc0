//! The counters only the server keeps: its listeners' bounds (TLS handshakes, connection caps and
//! timeouts, request byte budgets), the proxies' forward auth, the decision log and the statsd sink;
//! and the one gauge it sets, whether each store answers (its health watcher's pings).
//! The core records decisions ([`tollgate_core::observe::metrics`]); these count what the transport and
//! the exporters around it did, so they live in the server, at its top level: the listeners' modules
//! ([`crate::connections`], [`crate::inflight`], [`crate::write_timeout`]) and [`crate::observe`] both
//! count into them, and neither imports the other. Rendered with the core's at `/metrics`
//! ([`crate::observe::prometheus`]).

use std::sync::{Arc, Mutex, PoisonError};

use tollgate_core::observe::metrics::Counter;

/// How a proxy's forward-auth request was answered: the `answer` label of
/// `tollgate_forward_auth_requests_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForwardAuthAnswer {
    /// Allowed by the limits (2xx).
    Allowed,
    /// Refused by a limit (429, or the 401/403 NGINX needs).
    Refused,
    /// The request made no descriptor, so no limit applied (2xx).
    NotLimited,
    /// The request could not be read (no client address, a garbled cost) and the domain's
    /// `proxy.failure_mode` let it through.
    UnreadableAllowed,
    /// The request could not be read and `proxy.failure_mode: closed` refused it.
    UnreadableRefused,
    /// The request could not be read and no `proxy.failure_mode` answers: 400.
    Unreadable,
    /// No loaded domain of that name has a `proxy:` block: 404.
    NoProxyBlock,
    /// Nothing could be decided (the store failed with no failure mode, no rules loaded): 503.
    Error,
}

impl ForwardAuthAnswer {
    /// Every answer, in the order the series are written.
    pub const ALL: [ForwardAuthAnswer; 8] = [
        ForwardAuthAnswer::Allowed,
        ForwardAuthAnswer::Refused,
        ForwardAuthAnswer::NotLimited,
        ForwardAuthAnswer::UnreadableAllowed,
        ForwardAuthAnswer::UnreadableRefused,
        ForwardAuthAnswer::Unreadable,
        ForwardAuthAnswer::NoProxyBlock,
        ForwardAuthAnswer::Error,
    ];

    /// The label value.
    pub fn name(self) -> &'static str {
        match self {
            ForwardAuthAnswer::Allowed => "allowed",
            ForwardAuthAnswer::Refused => "refused",
            ForwardAuthAnswer::NotLimited => "not_limited",
            ForwardAuthAnswer::UnreadableAllowed => "unreadable_allowed",
            ForwardAuthAnswer::UnreadableRefused => "unreadable_refused",
            ForwardAuthAnswer::Unreadable => "unreadable",
            ForwardAuthAnswer::NoProxyBlock => "no_proxy_block",
            ForwardAuthAnswer::Error => "error",
        }
    }
}

/// Every counter of one server that the core does not keep. Like the core's registry, an explicit
/// value: two servers in one test process do not share counters.
#[derive(Debug, Default)]
pub struct ServerCounters {
    /// TLS handshakes on the gRPC listener that failed or timed out (a plaintext client, an unknown
    /// client certificate, a wrong SAN).
    pub tls_handshake_failures: Counter,
    /// Requests failed because unfinished requests held their connection's or the process's budget of
    /// bytes.
    pub request_bytes_over_budget: Counter,
    /// Requests failed because they did not arrive whole within the read timeout.
    pub request_read_timeouts: Counter,
    /// Connections closed at once because their listener held as many as it may.
    pub connections_refused: Counter,
    /// Connections closed because they sent no request within the read timeout.
    pub connections_timed_out: Counter,
    /// Connections closed to make room for a new one at their listener's cap.
    pub connections_evicted: Counter,
    /// Connections closed because a write made no progress within the write timeout (a peer that does
    /// not read its answers).
    pub connections_stalled: Counter,
    /// Stat lines the statsd sink could not send (they are sent again with the next flush).
    pub statsd_lines_dropped: Counter,
    /// Forward-auth requests, per [`ForwardAuthAnswer`].
    forward_auth: [Counter; ForwardAuthAnswer::ALL.len()],
    /// Forward-auth requests that came with a body, which the proxy should not forward (it is never
    /// read).
    pub forward_auth_bodies: Counter,
    /// Requests written to the decision log (`TOLLGATE_DECISION_LOG`).
    pub decision_log_written: Counter,
    /// Requests the decision log dropped: its queue full, or its file unwritable.
    pub decision_log_dropped: Counter,
    /// Whether each store answers (readiness' view of Redis; the embedded store is always up).
    store_up: Mutex<Vec<(&'static str, bool)>>,
}

impl ServerCounters {
    /// Every counter at zero.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Counts a forward-auth request answered `answer`.
    pub fn forward_auth(&self, answer: ForwardAuthAnswer) {
        self.forward_auth[answer as usize].add(1);
    }

    /// Forward-auth requests answered `answer` so far.
    pub fn forward_auth_answers(&self, answer: ForwardAuthAnswer) -> u64 {
        self.forward_auth[answer as usize].get()
    }

    /// Records whether the store `name` answers (`tollgate_store_up{store=name}`: `embedded`, `redis`,
    /// `redis_persecond`).
    pub fn set_store_up(&self, name: &'static str, up: bool) {
        let mut stores = self.store_up.lock().unwrap_or_else(PoisonError::into_inner);
        match stores.iter_mut().find(|(known, _)| *known == name) {
            Some((_, state)) => *state = up,
            None => stores.push((name, up)),
        }
    }

    /// Each store and whether it answers, as last recorded by [`ServerCounters::set_store_up`].
    pub fn stores_up(&self) -> Vec<(&'static str, bool)> {
        self.store_up
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}
