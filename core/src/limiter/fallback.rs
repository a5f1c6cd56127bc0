//! `failure_mode: local`: degrade to local counting instead of all-open or all-closed.
//!
//! While the store fails (Redis down, blackholed, too slow for the deadline), a limit with
//! `failure_mode: local` is decided in this instance's own embedded store, at this instance's share of
//! the limit: the rule's rate divided by the fleet size (`TOLLGATE_FLEET_SIZE`). Every request still
//! tries the store first, so counting returns to the store the moment it answers; what was counted
//! locally meanwhile simply expires.
//!
//! The share assumes traffic is spread evenly over the fleet. A fleet size above the real number of
//! replicas errs on the strict side, which is why the Helm chart sets it from the autoscaler's maximum.

use crate::algorithm::Decision;
use crate::rules::Rate;
use crate::store::memory::MemoryStore;
use crate::store::{Batch, StoreError};

/// The embedded store that counts `failure_mode: local` limits while the main store fails.
#[derive(Debug)]
pub(super) struct LocalFallback {
    store: MemoryStore,
    fleet_size: u64,
}

impl LocalFallback {
    /// Counts in `store`, each instance allowed `1 / fleet_size` of a rule's rate.
    pub(super) fn new(store: MemoryStore, fleet_size: u32) -> Self {
        Self {
            store,
            fleet_size: u64::from(fleet_size.max(1)),
        }
    }

    /// This instance's share of `rate`: its requests and burst divided by the fleet size, rounded
    /// down but never below 1 (a limit that admits something keeps admitting something; a limit of 0
    /// stays 0). The window and algorithm are the rule's.
    pub(super) fn share(&self, rate: &Rate) -> Rate {
        let part = |units: u64| {
            if units == 0 {
                0
            } else {
                (units / self.fleet_size).max(1)
            }
        };
        let mut share = *rate;
        share.requests_per_unit =
            u32::try_from(part(u64::from(rate.requests_per_unit))).unwrap_or(rate.requests_per_unit);
        share.limit.requests = part(rate.limit.requests);
        share.limit.burst = part(rate.limit.burst);
        share
    }

    /// Applies a batch of shares (see [`LocalFallback::share`]). The embedded store never waits.
    pub(super) fn apply(&self, batch: &Batch) -> Result<Vec<Decision>, StoreError> {
        self.store.apply_now(batch)
    }

    /// Drops state that can no longer change a decision; returns how many entries went.
    pub(super) fn sweep(&self) -> usize {
        self.store.sweep()
    }

    /// Entries evicted to stay within the store's key cap.
    pub(super) fn evictions(&self) -> u64 {
        self.store.evictions()
    }

    /// Refunds and acquires refused because a map was at its cap (never, in practice: the fallback
    /// decides only `failure_mode: local` limits, with no refunds or leases).
    pub(super) fn refused_full(&self) -> u64 {
        self.store.refused_full()
    }

    /// Entries held now.
    pub(super) fn len(&self) -> usize {
        self.store.len()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::algorithm::Algorithm;
    use crate::clock::SystemClock;
    use crate::rules::file::Unit;

    fn fallback(fleet: u32) -> LocalFallback {
        LocalFallback::new(MemoryStore::new(Arc::new(SystemClock)), fleet)
    }

    #[test]
    fn each_instance_gets_its_share_of_the_rate_and_burst() {
        let rate = Rate::new(100, Unit::Minute, 1, Algorithm::TokenBucket, Some(30));
        let share = fallback(4).share(&rate);
        assert_eq!(
            (share.requests_per_unit, share.limit.requests, share.limit.burst),
            (25, 25, 7)
        );
        assert_eq!(share.limit.window_us, rate.limit.window_us);
        assert_eq!(share.limit.algorithm, Algorithm::TokenBucket);
    }

    #[test]
    fn a_share_never_drops_to_zero_unless_the_limit_is_zero() {
        let small = Rate::new(3, Unit::Second, 1, Algorithm::FixedWindow, None);
        assert_eq!(fallback(10).share(&small).limit.requests, 1);
        let none = Rate::new(0, Unit::Second, 1, Algorithm::FixedWindow, None);
        assert_eq!(fallback(10).share(&none).limit.requests, 0);
        assert_eq!(
            fallback(1).share(&small).limit.requests,
            3,
            "a fleet of one keeps the rule"
        );
    }
}
