//! Non-exact descriptor values: `*` wildcards and CIDR ranges.
//!
//! envoyproxy/ratelimit matches a wildcard against the whole `key_value` string. Tollgate matches it
//! against the value alone, inside the group of nodes for that key: the answers are the same for every
//! key that does not itself contain `_`, and a key can no longer match another key's patterns.

use ipnet::IpNet;

use super::normalize::canonical_ip;

/// A compiled non-exact value.
#[derive(Debug, Clone)]
pub(crate) enum Pattern {
    /// A value containing `*`: each `*` matches zero or more characters.
    Wildcard(Wildcard),
    /// An IP network: matches any address inside it (or a normalised `network/len` inside it).
    Cidr(IpNet),
}

impl Pattern {
    /// Whether `value` (already normalised) matches; `network` is what normalisation read it as, if
    /// it read it as an address, so that a CIDR range does not read it again.
    pub(crate) fn matches(&self, value: &str, network: Option<&IpNet>) -> bool {
        match (self, network) {
            (Pattern::Wildcard(w), _) => w.matches(value),
            (Pattern::Cidr(net), Some(network)) => net.contains(network),
            (Pattern::Cidr(net), None) => cidr_contains(net, value),
        }
    }
}

/// A `*` pattern split into its literal segments.
#[derive(Debug, Clone)]
pub(crate) struct Wildcard {
    segments: Vec<String>,
}

impl Wildcard {
    /// Compiles a pattern; every `*` separates two literal segments (possibly empty).
    pub(crate) fn new(pattern: &str) -> Self {
        Self {
            segments: pattern.split('*').map(str::to_owned).collect(),
        }
    }

    /// Go's rule: the first segment is a prefix, the last a suffix, the middle ones appear in order
    /// without overlapping. So `foo*` matches `foo` itself.
    pub(crate) fn matches(&self, value: &str) -> bool {
        let (first, rest) = match self.segments.split_first() {
            Some(split) => split,
            None => return value.is_empty(),
        };
        let Some((last, middle)) = rest.split_last() else {
            // No `*` at all: an exact comparison (not reached for compiled wildcards).
            return value == first;
        };
        let Some(mut remaining) = value.strip_prefix(first.as_str()) else {
            return false;
        };
        for segment in middle {
            match remaining.find(segment.as_str()) {
                Some(at) => remaining = &remaining[at + segment.len()..],
                None => return false,
            }
        }
        remaining.len() >= last.len() && remaining.ends_with(last.as_str())
    }
}

fn cidr_contains(net: &IpNet, value: &str) -> bool {
    if let Some(ip) = canonical_ip(value) {
        return net.contains(&ip);
    }
    // A value already grouped by `ip_prefix` looks like `2001:db8::/64`.
    value.parse::<IpNet>().is_ok_and(|inner| net.contains(&inner))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wild(p: &str, v: &str) -> bool {
        Wildcard::new(p).matches(v)
    }

    #[test]
    fn trailing_star_matches_prefix_and_itself() {
        assert!(wild("foo*", "foo"));
        assert!(wild("foo*", "foobar"));
        assert!(!wild("foo*", "fo"));
        assert!(!wild("foo*", "xfoo"));
    }

    #[test]
    fn stars_anywhere_match_in_order() {
        assert!(wild("*bar", "foobar"));
        assert!(wild("a*b*c", "a-b-c"));
        assert!(wild("a*b*c", "abc"));
        assert!(!wild("a*b*c", "acb"));
        assert!(wild("*", ""));
        assert!(wild("/api/*/users/*", "/api/v1/users/42"));
        assert!(!wild("/api/*/users/*", "/api/v1/groups/42"));
    }

    #[test]
    fn prefix_and_suffix_do_not_overlap() {
        // "aba" must not match "ab*ba": the prefix and suffix would share the middle "b".
        assert!(!wild("ab*ba", "aba"));
        assert!(wild("ab*ba", "abba"));
    }

    /// A range tests the network normalisation read a value as, which must answer as reading the
    /// value's text would: for every prefix, spelling, family and range, inside, outside and not an
    /// address at all.
    #[test]
    fn the_network_normalisation_read_answers_as_the_text_does() {
        use crate::rules::file::{IpPrefix, Normalize};
        use crate::rules::normalize::Normalizer;
        let ranges = [
            "10.0.0.0/8",
            "192.0.2.0/24",
            "192.0.2.7/32",
            "2001:db8::/32",
            "2001:db8:1:2::/64",
            "::/0",
        ];
        let values = [
            "10.1.2.3",
            "11.1.2.3",
            "192.0.2.7",
            "192.0.2.8",
            "::ffff:10.1.2.3",
            "::FFFF:c000:0207",
            "2001:db8:1:2:aaaa::1",
            "2001:db9::1",
            " 10.1.2.3 ",
            "010.1.2.3",
            "not-an-ip",
            "2001:db8:1:2::/64",
        ];
        for prefix in [
            None,
            Some((32, 128)),
            Some((32, 64)),
            Some((24, 48)),
            Some((8, 0)),
        ] {
            for trim in [false, true] {
                let normalizer = Normalizer::new(&Normalize {
                    lowercase: false,
                    trim,
                    ip_prefix: prefix.map(|(v4, v6)| IpPrefix { v4, v6 }),
                    hash: false,
                });
                for value in values {
                    let normalized = normalizer.read(value);
                    for range in ranges {
                        let cidr = Pattern::Cidr(range.parse().expect("a range"));
                        assert_eq!(
                            cidr.matches(&normalized.text, normalized.network.as_ref()),
                            cidr.matches(&normalized.text, None),
                            "{value} in {range}, ip_prefix {prefix:?}, trim {trim}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn cidr_matches_addresses_and_grouped_networks() {
        let net: IpNet = "10.0.0.0/8".parse().expect("valid");
        assert!(cidr_contains(&net, "10.1.2.3"));
        assert!(!cidr_contains(&net, "11.1.2.3"));
        assert!(!cidr_contains(&net, "not-an-ip"));
        assert!(cidr_contains(&net, "::ffff:10.1.2.3"), "an IPv4-mapped client");
        let v6: IpNet = "2001:db8::/32".parse().expect("valid");
        assert!(cidr_contains(&v6, "2001:db8:1:2::/64"));
        assert!(!cidr_contains(&v6, "2001:db9::1"));
    }
}
