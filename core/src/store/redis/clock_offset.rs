//! Where Tollgate thinks the Redis clock is.
//!
//! Scripts decide by Redis's `TIME`, but a fixed window's key carries its window start in its name
//! (envoyproxy/ratelimit's format), so Tollgate must name the window before the call. It does so from
//! its own clock corrected by the offset to the Redis clock, measured on every reply.
//!
//! In Redis Cluster each master has its own clock, so one offset shared by all would be set by
//! whichever node answered last, and a key bound for a skewed node would be named for the wrong window
//! near a boundary. The offset is therefore kept per hash slot (each slot's replies come from the node
//! that owns it), with the latest reply from any node as the estimate for a slot not heard from yet.

use std::sync::atomic::{AtomicI64, Ordering};

use super::keys::slot;
use super::link::SLOTS;

/// A slot never heard from.
const UNKNOWN: i64 = i64::MIN;

/// Redis clock minus local clock, in µs: the latest of any reply, and per cluster slot.
#[derive(Debug)]
pub(super) struct ClockOffsets {
    latest: AtomicI64,
    /// One entry per cluster slot (128 KiB), only for a cluster target.
    per_slot: Option<Box<[AtomicI64]>>,
}

impl ClockOffsets {
    /// Offsets for a single node (`cluster` false) or for every slot of a cluster.
    pub(super) fn new(cluster: bool) -> Self {
        Self {
            latest: AtomicI64::new(0),
            per_slot: cluster.then(|| (0..SLOTS).map(|_| AtomicI64::new(UNKNOWN)).collect()),
        }
    }

    /// Records the offset a reply showed: Redis said `redis_now_us` for a call sent at `sent_at_us` and
    /// answered at `received_us` (local clock), assumed to run half-way through the round trip. `slot`
    /// is the cluster slot the call went to.
    pub(super) fn record(&self, slot: Option<u16>, sent_at_us: u64, received_us: u64, redis_now_us: u64) {
        let midpoint = i128::from(sent_at_us) + (i128::from(received_us) - i128::from(sent_at_us)) / 2;
        let offset = i64::try_from(i128::from(redis_now_us) - midpoint)
            .unwrap_or(0)
            .max(UNKNOWN + 1);
        self.latest.store(offset, Ordering::Relaxed);
        if let Some(entry) = self.slot_entry(slot) {
            entry.store(offset, Ordering::Relaxed);
        }
    }

    /// The Redis clock (µs since the epoch) of the node behind `slot` (any node's for `None` or a
    /// slot not heard from), given the local time.
    pub(super) fn redis_now_us(&self, slot: Option<u16>, local_us: u64) -> u64 {
        let offset = self
            .slot_entry(slot)
            .map(|entry| entry.load(Ordering::Relaxed))
            .filter(|&offset| offset != UNKNOWN)
            .unwrap_or_else(|| self.latest.load(Ordering::Relaxed));
        u64::try_from((i128::from(local_us) + i128::from(offset)).max(0)).unwrap_or(u64::MAX)
    }

    /// The name of a fixed window's key and the window's start (µs), from `name(start_us)`, with the
    /// start read off the clock of the node the name lands on. On a single node that is one clock. In
    /// a cluster, an envoyproxy/ratelimit key's slot depends on the start in its name, so the name is
    /// checked against its own node's clock and, if that node is in another window, named again (at
    /// most once more: a pair of nodes that disagree either way keeps the second name).
    pub(super) fn name_window(
        &self,
        local_us: u64,
        window_us: u64,
        name: impl Fn(u64) -> String,
    ) -> (String, u64) {
        let window = window_us.max(1);
        let start_at = |now: u64| now / window * window;
        let mut start = start_at(self.redis_now_us(None, local_us));
        let mut key = name(start);
        if self.per_slot.is_none() {
            return (key, start);
        }
        for _ in 0..2 {
            let node_start = start_at(self.redis_now_us(Some(slot(&key)), local_us));
            if node_start == start {
                break;
            }
            start = node_start;
            key = name(start);
        }
        (key, start)
    }

    fn slot_entry(&self, slot: Option<u16>) -> Option<&AtomicI64> {
        self.per_slot.as_ref()?.get(usize::from(slot?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR_US: u64 = 3_600 * 1_000_000;
    /// An exact hour.
    const T0: u64 = 1_764_417_600 * 1_000_000;

    fn go_key(start_us: u64) -> String {
        format!("rd_k_v_{}", start_us / 1_000_000)
    }

    #[test]
    fn the_offset_is_measured_at_the_middle_of_the_round_trip() {
        let offsets = ClockOffsets::new(false);
        // Sent at 1000, answered at 1200, Redis said 5100 (at 1100 locally): Redis is 4000 ahead.
        offsets.record(None, 1_000, 1_200, 5_100);
        assert_eq!(offsets.redis_now_us(None, 10_000), 14_000);
        assert_eq!(
            offsets.redis_now_us(Some(7), 10_000),
            14_000,
            "one clock on a single node"
        );
    }

    #[test]
    fn each_slot_keeps_its_own_nodes_offset() {
        let offsets = ClockOffsets::new(true);
        offsets.record(Some(1), 0, 0, 2_000_000);
        offsets.record(Some(2), 0, 0, 0);
        assert_eq!(offsets.redis_now_us(Some(1), 0), 2_000_000);
        assert_eq!(offsets.redis_now_us(Some(2), 0), 0, "not the latest reply's");
        assert_eq!(
            offsets.redis_now_us(Some(3), 0),
            0,
            "unknown slot: the latest reply's"
        );
        offsets.record(Some(2), 0, 0, 50);
        assert_eq!(offsets.redis_now_us(Some(3), 0), 50);
    }

    #[test]
    fn a_key_is_named_for_the_window_its_own_node_is_in() {
        let offsets = ClockOffsets::new(true);
        let local = T0 + HOUR_US - 1_000_000; // one second before the hour turns, locally
        let next = go_key(T0 + HOUR_US);
        let current = go_key(T0);
        // The node owning the current window's key runs 2 s ahead: it is in the next hour already, and
        // the node owning the next window's key agrees (it is the same node or runs ahead too).
        offsets.record(Some(slot(&current)), 0, 0, 2_000_000);
        offsets.record(Some(slot(&next)), 0, 0, 2_000_000);
        offsets.record(Some(16_383), 0, 0, 0); // the latest reply, from a node without skew
        let (key, start) = offsets.name_window(local, HOUR_US, go_key);
        assert_eq!((key.as_str(), start), (next.as_str(), T0 + HOUR_US));
        // Without per-slot offsets the latest reply's clock names the current window.
        let single = ClockOffsets::new(false);
        single.record(None, 0, 0, 0);
        assert_eq!(single.name_window(local, HOUR_US, go_key).0, current);
    }

    #[test]
    fn nodes_that_disagree_get_a_name_in_two_steps() {
        let offsets = ClockOffsets::new(true);
        let local = T0 + HOUR_US - 1_000_000;
        let next = go_key(T0 + HOUR_US);
        let current = go_key(T0);
        assert_ne!(slot(&current), slot(&next), "the test needs two slots");
        // The current key's node is ahead (next hour), the next key's node is behind (this hour).
        offsets.record(Some(slot(&current)), 0, 0, 2_000_000);
        offsets.record(Some(slot(&next)), 0, 0, 0);
        offsets.record(None, 0, 0, 0);
        let (key, _) = offsets.name_window(local, HOUR_US, go_key);
        assert!(key == next || key == current, "{key}");
    }
}
