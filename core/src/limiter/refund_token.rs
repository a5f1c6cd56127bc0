//! Refund tokens: a consuming Check's proof of what it consumed, so that a Refund gives back only
//! that, only for the same domain and descriptors, only while it still matters, and only once.
//!
//! A token is base64url (no padding) of
//! `version (1) | key id (4) | id (16) | expires_at_us (8, LE) | descriptor count (varint) |
//! cost per descriptor (varints) | MAC (16)`. The MAC is keyed BLAKE3 over everything before it plus
//! the domain and every descriptor's entries (length-prefixed), so a token names its request without
//! carrying it: a token replayed with other descriptors, another domain or a changed cost fails to
//! verify. The key id (the first bytes of the key's own hash) picks the verifying key among the
//! current and previous ones, so a fleet can rotate keys without breaking tokens already handed out.
//!
//! The `id` is what single use is enforced on: the store records it, in the same atomic call as the
//! refund, and refuses it the second time (see [`crate::store::RefundOnce`]). It only has to be unique:
//! 8 random bytes chosen when the keys are made, then a counter. Verifying is not trusting the id to
//! be secret: forging a token needs the key.

use std::sync::atomic::{AtomicU64, Ordering};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

use crate::rules::DescriptorEntry;

use super::RequestDescriptor;

/// The token format's version byte.
const VERSION: u8 = 1;
/// Bytes of MAC kept: 128 bits, beyond guessing.
const MAC_LEN: usize = 16;
/// Bytes of the fixed header: version, key id, id, expiry.
const HEADER_LEN: usize = 1 + 4 + 16 + 8;
/// Longest token accepted, in characters: far above any real request (a token costs about 1.4
/// characters per descriptor), so verification work stays bounded.
pub const MAX_TOKEN_LEN: usize = 64 * 1024;

/// Why a refund token was refused. Every case changes nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// No token was sent.
    #[error("a refund needs the refund_token of the check that consumed")]
    Missing,
    /// Not a token this service issues (bad encoding, length, version or unknown key).
    #[error("refund_token is not a token this service issued")]
    Malformed,
    /// The MAC does not match: forged, altered, or sent with another domain or other descriptors.
    #[error("refund_token does not match this domain and these descriptors")]
    Mismatch,
    /// The consumed units no longer matter (the limit's window or refill horizon has passed).
    #[error("refund_token has expired")]
    Expired,
    /// The token was already used.
    #[error("refund_token was already used")]
    Spent,
}

/// What a verified token grants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// The id single use is enforced on, in hex.
    pub id: String,
    /// Until when the token may be used, in µs since the epoch.
    pub expires_at_us: u64,
    /// The units each descriptor consumed, in request order: the most each may get back.
    pub costs: Vec<u64>,
}

/// One signing key.
#[derive(Clone)]
struct Key {
    id: [u8; 4],
    secret: [u8; 32],
}

impl Key {
    fn derive(material: &[u8]) -> Self {
        let secret = blake3::derive_key("tollgate 2026-12 refund token", material);
        let mut id = [0u8; 4];
        id.copy_from_slice(&blake3::hash(&secret).as_bytes()[..4]);
        Self { id, secret }
    }
}

/// The keys that sign and verify refund tokens: the first signs, every one verifies.
pub struct RefundKeys {
    keys: Vec<Key>,
    /// Random per process: ids minted here never meet another process's.
    prefix: [u8; 8],
    next: AtomicU64,
}

impl std::fmt::Debug for RefundKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RefundKeys")
            .field("keys", &self.keys.len())
            .finish_non_exhaustive()
    }
}

impl RefundKeys {
    /// Keys from secrets shared by the fleet: `current` signs; it and `previous` verify. `None` when
    /// the OS gives no randomness for the id prefix.
    pub fn new(current: &[u8], previous: &[&[u8]]) -> Option<Self> {
        let keys = std::iter::once(current)
            .chain(previous.iter().copied())
            .map(Key::derive)
            .collect();
        let mut prefix = [0u8; 8];
        getrandom::fill(&mut prefix).ok()?;
        Some(Self {
            keys,
            prefix,
            next: AtomicU64::new(0),
        })
    }

    /// A random key known to this process only: its tokens verify nowhere else.
    pub fn random() -> Option<Self> {
        let mut secret = [0u8; 32];
        getrandom::fill(&mut secret).ok()?;
        Self::new(&secret, &[])
    }

    /// A token for `costs` (one per descriptor, in order) consumed under `domain` by `descriptors`,
    /// usable until `expires_at_us`.
    pub fn mint<D: RequestDescriptor>(
        &self,
        domain: &str,
        descriptors: &[D],
        costs: &[u64],
        expires_at_us: u64,
    ) -> String {
        let key = &self.keys[0];
        let serial = self.next.fetch_add(1, Ordering::Relaxed);
        let mut bytes = Vec::with_capacity(HEADER_LEN + 2 + 2 * costs.len() + MAC_LEN);
        bytes.push(VERSION);
        bytes.extend_from_slice(&key.id);
        bytes.extend_from_slice(&self.prefix);
        bytes.extend_from_slice(&serial.to_le_bytes());
        bytes.extend_from_slice(&expires_at_us.to_le_bytes());
        put_varint(&mut bytes, costs.len() as u64);
        for &cost in costs {
            put_varint(&mut bytes, cost);
        }
        let mac = mac(key, &bytes, domain, descriptors);
        bytes.extend_from_slice(&mac);
        URL_SAFE_NO_PAD.encode(bytes)
    }

    /// The grant of `token` if this service issued it for `domain` and `descriptors` and it has not
    /// expired at `now_us`. (Whether it was already used is for the store to say.)
    pub fn verify<D: RequestDescriptor>(
        &self,
        token: &str,
        domain: &str,
        descriptors: &[D],
        now_us: u64,
    ) -> Result<Grant, TokenError> {
        if token.is_empty() {
            return Err(TokenError::Missing);
        }
        if token.len() > MAX_TOKEN_LEN {
            return Err(TokenError::Malformed);
        }
        let bytes = URL_SAFE_NO_PAD.decode(token).map_err(|_| TokenError::Malformed)?;
        let (signed, tag) = bytes
            .split_at_checked(bytes.len().saturating_sub(MAC_LEN))
            .filter(|(signed, _)| signed.len() > HEADER_LEN && signed[0] == VERSION)
            .ok_or(TokenError::Malformed)?;
        let key = self
            .keys
            .iter()
            .find(|k| k.id == signed[1..5])
            .ok_or(TokenError::Malformed)?;
        let mut rest = &signed[HEADER_LEN..];
        let count = take_varint(&mut rest).ok_or(TokenError::Malformed)?;
        if count != descriptors.len() as u64 {
            return Err(TokenError::Mismatch);
        }
        let costs = (0..count)
            .map(|_| take_varint(&mut rest))
            .collect::<Option<Vec<u64>>>()
            .filter(|_| rest.is_empty())
            .ok_or(TokenError::Malformed)?;
        // A constant-time comparison: blake3::Hash's equality is.
        let expected = blake3::Hash::from(pad(&mac(key, signed, domain, descriptors)));
        if expected != blake3::Hash::from(pad(tag)) {
            return Err(TokenError::Mismatch);
        }
        let mut expiry = [0u8; 8];
        expiry.copy_from_slice(&signed[21..29]);
        let expires_at_us = u64::from_le_bytes(expiry);
        if now_us >= expires_at_us {
            return Err(TokenError::Expired);
        }
        Ok(Grant {
            id: hex(&signed[5..21]),
            expires_at_us,
            costs,
        })
    }
}

/// The MAC of a token's bytes and the request they are bound to: one keyed hash over the bytes, then
/// the domain and every entry, each length-prefixed (one buffer and one call: cheaper than many small
/// updates for inputs this size).
fn mac<D: RequestDescriptor>(key: &Key, signed: &[u8], domain: &str, descriptors: &[D]) -> [u8; MAC_LEN] {
    let entries: usize = descriptors
        .iter()
        .flat_map(RequestDescriptor::entries)
        .map(|e| e.key().len() + e.value().len() + 16)
        .sum();
    let mut input = Vec::with_capacity(signed.len() + domain.len() + 8 + 8 * descriptors.len() + entries);
    let field = |input: &mut Vec<u8>, bytes: &[u8]| {
        input.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
        input.extend_from_slice(bytes);
    };
    input.extend_from_slice(signed);
    field(&mut input, domain.as_bytes());
    for descriptor in descriptors {
        input.extend_from_slice(&(descriptor.entries().len() as u64).to_le_bytes());
        for entry in descriptor.entries() {
            field(&mut input, entry.key().as_bytes());
            field(&mut input, entry.value().as_bytes());
        }
    }
    let mut out = [0u8; MAC_LEN];
    out.copy_from_slice(&blake3::keyed_hash(&key.secret, &input).as_bytes()[..MAC_LEN]);
    out
}

/// `tag` as a 32-byte array (zero-padded), to compare through [`blake3::Hash`]'s constant-time `==`.
fn pad(tag: &[u8]) -> [u8; 32] {
    let mut out = [0u8; 32];
    out[..tag.len().min(32)].copy_from_slice(&tag[..tag.len().min(32)]);
    out
}

/// Lowercase hex of `bytes` (token and lease ids).
pub(super) fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    bytes
        .iter()
        .flat_map(|b| [DIGITS[usize::from(b >> 4)], DIGITS[usize::from(b & 15)]])
        .map(char::from)
        .collect()
}

/// LEB128.
fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn take_varint(bytes: &mut &[u8]) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let (&byte, rest) = bytes.split_first()?;
        *bytes = rest;
        value |= u64::from(byte & 0x7f).checked_shl(shift)?;
        if byte & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::LimitOverride;

    struct D(Vec<(&'static str, &'static str)>);

    impl RequestDescriptor for D {
        type Entry = (&'static str, &'static str);
        fn entries(&self) -> &[Self::Entry] {
            &self.0
        }
        fn limit_override(&self) -> Option<LimitOverride> {
            None
        }
        fn hits_addend(&self) -> Option<u64> {
            None
        }
    }

    fn request() -> Vec<D> {
        vec![
            D(vec![("user", "ada")]),
            D(vec![("path", "/x"), ("ip", "10.0.0.1")]),
        ]
    }

    #[test]
    fn a_token_verifies_for_its_request_only_and_until_it_expires() {
        let keys = RefundKeys::new(b"fleet secret", &[]).expect("randomness");
        let token = keys.mint("api", &request(), &[3, u64::MAX], 1_000);
        let grant = keys.verify(&token, "api", &request(), 999).expect("valid");
        assert_eq!(grant.costs, [3, u64::MAX]);
        assert_eq!((grant.id.len(), grant.expires_at_us), (32, 1_000));
        assert_eq!(
            keys.verify(&token, "api", &request(), 1_000),
            Err(TokenError::Expired)
        );
        assert_eq!(
            keys.verify(&token, "other", &request(), 0),
            Err(TokenError::Mismatch)
        );
        let mut swapped = request();
        swapped[0] = D(vec![("user", "bob")]);
        assert_eq!(keys.verify(&token, "api", &swapped, 0), Err(TokenError::Mismatch));
        assert_eq!(
            keys.verify(&token, "api", &request()[..1], 0),
            Err(TokenError::Mismatch)
        );
        let again = keys.mint("api", &request(), &[3, 1], 1_000);
        let other = keys.verify(&again, "api", &request(), 0).expect("valid");
        assert_ne!(other.id, grant.id, "every token has its own id");
    }

    #[test]
    fn altered_foreign_and_garbage_tokens_are_refused() {
        let keys = RefundKeys::new(b"fleet secret", &[]).expect("randomness");
        let token = keys.mint("api", &request(), &[3, 4], u64::MAX);
        let mut bytes = URL_SAFE_NO_PAD.decode(&token).expect("base64");
        let cost_at = HEADER_LEN + 1;
        bytes[cost_at] = 100; // ask for more than was consumed
        let raised = URL_SAFE_NO_PAD.encode(&bytes);
        assert_eq!(
            keys.verify(&raised, "api", &request(), 0),
            Err(TokenError::Mismatch)
        );
        let stranger = RefundKeys::new(b"another fleet", &[]).expect("randomness");
        let foreign = stranger.mint("api", &request(), &[3, 4], u64::MAX);
        assert_eq!(
            keys.verify(&foreign, "api", &request(), 0),
            Err(TokenError::Malformed)
        );
        for garbage in [
            "!!",
            "AAAA",
            &"A".repeat(MAX_TOKEN_LEN + 1),
            &token[..token.len() - 2],
        ] {
            assert!(keys.verify(garbage, "api", &request(), 0).is_err(), "{garbage}");
        }
        assert_eq!(keys.verify("", "api", &request(), 0), Err(TokenError::Missing));
    }

    #[test]
    fn a_rotated_fleet_still_verifies_tokens_of_the_previous_key() {
        let old = RefundKeys::new(b"old", &[]).expect("randomness");
        let token = old.mint("api", &request(), &[1, 1], u64::MAX);
        let rotated = RefundKeys::new(b"new", &[b"old"]).expect("randomness");
        assert!(rotated.verify(&token, "api", &request(), 0).is_ok());
        let fresh = rotated.mint("api", &request(), &[1, 1], u64::MAX);
        assert_eq!(
            old.verify(&fresh, "api", &request(), 0),
            Err(TokenError::Malformed)
        );
    }

    #[test]
    fn varints_round_trip_and_refuse_overlong_input() {
        for value in [0, 1, 127, 128, 300, u64::from(u32::MAX), u64::MAX] {
            let mut out = Vec::new();
            put_varint(&mut out, value);
            let mut slice = out.as_slice();
            assert_eq!(take_varint(&mut slice), Some(value));
            assert!(slice.is_empty());
        }
        let mut overlong: &[u8] = &[0xff; 11];
        assert_eq!(take_varint(&mut overlong), None);
    }
}
