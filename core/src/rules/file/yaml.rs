//! Generic YAML node tree and Go-compatible structural validation.
//!
//! The Go service first unmarshals each file into `map[interface{}]interface{}` and walks it
//! with a flat key allow-list before decoding into typed structs. We do the same on [`Node`], so
//! the same files are rejected with the same messages. The tree keeps what typed decoding needs
//! to behave like Go's yaml.v2: the resolved type of every scalar, the source text of non-string
//! scalars (yaml.v2 puts that text into string fields, e.g. `value: yes` is the string `"yes"`),
//! and line numbers for type-mismatch messages.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::fmt;

use serde::de::{self, Deserialize, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_saphyr::granit_parser::{Event, Parser};
use serde_saphyr::{Budget, DuplicateKeyPolicy, NonFiniteFloatPolicy, Spanned};

/// Keys accepted anywhere in a rules file (outside `metadata`).
///
/// Flat like Go's `validKeys`: a known key is accepted at any depth and ignored where it has no
/// meaning. The second group are Tollgate extensions.
const VALID_KEYS: &[&str] = &[
    // envoyproxy/ratelimit
    "domain",
    "key",
    "value",
    "descriptors",
    "rate_limit",
    "unit",
    "requests_per_unit",
    "unlimited",
    "name",
    "replaces",
    "shadow_mode",
    "quota_mode",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "metadata",
    // Tollgate extensions
    "algorithm",
    "burst",
    "unit_multiplier",
    "failure_mode",
    "rate_limits",
    "lowercase",
    "trim",
    "ip_prefix",
    "v4",
    "v6",
    "hash",
    "match",
    "all_or_nothing",
    "concurrency",
    "max_in_flight",
    "lease_ttl",
    "proxy",
];

/// A YAML node: resolved value plus the source facts typed decoding needs.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Node {
    /// The resolved value.
    pub(crate) value: Value,
    /// Source text of a non-string scalar (bool, int, float); `None` for strings, nulls and
    /// collections, whose string form does not depend on spelling.
    pub(crate) raw: Option<Box<str>>,
    /// 1-based line where the node is used (0 if unknown).
    pub(crate) line: u32,
    /// Byte range of the node's definition in the parsed text; used to fill `raw`. (Narrow fields: a
    /// large rules file is millions of nodes, and the whole tree is alive at once.)
    span: Option<(u32, u32)>,
}

/// Last value stored under string key `key` among a mapping's entries.
pub(crate) fn lookup<'n>(entries: &'n [(Node, Node)], key: &str) -> Option<&'n Node> {
    entries.iter().rev().find(|(k, _)| k.is_key(key)).map(|(_, v)| v)
}

/// Resolved YAML value (YAML 1.1 resolution, as yaml.v2: `yes`/`no`/`on`/`off` are booleans,
/// `010` is octal).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Value {
    Null,
    Bool(bool),
    Int(i64),
    /// Only for integers above `i64::MAX` (yaml.v2 gives `uint64`, which Go's validator rejects).
    UInt(u64),
    Float(f64),
    Str(String),
    Seq(Vec<Node>),
    /// Entries in document order; a repeated scalar key keeps only its last value (yaml.v2).
    Map(Vec<(Node, Node)>),
}

impl Node {
    /// yaml.v2 tag name of the node's resolved type, for type-mismatch messages.
    pub(crate) fn tag(&self) -> &'static str {
        match self.value {
            Value::Null => "!!null",
            Value::Bool(_) => "!!bool",
            Value::Int(_) | Value::UInt(_) => "!!int",
            Value::Float(_) => "!!float",
            Value::Str(_) => "!!str",
            Value::Seq(_) => "!!seq",
            Value::Map(_) => "!!map",
        }
    }

    /// What yaml.v2 stores when this scalar is decoded into a Go `string`: the string itself,
    /// `""` for null, and the source spelling for other scalars. `None` for collections.
    pub(crate) fn scalar_text(&self) -> Option<String> {
        match &self.value {
            Value::Str(s) => Some(s.clone()),
            Value::Null => Some(String::new()),
            Value::Bool(_) | Value::Int(_) | Value::UInt(_) | Value::Float(_) => Some(
                self.raw
                    .as_deref()
                    .map_or_else(|| go_format(&self.value), str::to_owned),
            ),
            Value::Seq(_) | Value::Map(_) => None,
        }
    }

    /// Whether this node is the string `key` (a mapping's key names a field only as a string).
    pub(crate) fn is_key(&self, key: &str) -> bool {
        matches!(&self.value, Value::Str(s) if s == key)
    }

    /// Last value stored under string key `key` in a mapping node.
    pub(crate) fn get(&self, key: &str) -> Option<&Node> {
        match &self.value {
            Value::Map(entries) => lookup(entries, key),
            _ => None,
        }
    }

    /// Takes the last value stored under string key `key` out of a mapping node (a null left in its
    /// place).
    pub(crate) fn take(&mut self, key: &str) -> Option<Node> {
        match &mut self.value {
            Value::Map(entries) => entries
                .iter_mut()
                .rev()
                .find(|(k, _)| k.is_key(key))
                .map(|(_, v)| {
                    let null = Node {
                        value: Value::Null,
                        raw: None,
                        line: v.line,
                        span: None,
                    };
                    std::mem::replace(v, null)
                }),
            _ => None,
        }
    }

    /// A mapping of `entries` assembled from parts, with no place in the source.
    pub(crate) fn map(entries: Vec<(Node, Node)>) -> Node {
        Node {
            value: Value::Map(entries),
            raw: None,
            line: 0,
            span: None,
        }
    }

    /// Fill `raw` for non-string scalars from the text they were parsed from.
    pub(crate) fn fill_raw(&mut self, text: &str) {
        match &mut self.value {
            Value::Bool(_) | Value::Int(_) | Value::UInt(_) | Value::Float(_) => {
                self.raw = self
                    .span
                    .and_then(|(start, end)| text.get(start as usize..end as usize))
                    // A span that does not look like a plain scalar (e.g. one that starts with
                    // a tag) is not trusted; the canonical form is used instead.
                    .filter(|s| !s.is_empty() && !s.starts_with(['!', '&', '*']))
                    .map(Into::into);
            }
            Value::Seq(items) => items.iter_mut().for_each(|n| n.fill_raw(text)),
            Value::Map(entries) => entries.iter_mut().for_each(|(k, v)| {
                k.fill_raw(text);
                v.fill_raw(text);
            }),
            Value::Null | Value::Str(_) => {}
        }
    }
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        // `Spanned` gives us the definition's byte range (so aliases resolve to the anchored
        // text) without a second parse.
        let spanned = Spanned::<Value>::deserialize(deserializer)?;
        let span = spanned.defined.span();
        let range = match (span.byte_offset(), span.byte_len()) {
            (Some(start), Some(len)) => u32::try_from(start)
                .ok()
                .zip(u32::try_from(start.saturating_add(len)).ok()),
            _ => None,
        };
        Ok(Node {
            value: spanned.value,
            raw: None,
            line: u32::try_from(spanned.referenced.line()).unwrap_or(u32::MAX),
            span: range,
        })
    }
}

impl<'de> Deserialize<'de> for Value {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(ValueVisitor)
    }
}

struct ValueVisitor;

impl<'de> Visitor<'de> for ValueVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any YAML value")
    }

    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        Value::deserialize(d)
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Int(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value, E> {
        // Keep one representation per number so equal keys compare equal.
        Ok(i64::try_from(v).map_or(Value::UInt(v), Value::Int))
    }

    fn visit_i128<E: de::Error>(self, v: i128) -> Result<Value, E> {
        // yaml.v2 has no 128-bit integers; such a literal falls through to a float there too.
        i64::try_from(v)
            .map(Value::Int)
            .or_else(|_| u64::try_from(v).map(Value::UInt))
            .or(Ok(Value::Float(v as f64)))
    }

    fn visit_u128<E: de::Error>(self, v: u128) -> Result<Value, E> {
        u64::try_from(v)
            .map(|u| i64::try_from(u).map_or(Value::UInt(u), Value::Int))
            .or(Ok(Value::Float(v as f64)))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        Ok(Value::Float(v))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        Ok(Value::Str(v.to_owned()))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Value, E> {
        Ok(Value::Str(v))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element::<Node>()? {
            items.push(item);
        }
        items.shrink_to_fit();
        Ok(Value::Seq(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut entries: Vec<(Node, Node)> = Vec::new();
        // Position of each scalar key, so repeated keys are found without a quadratic scan; built only
        // for a map past `LINEAR_KEYS` entries (a rules file's maps have a handful), since building it
        // costs more than comparing a few keys.
        let mut positions: Option<HashMap<String, usize>> = None;
        while let Some((k, v)) = map.next_entry::<Node, Node>()? {
            // yaml.v2 (non-strict) lets a repeated key overwrite the earlier value; the earlier
            // value must not be validated either, so it is dropped here.
            let existing = match &mut positions {
                None => entries
                    .iter()
                    .position(|(known, _)| same_scalar(&known.value, &k.value)),
                Some(positions) => scalar_identity(&k.value).and_then(|id| match positions.entry(id) {
                    Entry::Occupied(slot) => Some(*slot.get()),
                    Entry::Vacant(slot) => {
                        slot.insert(entries.len());
                        None
                    }
                }),
            };
            match existing.and_then(|i| entries.get_mut(i)) {
                Some(entry) => *entry = (k, v),
                None => entries.push((k, v)),
            }
            if positions.is_none() && entries.len() > LINEAR_KEYS {
                let ids = entries.iter().enumerate();
                positions = Some(
                    ids.filter_map(|(at, (k, _))| Some((scalar_identity(&k.value)?, at)))
                        .collect(),
                );
            }
        }
        entries.shrink_to_fit();
        Ok(Value::Map(entries))
    }
}

/// Most entries a map's repeated keys are found in by comparing keys one by one.
const LINEAR_KEYS: usize = 16;

/// Whether two keys are the same scalar key: what [`scalar_identity`] says, without building the
/// identities (`1` and `0x1` are the same key, `"1"` is not; collections are never the same key).
pub(crate) fn same_scalar(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Null, Value::Null) => true,
        (Value::Bool(a), Value::Bool(b)) => a == b,
        (Value::Int(a), Value::Int(b)) => a == b,
        (Value::UInt(a), Value::UInt(b)) => a == b,
        (Value::Float(a), Value::Float(b)) => a.to_bits() == b.to_bits(),
        (Value::Str(a), Value::Str(b)) => a == b,
        _ => false,
    }
}

/// A string identifying a scalar key's resolved value (`1` and `0x1` are the same key, `"1"`
/// is not); `None` for collection keys, which are never merged.
fn scalar_identity(v: &Value) -> Option<String> {
    match v {
        Value::Null => Some("null".to_owned()),
        Value::Bool(b) => Some(format!("bool:{b}")),
        Value::Int(i) => Some(format!("int:{i}")),
        Value::UInt(u) => Some(format!("int:{u}")),
        Value::Float(f) => Some(format!("float:{}", f.to_bits())),
        Value::Str(s) => Some(format!("str:{s}")),
        Value::Seq(_) | Value::Map(_) => None,
    }
}

/// Parse the first YAML document of `text` into a node tree.
///
/// Errors are the parser's one-line message (the caller adds `error loading config file: `).
pub(crate) fn parse_document(text: &str) -> Result<Node, String> {
    let doc = first_document(text);
    let mut node: Node = serde_saphyr::from_str_with_options(doc, options_for(doc.len()))
        .map_err(|e| explain(e, doc.len()))?;
    node.fill_raw(doc);
    Ok(node)
}

/// Runs `seed` over the first YAML document of `text`, with the options of [`parse_document`]; the
/// seed is given that document's text (what [`Node::fill_raw`] needs). `None` if the parser or the
/// seed failed: the caller falls back to [`parse_document`], whose error is the one to report.
pub(crate) fn deserialize_document<'t, S>(text: &'t str, seed: impl FnOnce(&'t str) -> S) -> Option<S::Value>
where
    S: DeserializeSeed<'t>,
{
    let doc = first_document(text);
    deserialize_with(doc, options_for(doc.len()), seed)
}

/// Runs `seed` over `run`, a run of a file's top-level descriptors cut out of it (see
/// [`super::pieces`]), with the budgets its file is parsed with; the seed is given `run`. The nesting
/// allowed is one level less: the run's list is its document's root, where the file's list sits in the
/// root mapping, and what is too deep in the file must be too deep in the run. `None` if the parser or
/// the seed failed.
pub(crate) fn deserialize_run<'t, S>(run: &'t str, seed: impl FnOnce(&'t str) -> S) -> Option<S::Value>
where
    S: DeserializeSeed<'t>,
{
    let mut options = options_for(run.len());
    if let Some(budget) = options.budget.as_mut() {
        budget.max_depth = budget.max_depth.saturating_sub(1);
    }
    deserialize_with(run, options, seed)
}

/// Runs the seed made for `doc` over it with `options`; `None` if the parser or the seed failed.
fn deserialize_with<'t, S>(
    doc: &'t str,
    options: serde_saphyr::Options,
    seed: impl FnOnce(&'t str) -> S,
) -> Option<S::Value>
where
    S: DeserializeSeed<'t>,
{
    let seed = seed(doc);
    serde_saphyr::with_deserializer_from_str_with_options(doc, options, |de| seed.deserialize(de)).ok()
}

/// The parser's options for a document of `len` bytes.
pub(crate) fn options_for(len: usize) -> serde_saphyr::Options {
    serde_saphyr::options! {
        // Messages become `<file>: error loading config file: <msg>`: keep them on one line.
        with_snippet: false,
        // YAML 1.1 like yaml.v2: `010` is octal 8, not the float 10.
        legacy_octal_numbers: true,
        // `.inf`/`.nan` must reach the validator as floats (Go rejects them there).
        non_finite_float_policy: NonFiniteFloatPolicy::PassThrough,
        duplicate_keys: DuplicateKeyPolicy::LastWins,
        budget: Some(budget_for(len)),
    }
}

/// The parser's budget for a document of `len` bytes: serde-saphyr's defaults (250,000 nodes,
/// 1,000,000 events, 64 MiB of scalars), raised to what `len` bytes can spell without aliases (a node
/// takes a byte at least and makes at most two events; a scalar byte takes one), so the file-size cap
/// (`TOLLGATE_RULES_MAX_FILE_BYTES`) is the only bound on how many rules a file holds. What stays fixed
/// is what aliases may add: an alias bomb is refused whatever the file's size.
fn budget_for(len: usize) -> Budget {
    let mut budget = Budget::default();
    budget.max_nodes = budget.max_nodes.max(len);
    budget.max_events = budget.max_events.max(len.saturating_mul(2));
    budget.max_total_scalar_bytes = budget.max_total_scalar_bytes.max(len);
    budget
}

/// The parser's error as one line; a budget breach says which budget and what to do.
fn explain(error: serde_saphyr::Error, len: usize) -> String {
    let mut inner = &error;
    while let serde_saphyr::Error::WithSnippet { error, .. } | serde_saphyr::Error::AliasError { error, .. } =
        inner
    {
        inner = error;
    }
    match inner {
        serde_saphyr::Error::Budget { breach, .. } => format!(
            "the YAML parser's budget for a file of {len} bytes ran out ({breach:?}): budgets grow with \
             the file's size, so only aliases that expand too far or nesting deeper than 64 exceed them; \
             write the aliased parts out, or split the file (a file may hold up to \
             TOLLGATE_RULES_MAX_FILE_BYTES)"
        ),
        _ => error.to_string(),
    }
}

/// The text of the first document only: Go's `yaml.Unmarshal` reads one document and ignores
/// the rest, while serde-saphyr's single-document API rejects multi-document input.
fn first_document(text: &str) -> &str {
    if !may_hold_several_documents(text) {
        return text;
    }
    for event in Parser::new_from_str(text) {
        match event {
            Ok((Event::DocumentEnd, span)) => {
                return match span.byte_range() {
                    Some(range) => text.get(..range.end).unwrap_or(text),
                    None => text,
                };
            }
            Ok(_) => {}
            // Let the full parse report the error with its usual wording.
            Err(_) => return text,
        }
    }
    text
}

/// Whether the text may hold a second document: a document end (`...`), or a document start (`---`)
/// after the first document began, at the start of a line (YAML allows them nowhere else). Only then is
/// the text scanned for where the first ends: a scan is a whole parse, and doubled the time to load a
/// large file.
fn may_hold_several_documents(text: &str) -> bool {
    let mut begun = false;
    for line in text.lines() {
        if line.starts_with("...") || (line.starts_with("---") && begun) {
            return true;
        }
        begun |= line.starts_with("---") || !(line.trim().is_empty() || line.starts_with(['#', '%']));
    }
    false
}

/// Go's `validateYamlKeys` over the whole document, returning the Go message on failure.
///
/// The document itself must be a mapping (or empty), as yaml.v2 refuses to unmarshal anything
/// else into a map.
pub(crate) fn validate_structure(root: &Node) -> Result<(), String> {
    match &root.value {
        Value::Null => Ok(()),
        Value::Map(entries) => validate_map(entries),
        _ => Err(format!(
            "error loading config file: {}",
            mismatch(root, "a mapping (the document root)")
        )),
    }
}

/// Go's `validateYamlKeys` over one mapping's entries.
pub(crate) fn validate_map(entries: &[(Node, Node)]) -> Result<(), String> {
    for (k, v) in entries {
        let Value::Str(key) = &k.value else {
            return Err(format!(
                "config error, key is not of type string: {}",
                go_format(&k.value)
            ));
        };
        if !VALID_KEYS.contains(&key.as_str()) {
            return Err(format!("config error, unknown key '{key}'"));
        }
        // Metadata is free-form and only has to be convertible (checked when decoding); the proxy
        // block has keys of its own, checked strictly by its reader.
        if key == "metadata" || key == "proxy" {
            continue;
        }
        validate_value(v)?;
    }
    Ok(())
}

fn validate_value(v: &Node) -> Result<(), String> {
    match &v.value {
        Value::Seq(items) => {
            for item in items {
                match &item.value {
                    Value::Map(entries) => validate_map(entries)?,
                    other => {
                        return Err(format!(
                            "config error, yaml file contains list of type other than map: {}",
                            go_format(other)
                        ));
                    }
                }
            }
            Ok(())
        }
        Value::Map(entries) => validate_map(entries),
        Value::Str(_) | Value::Null | Value::Bool(_) | Value::Int(_) => Ok(()),
        // Go accepts only string, int, bool and nil leaves; uint64 and float64 fall through.
        Value::UInt(_) | Value::Float(_) => Err("error checking config".to_owned()),
    }
}

/// yaml.v2-style type-mismatch text: ``line N: cannot unmarshal !!str `x` into <target>``.
pub(crate) fn mismatch(node: &Node, target: &str) -> String {
    // yaml.v2 shows a scalar of more than 10 bytes as its first 7 and `...`. A document that is one
    // scalar (a file that is a token, say) is not shown at all: the message may reach a log.
    let shown = match (&node.value, node.scalar_text()) {
        (Value::Seq(_) | Value::Map(_), _) | (_, None) => String::new(),
        _ if target.contains("the document root") => String::new(),
        (_, Some(text)) if text.len() > 10 => {
            let cut = (0..=7).rev().find(|&at| text.is_char_boundary(at)).unwrap_or(0);
            format!(" `{}...`", &text[..cut])
        }
        (_, Some(text)) => format!(" `{text}`"),
    };
    format!(
        "line {}: cannot unmarshal {}{} into {}",
        node.line,
        node.tag(),
        shown,
        target
    )
}

/// Approximation of Go's `fmt` `%v` for the values yaml.v2 produces, used where the Go message
/// embeds a value (non-string keys, non-map list elements).
pub(crate) fn go_format(v: &Value) -> String {
    match v {
        Value::Null => "<nil>".to_owned(),
        Value::Bool(b) => b.to_string(),
        Value::Int(i) => i.to_string(),
        Value::UInt(u) => u.to_string(),
        Value::Float(f) => go_float(*f),
        Value::Str(s) => s.clone(),
        Value::Seq(items) => {
            let parts: Vec<String> = items.iter().map(|n| go_format(&n.value)).collect();
            format!("[{}]", parts.join(" "))
        }
        Value::Map(entries) => {
            // fmt prints maps with sorted keys.
            let mut parts: Vec<(String, String)> = entries
                .iter()
                .map(|(k, v)| (go_format(&k.value), go_format(&v.value)))
                .collect();
            parts.sort();
            let parts: Vec<String> = parts.into_iter().map(|(k, v)| format!("{k}:{v}")).collect();
            format!("map[{}]", parts.join(" "))
        }
    }
}

/// Go's `%v` for a float64 (`strconv` 'g', shortest): exponent form when exp < -4 or exp >= 6.
fn go_float(f: f64) -> String {
    if f.is_nan() {
        return "NaN".to_owned();
    }
    if f.is_infinite() {
        return if f > 0.0 { "+Inf" } else { "-Inf" }.to_owned();
    }
    // Rust's `{:e}` yields the shortest round-trip digits, e.g. "1.5e0", "-1e20".
    let sci = format!("{f:e}");
    let Some((mantissa, exp)) = sci.split_once('e') else {
        return sci;
    };
    let Ok(exp) = exp.parse::<i32>() else {
        return sci;
    };
    if (-4..6).contains(&exp) {
        f.to_string()
    } else {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{mantissa}e{sign}{:02}", exp.unsigned_abs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Node {
        match parse_document(text) {
            Ok(n) => n,
            Err(e) => panic!("parse failed: {e}"),
        }
    }

    fn check(text: &str) -> Result<(), String> {
        validate_structure(&parse(text))
    }

    #[test]
    fn scalars_resolve_like_yaml_v2() {
        let n = parse("a: yes\nb: 010\nc: 0x1F\nd: ~\ne: '12'\nf: 12\ng: 1.5\nh: n\n");
        let text = |k: &str| n.get(k).and_then(Node::scalar_text);
        assert_eq!(n.get("a").map(|n| &n.value), Some(&Value::Bool(true)));
        assert_eq!(text("a").as_deref(), Some("yes"));
        assert_eq!(n.get("b").map(|n| &n.value), Some(&Value::Int(8)));
        assert_eq!(text("b").as_deref(), Some("010"));
        assert_eq!(text("c").as_deref(), Some("0x1F"));
        assert_eq!(text("d").as_deref(), Some(""));
        assert_eq!(n.get("e").map(|n| &n.value), Some(&Value::Str("12".into())));
        assert_eq!(n.get("f").map(|n| &n.value), Some(&Value::Int(12)));
        assert_eq!(n.get("g").map(|n| &n.value), Some(&Value::Float(1.5)));
        assert_eq!(n.get("h").map(|n| &n.value), Some(&Value::Bool(false)));
    }

    /// The parser's node budget grows with the document: 300,000 nodes, past serde-saphyr's default of
    /// 250,000 (a 20,000-route rules file was refused at it), parse.
    #[test]
    fn a_large_document_is_not_refused_for_its_number_of_nodes() {
        let text = format!("[{}]", vec!["1"; 300_000].join(","));
        assert_eq!(text.len(), 600_001);
        match parse(&text).value {
            Value::Seq(items) => assert_eq!(items.len(), 300_000),
            other => panic!("{other:?}"),
        }
    }

    /// What aliases add stays bounded whatever the file's size, and the refusal says what to do.
    #[test]
    fn an_alias_bomb_is_refused_with_what_to_do() {
        let mut text = String::from("a: &a [1,1,1,1,1,1,1,1,1,1]\n");
        for (level, prev) in ["b", "c", "d", "e", "f", "g", "h"]
            .iter()
            .zip(["a", "b", "c", "d", "e", "f", "g"])
        {
            let refs = vec![format!("*{prev}"); 10].join(",");
            text.push_str(&format!("{level}: &{level} [{refs}]\n"));
        }
        let error = parse_document(&text).expect_err("ten million nodes from a 400-byte file");
        assert!(error.contains("budget") && error.contains("aliases"), "{error}");
    }

    #[test]
    fn aliases_keep_the_anchored_spelling() {
        let n = parse("a: &x On\nb: *x\n");
        assert_eq!(n.get("b").and_then(Node::scalar_text).as_deref(), Some("On"));
    }

    #[test]
    fn only_first_document_is_read() {
        let n = parse("---\ndomain: a\n---\ndomain: b\n---\n[unclosed\n");
        assert_eq!(n.get("domain").and_then(Node::scalar_text).as_deref(), Some("a"));
        let n = parse("domain: a\n...\n---\ndomain: b\n");
        assert_eq!(n.get("domain").and_then(Node::scalar_text).as_deref(), Some("a"));
        // An empty first document is what Go sees, too.
        assert_eq!(parse("---\n---\ndomain: b\n").value, Value::Null);
        assert!(!may_hold_several_documents(
            "# c\n%YAML 1.1\n---\ndomain: a\nk: |\n  ---\n"
        ));
        assert!(may_hold_several_documents("domain: a\n--- # next\n"));
    }

    #[test]
    fn repeated_key_last_wins() {
        let n = parse("value: 1.5\nkey: k\nvalue: 2\n");
        assert_eq!(n.get("value").map(|n| &n.value), Some(&Value::Int(2)));
        assert_eq!(validate_structure(&n), Ok(()));
        let Value::Map(entries) = &n.value else {
            panic!("not a map");
        };
        assert_eq!(entries.len(), 2);
        // Equal resolved values are the same key; a quoted string is a different one.
        let n = parse("{1: a, 0x1: b, '1': c}");
        let Value::Map(entries) = &n.value else {
            panic!("not a map");
        };
        assert_eq!(entries.len(), 2);
        // The same in a map too long to compare keys one by one, before and after it grew so.
        let keys: String = (0..40).map(|i| format!("k{i}: {i}\n")).collect();
        let n = parse(&format!("k3: first\n{keys}0x1: a\n1: b\nk3: last\nk39: again\n"));
        let Value::Map(entries) = &n.value else {
            panic!("not a map");
        };
        assert_eq!(entries.len(), 41);
        assert_eq!(n.get("k3").map(|n| &n.value), Some(&Value::Str("last".into())));
        assert_eq!(n.get("k39").map(|n| &n.value), Some(&Value::Str("again".into())));
        assert_eq!(entries[0].0.value, Value::Str("k3".into()), "kept in first place");
    }

    #[test]
    fn structural_errors() {
        assert_eq!(
            check("domain: d\n1: x\n"),
            Err("config error, key is not of type string: 1".into())
        );
        assert_eq!(
            check("domain: d\ndescriptors:\n  - key: k\n    ~: x\n"),
            Err("config error, key is not of type string: <nil>".into())
        );
        assert_eq!(
            check("domain: d\ndescriptors:\n  - key: k\n    ratelimit: {unit: second}\n"),
            Err("config error, unknown key 'ratelimit'".into())
        );
        assert_eq!(
            check("domain: d\ndescriptors:\n  - a\n  - b\n"),
            Err("config error, yaml file contains list of type other than map: a".into())
        );
        assert_eq!(
            check("domain: d\ndescriptors:\n  - [1, x]\n"),
            Err("config error, yaml file contains list of type other than map: [1 x]".into())
        );
        assert_eq!(
            check("domain: d\ndescriptors:\n  - key: k\n    value: 1.5\n"),
            Err("error checking config".into())
        );
        assert_eq!(
            check("domain: d\ndescriptors:\n  - key: k\n    value: .inf\n"),
            Err("error checking config".into())
        );
        assert_eq!(
            check("domain: 18446744073709551615\n"),
            Err("error checking config".into())
        );
        assert!(check("- a\n").is_err_and(|e| e.starts_with("error loading config file: line 1: cannot")));
    }

    #[test]
    fn structure_accepts_flat_keys_and_free_metadata() {
        assert_eq!(check(""), Ok(()));
        assert_eq!(
            check("domain: d\ndescriptors:\n  - key: k\n    domain: ignored\n"),
            Ok(())
        );
        assert_eq!(
            check("domain: d\ndescriptors:\n  - key: k\n    metadata: {x: 1.5, 2: [a], y: {z: ~}}\n"),
            Ok(())
        );
    }

    #[test]
    fn go_value_formatting() {
        assert_eq!(go_float(1.5), "1.5");
        assert_eq!(go_float(1e21), "1e+21");
        assert_eq!(go_float(1e20), "1e+20");
        assert_eq!(go_float(123456.0), "123456");
        assert_eq!(go_float(1234567.0), "1.234567e+06");
        assert_eq!(go_float(1e-5), "1e-05");
        assert_eq!(go_float(f64::NEG_INFINITY), "-Inf");
        let n = parse("{b: 1, a: [x, ~]}");
        assert_eq!(go_format(&n.value), "map[a:[x <nil>] b:1]");
    }
}
