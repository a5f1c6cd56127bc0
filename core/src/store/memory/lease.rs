//! The embedded store's concurrency leases (see [`crate::store::lease`] for the semantics).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use super::MemoryStore;
use crate::clock::Clock;
use crate::store::StoreError;
use crate::store::lease::{AcquireRequest, LeaseSlot, LeaseStore, ReleaseRequest, Released};

/// The leases held on one key: (lease id, expiry in µs since the epoch).
type Holders = Vec<(String, u64)>;

/// The retry hint of an acquire refused because the store is full: a second, as for a store failure.
const FULL_RETRY_US: u64 = 1_000_000;

/// The embedded lease store. One lock for all keys: leases guard expensive work, so their rate is far
/// below that of rate-limit checks, and one lock makes all-or-none across keys trivially atomic. The
/// lock is never held across an await.
#[derive(Debug)]
pub struct MemoryLeases {
    keys: Mutex<HashMap<String, Holders>>,
    clock: Arc<dyn Clock>,
    /// Most leases recorded at once, over every key: a lease is never evicted (that would free a held
    /// slot), so a new one that finds the store full, once the expired are dropped, is refused.
    max_leases: usize,
    /// Acquires refused because the store was full.
    refused_full: AtomicU64,
}

impl MemoryLeases {
    /// An empty store reading time from `clock`, holding at most `max_leases` leases.
    pub fn new(clock: Arc<dyn Clock>, max_leases: usize) -> Self {
        Self {
            keys: Mutex::default(),
            clock,
            max_leases,
            refused_full: AtomicU64::new(0),
        }
    }

    /// Acquires refused so far because the store held `max_leases` live leases.
    pub fn refused_full(&self) -> u64 {
        self.refused_full.load(Ordering::Relaxed)
    }

    /// Slots held by leases that have not expired, over every key (`tollgate_leases_in_flight`).
    pub fn held_slots(&self) -> u64 {
        let now = self.clock.now_us();
        let keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        let live = keys.values().flatten().filter(|(_, expires)| *expires > now);
        live.count() as u64
    }

    /// Drops expired leases and keys left empty; returns how many leases were dropped.
    pub fn sweep(&self) -> usize {
        let now = self.clock.now_us();
        let mut keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        let mut dropped = 0;
        keys.retain(|_, holders| {
            dropped += purge(holders, now);
            !holders.is_empty()
        });
        dropped
    }

    /// Leases currently recorded, expired or not (for tests).
    pub fn len(&self) -> usize {
        let keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        keys.values().map(Vec::len).sum()
    }

    /// Whether no lease is recorded.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn acquire_now(&self, request: &AcquireRequest) -> Vec<LeaseSlot> {
        let now = self.clock.now_us();
        let mut keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        let mut slots: Vec<LeaseSlot> = request
            .items
            .iter()
            .map(|item| match keys.get_mut(&item.key) {
                Some(holders) => {
                    purge(holders, now);
                    slot_of(holders, item.max_in_flight, request, now)
                }
                None => slot_of(&Holders::new(), item.max_in_flight, request, now),
            })
            .collect();
        if slots.iter().all(|s| s.available) && !request.renew && !self.has_room(&mut keys, request, now) {
            self.refused_full.fetch_add(1, Ordering::Relaxed);
            for slot in &mut slots {
                slot.available = false;
                slot.retry_after_us = FULL_RETRY_US;
            }
        }
        if slots.iter().all(|s| s.available) {
            let expires = now.saturating_add(request.ttl_us);
            for (item, slot) in request.items.iter().zip(&mut slots) {
                let holders = keys.entry(item.key.clone()).or_default();
                match holders.iter_mut().find(|(id, _)| *id == request.lease_id) {
                    Some(held) => held.1 = expires,
                    None => holders.push((request.lease_id.clone(), expires)),
                }
                slot.in_flight = holders.len() as u64;
            }
        }
        // Only the keys this call touched can have become empty (their expired leases purged);
        // scanning every key here would make an acquire cost O(all keys).
        for item in &request.items {
            if keys.get(&item.key).is_some_and(Vec::is_empty) {
                keys.remove(&item.key);
            }
        }
        slots
    }

    /// Whether the leases `request` would add fit under `max_leases`, dropping expired leases
    /// everywhere first when they would not. Counts every lease (a linear pass): only an acquire that
    /// finds the store nearly full pays for the sweep.
    fn has_room(&self, keys: &mut HashMap<String, Holders>, request: &AcquireRequest, now: u64) -> bool {
        let adding = request.items.len();
        let held: usize = keys.values().map(Vec::len).sum();
        if held + adding <= self.max_leases {
            return true;
        }
        keys.retain(|_, holders| {
            purge(holders, now);
            !holders.is_empty()
        });
        keys.values().map(Vec::len).sum::<usize>() + adding <= self.max_leases
    }

    fn release_now(&self, keys_wanted: &[String], lease_id: &str) -> Vec<Released> {
        let now = self.clock.now_us();
        let mut keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        keys_wanted
            .iter()
            .map(|key| {
                let Some(holders) = keys.get_mut(key) else {
                    return Released::default();
                };
                purge(holders, now);
                let before = holders.len();
                holders.retain(|(id, _)| id != lease_id);
                let out = Released {
                    released: holders.len() < before,
                    in_flight: holders.len() as u64,
                };
                if holders.is_empty() {
                    keys.remove(key);
                }
                out
            })
            .collect()
    }
}

/// The embedded store keeps its leases next to its counters.
impl LeaseStore for MemoryStore {
    async fn acquire(&self, request: &AcquireRequest) -> Result<Vec<LeaseSlot>, StoreError> {
        Ok(self.leases().acquire_now(request))
    }

    async fn release(&self, request: &ReleaseRequest) -> Result<Vec<Released>, StoreError> {
        Ok(self.leases().release_now(&request.keys, &request.lease_id))
    }
}

/// Drops the leases expired at `now` (a lease expiring exactly now is gone); returns how many.
fn purge(holders: &mut Holders, now: u64) -> usize {
    let before = holders.len();
    holders.retain(|(_, expires)| *expires > now);
    before - holders.len()
}

/// Whether `request`'s lease may hold a slot of a key whose live holders are `holders`: a renewal
/// where it holds one, a new lease where it holds none and there is room.
fn slot_of(holders: &Holders, max_in_flight: u64, request: &AcquireRequest, now: u64) -> LeaseSlot {
    let in_flight = holders.len() as u64;
    let held = holders.iter().any(|(id, _)| *id == request.lease_id);
    let available = if request.renew {
        held
    } else {
        !held && in_flight < max_in_flight
    };
    if available || request.renew {
        return LeaseSlot {
            available,
            in_flight,
            retry_after_us: 0,
        };
    }
    let oldest = holders.iter().map(|(_, expires)| *expires).min().unwrap_or(now);
    LeaseSlot {
        available: false,
        in_flight,
        // With max_in_flight 0 nothing ever frees a slot; the hint is then 0 ("no use waiting" is
        // told by the limit itself).
        retry_after_us: oldest.saturating_sub(now),
    }
}

#[cfg(test)]
mod tests {
    //! What leases admit, across keys and over time, is the store contract
    //! (`tests/it/store_contract.rs`), run on this store too; here only what is this store's own.
    use super::*;
    use crate::clock::ManualClock;
    use crate::store::lease::LeaseItem;

    fn setup() -> (ManualClock, MemoryLeases) {
        let clock = ManualClock::new(1_000_000);
        let leases = MemoryLeases::new(Arc::new(clock.clone()), 1_000);
        (clock, leases)
    }

    fn request(keys: &[(&str, u64)], id: &str, ttl_us: u64) -> AcquireRequest {
        AcquireRequest {
            items: keys
                .iter()
                .map(|(key, max)| LeaseItem {
                    key: (*key).to_owned(),
                    max_in_flight: *max,
                })
                .collect(),
            lease_id: id.to_owned(),
            renew: false,
            ttl_us,
            scope_len: 0,
        }
    }

    #[test]
    fn a_refused_lease_records_nothing_and_sweep_drops_expired() {
        let (clock, leases) = setup();
        assert!(!leases.acquire_now(&request(&[("k", 0)], "a", 10))[0].available);
        assert!(leases.is_empty());
        leases.acquire_now(&request(&[("k", 5)], "a", 10));
        leases.acquire_now(&request(&[("j", 5)], "b", 20));
        clock.advance_us(15);
        assert_eq!(leases.sweep(), 1);
        assert_eq!(leases.len(), 1);
    }

    /// A hostile caller minting leases on ever new keys fills the store up to its cap, no further; live
    /// leases are never evicted (that would free a held slot), expired ones make room.
    #[test]
    fn leases_stop_at_the_cap_and_expired_ones_make_room() {
        let clock = ManualClock::new(1_000_000);
        let leases = MemoryLeases::new(Arc::new(clock.clone()), 3);
        for i in 0..3 {
            let key = format!("k{i}");
            assert!(leases.acquire_now(&request(&[(&key, 5)], &format!("l{i}"), 10))[0].available);
        }
        let refused = leases.acquire_now(&request(&[("k9", 5)], "l9", 10));
        assert!(!refused[0].available, "full");
        assert_eq!(refused[0].retry_after_us, FULL_RETRY_US);
        assert_eq!((leases.len(), leases.refused_full()), (3, 1));
        // Renewing a lease held adds nothing and is never refused for room.
        let renew = AcquireRequest {
            renew: true,
            ..request(&[("k0", 5)], "l0", 10)
        };
        assert!(leases.acquire_now(&renew)[0].available);
        clock.advance_us(11);
        assert!(
            leases.acquire_now(&request(&[("k9", 5)], "l9", 10))[0].available,
            "room again"
        );
        assert!(leases.len() <= 3);
    }
}
