//! Value normalisation before matching and keying, and hashing of values before they enter a key.
//!
//! Normalisation is declared on descriptor nodes (`lowercase`, `trim`, `ip_prefix`) and applies to every
//! node with the same key under the same parent, so that `User@Example.com ` and `user@example.com`
//! hit the same rule and the same counter, and every address of one IPv6 /64 (which a single customer
//! usually holds) shares one counter.
//!
//! Hashing (`hash: true`) happens only when the storage key is built: matching still sees the real value,
//! but raw emails, phone numbers and API keys never reach Redis. The hash is keyed (BLAKE3 keyed mode with
//! a secret from the settings) because an unkeyed hash of a phone number is reversed by enumerating the
//! number space.

use std::borrow::Cow;
use std::net::{IpAddr, Ipv6Addr};

use ipnet::IpNet;

use crate::rules::file::{IpPrefix, Normalize};
use crate::rules::ip_text::{ip_string, net_string, read_v4};

/// Values longer than this are hashed in storage keys even without `hash: true`, so a hostile client
/// cannot make Tollgate write megabyte-long Redis keys. Real descriptor values (IPs, user ids, paths)
/// are far shorter, so keys stay readable and compatible with envoyproxy/ratelimit's.
pub const MAX_RAW_VALUE_IN_KEY: usize = 256;

/// How many bytes of the BLAKE3 output go into a key: 128 bits make collisions between distinct values
/// practically impossible while keeping keys short (32 hex characters).
const HASH_BYTES: usize = 16;

/// What a hashed value starts with in a storage key, before its 32 hex digits. A value written as it is
/// must never equal a hash: the hash of a long value is anyone's to compute (with no `TOLLGATE_HASH_KEY`)
/// or to read from a key name, and a short value spelling it would share the long value's counter. An
/// escaped value holds `%` only as `%25` or `%5F`, so it never holds this mark; in Go's encoding, where
/// values are written as they are, a value that reads as a hash is hashed itself
/// (`reads_as_hash`).
pub const HASH_MARK: &str = "%h";

/// The length of a hashed value in a storage key: the mark and the hex digits.
pub(crate) const MARKED_HASH_LEN: usize = HASH_MARK.len() + 2 * HASH_BYTES;

/// Whether `value` has the shape of a hashed value in a storage key ([`HASH_MARK`] then 32 lowercase
/// hex digits): written as it is, it could equal one.
#[inline]
pub(crate) fn reads_as_hash(value: &str) -> bool {
    value.len() == MARKED_HASH_LEN
        && value.starts_with(HASH_MARK)
        && value.as_bytes()[HASH_MARK.len()..]
            .iter()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// The compiled normalisation of one key at one level of a domain.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Normalizer {
    lowercase: bool,
    trim: bool,
    ip_prefix: Option<IpPrefix>,
}

impl Normalizer {
    /// Compiles a node's declaration.
    pub(crate) fn new(n: &Normalize) -> Self {
        Self {
            lowercase: n.lowercase,
            trim: n.trim,
            ip_prefix: n.ip_prefix,
        }
    }

    /// Whether this normaliser changes anything (most keys have none; they skip all work).
    pub(crate) fn is_identity(&self) -> bool {
        *self == Self::default()
    }

    /// Normalises one value; borrows when nothing changes, which is the common case.
    pub(crate) fn apply<'a>(&self, value: &'a str) -> Cow<'a, str> {
        self.read(value).text
    }

    /// Normalises one value, keeping the network `ip_prefix` read it as, if it did.
    pub(crate) fn read<'a>(&self, value: &'a str) -> Normalized<'a> {
        let mut text = Cow::Borrowed(if self.trim { value.trim() } else { value });
        if self.lowercase && text.chars().any(char::is_uppercase) {
            text = Cow::Owned(text.to_lowercase());
        }
        let Some((network, grouped)) = self.ip_prefix.as_ref().and_then(|prefix| group_ip(&text, prefix))
        else {
            return Normalized { text, network: None };
        };
        if let Some(grouped) = grouped {
            text = Cow::Owned(grouped);
        }
        Normalized {
            text,
            network: Some(network),
        }
    }
}

/// A normalised value, and the network it stands for when `ip_prefix` read it as an address (a plain
/// address is its own full-length network): a CIDR pattern tests that rather than read the text again.
#[derive(Debug)]
pub(crate) struct Normalized<'a> {
    /// The value as matched and keyed.
    pub(crate) text: Cow<'a, str>,
    /// What `text` reads as, when `ip_prefix` read it.
    pub(crate) network: Option<IpNet>,
}

/// Masks an address to its configured prefix: the network, and its text when that differs from
/// `value`. A full-length prefix keeps the plain canonical address, so `ip_prefix: {v4: 32}` only
/// canonicalises; anything shorter gives `network/len`. Values that are not addresses are left alone
/// (a descriptor may legitimately carry a hostname).
fn group_ip(value: &str, prefix: &IpPrefix) -> Option<(IpNet, Option<String>)> {
    let ip = match read_v4(value) {
        // The usual case, an IPv4 client kept whole, is already canonical as written: `read_v4` takes,
        // as std does, only four decimal octets without leading zeros, the very text std prints.
        Some(v4) if prefix.v4 == 32 => return Some((IpNet::from(IpAddr::V4(v4)), None)),
        Some(v4) => IpAddr::V4(v4),
        None => canonical_v6(value)?,
    };
    let len = match ip {
        IpAddr::V4(_) => prefix.v4,
        IpAddr::V6(_) => prefix.v6,
    };
    let net = IpNet::new(ip, len).ok()?.trunc();
    let text = if net.prefix_len() == net.max_prefix_len() {
        ip_string(net.addr())
    } else {
        net_string(net)
    };
    Some((net, Some(text)))
}

/// `value` as an address, an IPv4-mapped IPv6 address (`::ffff:203.0.113.9`, what a dual-stack front end
/// reports for an IPv4 client) as the IPv4 address it stands for: one client, one address, however it
/// was written. Without this every IPv4 client of such a front end would fall in `::/64` and share one
/// budget, and a CIDR rule for `203.0.113.0/24` would miss them.
pub(crate) fn canonical_ip(value: &str) -> Option<IpAddr> {
    match read_v4(value) {
        Some(v4) => Some(IpAddr::V4(v4)),
        None => canonical_v6(value),
    }
}

/// [`canonical_ip`] of a value that is not a dotted quad.
fn canonical_v6(value: &str) -> Option<IpAddr> {
    let v6 = value.parse::<Ipv6Addr>().ok()?;
    Some(v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4))
}

/// Hashes descriptor values for storage keys with a deployment-wide secret.
#[derive(Clone)]
pub struct ValueHasher {
    key: [u8; 32],
}

impl std::fmt::Debug for ValueHasher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The key is a secret: never print it.
        f.write_str("ValueHasher { key: <redacted> }")
    }
}

impl ValueHasher {
    /// Derives the hashing key from a secret. Every replica sharing a store must use the same secret,
    /// or they will count the same caller under different keys.
    pub fn new(secret: &str) -> Self {
        Self {
            key: blake3::derive_key("tollgate 2026-11 descriptor value hashing", secret.as_bytes()),
        }
    }

    /// Appends the hex digest of `value` to `out` (32 hex digits), as `/top` and the denial log show
    /// callers.
    pub fn append_hash(&self, out: &mut String, value: &str) {
        let digest = blake3::keyed_hash(&self.key, value.as_bytes());
        out.push_str(&digest.to_hex()[..2 * HASH_BYTES]);
    }

    /// Appends `value` hashed as a storage key holds it: [`HASH_MARK`], then the hex digest.
    pub fn append_key_hash(&self, out: &mut String, value: &str) {
        out.push_str(HASH_MARK);
        self.append_hash(out, value);
    }
}

impl Default for ValueHasher {
    fn default() -> Self {
        Self::new("")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn normalizer(lowercase: bool, trim: bool, ip_prefix: Option<(u8, u8)>) -> Normalizer {
        Normalizer {
            lowercase,
            trim,
            ip_prefix: ip_prefix.map(|(v4, v6)| IpPrefix { v4, v6 }),
        }
    }

    #[test]
    fn identity_borrows() {
        let n = Normalizer::default();
        assert!(n.is_identity());
        assert!(matches!(n.apply("Value"), Cow::Borrowed("Value")));
    }

    #[test]
    fn lowercase_and_trim() {
        let n = normalizer(true, true, None);
        assert_eq!(n.apply("  User@Example.COM \t"), "user@example.com");
        assert!(matches!(n.apply(" already "), Cow::Borrowed("already")));
    }

    #[test]
    fn ipv6_is_grouped_by_64_and_ipv4_kept_whole() {
        let n = normalizer(false, false, Some((32, 64)));
        assert_eq!(n.apply("2001:db8:1:2:aaaa::1"), "2001:db8:1:2::/64");
        assert_eq!(n.apply("2001:db8:1:2:bbbb::9"), "2001:db8:1:2::/64");
        assert_eq!(n.apply("192.0.2.7"), "192.0.2.7");
        assert_eq!(n.apply("not-an-ip"), "not-an-ip");
        let v4 = normalizer(false, false, Some((24, 128)));
        assert_eq!(v4.apply("192.0.2.7"), "192.0.2.0/24");
    }

    #[test]
    fn an_ipv4_address_kept_whole_is_borrowed_and_only_canonical_text_is_one() {
        let n = normalizer(false, false, Some((32, 64)));
        for written in ["192.0.2.7", "0.0.0.0", "255.255.255.255", "10.0.0.1"] {
            let applied = n.apply(written);
            assert!(matches!(applied, Cow::Borrowed(_)), "{written}");
            let ip: IpAddr = written.parse().expect("an address");
            assert_eq!(applied, ip.to_string(), "as written is as printed");
        }
        for not_canonical in [
            "010.0.0.1",
            "1.2.3",
            "1.2.3.4.5",
            "0x7f.0.0.1",
            "256.0.0.1",
            " 1.2.3.4",
        ] {
            assert_eq!(
                n.apply(not_canonical),
                not_canonical,
                "not an address: left alone"
            );
            assert!(not_canonical.parse::<IpAddr>().is_err(), "{not_canonical}");
        }
    }

    #[test]
    fn an_ipv4_mapped_address_is_its_ipv4_client() {
        let n = normalizer(false, false, Some((32, 64)));
        assert_eq!(n.apply("::ffff:203.0.113.9"), "203.0.113.9");
        assert_eq!(n.apply("::FFFF:cb00:7109"), "203.0.113.9", "any spelling");
        assert_ne!(
            n.apply("::ffff:203.0.113.9"),
            n.apply("::ffff:203.0.113.10"),
            "two IPv4 clients, two budgets (not one ::/64)"
        );
        let v4 = normalizer(false, false, Some((24, 64)));
        assert_eq!(v4.apply("::ffff:203.0.113.9"), "203.0.113.0/24");
    }

    #[test]
    fn hashing_is_keyed_and_stable() {
        let a = ValueHasher::new("secret-a");
        let b = ValueHasher::new("secret-b");
        let (mut x, mut y, mut z) = (String::new(), String::new(), String::new());
        a.append_hash(&mut x, "alice@example.com");
        a.append_hash(&mut y, "alice@example.com");
        b.append_hash(&mut z, "alice@example.com");
        assert_eq!(x, y);
        assert_ne!(x, z);
        assert_eq!(x.len(), 2 * HASH_BYTES);
        assert!(!x.contains("alice"));
        assert!(format!("{a:?}").contains("redacted"));
    }

    #[test]
    fn a_key_hash_is_marked_and_reads_as_one() {
        let hasher = ValueHasher::default();
        let (mut plain, mut marked) = (String::new(), String::new());
        hasher.append_hash(&mut plain, "a long value");
        hasher.append_key_hash(&mut marked, "a long value");
        assert_eq!(marked, format!("{HASH_MARK}{plain}"));
        assert!(reads_as_hash(&marked));
        assert!(!reads_as_hash(&plain), "the bare digest is not a key's hash");
        assert!(!reads_as_hash(&marked[..marked.len() - 1]));
        assert!(!reads_as_hash(&format!("{marked}0")));
        assert!(
            !reads_as_hash(&format!("{HASH_MARK}{}", "A".repeat(32))),
            "lowercase digits only"
        );
        assert!(!reads_as_hash(&format!("{HASH_MARK}{}", "g".repeat(32))));
        assert!(reads_as_hash(&format!("{HASH_MARK}{}", "0a".repeat(16))));
    }
}
