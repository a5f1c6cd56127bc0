//! Descriptor → rule, with envoyproxy/ratelimit's semantics ("most specific wins, same depth only"):
//! at each level try the exact value, then the patterns in declaration order (first match wins), then
//! the key's default node; a rule applies only when the request ends exactly at its node. There is no
//! backtracking: once a level picked a node, a deeper miss means no limit.
//!
//! The walk also writes the storage key (envoyproxy/ratelimit's format minus the window suffix) into a
//! caller-provided buffer, so matching a descriptor costs one allocation at most. Request values enter
//! it as they are ([`ValueEncoding::Go`]) or escaped ([`ValueEncoding::Escaped`]): in Go's format `_`
//! both separates and may occur inside a value, so a value `/login_remote_address_192.0.2.9` of a
//! `path` rule spells the key of `path=/login` with `remote_address=192.0.2.9` below it. Keys shared
//! with a Go fleet keep that format; Tollgate's own keys escape, so no value can spell another
//! descriptor's key. (Domains and entry keys come from the rules, and are written as they are.)
//!
//! A hashed value (`hash: true`, or a value over [`MAX_RAW_VALUE_IN_KEY`]) is marked
//! ([`super::normalize::HASH_MARK`]), so that no value written as it is can equal it: escaping leaves no
//! mark in a value, and in Go's encoding a value that reads as a marked hash is hashed itself.

use std::sync::Arc;

use super::normalize::{MARKED_HASH_LEN, MAX_RAW_VALUE_IN_KEY, Normalizer, ValueHasher, reads_as_hash};
use super::pattern::Pattern;
use super::small_map::SmallMap;
use super::{Domain, Rule};

/// How request values enter a storage key (see the module's comment).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueEncoding {
    /// As they are, as envoyproxy/ratelimit keys them, for the counters a Go fleet shares.
    Go,
    /// `%` as `%25` and `_` as `%5F`: no value holds a separator.
    Escaped,
}

/// How a walk writes values: in which encoding, and whether it scans them for `_` and `%` (it need
/// not in Go's encoding where no rule of the domain has keys of Tollgate's own).
#[derive(Debug, Clone, Copy)]
struct Writing {
    encoding: ValueEncoding,
    scan: bool,
}

impl Writing {
    /// As envoyproxy/ratelimit writes keys, unscanned.
    const AS_GO: Writing = Writing {
        encoding: ValueEncoding::Go,
        scan: false,
    };
}

/// A rule found for a descriptor.
#[derive(Debug)]
pub struct Found<'r> {
    /// The rule.
    pub rule: &'r Arc<Rule>,
    /// Whether some value written into the key holds `_` or `%`, so that the encodings differ (only
    /// looked for where the domain has keys of Tollgate's own: false otherwise).
    pub encodings_differ: bool,
}

/// One key/value pair of a request descriptor, whatever type carries it (proto message, tuple...).
pub trait DescriptorEntry {
    /// The entry's key.
    fn key(&self) -> &str;
    /// The entry's value (may be empty).
    fn value(&self) -> &str;
}

impl<K: AsRef<str>, V: AsRef<str>> DescriptorEntry for (K, V) {
    fn key(&self) -> &str {
        self.0.as_ref()
    }
    fn value(&self) -> &str {
        self.1.as_ref()
    }
}

/// The children of one node, grouped by entry key.
#[derive(Debug, Default)]
pub(crate) struct Level {
    pub(crate) keys: SmallMap<KeyGroup>,
}

/// Every node of one key at one level.
#[derive(Debug, Default)]
pub(crate) struct KeyGroup {
    pub(crate) normalizer: Normalizer,
    /// `hash: true` on any node of this key: values enter storage keys hashed.
    pub(crate) hash: bool,
    pub(crate) exact: SmallMap<Node>,
    /// Wildcard and CIDR nodes in declaration order.
    pub(crate) patterns: Vec<PatternNode>,
    pub(crate) default: Option<Node>,
}

/// A node whose value is a wildcard or a network.
#[derive(Debug)]
pub(crate) struct PatternNode {
    pub(crate) pattern: Pattern,
    /// With `share_threshold`, every matching value shares one counter keyed by this pattern text.
    /// (Held here, not in [`Node`]: only patterns share, and every exact node is 16 bytes smaller.)
    pub(crate) shared_key_value: Option<Box<str>>,
    pub(crate) node: Node,
}

/// One descriptor node.
#[derive(Debug, Default)]
pub(crate) struct Node {
    pub(crate) rule: Option<Arc<Rule>>,
    pub(crate) children: Option<Box<Level>>,
}

impl Domain {
    /// Finds the rule for a descriptor. `key` must hold the key prefix (`CACHE_KEY_PREFIX + domain +
    /// "_"`); on a match it is extended with `entry_key + "_" + value + "_"` for every entry, each value
    /// in `encoding`. On `None` its contents are unspecified.
    pub fn find<'r, E: DescriptorEntry>(
        &'r self,
        entries: &[E],
        hasher: &ValueHasher,
        key: &mut String,
        encoding: ValueEncoding,
    ) -> Option<Found<'r>> {
        let (last, init) = entries.split_last()?;
        let mut level = &self.root;
        // Whether values are scanned for `_` and `%` in Go's encoding: only where a rule of the domain
        // has keys of Tollgate's own, which the caller may have to walk again for.
        let writing = Writing {
            encoding,
            scan: encoding == ValueEncoding::Escaped || self.own_keyed,
        };
        let mut encodings_differ = false;
        for entry in init {
            level = level
                .select(entry, hasher, key, writing, &mut encodings_differ)?
                .children
                .as_deref()?;
        }
        let rule = level
            .select(last, hasher, key, writing, &mut encodings_differ)?
            .rule
            .as_ref()?;
        Some(Found {
            rule,
            encodings_differ,
        })
    }

    /// The name `detailed_metric` counts a matched descriptor under, as envoyproxy/ratelimit names it:
    /// the domain, then `key_value` per entry, joined by dots, each value as it enters the storage
    /// key (normalized, hashed where the rule hashes it or it is over-long, a `share_threshold`
    /// pattern's text), never escaped. `None` when the descriptor does not match.
    pub fn metric_path<E: DescriptorEntry>(&self, entries: &[E], hasher: &ValueHasher) -> Option<String> {
        let mut path = self.name().to_owned();
        let mut segment = String::new();
        let mut level = &self.root;
        let mut encodings_differ = false;
        for (at, entry) in entries.iter().enumerate() {
            segment.clear();
            let node = level.select(entry, hasher, &mut segment, Writing::AS_GO, &mut encodings_differ)?;
            path.push('.');
            // `select` wrote `key_value_`: the name has no trailing separator.
            path.push_str(&segment[..segment.len() - 1]);
            if at + 1 < entries.len() {
                level = node.children.as_deref()?;
            }
        }
        Some(path)
    }

    /// A descriptor as the debug line of a decision shows it: `key=value` per entry, joined by `, `. Where the
    /// descriptor matches, each value is written as it enters the storage key (normalized, hashed where
    /// the rule says `hash: true` or it is over-long, a `share_threshold` pattern's text), so a hashed
    /// value is never shown. Past the entry where matching stops, values are shown as sent, or hashed
    /// when any rule of the domain hashes (the log cannot tell which rule such a value was meant for).
    pub fn shown_descriptor<E: DescriptorEntry>(&self, entries: &[E], hasher: &ValueHasher) -> String {
        let mut shown = String::with_capacity(32 * entries.len());
        self.shown_values(entries, hasher, |at, key, value| {
            if at > 0 {
                shown.push_str(", ");
            }
            shown.push_str(key);
            shown.push('=');
            shown.push_str(value);
        });
        shown
    }

    /// A descriptor's entries as [`Domain::shown_descriptor`] shows them, each `(key, value)`: what the
    /// decision log records, so that a replay counts each caller apart without a hashed value ever
    /// being written in the clear.
    pub fn shown_entries<E: DescriptorEntry>(
        &self,
        entries: &[E],
        hasher: &ValueHasher,
    ) -> Vec<(String, String)> {
        let mut shown = Vec::with_capacity(entries.len());
        self.shown_values(entries, hasher, |_, key, value| {
            shown.push((key.to_owned(), value.to_owned()))
        });
        shown
    }

    /// Walks `entries` down the tree, calling `each(index, key, shown value)` for every entry.
    fn shown_values<E: DescriptorEntry>(
        &self,
        entries: &[E],
        hasher: &ValueHasher,
        mut each: impl FnMut(usize, &str, &str),
    ) {
        let mut segment = String::new();
        let mut hashed = String::new();
        let mut level = Some(&self.root);
        let mut encodings_differ = false;
        for (at, entry) in entries.iter().enumerate() {
            segment.clear();
            let node = level
                .and_then(|l| l.select(entry, hasher, &mut segment, Writing::AS_GO, &mut encodings_differ));
            match node {
                // `select` wrote `key_value_`.
                Some(node) => {
                    each(
                        at,
                        entry.key(),
                        &segment[entry.key().len() + 1..segment.len() - 1],
                    );
                    level = node.children.as_deref();
                }
                None if self.hashes => {
                    level = None;
                    hashed.clear();
                    // Marked, as a matched value hashed into its key is.
                    hasher.append_key_hash(&mut hashed, entry.value());
                    each(at, entry.key(), &hashed);
                }
                None => {
                    level = None;
                    each(at, entry.key(), entry.value());
                }
            }
        }
    }

    /// Appends the storage key of a descriptor that bypasses matching (a request limit override): its
    /// entry keys as they are and its values in `encoding`, as a rule's key writes them, except that
    /// over-long ones are hashed (nothing from the request makes a key component longer than
    /// [`MAX_RAW_VALUE_IN_KEY`]).
    pub fn raw_key<E: DescriptorEntry>(
        &self,
        entries: &[E],
        hasher: &ValueHasher,
        key: &mut String,
        encoding: ValueEncoding,
    ) {
        let writing = Writing {
            encoding,
            scan: encoding == ValueEncoding::Escaped,
        };
        for entry in entries {
            push_value(key, entry.key(), hasher, Writing::AS_GO);
            key.push('_');
            push_value(key, entry.value(), hasher, writing);
            key.push('_');
        }
    }
}

impl Level {
    /// Gives back the capacity that building this level left unused (its children did the same when
    /// they were built): a compiled rule set lives until the next reload.
    pub(crate) fn shrink_to_fit(&mut self) {
        self.keys.shrink_to_fit();
        for group in self.keys.values_mut() {
            group.exact.shrink_to_fit();
            group.patterns.shrink_to_fit();
        }
    }

    #[inline]
    fn select<E: DescriptorEntry>(
        &self,
        entry: &E,
        hasher: &ValueHasher,
        key: &mut String,
        writing: Writing,
        encodings_differ: &mut bool,
    ) -> Option<&Node> {
        let group = self.keys.get(entry.key())?;
        let normalized = group.normalizer.read(entry.value());
        let (value, network) = (normalized.text, normalized.network.as_ref());
        let (node, shared) = match group.exact.get(value.as_ref()) {
            Some(node) => (node, None),
            None => match group.patterns.iter().find(|p| p.pattern.matches(&value, network)) {
                Some(p) => (&p.node, p.shared_key_value.as_deref()),
                None => (group.default.as_ref()?, None),
            },
        };
        key.push_str(entry.key());
        key.push('_');
        match shared {
            Some(pattern) => key.push_str(pattern),
            None if group.hash => hasher.append_key_hash(key, &value),
            None => *encodings_differ |= push_value(key, &value, hasher, writing),
        }
        key.push('_');
        Some(node)
    }
}

/// Appends a request value to a storage key: hashed when longer than [`MAX_RAW_VALUE_IN_KEY`] (nothing
/// from a request makes a key component longer), else in `writing`'s encoding. Returns whether it holds
/// `_` or `%`, so that the encodings differ (looked for only when `writing` scans).
#[inline]
fn push_value(key: &mut String, value: &str, hasher: &ValueHasher, writing: Writing) -> bool {
    if value.len() > MAX_RAW_VALUE_IN_KEY {
        push_hashed(key, value, hasher);
        return false;
    }
    if !writing.scan {
        push_as_go(key, value, hasher);
        return false;
    }
    if memchr::memchr2(b'_', b'%', value.as_bytes()).is_none() {
        key.push_str(value);
        return false;
    }
    match writing.encoding {
        ValueEncoding::Go => push_as_go(key, value, hasher),
        ValueEncoding::Escaped => {
            for c in value.chars() {
                match c {
                    '%' => key.push_str("%25"),
                    '_' => key.push_str("%5F"),
                    c => key.push(c),
                }
            }
        }
    }
    true
}

/// Appends a value in Go's encoding: as it is, unless it reads as a hashed value, which it would then
/// spell; such a value is hashed itself (a value no client of envoyproxy/ratelimit sends by chance).
/// Inline, only the length is compared: the rest of the check is out of line.
#[inline]
fn push_as_go(key: &mut String, value: &str, hasher: &ValueHasher) {
    if value.len() != MARKED_HASH_LEN || !push_if_hash_shaped(key, value, hasher) {
        key.push_str(value);
    }
}

/// Appends `value` hashed if it reads as a hashed value; returns whether it did.
#[cold]
#[inline(never)]
fn push_if_hash_shaped(key: &mut String, value: &str, hasher: &ValueHasher) -> bool {
    let shaped = reads_as_hash(value);
    if shaped {
        hasher.append_key_hash(key, value);
    }
    shaped
}

/// Appends a value hashed: out of line, so that the common value, written as it is, pays nothing for
/// the hashing it does not do.
#[cold]
#[inline(never)]
fn push_hashed(key: &mut String, value: &str, hasher: &ValueHasher) {
    hasher.append_key_hash(key, value);
}
