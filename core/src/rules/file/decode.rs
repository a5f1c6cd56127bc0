//! Phase 1 of reading a rules file: the typed decode of the YAML node tree into raw descriptors
//! (Go's second `yaml.Unmarshal` into structs). Scalar type mismatches and out-of-range integers
//! become `error loading config file: ...`; metadata that cannot become a `Struct` becomes
//! `error parsing metadata: ...`. Nothing here judges meaning: that is [`super::validate`].

use std::collections::BTreeMap;

use super::model::MetaValue;
use super::yaml::{self, Node, Value};

/// Decode failures; the variants get different Go message prefixes.
pub(super) enum DecodeError {
    /// yaml.v2 unmarshal error (wrong type or out-of-range integer).
    Type(String),
    /// Metadata that cannot become a `Struct`.
    Metadata(String),
    /// A `proxy:` block that cannot be used (its message names the place).
    Proxy(String),
}

/// A rules file's content before its meaning is checked: what the YAML decodes to. Another source (the
/// server's xDS client) builds its parts, and [`super::validate_raw`] turns them into a
/// [`super::DomainConfig`].
#[derive(Debug, Clone, Default)]
pub struct RawRoot {
    /// `domain`.
    pub domain: String,
    /// `all_or_nothing` (Tollgate).
    pub all_or_nothing: bool,
    /// `descriptors`.
    pub descriptors: Vec<RawDescriptor>,
    /// `proxy` (Tollgate), already checked (it has no Go form to keep apart from its meaning).
    pub proxy: Option<crate::rules::proxy::ProxyRules>,
}

/// One descriptor node before validation; the fields are the rules file's keys.
#[derive(Debug, Clone, Default)]
pub struct RawDescriptor {
    /// `key`.
    pub key: String,
    /// `value` (empty: any value).
    pub value: String,
    /// `rate_limit`: outer `Some` = key present; inner `None` = `rate_limit:` null (accepted, no limit).
    pub rate_limit: Option<Option<RawLimit>>,
    /// `rate_limits` (Tollgate): `Some` = key present (null decodes to an empty list, rejected later).
    pub rate_limits: Option<Vec<RawLimit>>,
    /// `concurrency` (Tollgate).
    pub concurrency: Option<RawConcurrency>,
    /// `shadow_mode`.
    pub shadow_mode: bool,
    /// `quota_mode`.
    pub quota_mode: bool,
    /// `detailed_metric`.
    pub detailed_metric: bool,
    /// `value_to_metric`.
    pub value_to_metric: bool,
    /// `share_threshold`.
    pub share_threshold: bool,
    /// `metadata`, free-form.
    pub metadata: Option<BTreeMap<String, MetaValue>>,
    /// `lowercase` (Tollgate).
    pub lowercase: bool,
    /// `trim` (Tollgate).
    pub trim: bool,
    /// `hash` (Tollgate).
    pub hash: bool,
    /// `ip_prefix` (Tollgate): the IPv4 and IPv6 prefix lengths given.
    pub ip_prefix: Option<(Option<u32>, Option<u32>)>,
    /// `match` (Tollgate), as spelled.
    pub match_kind: Option<String>,
    /// `descriptors`: the nodes below.
    pub descriptors: Vec<RawDescriptor>,
}

/// `concurrency` before validation (Tollgate).
#[derive(Debug, Clone, Default)]
pub struct RawConcurrency {
    /// `max_in_flight`.
    pub max_in_flight: Option<u32>,
    /// `lease_ttl`, as spelled.
    pub lease_ttl: Option<String>,
    /// `failure_mode`, as spelled.
    pub failure_mode: Option<String>,
}

/// One limit (`rate_limit` or an item of `rate_limits`) before validation.
#[derive(Debug, Clone, Default)]
pub struct RawLimit {
    /// `unit`, as spelled (`second` … `year`, any case).
    pub unit: String,
    /// `requests_per_unit`.
    pub requests_per_unit: u32,
    /// `unlimited`.
    pub unlimited: bool,
    /// `name`.
    pub name: String,
    /// `replaces`: the names of the limits this one replaces.
    pub replaces: Vec<String>,
    /// `algorithm` (Tollgate), as spelled.
    pub algorithm: Option<String>,
    /// `burst` (Tollgate).
    pub burst: Option<u32>,
    /// `unit_multiplier` (Tollgate).
    pub unit_multiplier: Option<u32>,
    /// `failure_mode` (Tollgate), as spelled.
    pub failure_mode: Option<String>,
}

type Decoded<T> = Result<T, DecodeError>;

fn type_error(node: &Node, target: &str, key: &str) -> DecodeError {
    DecodeError::Type(format!("{} (key '{key}')", yaml::mismatch(node, target)))
}

/// Go `string` field: any scalar, spelled as in the file (yaml.v2 semantics); absent = "".
pub(super) fn string_field(map: &Node, key: &str) -> Decoded<String> {
    Ok(opt_string_field(map, key)?.unwrap_or_default())
}

/// Extension string field: absent or null = `None`.
fn opt_string_field(map: &Node, key: &str) -> Decoded<Option<String>> {
    match map.get(key) {
        None => Ok(None),
        Some(n) if n.value == Value::Null => Ok(None),
        Some(n) => n
            .scalar_text()
            .map(Some)
            .ok_or_else(|| type_error(n, "string", key)),
    }
}

/// Go `bool` field: only booleans (YAML 1.1 spellings included) or null (= false).
pub(super) fn bool_field(map: &Node, key: &str) -> Decoded<bool> {
    match map.get(key).map(|n| (n, &n.value)) {
        None | Some((_, Value::Null)) => Ok(false),
        Some((_, Value::Bool(b))) => Ok(*b),
        Some((n, _)) => Err(type_error(n, "bool", key)),
    }
}

/// Go `uint32` field: absent or null = `None` (Go's zero value is applied by the caller).
fn u32_field(map: &Node, key: &str) -> Decoded<Option<u32>> {
    let Some(n) = map.get(key) else {
        return Ok(None);
    };
    let out_of_range = || {
        DecodeError::Type(format!(
            "{} ({key} must be between 0 and {})",
            yaml::mismatch(n, "uint32"),
            u32::MAX
        ))
    };
    match &n.value {
        Value::Null => Ok(None),
        Value::Int(i) => u32::try_from(*i).map(Some).map_err(|_| out_of_range()),
        Value::UInt(_) => Err(out_of_range()),
        _ => Err(type_error(n, "uint32", key)),
    }
}

/// A list field: absent or null = `None`; elements are maps (checked structurally already).
fn list_field<'a>(map: &'a Node, key: &str) -> Decoded<Option<&'a [Node]>> {
    match map.get(key) {
        None => Ok(None),
        Some(n) => match &n.value {
            Value::Null => Ok(Some(&[])),
            Value::Seq(items) => Ok(Some(items)),
            _ => Err(type_error(n, "a list", key)),
        },
    }
}

/// A nested mapping field: absent = `None`, null = `Some(None)`.
fn map_field<'a>(map: &'a Node, key: &str) -> Decoded<Option<Option<&'a Node>>> {
    match map.get(key) {
        None => Ok(None),
        Some(n) => match &n.value {
            Value::Null => Ok(Some(None)),
            Value::Map(_) => Ok(Some(Some(n))),
            _ => Err(type_error(n, "a mapping", key)),
        },
    }
}

/// Decodes a file's root, consuming its tree: each top-level descriptor's subtree is dropped as soon as
/// it is decoded, so the tree (several times the file's size) and the decoded rules are never both
/// whole, and what the one frees the other reuses.
pub(super) fn decode_root(mut root: Node) -> Decoded<RawRoot> {
    let domain = string_field(&root, "domain")?;
    let all_or_nothing = bool_field(&root, "all_or_nothing")?;
    let proxy = super::proxy::decode(root.get("proxy")).map_err(DecodeError::Proxy)?;
    list_field(&root, "descriptors")?;
    let items = match root.take("descriptors").map(|n| n.value) {
        Some(Value::Seq(items)) => items,
        // Absent or null: checked by `list_field` above.
        _ => Vec::new(),
    };
    drop(root);
    let descriptors = items
        .into_iter()
        .map(|item| decode_descriptor(&item))
        .collect::<Decoded<_>>()?;
    Ok(RawRoot {
        domain,
        all_or_nothing,
        descriptors,
        proxy,
    })
}

fn decode_descriptors(parent: &Node) -> Decoded<Vec<RawDescriptor>> {
    list_field(parent, "descriptors")?
        .unwrap_or_default()
        .iter()
        .map(decode_descriptor)
        .collect()
}

pub(super) fn decode_descriptor(d: &Node) -> Decoded<RawDescriptor> {
    if d.get("proxy").is_some() {
        return Err(DecodeError::Proxy(
            "proxy is a top-level key: how a proxy's request becomes this domain's descriptors".into(),
        ));
    }
    let rate_limit = match map_field(d, "rate_limit")? {
        None => None,
        Some(None) => Some(None),
        Some(Some(m)) => Some(Some(decode_limit(m)?)),
    };
    let rate_limits = match list_field(d, "rate_limits")? {
        None => None,
        Some(items) => Some(items.iter().map(decode_limit).collect::<Decoded<_>>()?),
    };
    let concurrency = match map_field(d, "concurrency")? {
        None | Some(None) => None,
        Some(Some(m)) => Some(RawConcurrency {
            max_in_flight: u32_field(m, "max_in_flight")?,
            lease_ttl: opt_string_field(m, "lease_ttl")?,
            failure_mode: opt_string_field(m, "failure_mode")?,
        }),
    };
    let ip_prefix = match map_field(d, "ip_prefix")? {
        None | Some(None) => None,
        Some(Some(m)) => Some((u32_field(m, "v4")?, u32_field(m, "v6")?)),
    };
    let metadata = match d.get("metadata") {
        None => None,
        Some(n) => match &n.value {
            Value::Null => None,
            Value::Map(entries) => Some(meta_map(entries)?),
            _ => return Err(type_error(n, "a mapping", "metadata")),
        },
    };
    Ok(RawDescriptor {
        key: string_field(d, "key")?,
        value: string_field(d, "value")?,
        rate_limit,
        rate_limits,
        concurrency,
        shadow_mode: bool_field(d, "shadow_mode")?,
        quota_mode: bool_field(d, "quota_mode")?,
        detailed_metric: bool_field(d, "detailed_metric")?,
        value_to_metric: bool_field(d, "value_to_metric")?,
        share_threshold: bool_field(d, "share_threshold")?,
        metadata,
        lowercase: bool_field(d, "lowercase")?,
        trim: bool_field(d, "trim")?,
        hash: bool_field(d, "hash")?,
        ip_prefix,
        match_kind: opt_string_field(d, "match")?,
        descriptors: decode_descriptors(d)?,
    })
}

fn decode_limit(m: &Node) -> Decoded<RawLimit> {
    let replaces = list_field(m, "replaces")?
        .unwrap_or_default()
        .iter()
        .map(|r| string_field(r, "name"))
        .collect::<Decoded<_>>()?;
    Ok(RawLimit {
        unit: string_field(m, "unit")?,
        requests_per_unit: u32_field(m, "requests_per_unit")?.unwrap_or(0),
        unlimited: bool_field(m, "unlimited")?,
        name: string_field(m, "name")?,
        replaces,
        algorithm: opt_string_field(m, "algorithm")?,
        burst: u32_field(m, "burst")?,
        unit_multiplier: u32_field(m, "unit_multiplier")?,
        failure_mode: opt_string_field(m, "failure_mode")?,
    })
}

fn meta_map(entries: &[(Node, Node)]) -> Decoded<BTreeMap<String, MetaValue>> {
    entries
        .iter()
        .map(|(k, v)| {
            // Scalar keys become their source text (as yaml.v2 does for string-keyed maps);
            // null and collection keys cannot name a Struct field.
            let key = match &k.value {
                Value::Null | Value::Seq(_) | Value::Map(_) => None,
                _ => k.scalar_text(),
            };
            let key = key.ok_or_else(|| {
                DecodeError::Metadata(format!(
                    "key is not of type string: {}",
                    yaml::go_format(&k.value)
                ))
            })?;
            Ok((key, meta_value(v)?))
        })
        .collect()
}

fn meta_value(n: &Node) -> Decoded<MetaValue> {
    Ok(match &n.value {
        Value::Null => MetaValue::Null,
        Value::Bool(b) => MetaValue::Bool(*b),
        Value::Int(i) => MetaValue::Int(*i),
        Value::UInt(u) => MetaValue::Float(*u as f64),
        Value::Float(f) => MetaValue::Float(*f),
        Value::Str(s) => MetaValue::String(s.clone()),
        Value::Seq(items) => MetaValue::List(items.iter().map(meta_value).collect::<Decoded<_>>()?),
        Value::Map(entries) => MetaValue::Map(meta_map(entries)?),
    })
}
