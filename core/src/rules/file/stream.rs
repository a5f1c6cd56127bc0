//! The fast path of reading a rules file: each top-level descriptor is checked, decoded and validated
//! as soon as the parser has read it, and its YAML subtree dropped, so a load never holds the node
//! tree of the whole file (several times the file's size: most of a large load's peak memory, and the
//! time the kernel took to hand it fresh pages).
//!
//! Go checks the whole file's keys before it decodes anything, and decodes everything before it
//! validates, so which error a file with several reports depends on seeing the whole file. The fast
//! path therefore only ever succeeds: at the first problem of any kind it gives up, and the caller
//! reads the file again the slow way ([`super::parse_text`]'s tree), which finds the error Go would
//! report. It also gives up on what it does not need to handle fast: a repeated top-level key (the
//! last one wins, so the earlier one must not have been built) and a `domain` after the descriptors.

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use std::fmt;

use super::decode;
use super::model::{DescriptorConfig, DomainConfig};
use super::validate::{self, Siblings};
use super::yaml::{self, Node, Value};

/// `file`'s text as a validated config, or `None` if the fast path gave up (see the module docs).
pub(super) fn parse(file: &str, text: &str) -> Option<DomainConfig> {
    Some(read(text)?.into_config(file))
}

/// What the fast path read of a file: its root's fields and its top-level descriptors, built.
pub(super) struct Read {
    /// The root's `all_or_nothing`.
    all_or_nothing: bool,
    /// The root's `proxy` block.
    proxy: Option<crate::rules::proxy::ProxyRules>,
    /// The 1-based line of the root's `descriptors` key, if it has one.
    pub(super) descriptors_line: Option<u32>,
    /// The top-level descriptors built, under the domain as the slow path decodes it.
    pub(super) top: Top,
}

impl Read {
    /// The domain the top-level descriptors are built under.
    pub(super) fn domain(&self) -> &str {
        &self.top.domain
    }

    /// The validated config, named `file`.
    pub(super) fn into_config(self, file: &str) -> DomainConfig {
        let Top {
            domain,
            mut descriptors,
            ..
        } = self.top;
        descriptors.shrink_to_fit();
        DomainConfig {
            domain,
            file: file.to_owned(),
            all_or_nothing: self.all_or_nothing,
            descriptors,
            proxy: self.proxy,
        }
    }
}

/// Reads a file's text the fast way, or `None` if the fast path gave up.
pub(super) fn read(text: &str) -> Option<Read> {
    let root = yaml::deserialize_document(text, |doc| Root {
        doc,
        entries: Vec::new(),
        top: None,
        descriptors_line: None,
    })?;
    yaml::validate_map(&root.entries).ok()?;
    let root_node = Node::map(root.entries);
    let domain = decode::string_field(&root_node, "domain").ok()?;
    let all_or_nothing = decode::bool_field(&root_node, "all_or_nothing").ok()?;
    let proxy = super::proxy::decode(root_node.get("proxy")).ok()?;
    if domain.is_empty() {
        return None;
    }
    // The top level was built under the domain read before it: the domain must not change after.
    let top = match root.top {
        Some(top) if top.domain != domain => return None,
        Some(top) => top,
        None => Top::new(domain),
    };
    Some(Read {
        all_or_nothing,
        proxy,
        descriptors_line: root.descriptors_line,
        top,
    })
}

/// Reads `run`, a run of a file's top-level descriptors cut out of it (see [`super::pieces`]), building
/// each under `domain`; `None` if the fast path gave up.
pub(super) fn read_run(run: &str, domain: &str) -> Option<Top> {
    yaml::deserialize_run(run, |doc| Run {
        doc,
        top: Top::new(domain.to_owned()),
    })
}

/// Top-level descriptors built, with the checks among them.
pub(super) struct Top {
    /// The domain they are built under.
    domain: String,
    /// The checks among them (no two alike, normalisations agree).
    siblings: Siblings,
    /// Those built so far, in file order.
    descriptors: Vec<DescriptorConfig>,
}

impl Top {
    fn new(domain: String) -> Self {
        Top {
            domain,
            siblings: Siblings::default(),
            descriptors: Vec::new(),
        }
    }

    /// Whether none were built.
    pub(super) fn is_empty(&self) -> bool {
        self.descriptors.is_empty()
    }

    /// Checks, decodes and validates one top-level descriptor; `doc` is the text its spans point into.
    fn build(&mut self, doc: &str, mut item: Node) -> Option<()> {
        let Value::Map(entries) = &item.value else {
            return None;
        };
        yaml::validate_map(entries).ok()?;
        item.fill_raw(doc);
        let raw = decode::decode_descriptor(&item).ok()?;
        drop(item);
        let built = validate::build_descriptor(&raw, &self.domain, &mut self.siblings).ok()?;
        self.descriptors.push(built);
        Some(())
    }

    /// Appends `next`, the descriptors that follow these in the file, built apart; `None` if one of
    /// them clashes with one of these (which building it here would have refused).
    pub(super) fn append(&mut self, next: Top) -> Option<()> {
        if next.domain != self.domain || !self.siblings.merge(next.siblings) {
            return None;
        }
        self.descriptors.extend(next.descriptors);
        Some(())
    }
}

/// The document's root mapping as it is read.
struct Root<'t> {
    /// The document's text (spans are relative to it).
    doc: &'t str,
    /// The root's entries but `descriptors`.
    entries: Vec<(Node, Node)>,
    /// The top-level descriptors, built from the first one on under the domain read before it.
    top: Option<Top>,
    /// The line of the `descriptors` key, once read.
    descriptors_line: Option<u32>,
}

/// Why the fast path gave up; never shown (the slow path words the error).
fn give_up<E: de::Error>() -> E {
    E::custom("the fast path gave up")
}

impl Root<'_> {
    /// Checks, decodes and validates one top-level descriptor.
    fn build(&mut self, item: Node) -> Option<()> {
        if self.top.is_none() {
            let domain = self.domain()?;
            self.top = Some(Top::new(domain));
        }
        self.top.as_mut()?.build(self.doc, item)
    }

    /// The domain read so far, decoded as the slow path decodes it; `None` if there is none yet.
    fn domain(&self) -> Option<String> {
        yaml::lookup(&self.entries, "domain")?
            .scalar_text()
            .filter(|d| !d.is_empty())
    }
}

impl<'de> DeserializeSeed<'de> for Root<'_> {
    type Value = Self;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Root<'_> {
    type Value = Self;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a rules file's root mapping")
    }

    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<Self, A::Error> {
        while let Some(mut key) = map.next_key::<Node>()? {
            if key.is_key("descriptors") {
                if self.descriptors_line.replace(key.line).is_some() {
                    return Err(give_up());
                }
                map.next_value_seed(Descriptors(&mut self))?;
                continue;
            }
            let repeated = self
                .entries
                .iter()
                .any(|(k, _)| yaml::same_scalar(&k.value, &key.value));
            let late_domain = self.top.is_some() && key.is_key("domain");
            if repeated || late_domain {
                return Err(give_up());
            }
            let mut value = map.next_value::<Node>()?;
            key.fill_raw(self.doc);
            value.fill_raw(self.doc);
            self.entries.push((key, value));
        }
        Ok(self)
    }
}

/// The root's `descriptors`: each item built as it is read.
struct Descriptors<'r, 't>(&'r mut Root<'t>);

impl<'de> DeserializeSeed<'de> for Descriptors<'_, '_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Descriptors<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of descriptors")
    }

    /// `descriptors:` with nothing: no descriptors, as in the slow path.
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while let Some(item) = seq.next_element::<Node>()? {
            self.0.build(item).ok_or_else(give_up)?;
        }
        Ok(())
    }
}

/// A run of top-level descriptors parsed alone: its list is the document's root.
struct Run<'t> {
    /// The run's text (spans are relative to it).
    doc: &'t str,
    /// What is built of it.
    top: Top,
}

impl<'de> DeserializeSeed<'de> for Run<'_> {
    type Value = Top;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Top, D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for Run<'_> {
    type Value = Top;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a run of top-level descriptors")
    }

    fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<Top, A::Error> {
        while let Some(item) = seq.next_element::<Node>()? {
            self.top.build(self.doc, item).ok_or_else(give_up)?;
        }
        Ok(self.top)
    }
}

#[cfg(test)]
mod tests {
    use super::super::parse_text_in_go_order;
    use super::parse;

    /// Files the fast path must read, each exactly as the whole-file path does.
    const VALID: &[&str] = &[
        "domain: d\ndescriptors:\n  - key: k\n    value: v\n    descriptors:\n      - key: u\n        \
         rate_limit: {unit: minute, requests_per_unit: 100}\n",
        // yaml.v2 spellings: a non-string scalar in a string field keeps its spelling.
        "domain: 010\ndescriptors:\n  - key: yes\n    value: 0x1F\n    rate_limit:\n      unit: SECOND\n      \
         requests_per_unit: 010\n  - {key: n, value: ~, shadow_mode: on}\n",
        // Every extension, metadata, and a key known only elsewhere (ignored, as Go does).
        "domain: ext\nall_or_nothing: true\ndescriptors:\n  - key: path\n    value: /api/*\n    lowercase: true\n    \
         trim: true\n    share_threshold: true\n    detailed_metric: true\n    metadata: {team: a, n: 1.5, l: [1, x]}\n    \
         rate_limits:\n      - {unit: minute, requests_per_unit: 100, algorithm: gcra, burst: 20, failure_mode: closed}\n      \
         - {unit: day, requests_per_unit: 10000, unit_multiplier: 2, name: daily}\n  - key: ip\n    value: 10.0.0.0/8\n    \
         match: cidr\n    hash: true\n    ip_prefix: {v4: 24, v6: 64}\n    concurrency: {max_in_flight: 5, lease_ttl: 30s}\n  \
         - key: user\n    name: ignored\n    rate_limit: {unlimited: true}\n    replaces: ignored\n",
        // Anchors and aliases, also across top-level descriptors.
        "domain: a\ndescriptors:\n  - key: k1\n    rate_limit: &r {unit: hour, requests_per_unit: 5}\n  - key: k2\n    \
         rate_limit: *r\n",
        // Empty `descriptors` may come before the domain: no descriptor needed it.
        "descriptors:\ndomain: d\n",
        "domain: d\n",
        "domain: d\ndescriptors: []\nmetadata: {x: 1}\n",
        "---\ndomain: d\ndescriptors:\n  - key: k\n...\n---\nignored: [\n",
    ];

    /// Files the fast path gives up on although they are valid: the whole-file path reads them.
    const SLOW_BUT_VALID: &[&str] = &[
        // The domain after the descriptors.
        "descriptors:\n  - key: k\ndomain: d\n",
        // A repeated key: the last one wins.
        "domain: d\ndescriptors:\n  - key: a\ndescriptors:\n  - key: b\n",
        "domain: x\ndomain: d\ndescriptors:\n  - key: k\n",
    ];

    /// Files with an error: the fast path must give up on each, whatever the error.
    const INVALID: &[&str] = &[
        "",
        "[1, 2]\n",
        "domain: ''\ndescriptors:\n  - key: k\n",
        "domain: d\ndescriptors:\n  - key: k\n    ratelimit: {}\n",
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
        "domain: d\ndescriptors:\n  - key: k\n  - key: k\n",
        "domain: d\ndescriptors:\n  - a\n",
        "domain: d\ndescriptors: 5\n",
        "domain: [d]\ndescriptors:\n  - key: k\n",
        "domain: d\nrate_limit: 1.5\ndescriptors:\n  - key: k\n",
        // Go reports the unknown key of the second descriptor, not the first one's type error.
        "domain: d\ndescriptors:\n  - key: k\n    shadow_mode: maybe\n  - key: j\n    bogus: 1\n",
        "domain: d\ndescriptors:\n  - key: k\n    descriptors:\n      - key: u\n        value: [x]\n",
        "domain: d\ndescriptors:\n  - key: k\n    value: v\n    rate_limit: {unit: second, requests_per_unit: 1}\n    \
         rate_limits: [{unit: second, requests_per_unit: 1}]\n",
        "domain: d\ndescriptors: [\n",
    ];

    #[test]
    fn valid_files_are_read_fast_and_as_the_whole_file_path_reads_them() {
        for text in VALID {
            let slow = parse_text_in_go_order("f.yaml", text);
            assert!(slow.is_ok(), "{text:?}: {slow:?}");
            assert_eq!(parse("f.yaml", text).ok_or(()), slow.map_err(|_| ()), "{text:?}");
        }
    }

    #[test]
    fn what_the_fast_path_gives_up_on_is_read_the_slow_way() {
        for text in SLOW_BUT_VALID {
            assert_eq!(parse("f.yaml", text), None, "{text:?}");
            let config = super::super::parse_text("f.yaml", text).expect("valid");
            assert_eq!(config.domain, "d", "{text:?}");
        }
        let last_wins = super::super::parse_text("f.yaml", SLOW_BUT_VALID[1]).expect("valid");
        assert_eq!(last_wins.descriptors[0].key, "b");
    }

    #[test]
    fn a_file_with_an_error_gets_the_error_go_reports() {
        for text in INVALID {
            assert_eq!(parse("f.yaml", text), None, "{text:?}");
            let slow = parse_text_in_go_order("f.yaml", text);
            assert!(slow.is_err(), "{text:?}");
            assert_eq!(super::super::parse_text("f.yaml", text), slow, "{text:?}");
        }
        assert_eq!(
            super::super::parse_text("f.yaml", INVALID[10]),
            Err("config error, unknown key 'bogus'".to_owned())
        );
    }
}
