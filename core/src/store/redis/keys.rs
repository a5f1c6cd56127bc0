//! Redis key names and Redis Cluster slots.
//!
//! - **Fixed window, one limit per descriptor, its key in Go's format** ([`crate::store::BatchItem::go_format`]):
//!   envoyproxy/ratelimit's exact key,
//!   `CACHE_KEY_PREFIX + domain + "_" + key + "_" + value + "_" … + window_start_seconds`, holding a plain
//!   counter. A fleet mixing the Go service and Tollgate during a rolling migration shares these counters.
//! - **Everything else** (other algorithms, several limits on one descriptor, `all_or_nothing`
//!   domains, keys of Tollgate's own format): Tollgate keys, `{tag}rest` + `algorithm_windowS` (+ `_start`
//!   for fixed windows). A key of Tollgate's own format is never named as Go's: its text may equal a Go
//!   key's (`k1` = `v_k2_w` in Go's format is `k1` = `v`, `k2` = `w` escaped), its name never does. The
//!   hash tag keeps together what one script must touch atomically in Redis Cluster. It is the
//!   descriptor's key (all limits of one descriptor, one slot), or for `all_or_nothing` domains the
//!   domain (the whole request, one slot). `rest` is the remainder of the descriptor's key.
//!
//! So a key's name depends on the domain's `all_or_nothing` setting and on how many limits its
//! descriptor has in the batch, not on the key alone. Peeks and refunds must name the keys the
//! consuming batches wrote: every batch carries the domain's setting ([`crate::store::Batch::keep_together`],
//! whatever the call's policy) and the same limits per descriptor. Changing a domain's
//! `all_or_nothing` also moves its keys: the counters start afresh under the new names (the old
//! ones expire), as when a limit's algorithm or window changes.
//!
//! In Redis Cluster a request's items are grouped by [`slot`] and each group is one script call.

use std::collections::BTreeMap;

use super::link::SLOTS;
use crate::algorithm::{Algorithm, Limit};
use crate::store::BatchItem;

/// How a batch's keys are placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Placement<'a> {
    /// Each descriptor on its own.
    PerDescriptor {
        /// A fixed window of this item is named as envoyproxy/ratelimit names it: its key is in Go's
        /// format, and its descriptor has no other limit (several must share a slot).
        go_named: bool,
    },
    /// The whole batch in the slot of this scope (`CACHE_KEY_PREFIX + domain`).
    Scope(&'a str),
}

/// The Redis key for one item. `window_start_us` is used only by fixed windows. Windows are named in
/// whole seconds: rules can only express whole-second windows (unit × multiplier), so no two limits
/// of one descriptor can share a name.
pub(crate) fn redis_key(
    descriptor_key: &str,
    limit: &Limit,
    window_start_us: u64,
    placement: Placement<'_>,
) -> String {
    let window_secs = limit.window_us / 1_000_000;
    let start_secs = window_start_us / 1_000_000;
    if limit.algorithm == Algorithm::FixedWindow && placement == (Placement::PerDescriptor { go_named: true })
    {
        return format!("{descriptor_key}{start_secs}");
    }
    let (tag, rest) = match placement {
        Placement::Scope(scope) => descriptor_key.split_at(scope.len().min(descriptor_key.len())),
        Placement::PerDescriptor { .. } => (descriptor_key, ""),
    };
    let algorithm = limit.algorithm.as_str();
    match limit.algorithm {
        Algorithm::FixedWindow => format!("{{{tag}}}{rest}{algorithm}_{window_secs}s_{start_secs}"),
        _ => format!("{{{tag}}}{rest}{algorithm}_{window_secs}s"),
    }
}

/// The Redis Cluster slot of a key: CRC16 (XMODEM) of the hash tag (the text between the first `{`
/// and the next `}`, if non-empty) or of the whole key, modulo 16384 — the cluster specification's
/// rule, so Tollgate groups keys exactly as the cluster places them.
pub fn slot(key: &str) -> u16 {
    crc16_xmodem(hash_tag(key.as_bytes())) % SLOTS
}

/// The positions of `keys`, grouped by the Redis Cluster hash slot each lies in (ascending slots).
pub(super) fn by_slot<'k>(keys: impl Iterator<Item = &'k str>) -> BTreeMap<u16, Vec<usize>> {
    let mut by_slot: BTreeMap<u16, Vec<usize>> = BTreeMap::new();
    for (at, key) in keys.enumerate() {
        by_slot.entry(slot(key)).or_default().push(at);
    }
    by_slot
}

/// Whether the item at `at` belongs to a group of several items (groups are contiguous).
pub(super) fn shares_group(items: &[BatchItem], at: usize) -> bool {
    let group = items[at].group;
    (at > 0 && items[at - 1].group == group) || items.get(at + 1).is_some_and(|next| next.group == group)
}

/// The key that records refund token `id` as used by the descriptor at position `group` of its
/// request, whose key (without window) is `descriptor_key` and whose item's Redis key is `redis_key`
/// (see [`crate::store::RefundOnce`]).
///
/// - It names the descriptor, not the Redis key: a fixed window's Redis key changes with the window,
///   and a marker that changed with it would let one token refund again in the next window.
/// - It names the position: a request may hold one descriptor twice, each consuming its own cost.
/// - It lies in `redis_key`'s cluster slot, so the claim and the refund are one script call, and its
///   length does not grow with the key: a tag chosen for that slot, a hash, the id.
pub(crate) fn refund_marker(redis_key: &str, descriptor_key: &str, group: u32, id: &str) -> String {
    let mut hasher = blake3::Hasher::new();
    hasher.update(descriptor_key.as_bytes());
    hasher.update(&group.to_le_bytes());
    let digest = hasher.finalize();
    let mut marker = String::with_capacity(64 + id.len());
    marker.push('{');
    marker.push_str(&SLOT_TAGS[usize::from(slot(redis_key))]);
    marker.push_str("}refund:");
    marker.push_str(&digest.to_hex()[..16]);
    marker.push(':');
    marker.push_str(id);
    marker
}

/// The hash that counts the replicas reserving units of `redis_key` (hot-key reservations, see
/// `lua/batch.lua`): in the key's cluster slot, so the reservation is one script call, and of a length
/// that does not grow with the key.
pub(crate) fn reservers_key(redis_key: &str) -> String {
    let digest = blake3::hash(redis_key.as_bytes());
    let mut name = String::with_capacity(64);
    name.push('{');
    name.push_str(&SLOT_TAGS[usize::from(slot(redis_key))]);
    name.push_str("}reservers:");
    name.push_str(&digest.to_hex()[..32]);
    name
}

/// For every cluster slot, a short hash tag that lands in it (found once, by counting in base 36:
/// about 160,000 CRC16s, a few milliseconds).
static SLOT_TAGS: std::sync::LazyLock<Vec<String>> = std::sync::LazyLock::new(|| {
    let mut tags = vec![String::new(); usize::from(SLOTS)];
    let mut missing = tags.len();
    let mut n: u64 = 0;
    while missing > 0 {
        let tag = base36(n);
        let at = usize::from(crc16_xmodem(tag.as_bytes()) % SLOTS);
        if tags[at].is_empty() {
            tags[at] = tag;
            missing -= 1;
        }
        n += 1;
    }
    tags
});

fn base36(mut n: u64) -> String {
    const DIGITS: &[u8; 36] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut out = Vec::new();
    loop {
        out.push(DIGITS[(n % 36) as usize]);
        n /= 36;
        if n == 0 {
            break;
        }
    }
    out.reverse();
    String::from_utf8(out).unwrap_or_default()
}

fn hash_tag(key: &[u8]) -> &[u8] {
    let Some(open) = key.iter().position(|&b| b == b'{') else {
        return key;
    };
    match key[open + 1..].iter().position(|&b| b == b'}') {
        Some(0) | None => key,
        Some(len) => &key[open + 1..open + 1 + len],
    }
}

fn crc16_xmodem(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in bytes {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limit(algorithm: Algorithm, window_secs: u64) -> Limit {
        Limit {
            algorithm,
            requests: 10,
            window_us: window_secs * 1_000_000,
            burst: 10,
        }
    }

    #[test]
    fn fixed_window_keys_are_envoyproxy_ratelimit_keys() {
        // envoyproxy/ratelimit's own examples: `domain_key_value_1234` and, with a prefix,
        // `prefix:domain_key_value_1234`.
        let l = limit(Algorithm::FixedWindow, 60);
        let key = redis_key(
            "domain_key_value_",
            &l,
            1_234_000_000,
            Placement::PerDescriptor { go_named: true },
        );
        assert_eq!(key, "domain_key_value_1234");
        let key = redis_key(
            "prefix:domain_key2_value2_subkey2_subvalue2_",
            &l,
            1_200_000_000,
            Placement::PerDescriptor { go_named: true },
        );
        assert_eq!(key, "prefix:domain_key2_value2_subkey2_subvalue2_1200");
    }

    #[test]
    fn tollgate_keys_are_tagged_readable_and_distinct_per_limit() {
        let per_second = limit(Algorithm::FixedWindow, 1);
        let per_day = limit(Algorithm::FixedWindow, 86_400);
        let own = Placement::PerDescriptor { go_named: false };
        let a = redis_key("api_user_alice_", &per_second, 86_400_000_000, own);
        let b = redis_key("api_user_alice_", &per_day, 86_400_000_000, own);
        assert_eq!(a, "{api_user_alice_}fixed_window_1s_86400");
        assert_eq!(b, "{api_user_alice_}fixed_window_86400s_86400");
        assert_eq!(slot(&a), slot(&b));
        let bucket = redis_key("api_user_alice_", &limit(Algorithm::TokenBucket, 60), 0, own);
        assert_eq!(bucket, "{api_user_alice_}token_bucket_60s");
    }

    #[test]
    fn scope_placement_puts_a_whole_domain_in_one_slot() {
        let l = limit(Algorithm::Gcra, 60);
        let a = redis_key("pre:api_user_alice_", &l, 0, Placement::Scope("pre:api"));
        let b = redis_key("pre:api_ip_10.0.0.1_", &l, 0, Placement::Scope("pre:api"));
        assert_eq!(a, "{pre:api}_user_alice_gcra_60s");
        assert_eq!(slot(&a), slot(&b));
    }

    #[test]
    fn slots_follow_the_cluster_specification() {
        // The specification's CRC16 check value, and its hash tag examples.
        assert_eq!(crc16_xmodem(b"123456789"), 0x31C3);
        assert_eq!(slot("{user1000}.following"), slot("{user1000}.followers"));
        assert_eq!(slot("foo{}{bar}"), crc16_xmodem(b"foo{}{bar}") % SLOTS);
        assert_eq!(slot("foo{{bar}}zap"), crc16_xmodem(b"{bar") % SLOTS);
        assert_eq!(slot("foo{bar}{zap}"), slot("bar"));
        assert_eq!(slot("foo"), 12182);
    }

    #[test]
    fn reservers_share_their_keys_slot_whatever_the_key() {
        for key in ["d_k_v_60", "{t}x", "a{}b", "}{", "{", "x{y", ""] {
            let reservers = reservers_key(key);
            assert_eq!(slot(&reservers), slot(key), "{key:?} -> {reservers}");
            assert!(reservers.len() < 64, "{reservers}");
        }
        assert_ne!(reservers_key("d_k_v_60"), reservers_key("d_k_v_120"));
    }

    #[test]
    fn refund_markers_share_their_keys_slot_whatever_the_key() {
        let long = "x".repeat(10_000);
        for key in [
            "pre:d_k_v_",
            "{pre:d}_k_v_token_bucket_60s",
            "a}b{",
            "}{",
            "",
            long.as_str(),
        ] {
            let marker = refund_marker(key, "d_k_v_", 0, "00ff");
            assert_eq!(slot(&marker), slot(key), "{key:?} -> {marker}");
            assert!(marker.len() < 64, "{marker}");
        }
        let marker = |key, group, id| refund_marker("{t}x", key, group, id);
        assert_ne!(marker("a", 0, "1"), marker("b", 0, "1"));
        assert_ne!(marker("a", 0, "1"), marker("a", 0, "2"));
        assert_ne!(
            marker("a", 0, "1"),
            marker("a", 1, "1"),
            "two places of one descriptor"
        );
        assert_eq!(
            refund_marker("d_k_v_60", "d_k_v_", 0, "1")[4..],
            refund_marker("d_k_v_120", "d_k_v_", 0, "1")[4..],
            "the next window's key, the same descriptor: the same marker name past the slot tag"
        );
    }
}
