//! Why a request could not be decided, and what kind of failure that is for the front ends.

use super::target::MAX_ENTRIES;
use super::{MAX_LEASE_ID_LEN, TokenError};
use crate::store::StoreError;

/// Why a request could not be decided.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimiterError {
    /// The request named no domain. (Message text as envoyproxy/ratelimit.)
    #[error("rate limit domain must not be empty")]
    EmptyDomain,
    /// The request carried no descriptor. (Message text as envoyproxy/ratelimit.)
    #[error("rate limit descriptor list must not be empty")]
    NoDescriptors,
    /// More descriptors than [`super::LimiterOptions::max_descriptors`].
    #[error("too many descriptors: {count} (at most {max})")]
    TooManyDescriptors {
        /// Descriptors in the request.
        count: usize,
        /// The configured maximum.
        max: usize,
    },
    /// A limit override the rules file format would refuse (a sliding log over its cap).
    #[error("descriptor {index}: limit override: {reason}")]
    InvalidOverride {
        /// Position of the descriptor in the request.
        index: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// A descriptor with more entries than [`MAX_ENTRIES`].
    #[error("descriptor {index}: {count} entries (at most {MAX_ENTRIES})")]
    TooManyEntries {
        /// Position of the descriptor in the request.
        index: usize,
        /// Entries in it.
        count: usize,
    },
    /// A limit override with an unknown unit (envoyproxy/ratelimit crashes on this).
    #[error("descriptor {index}: limit override has invalid unit {unit} (expected SECOND..YEAR)")]
    InvalidOverrideUnit {
        /// Position of the descriptor in the request.
        index: usize,
        /// The unit number received.
        unit: i32,
    },
    /// A lease id that is empty (Release) or longer than [`MAX_LEASE_ID_LEN`] bytes.
    #[error("lease_id must be 1 to {MAX_LEASE_ID_LEN} bytes")]
    InvalidLeaseId,
    /// A lease TTL of zero or below.
    #[error("lease ttl must be positive")]
    InvalidLeaseTtl,
    /// A refund whose token is missing, forged, expired, already used, or for another request.
    #[error(transparent)]
    Refund(#[from] TokenError),
    /// A renewal of a lease that holds no live slot (expired, released, or never minted here).
    #[error("no live lease with this lease_id: acquire without an id to take a new one")]
    LeaseNotFound,
    /// The OS gave no randomness to mint an unguessable id with.
    #[error("cannot mint an id: the operating system gave no randomness")]
    NoRandomness,
    /// A Check mode the native API does not define (the number as sent).
    #[error("unknown mode {0} (expected MODE_CONSUME, MODE_PEEK or MODE_ALL_OR_NOTHING)")]
    UnknownMode(i32),
    /// The native API named a domain no rules define (Envoy's API answers OK, as envoyproxy/ratelimit).
    #[error("unknown domain '{0}': no rules define it")]
    UnknownDomain(String),
    /// No rules have loaded yet. (Message text as envoyproxy/ratelimit.)
    #[error("no rate limit configuration loaded")]
    NoConfig,
    /// The store failed and at least one affected limit has no `failure_mode`.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What kind of failure a [`LimiterError`] is, for the front ends to map to their status codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The request is malformed: the caller must change it.
    InvalidRequest,
    /// Nothing can be decided now (the store is down and no failure mode answers): retrying may help.
    Unavailable,
    /// No rule set has loaded yet (rules over xDS, force-started): envoyproxy/ratelimit answers these
    /// with gRPC `UNKNOWN` and "no rate limit configuration loaded".
    NoRules,
    /// An all-or-nothing call whose keys Redis Cluster cannot update atomically.
    NotAtomic,
    /// The request names something that does not exist (a lease to renew, a domain of the native API).
    NotFound,
    /// The caller may not do this (a refund without a valid, unused token).
    PermissionDenied,
}

impl LimiterError {
    /// The error's kind.
    pub fn kind(&self) -> ErrorKind {
        match self {
            LimiterError::Store(StoreError::CrossSlot | StoreError::AcrossStores) => ErrorKind::NotAtomic,
            LimiterError::NoConfig => ErrorKind::NoRules,
            LimiterError::Store(_) | LimiterError::NoRandomness => ErrorKind::Unavailable,
            LimiterError::LeaseNotFound | LimiterError::UnknownDomain(_) => ErrorKind::NotFound,
            LimiterError::Refund(_) => ErrorKind::PermissionDenied,
            LimiterError::EmptyDomain
            | LimiterError::NoDescriptors
            | LimiterError::TooManyDescriptors { .. }
            | LimiterError::TooManyEntries { .. }
            | LimiterError::InvalidOverride { .. }
            | LimiterError::InvalidOverrideUnit { .. }
            | LimiterError::InvalidLeaseId
            | LimiterError::InvalidLeaseTtl
            | LimiterError::UnknownMode(_) => ErrorKind::InvalidRequest,
        }
    }
}
