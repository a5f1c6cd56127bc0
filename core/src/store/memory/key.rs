//! A storage key as an entry of the embedded store holds it: in the entry itself when it is short,
//! which most keys are (a domain, a key and a value or an address), else on the heap.
//!
//! A lookup compares the key it found with the one it looks for. Held on the heap, every key was a
//! second cache miss after the entry's own, and the largest single cost of a replay over many
//! clients; held inline it sits in the lines the entry's state is read from anyway.

/// Longest key held inline: a domain, a key and a grouped IPv6 network (`api_remote_address_` and
/// `2001:db8:1234:5678::/64`, 42 bytes) fit, and the key stays 48 bytes, as small as a `String`
/// and its allocation together.
const INLINE: usize = 46;

/// The key's bytes, inline or boxed.
#[derive(Debug)]
pub(super) enum StoredKey {
    /// `len` bytes at the front of `bytes`.
    Inline { len: u8, bytes: [u8; INLINE] },
    /// A longer key.
    Boxed(Box<[u8]>),
}

impl StoredKey {
    /// Holds `key`.
    pub(super) fn new(key: &str) -> Self {
        let key = key.as_bytes();
        match u8::try_from(key.len()) {
            Ok(len) if key.len() <= INLINE => {
                let mut bytes = [0; INLINE];
                bytes[..key.len()].copy_from_slice(key);
                StoredKey::Inline { len, bytes }
            }
            _ => StoredKey::Boxed(key.into()),
        }
    }

    /// The key's bytes, as [`StoredKey::new`] was given them.
    pub(super) fn as_bytes(&self) -> &[u8] {
        match self {
            StoredKey::Inline { len, bytes } => &bytes[..usize::from(*len)],
            StoredKey::Boxed(bytes) => bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_reads_back_as_given_inline_or_boxed() {
        for len in [0, 1, 32, INLINE - 1, INLINE, INLINE + 1, 300] {
            let key: String = "abcdefghij".chars().cycle().take(len).collect();
            let stored = StoredKey::new(&key);
            assert_eq!(stored.as_bytes(), key.as_bytes(), "{len}");
            assert_eq!(matches!(stored, StoredKey::Inline { .. }), len <= INLINE, "{len}");
        }
        assert_eq!(
            size_of::<StoredKey>(),
            48,
            "no larger than a String and its allocation"
        );
    }
}
