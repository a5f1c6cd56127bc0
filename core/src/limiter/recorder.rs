//! Recording the requests a limiter decides, for `tollgate what-if` to replay them: the server's
//! decision log is a [`Recorder`]. Each request decided as Envoy's `ShouldRateLimit` (over gRPC, as
//! JSON, from a proxy's forward auth) in a loaded domain is handed over with its time and its
//! descriptors, each value written as the debug lines show it (as it enters the storage key: a
//! `hash: true` value stays hashed). The native API's calls (costs, peeks, refunds, leases) are not
//! recorded: a replay decides as Envoy does.
//!
//! With no recorder installed this costs one branch per request; with one, what is not sampled costs
//! one hash of the request's entries.

use std::fmt;
use std::hash::{Hash as _, Hasher as _};

use super::{Limiter, RequestDescriptor};
use crate::rules::{DescriptorEntry, Domain};
use crate::store::Store;

/// One request decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    /// When, in microseconds since the epoch (the limiter's clock).
    pub time_us: u64,
    /// The request's domain.
    pub domain: String,
    /// Its descriptors, in order.
    pub descriptors: Vec<RecordedDescriptor>,
}

/// One descriptor of a [`Recorded`] request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedDescriptor {
    /// `(key, value)`, values as they enter storage keys.
    pub entries: Vec<(String, String)>,
    /// The descriptor's own cost, if it named one.
    pub hits_addend: Option<u64>,
}

/// Takes the requests a limiter decided ([`Limiter::with_recorder`]).
pub trait Recorder: Send + Sync + fmt::Debug {
    /// Whether a request with this sampling key is wanted. Keys spread evenly over `u64`, and a
    /// request with the same domain and descriptors always has the same key, so sampling keeps or
    /// drops a caller's requests together.
    fn wants(&self, key: u64) -> bool;

    /// Takes one request. It must not block: the request is still being answered.
    fn record(&self, request: Recorded);
}

impl<S: Store> Limiter<S> {
    /// Hands every request decided as Envoy's to `recorder`.
    pub fn with_recorder(mut self, recorder: std::sync::Arc<dyn Recorder>) -> Self {
        self.recorder = Some(recorder);
        self
    }

    /// Records a request decided as Envoy's, in `rules`, if a recorder wants it.
    pub(super) fn record<D: RequestDescriptor>(&self, rules: &Domain, descriptors: &[D]) {
        let Some(recorder) = &self.recorder else {
            return;
        };
        if !recorder.wants(sampling_key(rules.name(), descriptors)) {
            return;
        }
        let descriptors = descriptors
            .iter()
            .map(|d| RecordedDescriptor {
                entries: rules.shown_entries(d.entries(), &self.hasher),
                hits_addend: d.hits_addend(),
            })
            .collect();
        recorder.record(Recorded {
            time_us: self.refunds.clock.now_us(),
            domain: rules.name().to_owned(),
            descriptors,
        });
    }
}

/// The request's sampling key: a fixed-key hash of its domain and raw entries (never stored).
fn sampling_key<D: RequestDescriptor>(domain: &str, descriptors: &[D]) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    domain.hash(&mut hasher);
    for descriptor in descriptors {
        for entry in descriptor.entries() {
            entry.key().hash(&mut hasher);
            entry.value().hash(&mut hasher);
        }
    }
    hasher.finish()
}
