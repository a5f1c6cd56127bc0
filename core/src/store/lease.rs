//! Concurrency leases: at most `max_in_flight` holders of a key at once (Stripe's concurrency limiter).
//!
//! A lease is an id with an expiry. Acquiring takes one slot of every key of the request, or none: if
//! any key is full, nothing is taken anywhere. Each slot expires on its own after the lease's TTL, so a
//! client that crashes between acquire and release holds its slots for at most one TTL. Lease ids are
//! minted by the server; renewing (a heartbeat for long jobs) extends a live lease's slots and never
//! takes a new one, and a new lease never counts a slot some id already holds, so two callers can
//! never share a slot. Expired slots are purged whenever their key is touched, and by a periodic
//! sweep.
//!
//! This file holds the request and answer types and the [`LeaseStore`] trait. Backends:
//! [`crate::store::memory::MemoryLeases`] (the embedded store), and a Redis sorted set per key
//! (member = lease id, score = expiry), updated by one Lua script per call (`lua/lease.lua`).

use std::future::Future;

use super::StoreError;

/// One key of an acquire: which slots, and how many may be held at once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseItem {
    /// The slots' key (the descriptor's key, as for rate limits).
    pub key: String,
    /// Most leases held on `key` at once; 0 refuses every lease.
    pub max_in_flight: u64,
}

/// Take (or renew) one slot of every item for `lease_id`, all or none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcquireRequest {
    /// The keys, in request order.
    pub items: Vec<LeaseItem>,
    /// The lease's id (minted by the server for a new lease).
    pub lease_id: String,
    /// Renew: extend `lease_id` on every key where it holds a live slot, and take nothing new (a key
    /// where it holds none is unavailable). Otherwise take a new slot: a key where `lease_id` already
    /// holds one is unavailable too, so two acquirers can never share a slot.
    pub renew: bool,
    /// How long the slots live from now, in µs (> 0).
    pub ttl_us: u64,
    /// Every key starts with the same scope (`CACHE_KEY_PREFIX + domain`), this many bytes long. Redis
    /// Cluster places all keys of a call in that scope's slot.
    pub scope_len: usize,
}

/// Free the slots `lease_id` holds on each key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReleaseRequest {
    /// The keys, in request order.
    pub keys: Vec<String>,
    /// The lease's id.
    pub lease_id: String,
    /// As [`AcquireRequest::scope_len`].
    pub scope_len: usize,
}

/// What an acquire found on one key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LeaseSlot {
    /// Whether the key has room for a new lease (or, when renewing, holds this one live). The lease
    /// is taken or renewed only if every key of the request allows it.
    pub available: bool,
    /// Leases held on the key after the call.
    pub in_flight: u64,
    /// When the key is full: µs until its oldest lease expires (a release may free a slot sooner).
    pub retry_after_us: u64,
}

/// What a release found on one key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Released {
    /// Whether the lease held a slot of the key (false: never held, already released, or expired).
    pub released: bool,
    /// Leases held on the key after the call.
    pub in_flight: u64,
}

/// A place to keep leases. Both calls are atomic: no other call interleaves with one.
pub trait LeaseStore: Send + Sync + 'static {
    /// Takes or renews a slot of every item for the lease if every item has room; else changes nothing.
    /// Returns one [`LeaseSlot`] per item, in order.
    fn acquire(
        &self,
        request: &AcquireRequest,
    ) -> impl Future<Output = Result<Vec<LeaseSlot>, StoreError>> + Send;

    /// Frees the lease's slot of each key. Returns one [`Released`] per key, in order.
    fn release(
        &self,
        request: &ReleaseRequest,
    ) -> impl Future<Output = Result<Vec<Released>, StoreError>> + Send;
}
