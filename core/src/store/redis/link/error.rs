//! How a call on the link fails: [`CallError`], kept typed until it reaches the store's edge so that
//! the pool and Sentinel can tell a stalled connection or a moved master from other failures, and
//! [`within`], which bounds a call by its deadline.

use std::future::Future;
use std::time::Duration;

use super::sentinel;
use crate::store::StoreError;

/// Why one call failed.
pub(crate) enum CallError {
    /// No connection has been made yet.
    NotConnected,
    /// Every connection to the node is stalled: a call on each outlived its timeout, and none is known
    /// to be drained or replaced yet ([`super::node_pool`]).
    Stalled,
    /// A call that must be sent whole (settled at once) whose keys live in several Redis Cluster slots.
    CrossSlot,
    Timeout,
    Redis(redis::RedisError),
    Reply(ReplyError),
}

impl CallError {
    /// The error as the store reports it; `deadline`, the call's, for a timeout.
    pub(crate) fn into_store_error(self, deadline: Duration) -> StoreError {
        match self {
            CallError::NotConnected => StoreError::Unavailable("not connected to Redis yet".into()),
            CallError::Stalled => StoreError::Unavailable(
                "Redis stopped answering: waiting for it to drain or reconnect".into(),
            ),
            CallError::CrossSlot => StoreError::CrossSlot,
            CallError::Timeout => StoreError::Timeout(deadline),
            CallError::Redis(error) => StoreError::Unavailable(error.to_string()),
            CallError::Reply(error) => StoreError::Unavailable(format!("unexpected script reply: {error}")),
        }
    }

    /// Whether the master may have moved (Sentinel): the call timed out, the connection broke, or the
    /// server now refuses writes as a replica.
    pub(crate) fn suggests_failover(&self) -> bool {
        match self {
            CallError::Timeout => true,
            CallError::NotConnected | CallError::Stalled | CallError::CrossSlot => false,
            CallError::Redis(error) => sentinel::suggests_failover(error),
            CallError::Reply(_) => false,
        }
    }
}

/// `call`, bounded by `timeout`: its reply, or the Redis error or missed deadline as a [`CallError`].
pub(crate) async fn within<T>(
    timeout: Duration,
    call: impl Future<Output = redis::RedisResult<T>>,
) -> Result<T, CallError> {
    match tokio::time::timeout(timeout, call).await {
        Ok(reply) => reply.map_err(CallError::Redis),
        Err(_) => Err(CallError::Timeout),
    }
}

/// Why a reply (of the script, or of a fixed-window pipeline) could not be decoded. None of these
/// happens with the calls Tollgate sends; they mean the server is not the Redis we expect (or the
/// reply was corrupted), never a decision.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReplyError {
    /// The reply was not of the expected type: a bulk string from the script, an array from a
    /// pipeline.
    #[error("unexpected reply type: {0}")]
    WrongType(String),
    /// The reply had the wrong size: bytes of the script's reply, values of a pipeline's.
    #[error("expected {expected} in the reply, got {got}")]
    WrongLength {
        /// The script: `8 + 25 × items` bytes; a pipeline: its commands' replies.
        expected: usize,
        /// What arrived.
        got: usize,
    },
    /// A value was not what it may be: `allowed` other than 0 or 1 in the script's reply, or a
    /// pipeline's reply that is not an integer.
    #[error("reply value {index} is not valid: {value}")]
    BadValue {
        /// Position in the reply: the script's item, or the pipeline's command.
        index: usize,
        /// The value as received, for the log.
        value: String,
    },
}
