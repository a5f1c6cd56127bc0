//! Fixed-window counters this replica has already given a TTL, so that their next `INCRBY` can go
//! without an `EXPIRE`.
//!
//! A counter's `EXPIRE … NX` does something only once, when the counter is created: every later one
//! finds the TTL set and changes nothing, yet costs Redis a command (about a third of a pipelined
//! decision's Redis CPU, measured in docs/performance.md). A counter key names its window, so it is
//! created once, at its window's first hit, and lives a window plus jitter. Once this replica has seen
//! an `EXPIRE` answered for a key, later hits on it send `INCRBY` alone.
//!
//! What is remembered is only a hint, and a wrong hint costs nothing lasting: the counter can have lost
//! its TTL only by being deleted (an operator's `DEL` or `FLUSHALL`, eviction, a failover that lost
//! writes) and created again by an `INCRBY` without `EXPIRE`. That `INCRBY` is the one whose count is
//! no more than its own cost, and its sender sees so and sets the TTL right after
//! ([`super::pipeline`]). The same holds for two keys sharing a fingerprint (one chance in 2^64).
//!
//! Bounded: a fixed table of [`SLOTS`] fingerprints (1 MiB) in buckets of [`WAYS`], one cache line
//! each. A key may sit anywhere in its bucket, so keys sharing a bucket do not push each other out
//! while it has room; a full bucket gives up a slot in turn. More live counters than slots only means
//! more `EXPIRE`s sent, never a counter without a TTL. Lock-free: a lookup reads one cache line, an
//! insert writes one slot.

use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::Semaphore;

/// Slots in the table: the counters a replica can remember at once (8 bytes each).
pub(super) const SLOTS: usize = 1 << 17;

/// Repairs (an `EXPIRE` pipeline each) that may be in flight in the background at once.
const REPAIRS_IN_FLIGHT: usize = 16;

/// Slots of a bucket: as many fingerprints as one 64-byte cache line holds.
const WAYS: usize = 8;

/// A slot nobody has written.
const EMPTY: u64 = 0;

/// The slots one key may sit in.
#[repr(align(64))]
struct Bucket([AtomicU64; WAYS]);

/// The fingerprints of counters known to carry a TTL, and what they saved.
pub(super) struct TimedCounters {
    buckets: Box<[Bucket]>,
    /// Which slot a full bucket gives up next (taken modulo [`WAYS`]).
    turn: AtomicU64,
    /// Seeded at random per process, so nobody outside can aim keys at one slot.
    hasher: hashbrown::DefaultHashBuilder,
    /// `EXPIRE`s sent with an `INCRBY`.
    pub(super) sent: AtomicU64,
    /// `EXPIRE`s left out because the counter was known to carry a TTL.
    pub(super) skipped: AtomicU64,
    /// Counters found created without a TTL (after a wrong hint), and given one after the fact.
    pub(super) repaired: AtomicU64,
    /// Permits for repairs sent in the background; with none left, a repair holds its answer up.
    pub(super) repairs: Arc<Semaphore>,
}

impl std::fmt::Debug for TimedCounters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TimedCounters")
            .field("slots", &(self.buckets.len() * WAYS))
            .finish_non_exhaustive()
    }
}

impl Default for TimedCounters {
    fn default() -> Self {
        Self::new()
    }
}

impl TimedCounters {
    /// An empty table of [`SLOTS`] slots.
    pub(super) fn new() -> Self {
        Self {
            buckets: (0..SLOTS / WAYS)
                .map(|_| Bucket(std::array::from_fn(|_| AtomicU64::new(EMPTY))))
                .collect(),
            turn: AtomicU64::new(0),
            hasher: hashbrown::DefaultHashBuilder::default(),
            sent: AtomicU64::new(0),
            skipped: AtomicU64::new(0),
            repaired: AtomicU64::new(0),
            repairs: Arc::new(Semaphore::new(REPAIRS_IN_FLIGHT)),
        }
    }

    /// The fingerprint of the counter named `key`: never [`EMPTY`].
    pub(super) fn fingerprint(&self, key: &str) -> u64 {
        self.hasher.hash_one(key) | 1
    }

    /// Whether the counter with this `fingerprint` was seen with a TTL.
    pub(super) fn has_ttl(&self, fingerprint: u64) -> bool {
        self.bucket(fingerprint)
            .iter()
            .any(|slot| slot.load(Ordering::Relaxed) == fingerprint)
    }

    /// Remembers that the counter with this `fingerprint` carries a TTL: in an empty slot of its
    /// bucket if there is one, else in place of the bucket's next slot in turn.
    pub(super) fn remember(&self, fingerprint: u64) {
        let bucket = self.bucket(fingerprint);
        if let Some(slot) = bucket.iter().find(|slot| {
            let held = slot.load(Ordering::Relaxed);
            held == EMPTY || held == fingerprint
        }) {
            slot.store(fingerprint, Ordering::Relaxed);
            return;
        }
        let turn = self.turn.fetch_add(1, Ordering::Relaxed);
        bucket[usize::try_from(turn % WAYS as u64).unwrap_or(0)].store(fingerprint, Ordering::Relaxed);
    }

    fn bucket(&self, fingerprint: u64) -> &[AtomicU64; WAYS] {
        // The high bits pick the bucket; the low bit is always set and picks nothing.
        let bits = (self.buckets.len()).trailing_zeros();
        let at = usize::try_from(fingerprint >> (u64::BITS - bits)).unwrap_or(0);
        &self.buckets[at].0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_counter_is_known_once_remembered() {
        let table = TimedCounters::new();
        let key = table.fingerprint("rd_k_v_1700000000");
        assert!(!table.has_ttl(key));
        table.remember(key);
        assert!(table.has_ttl(key));
        assert!(!table.has_ttl(table.fingerprint("rd_k_v_1700000060")));
    }

    #[test]
    fn a_bucket_holds_several_keys_then_gives_up_its_slots_in_turn() {
        let table = TimedCounters::new();
        // Fingerprints of one bucket: same high bits, other low ones.
        let first = table.fingerprint("a");
        let others: Vec<u64> = (1..=WAYS as u64).map(|n| first ^ (n << 1)).collect();
        table.remember(first);
        for &other in &others[..WAYS - 1] {
            table.remember(other);
        }
        assert!(table.has_ttl(first), "a full bucket keeps all it holds");
        assert!(others[..WAYS - 1].iter().all(|&other| table.has_ttl(other)));
        table.remember(first);
        assert_eq!(
            table
                .bucket(first)
                .iter()
                .filter(|slot| slot.load(Ordering::Relaxed) == first)
                .count(),
            1,
            "remembered twice, held once"
        );
        // One more than the bucket holds: one earlier key gives up its slot, and only one.
        table.remember(others[WAYS - 1]);
        assert!(table.has_ttl(others[WAYS - 1]));
        let kept = std::iter::once(first)
            .chain(others[..WAYS - 1].iter().copied())
            .filter(|&key| table.has_ttl(key))
            .count();
        assert_eq!(kept, WAYS - 1);
    }

    #[test]
    fn fingerprints_are_never_empty_and_reach_every_bucket() {
        let table = TimedCounters::new();
        assert_ne!(table.fingerprint(""), EMPTY);
        // The bucket index comes from all the high bits: the highest fingerprint, the last bucket.
        let top = u64::MAX;
        table.remember(top);
        assert!(table.has_ttl(top));
        assert_eq!(
            std::ptr::from_ref(table.bucket(top)),
            std::ptr::from_ref(&table.buckets[SLOTS / WAYS - 1].0)
        );
    }
}
