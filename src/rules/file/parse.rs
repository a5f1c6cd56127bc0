//! Node tree -> validated model.
//!
//! Two phases, mirroring the Go loader so that a file with several problems reports the same
//! one first:
//!
//! 1. [`decode_root`] is the typed decode (Go's second `yaml.Unmarshal` into structs): scalar
//!    type mismatches and out-of-range integers become `error loading config file: ...`.
//! 2. [`build`] is the semantic validation of `loadDescriptors`, in Go's order per node (empty
//!    key, duplicate composite key, unit/unlimited, replaces, share_threshold), followed by the
//!    Tollgate extension checks and then the children.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::IpAddr;

use ipnet::IpNet;

use super::model::{
    ALGORITHMS, BURST_ALGORITHMS, ConcurrencyConfig, DEFAULT_LEASE_TTL, DescriptorConfig, DomainConfig,
    FailureMode, IpPrefix, LimitPolicy, LimitSpec, MAX_IN_FLIGHT, MAX_LEASE_TTL,
    MAX_SLIDING_LOG_REQUESTS_PER_UNIT, MetaValue, Normalize, RateLimitConfig, Unit, ValueMatch,
};
use super::yaml::{self, Node, Value};

/// Parse, structurally validate, decode and semantically validate one file's text.
///
/// Errors are the bare message; the caller prefixes the file name.
pub(crate) fn parse_text(file: &str, text: &str) -> Result<DomainConfig, String> {
    let root = yaml::parse_document(text).map_err(|e| format!("error loading config file: {e}"))?;
    yaml::validate_structure(&root)?;
    let raw = decode_root(&root).map_err(|e| match e {
        DecodeError::Type(m) => format!("error loading config file: {m}"),
        DecodeError::Metadata(m) => format!("error parsing metadata: {m}"),
    })?;
    build(raw, file)
}

// ---------------------------------------------------------------------------------------------
// Phase 1: typed decode
// ---------------------------------------------------------------------------------------------

/// Decode failures; the variants get different Go message prefixes.
enum DecodeError {
    /// yaml.v2 unmarshal error (wrong type or out-of-range integer).
    Type(String),
    /// Metadata that cannot become a `Struct`.
    Metadata(String),
}

struct RawRoot {
    domain: String,
    all_or_nothing: bool,
    descriptors: Vec<RawDescriptor>,
}

struct RawDescriptor {
    key: String,
    value: String,
    /// Outer `Some` = key present; inner `None` = `rate_limit:` null (accepted, no limit).
    rate_limit: Option<Option<RawLimit>>,
    /// `Some` = key present (null decodes to an empty list, rejected later).
    rate_limits: Option<Vec<RawLimit>>,
    concurrency: Option<RawConcurrency>,
    shadow_mode: bool,
    quota_mode: bool,
    detailed_metric: bool,
    value_to_metric: bool,
    share_threshold: bool,
    metadata: Option<BTreeMap<String, MetaValue>>,
    lowercase: bool,
    trim: bool,
    hash: bool,
    ip_prefix: Option<(Option<u32>, Option<u32>)>,
    match_kind: Option<String>,
    descriptors: Vec<RawDescriptor>,
}

struct RawConcurrency {
    max_in_flight: Option<u32>,
    lease_ttl: Option<String>,
    failure_mode: Option<String>,
}

struct RawLimit {
    unit: String,
    requests_per_unit: u32,
    unlimited: bool,
    name: String,
    replaces: Vec<String>,
    algorithm: Option<String>,
    burst: Option<u32>,
    unit_multiplier: Option<u32>,
    failure_mode: Option<String>,
}

type Decoded<T> = Result<T, DecodeError>;

fn type_error(node: &Node, target: &str, key: &str) -> DecodeError {
    DecodeError::Type(format!("{} (key '{key}')", yaml::mismatch(node, target)))
}

/// Go `string` field: any scalar, spelled as in the file (yaml.v2 semantics); absent = "".
fn string_field(map: &Node, key: &str) -> Decoded<String> {
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
fn bool_field(map: &Node, key: &str) -> Decoded<bool> {
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

fn decode_root(root: &Node) -> Decoded<RawRoot> {
    Ok(RawRoot {
        domain: string_field(root, "domain")?,
        all_or_nothing: bool_field(root, "all_or_nothing")?,
        descriptors: decode_descriptors(root)?,
    })
}

fn decode_descriptors(parent: &Node) -> Decoded<Vec<RawDescriptor>> {
    list_field(parent, "descriptors")?
        .unwrap_or_default()
        .iter()
        .map(decode_descriptor)
        .collect()
}

fn decode_descriptor(d: &Node) -> Decoded<RawDescriptor> {
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

// ---------------------------------------------------------------------------------------------
// Phase 2: semantic validation
// ---------------------------------------------------------------------------------------------

fn build(raw: RawRoot, file: &str) -> Result<DomainConfig, String> {
    if raw.domain.is_empty() {
        return Err("config file cannot have empty domain".to_owned());
    }
    let descriptors = build_level(&raw.descriptors, &raw.domain)?;
    Ok(DomainConfig {
        domain: raw.domain,
        file: file.to_owned(),
        all_or_nothing: raw.all_or_nothing,
        descriptors,
    })
}

/// The node's name in its parent: `key`, or `key_value` when it has a value (Go's finalKey).
///
/// Note `key: a_b` and `key: a, value: b` collide, exactly as in Go.
pub(crate) fn final_key(key: &str, value: Option<&str>) -> String {
    match value {
        Some(v) => format!("{key}_{v}"),
        None => key.to_owned(),
    }
}

/// Uniqueness checks among the children of one parent.
#[derive(Default)]
pub(crate) struct Siblings {
    final_keys: HashSet<String>,
    /// First non-default normalisation declared per `key`.
    normalisation: HashMap<String, Normalize>,
}

impl Siblings {
    /// Go's duplicate check; `path` is the composite key reported (`domain.k1_v1.k2`).
    pub(crate) fn check_duplicate(&mut self, final_key: &str, path: &str) -> Result<(), String> {
        if self.final_keys.insert(final_key.to_owned()) {
            Ok(())
        } else {
            Err(format!("duplicate descriptor composite key '{path}'"))
        }
    }

    /// The matcher normalises the request value per key and level, so siblings sharing a key
    /// must agree. A sibling declaring nothing does not constrain the others.
    pub(crate) fn check_normalisation(&mut self, key: &str, n: &Normalize) -> Result<(), String> {
        if n.is_none() {
            return Ok(());
        }
        match self.normalisation.get(key) {
            Some(existing) if existing != n => {
                Err(format!("conflicting value normalisation for key '{key}'"))
            }
            Some(_) => Ok(()),
            None => {
                self.normalisation.insert(key.to_owned(), n.clone());
                Ok(())
            }
        }
    }
}

fn build_level(raws: &[RawDescriptor], parent: &str) -> Result<Vec<DescriptorConfig>, String> {
    let mut siblings = Siblings::default();
    raws.iter()
        .map(|r| build_descriptor(r, parent, &mut siblings))
        .collect()
}

fn build_descriptor(
    r: &RawDescriptor,
    parent: &str,
    siblings: &mut Siblings,
) -> Result<DescriptorConfig, String> {
    if r.key.is_empty() {
        return Err("descriptor has empty key".to_owned());
    }
    // Go: an empty value means "no value".
    let value = (!r.value.is_empty()).then(|| r.value.clone());
    let final_key = final_key(&r.key, value.as_deref());
    let path = format!("{parent}.{final_key}");
    siblings.check_duplicate(&final_key, &path)?;

    let rate_limits = build_limits(r, &path)?;
    let concurrency = r
        .concurrency
        .as_ref()
        .map(|c| build_concurrency(c, &path))
        .transpose()?;
    let value_match = build_match(r, value.as_deref(), &path)?;
    if r.share_threshold && value_match == ValueMatch::Exact {
        // Go's text; a `match: cidr` node is also accepted (Tollgate extension).
        return Err(format!(
            "share_threshold can only be used with wildcard values (containing '*'), but found key '{final_key}'"
        ));
    }
    let normalize = build_normalize(r, &path)?;
    siblings.check_normalisation(&r.key, &normalize)?;
    let descriptors = build_level(&r.descriptors, &path)?;

    Ok(DescriptorConfig {
        key: r.key.clone(),
        value,
        value_match,
        rate_limits,
        concurrency,
        shadow_mode: r.shadow_mode,
        quota_mode: r.quota_mode,
        detailed_metric: r.detailed_metric,
        value_to_metric: r.value_to_metric,
        share_threshold: r.share_threshold,
        metadata: r.metadata.clone(),
        normalize,
        descriptors,
    })
}

fn build_limits(r: &RawDescriptor, path: &str) -> Result<Vec<RateLimitConfig>, String> {
    match (&r.rate_limit, &r.rate_limits) {
        (Some(_), Some(_)) => Err(format!(
            "descriptor '{path}' has both rate_limit and rate_limits; use only one of them"
        )),
        (None, None) | (Some(None), None) => Ok(Vec::new()),
        (Some(Some(limit)), None) => Ok(vec![build_limit(limit, path)?]),
        (None, Some(list)) => {
            if list.is_empty() {
                return Err(format!(
                    "rate_limits of descriptor '{path}' must be a non-empty list"
                ));
            }
            let mut seen = HashSet::new();
            let mut out = Vec::with_capacity(list.len());
            for limit in list {
                if limit.unlimited {
                    return Err(format!(
                        "rate_limits of descriptor '{path}' cannot contain an unlimited entry; \
                         use rate_limit with unlimited: true instead"
                    ));
                }
                let built = build_limit(limit, path)?;
                if let LimitPolicy::Limited(spec) = &built.policy {
                    // Two entries with the same window and algorithm would share one counter.
                    let id = (spec.algorithm.clone(), spec.unit, spec.unit_multiplier);
                    if !seen.insert(id) {
                        return Err(format!(
                            "rate_limits of descriptor '{path}' has two entries with the same \
                             algorithm ({}), unit ({}) and unit_multiplier ({})",
                            spec.algorithm.as_deref().unwrap_or("default"),
                            spec.unit.name(),
                            spec.unit_multiplier
                        ));
                    }
                }
                out.push(built);
            }
            Ok(out)
        }
    }
}

fn build_limit(l: &RawLimit, path: &str) -> Result<RateLimitConfig, String> {
    let unit = Unit::from_name(&l.unit);
    if l.unlimited {
        // Only a *valid* unit is an error with unlimited (Go).
        if unit.is_some() {
            return Err("should not specify rate limit unit when unlimited".to_owned());
        }
    } else if unit.is_none() {
        return Err(format!("invalid rate limit unit '{}'", l.unit));
    }
    for replaced in &l.replaces {
        if replaced.is_empty() {
            return Err("should not have an empty replaces entry".to_owned());
        }
        if *replaced == l.name {
            return Err("replaces should not contain name of same descriptor".to_owned());
        }
    }
    let failure_mode = build_failure_mode(l.failure_mode.as_deref(), path)?;
    let name = (!l.name.is_empty()).then(|| l.name.clone());
    let replaces = l.replaces.clone();

    let policy = match unit {
        // `unit.is_none()` with `unlimited` false was rejected above.
        Some(unit) if !l.unlimited => LimitPolicy::Limited(build_spec(l, unit, path)?),
        _ => {
            // These would be silently meaningless on an unlimited rule.
            for (key, set) in [
                ("algorithm", l.algorithm.is_some()),
                ("burst", l.burst.is_some()),
                ("unit_multiplier", l.unit_multiplier.is_some()),
            ] {
                if set {
                    return Err(format!(
                        "{key} cannot be used with unlimited: true (descriptor '{path}')"
                    ));
                }
            }
            LimitPolicy::Unlimited
        }
    };
    Ok(RateLimitConfig {
        name,
        replaces,
        failure_mode,
        policy,
    })
}

fn build_failure_mode(given: Option<&str>, path: &str) -> Result<Option<FailureMode>, String> {
    match given.map(str::to_ascii_lowercase) {
        None => Ok(None),
        Some(m) if m == "open" => Ok(Some(FailureMode::Open)),
        Some(m) if m == "closed" => Ok(Some(FailureMode::Closed)),
        Some(m) => Err(format!(
            "invalid failure_mode '{m}' in descriptor '{path}' (valid: open, closed)"
        )),
    }
}

fn build_concurrency(c: &RawConcurrency, path: &str) -> Result<ConcurrencyConfig, String> {
    let Some(max_in_flight) = c.max_in_flight else {
        return Err(format!("concurrency of descriptor '{path}' needs max_in_flight"));
    };
    if max_in_flight > MAX_IN_FLIGHT {
        return Err(format!(
            "max_in_flight {max_in_flight} in descriptor '{path}' exceeds {MAX_IN_FLIGHT}"
        ));
    }
    let lease_ttl = match c.lease_ttl.as_deref() {
        None => DEFAULT_LEASE_TTL,
        Some(text) => parse_lease_ttl(text).ok_or_else(|| {
            format!(
                "lease_ttl '{text}' in descriptor '{path}' must be a duration such as 30s or 500ms, \
                 between 1ms and {}",
                humantime::format_duration(MAX_LEASE_TTL)
            )
        })?,
    };
    Ok(ConcurrencyConfig {
        max_in_flight,
        lease_ttl,
        failure_mode: build_failure_mode(c.failure_mode.as_deref(), path)?,
    })
}

/// A `lease_ttl`: a duration with units (`30s`, `1m 30s`, `500ms`) or a bare number of seconds.
fn parse_lease_ttl(text: &str) -> Option<std::time::Duration> {
    let ttl = match text.trim().parse::<u64>() {
        Ok(seconds) => std::time::Duration::from_secs(seconds),
        Err(_) => humantime::parse_duration(text.trim()).ok()?,
    };
    (ttl >= std::time::Duration::from_millis(1) && ttl <= MAX_LEASE_TTL).then_some(ttl)
}

fn build_spec(l: &RawLimit, unit: Unit, path: &str) -> Result<LimitSpec, String> {
    let algorithm = match l.algorithm.as_deref().map(str::to_ascii_lowercase) {
        None => None,
        Some(a) if ALGORITHMS.contains(&a.as_str()) => Some(a),
        Some(a) => {
            return Err(format!(
                "unknown algorithm '{a}' in descriptor '{path}' (valid: {})",
                ALGORITHMS.join(", ")
            ));
        }
    };
    let unit_multiplier = l.unit_multiplier.unwrap_or(1);
    if unit_multiplier == 0 {
        return Err(format!(
            "unit_multiplier must be at least 1 in descriptor '{path}'"
        ));
    }
    if let Some(burst) = l.burst {
        if burst == 0 {
            return Err(format!("burst must be at least 1 in descriptor '{path}'"));
        }
        if let Some(a) = algorithm.as_deref()
            && !BURST_ALGORITHMS.contains(&a)
        {
            return Err(format!(
                "burst is only valid with algorithm {} (descriptor '{path}' uses '{a}')",
                BURST_ALGORITHMS.join(" or ")
            ));
        }
    }
    if algorithm.as_deref() == Some("sliding_log") && l.requests_per_unit > MAX_SLIDING_LOG_REQUESTS_PER_UNIT
    {
        return Err(format!(
            "sliding_log keeps one entry per request: requests_per_unit {} in descriptor '{path}' \
             exceeds MAX_SLIDING_LOG_REQUESTS_PER_UNIT ({MAX_SLIDING_LOG_REQUESTS_PER_UNIT}); \
             use sliding_window or gcra",
            l.requests_per_unit
        ));
    }
    Ok(LimitSpec {
        unit,
        unit_multiplier,
        requests_per_unit: l.requests_per_unit,
        algorithm,
        burst: l.burst,
    })
}

fn build_match(r: &RawDescriptor, value: Option<&str>, path: &str) -> Result<ValueMatch, String> {
    let wildcard = value.is_some_and(|v| v.contains('*'));
    match r.match_kind.as_deref().map(str::to_ascii_lowercase).as_deref() {
        None => Ok(if wildcard {
            ValueMatch::Wildcard
        } else {
            ValueMatch::Exact
        }),
        Some("exact") if wildcard => Err(format!(
            "match: exact cannot be used with a value containing '*' (descriptor '{path}')"
        )),
        Some("exact") => Ok(ValueMatch::Exact),
        Some("cidr") => {
            let Some(v) = value else {
                return Err(format!("match: cidr requires a value (descriptor '{path}')"));
            };
            v.parse::<IpNet>()
                .or_else(|_| v.parse::<IpAddr>().map(IpNet::from))
                // Host bits are dropped so equal networks compare equal.
                .map(|net| ValueMatch::Cidr(net.trunc()))
                .map_err(|_| {
                    format!("value '{v}' is not a CIDR or IP address (match: cidr, descriptor '{path}')")
                })
        }
        Some(other) => Err(format!(
            "unknown match '{other}' in descriptor '{path}' (valid: exact, cidr)"
        )),
    }
}

fn build_normalize(r: &RawDescriptor, path: &str) -> Result<Normalize, String> {
    let ip_prefix = match r.ip_prefix {
        None => None,
        Some((v4, v6)) => {
            let default = IpPrefix::default();
            let check = |name: &str, given: Option<u32>, max: u8| match given {
                None => Ok(max),
                Some(len) => u8::try_from(len).ok().filter(|l| *l <= max).ok_or_else(|| {
                    format!("ip_prefix {name} must be between 0 and {max}, got {len} (descriptor '{path}')")
                }),
            };
            Some(IpPrefix {
                v4: check("v4", v4, default.v4)?,
                v6: check("v6", v6, default.v6)?,
            })
        }
    };
    Ok(Normalize {
        lowercase: r.lowercase,
        trim: r.trim,
        ip_prefix,
        hash: r.hash,
    })
}

#[cfg(test)]
mod tests {
    use super::super::{ConfigError, parse_file};
    use super::*;

    const FILE: &str = "rules.yaml";

    fn ok(text: &str) -> DomainConfig {
        match parse_file(FILE, text) {
            Ok(c) => c,
            Err(e) => panic!("rejected: {e}"),
        }
    }

    fn err(text: &str) -> String {
        match parse_file(FILE, text) {
            Ok(c) => panic!("accepted: {c:?}"),
            Err(e) => {
                assert!(matches!(e, ConfigError::Invalid { ref file, .. } if file == FILE));
                e.to_string()
            }
        }
    }

    #[track_caller]
    fn assert_err(text: &str, message: &str) {
        assert_eq!(err(text), format!("{FILE}: {message}"));
    }

    /// Error for a single top-level descriptor written as YAML lines (indented by 4).
    #[track_caller]
    fn assert_descriptor_err(descriptor: &str, message: &str) {
        assert_err(&format!("domain: d\ndescriptors:\n  - {descriptor}\n"), message);
    }

    fn limited(unit: Unit, rpu: u32) -> RateLimitConfig {
        RateLimitConfig {
            name: None,
            replaces: vec![],
            failure_mode: None,
            policy: LimitPolicy::Limited(LimitSpec {
                unit,
                unit_multiplier: 1,
                requests_per_unit: rpu,
                algorithm: None,
                burst: None,
            }),
        }
    }

    fn node(key: &str, value: Option<&str>) -> DescriptorConfig {
        DescriptorConfig {
            key: key.into(),
            value: value.map(Into::into),
            value_match: if value.is_some_and(|v| v.contains('*')) {
                ValueMatch::Wildcard
            } else {
                ValueMatch::Exact
            },
            rate_limits: vec![],
            concurrency: None,
            shadow_mode: false,
            quota_mode: false,
            detailed_metric: false,
            value_to_metric: false,
            share_threshold: false,
            metadata: None,
            normalize: Normalize::default(),
            descriptors: vec![],
        }
    }

    fn with_limit(mut d: DescriptorConfig, l: RateLimitConfig) -> DescriptorConfig {
        d.rate_limits.push(l);
        d
    }

    fn with_children(mut d: DescriptorConfig, c: Vec<DescriptorConfig>) -> DescriptorConfig {
        d.descriptors = c;
        d
    }

    fn spec(c: &DomainConfig, path: &[usize]) -> LimitSpec {
        let mut d = &c.descriptors[path[0]];
        for i in &path[1..] {
            d = &d.descriptors[*i];
        }
        match &d.rate_limits[0].policy {
            LimitPolicy::Limited(s) => s.clone(),
            LimitPolicy::Unlimited => panic!("unlimited"),
        }
    }

    // ----- Go fixtures (reference §2.5) ------------------------------------------------------

    const BASIC: &str = r#"
# Equivalent of test/config/basic_config.yaml.
domain: test-domain
descriptors:
  # Top level key/value with no rate limit.
  - key: key1
    value: value1
    descriptors:
      # 2nd level key only with default rate limit.
      - key: subkey1
        rate_limit:
          unit: second
          requests_per_unit: 5
      # 2nd level key/value with limit. Specific override at 2nd level.
      - key: subkey1
        value: subvalue1
        rate_limit:
          unit: second
          requests_per_unit: 10

  # Top level key only with default rate limit.
  - key: key2
    rate_limit:
      unit: minute
      requests_per_unit: 20

  # Top level key/value with limit. Specific override at 1st level.
  - key: key2
    value: value2
    rate_limit:
      unit: MINUTE
      requests_per_unit: 30

  # Top level key/value with no limit (whitelist).
  - key: key2
    value: value3

  - key: key3
    rate_limit:
      unit: hour
      requests_per_unit: 1

  - key: key4
    rate_limit:
      unit: Day
      requests_per_unit: 1

  # A limit at an intermediate level plus children.
  - key: key5
    value: value5
    rate_limit:
      unit: second
      requests_per_unit: 5
    descriptors:
      - key: subkey5
        value: subvalue
        rate_limit:
          unit: second
          requests_per_unit: 10
"#;

    #[test]
    fn basic_config_model() {
        let c = ok(BASIC);
        let expected = DomainConfig {
            domain: "test-domain".into(),
            file: FILE.into(),
            all_or_nothing: false,
            descriptors: vec![
                with_children(
                    node("key1", Some("value1")),
                    vec![
                        with_limit(node("subkey1", None), limited(Unit::Second, 5)),
                        with_limit(node("subkey1", Some("subvalue1")), limited(Unit::Second, 10)),
                    ],
                ),
                with_limit(node("key2", None), limited(Unit::Minute, 20)),
                with_limit(node("key2", Some("value2")), limited(Unit::Minute, 30)),
                node("key2", Some("value3")),
                with_limit(node("key3", None), limited(Unit::Hour, 1)),
                with_limit(node("key4", None), limited(Unit::Day, 1)),
                with_children(
                    with_limit(node("key5", Some("value5")), limited(Unit::Second, 5)),
                    vec![with_limit(
                        node("subkey5", Some("subvalue")),
                        limited(Unit::Second, 10),
                    )],
                ),
            ],
        };
        assert_eq!(c, expected);
    }

    #[test]
    fn concurrency_rules() {
        let c = ok(
            "domain: d\ndescriptors:\n  - key: export\n    concurrency: {max_in_flight: 20, lease_ttl: 30s}\n  - key: job\n    concurrency: {max_in_flight: 0, failure_mode: open}\n    rate_limit: {unit: minute, requests_per_unit: 5}\n",
        );
        assert_eq!(
            c.descriptors[0].concurrency,
            Some(ConcurrencyConfig {
                max_in_flight: 20,
                lease_ttl: std::time::Duration::from_secs(30),
                failure_mode: None,
            })
        );
        let job = c.descriptors[1].concurrency.expect("job has a concurrency rule");
        assert_eq!((job.max_in_flight, job.lease_ttl), (0, DEFAULT_LEASE_TTL));
        assert_eq!(job.failure_mode, Some(FailureMode::Open));
        assert_eq!(c.descriptors[1].rate_limits.len(), 1);
        assert_eq!(
            parse_lease_ttl("1m 30s"),
            Some(std::time::Duration::from_secs(90))
        );
        assert_eq!(parse_lease_ttl("45"), Some(std::time::Duration::from_secs(45)));
        assert_eq!(
            parse_lease_ttl("500ms"),
            Some(std::time::Duration::from_millis(500))
        );
        for bad in ["0s", "25h", "soon", "", "-3s"] {
            assert_eq!(parse_lease_ttl(bad), None, "{bad}");
        }
    }

    #[test]
    fn concurrency_errors() {
        assert_descriptor_err(
            "{key: k, concurrency: {lease_ttl: 5s}}",
            "concurrency of descriptor 'd.k' needs max_in_flight",
        );
        assert_descriptor_err(
            "{key: k, concurrency: {max_in_flight: 100001}}",
            "max_in_flight 100001 in descriptor 'd.k' exceeds 100000",
        );
        assert_descriptor_err(
            "{key: k, concurrency: {max_in_flight: 2, lease_ttl: forever}}",
            "lease_ttl 'forever' in descriptor 'd.k' must be a duration such as 30s or 500ms, between 1ms and 1day",
        );
        assert_descriptor_err(
            "{key: k, concurrency: {max_in_flight: 2, failure_mode: maybe}}",
            "invalid failure_mode 'maybe' in descriptor 'd.k' (valid: open, closed)",
        );
    }

    #[test]
    fn bad_yaml() {
        let e = err("domain: test-domain\ndescriptors:\n  - key: [unclosed\n");
        assert!(
            e.starts_with(&format!("{FILE}: error loading config file: ")),
            "{e}"
        );
        assert!(!e.contains('\n'), "one-line message: {e}");
        let e = err("domain: d\n  key: x\n bad indentation: [\n");
        assert!(e.starts_with(&format!("{FILE}: error loading config file: ")));
    }

    #[test]
    fn non_string_key() {
        assert_err(
            "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n    rate_limit:\n      unit: day\n      4: 5\n",
            "config error, key is not of type string: 4",
        );
        assert_err(
            "domain: d\ntrue: x\n",
            "config error, key is not of type string: true",
        );
    }

    #[test]
    fn misspelled_keys() {
        assert_err(
            "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n    ratelimit:\n      unit: day\n      requests_per_unit: 5\n",
            "config error, unknown key 'ratelimit'",
        );
        assert_err(
            "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n    rate_limit:\n      unit: day\n      requestsperunit: 5\n",
            "config error, unknown key 'requestsperunit'",
        );
        // Keys are case-sensitive.
        assert_err("Domain: d\n", "config error, unknown key 'Domain'");
        // Metadata contents are free-form, but the key itself is checked.
        assert_err(
            "domain: d\ndescriptors:\n  - key: k\n    meta: {a: 1}\n",
            "config error, unknown key 'meta'",
        );
    }

    #[test]
    fn non_map_list() {
        assert_err(
            "domain: test-domain\ndescriptors:\n  - a\n  - b\n",
            "config error, yaml file contains list of type other than map: a",
        );
        assert_err(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      replaces: [x]\n",
            "config error, yaml file contains list of type other than map: x",
        );
    }

    #[test]
    fn unsupported_leaf_types() {
        assert_descriptor_err(
            "key: k\n    rate_limit: {unit: second, requests_per_unit: 1.5}",
            "error checking config",
        );
        assert_descriptor_err("key: k\n    value: 1e3", "error checking config");
        assert_err(
            "domain: d\ndescriptors:\n  - key: k\n    value: .nan\n",
            "error checking config",
        );
    }

    #[test]
    fn requests_per_unit_out_of_range() {
        for bad in ["-1", "4294967296", "99999999999999999999"] {
            let text = format!(
                "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: {bad}\n"
            );
            let e = err(&text);
            if bad == "99999999999999999999" {
                // Beyond int64 yaml.v2 produces a float, rejected by the validator.
                assert_eq!(e, format!("{FILE}: error checking config"));
                continue;
            }
            assert_eq!(
                e,
                format!(
                    "{FILE}: error loading config file: line 6: cannot unmarshal !!int `{bad}` into uint32 (requests_per_unit must be between 0 and 4294967295)"
                )
            );
        }
        let c = ok(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 4294967295}\n",
        );
        assert_eq!(spec(&c, &[0]).requests_per_unit, u32::MAX);
    }

    #[test]
    fn type_mismatches() {
        assert_descriptor_err(
            "key: k\n    rate_limit: {unit: second, requests_per_unit: \"10\"}",
            "error loading config file: line 4: cannot unmarshal !!str `10` into uint32 (key 'requests_per_unit')",
        );
        assert_descriptor_err(
            "key: k\n    shadow_mode: 1",
            "error loading config file: line 4: cannot unmarshal !!int `1` into bool (key 'shadow_mode')",
        );
        assert_descriptor_err(
            "key: {}",
            "error loading config file: line 3: cannot unmarshal !!map into string (key 'key')",
        );
        assert_descriptor_err(
            "key: k\n    rate_limit: second",
            "error loading config file: line 4: cannot unmarshal !!str `second` into a mapping (key 'rate_limit')",
        );
        assert_err(
            "domain: d\ndescriptors: oops\n",
            "error loading config file: line 2: cannot unmarshal !!str `oops` into a list (key 'descriptors')",
        );
        let e = err("[domain, d]\n");
        assert!(e.starts_with(&format!(
            "{FILE}: error loading config file: line 1: cannot unmarshal !!seq"
        )));
    }

    #[test]
    fn empty_domain() {
        assert_err(
            "domain: \"\"\ndescriptors:\n  - key: k\n",
            "config file cannot have empty domain",
        );
        assert_err(
            "descriptors:\n  - key: k\n",
            "config file cannot have empty domain",
        );
        assert_err("", "config file cannot have empty domain");
        assert_err("# only a comment\n", "config file cannot have empty domain");
    }

    #[test]
    fn empty_key() {
        assert_err(
            "domain: test-domain\ndescriptors:\n  - key: key1\n    descriptors:\n      - value: v\n        rate_limit: {unit: second, requests_per_unit: 1}\n",
            "descriptor has empty key",
        );
        assert_descriptor_err("key: ~", "descriptor has empty key");
    }

    #[test]
    fn duplicate_key() {
        assert_err(
            "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n  - key: key1\n    value: value1\n",
            "duplicate descriptor composite key 'test-domain.key1_value1'",
        );
        assert_err(
            "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n    descriptors:\n      - key: subkey1\n      - key: subkey1\n",
            "duplicate descriptor composite key 'test-domain.key1_value1.subkey1'",
        );
        // The well-known surprise: two windows on one key need rate_limits (or two keys).
        assert_err(
            "domain: d\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: user\n    rate_limit: {unit: day, requests_per_unit: 100}\n",
            "duplicate descriptor composite key 'd.user'",
        );
        // Go's finalKey collision: key "a_b" vs key "a" + value "b".
        assert_err(
            "domain: d\ndescriptors:\n  - key: a_b\n  - key: a\n    value: b\n",
            "duplicate descriptor composite key 'd.a_b'",
        );
        // An empty value is no value.
        assert_err(
            "domain: d\ndescriptors:\n  - key: a\n  - key: a\n    value: \"\"\n",
            "duplicate descriptor composite key 'd.a'",
        );
    }

    #[test]
    fn duplicate_in_children_reported_before_later_sibling() {
        // Go loads a node's children before looking at the next sibling.
        assert_err(
            "domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - key: c\n      - key: c\n  - key: a\n",
            "duplicate descriptor composite key 'd.a.c'",
        );
    }

    #[test]
    fn bad_limit_unit() {
        for (unit, shown) in [("foo", "foo"), ("UNKNOWN", "UNKNOWN"), ("~", ""), ("", "")] {
            assert_descriptor_err(
                &format!("key: k\n    rate_limit:\n      unit: {unit}\n      requests_per_unit: 5"),
                &format!("invalid rate limit unit '{shown}'"),
            );
        }
        assert_descriptor_err(
            "key: k\n    rate_limit:\n      requests_per_unit: 5",
            "invalid rate limit unit ''",
        );
    }

    #[test]
    fn unlimited_with_unit() {
        assert_descriptor_err(
            "key: k\n    rate_limit:\n      unlimited: true\n      unit: second\n      requests_per_unit: 5",
            "should not specify rate limit unit when unlimited",
        );
        // Missing or invalid units are fine with unlimited.
        for unit in ["", "\n      unit: foo", "\n      unit: unknown"] {
            let c = ok(&format!(
                "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unlimited: true{unit}\n"
            ));
            assert_eq!(c.descriptors[0].rate_limits[0].policy, LimitPolicy::Unlimited);
        }
    }

    #[test]
    fn replaces_errors() {
        assert_descriptor_err(
            "key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 5\n      name: a\n      replaces:\n        - name: \"\"",
            "should not have an empty replaces entry",
        );
        assert_descriptor_err(
            "key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 5\n      replaces:\n        - {}",
            "should not have an empty replaces entry",
        );
        assert_descriptor_err(
            "key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 5\n      name: a\n      replaces:\n        - name: b\n        - name: a",
            "replaces should not contain name of same descriptor",
        );
    }

    #[test]
    fn share_threshold_requires_wildcard() {
        assert_descriptor_err(
            "key: path\n    value: /foo\n    share_threshold: true",
            "share_threshold can only be used with wildcard values (containing '*'), but found key 'path_/foo'",
        );
        assert_descriptor_err(
            "key: path\n    share_threshold: true",
            "share_threshold can only be used with wildcard values (containing '*'), but found key 'path'",
        );
        let c = ok(
            "domain: d\ndescriptors:\n  - key: path\n    value: /foo/*\n    share_threshold: true\n    rate_limit: {unit: minute, requests_per_unit: 5}\n",
        );
        assert!(c.descriptors[0].share_threshold);
        assert_eq!(c.descriptors[0].value_match, ValueMatch::Wildcard);
    }

    #[test]
    fn metadata() {
        let c = ok(r#"
domain: d
descriptors:
  - key: k
    metadata:
      team: payments
      weight: 1.5
      count: 3
      enabled: yes
      none: ~
      tags: [a, 2]
      nested: {x: {y: z}}
      7: seven
"#);
        let m = c.descriptors[0].metadata.clone().unwrap_or_default();
        assert_eq!(m.get("team"), Some(&MetaValue::String("payments".into())));
        assert_eq!(m.get("weight"), Some(&MetaValue::Float(1.5)));
        assert_eq!(m.get("count"), Some(&MetaValue::Int(3)));
        assert_eq!(m.get("enabled"), Some(&MetaValue::Bool(true)));
        assert_eq!(m.get("none"), Some(&MetaValue::Null));
        assert_eq!(
            m.get("tags"),
            Some(&MetaValue::List(vec![
                MetaValue::String("a".into()),
                MetaValue::Int(2)
            ]))
        );
        assert_eq!(m.get("7"), Some(&MetaValue::String("seven".into())));
        let inner = BTreeMap::from([("y".to_owned(), MetaValue::String("z".into()))]);
        assert_eq!(
            m.get("nested"),
            Some(&MetaValue::Map(BTreeMap::from([(
                "x".to_owned(),
                MetaValue::Map(inner)
            )])))
        );
        assert_eq!(
            ok("domain: d\ndescriptors:\n  - key: k\n    metadata: ~\n").descriptors[0].metadata,
            None
        );
        assert_descriptor_err(
            "key: k\n    metadata: {a: {~: 1}}",
            "error parsing metadata: key is not of type string: <nil>",
        );
        assert_descriptor_err(
            "key: k\n    metadata: [a]",
            "error loading config file: line 4: cannot unmarshal !!seq into a mapping (key 'metadata')",
        );
    }

    // ----- Accepted configurations -----------------------------------------------------------

    #[test]
    fn accepted_go_variants() {
        let c = ok(r#"
---
domain: d
descriptors:
  - key: no_rpu
    rate_limit:
      unit: second
  - key: placeholder
  - key: null_limit
    rate_limit:
  - key: a
    value: v
    domain: ignored-inside-descriptor
    descriptors:
      - key: a
        value: v
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: b
    descriptors:
      - key: a
        value: v
"#);
        assert_eq!(spec(&c, &[0]).requests_per_unit, 0);
        assert!(c.descriptors[1].rate_limits.is_empty());
        assert!(c.descriptors[2].rate_limits.is_empty());
        assert_eq!(c.descriptors[3].descriptors[0].value.as_deref(), Some("v"));
        assert_eq!(c.descriptors[4].descriptors[0].key, "a");
    }

    #[test]
    fn scalars_in_string_fields_keep_their_spelling() {
        let c = ok(
            "domain: 123\ndescriptors:\n  - key: on\n    value: 0x1F\n  - key: flag\n    value: Yes\n  - key: octal\n    value: 010\n",
        );
        assert_eq!(c.domain, "123");
        assert_eq!(c.descriptors[0].key, "on");
        assert_eq!(c.descriptors[0].value.as_deref(), Some("0x1F"));
        assert_eq!(c.descriptors[1].value.as_deref(), Some("Yes"));
        assert_eq!(c.descriptors[2].value.as_deref(), Some("010"));
    }

    #[test]
    fn value_kinds_without_collision() {
        let c = ok(
            "domain: d\ndescriptors:\n  - key: k\n  - key: k\n    value: exact\n  - key: k\n    value: \"foo*bar*\"\n",
        );
        let kinds: Vec<_> = c
            .descriptors
            .iter()
            .map(|d| (d.value.clone(), d.value_match.clone()))
            .collect();
        assert_eq!(
            kinds,
            vec![
                (None, ValueMatch::Exact),
                (Some("exact".into()), ValueMatch::Exact),
                (Some("foo*bar*".into()), ValueMatch::Wildcard),
            ]
        );
    }

    #[test]
    fn unlimited_and_replaces() {
        let c = ok(r#"
domain: d
descriptors:
  - key: ldap
    rate_limit:
      unlimited: true
      name: ldap_unlimited
  - key: user
    rate_limit:
      unit: minute
      requests_per_unit: 10
      name: ""
      replaces:
        - name: global
        - name: other
"#);
        assert_eq!(
            c.descriptors[0].rate_limits[0],
            RateLimitConfig {
                name: Some("ldap_unlimited".into()),
                replaces: vec![],
                failure_mode: None,
                policy: LimitPolicy::Unlimited,
            }
        );
        let user = &c.descriptors[1].rate_limits[0];
        assert_eq!(user.name, None);
        assert_eq!(user.replaces, vec!["global".to_owned(), "other".to_owned()]);
    }

    #[test]
    fn per_node_flags() {
        let c = ok(
            "domain: d\nall_or_nothing: true\ndescriptors:\n  - key: k\n    shadow_mode: true\n    quota_mode: true\n    detailed_metric: true\n    value_to_metric: true\n",
        );
        assert!(c.all_or_nothing);
        let d = &c.descriptors[0];
        assert!(d.shadow_mode && d.quota_mode && d.detailed_metric && d.value_to_metric);
        assert!(!d.share_threshold);
    }

    // ----- README examples -------------------------------------------------------------------

    #[test]
    fn readme_examples() {
        let per_ip = ok(r#"
domain: edge_proxy_per_ip
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 10

  # Black list IP
  - key: remote_address
    value: 50.0.0.5
    rate_limit:
      unit: second
      requests_per_unit: 0
"#);
        assert_eq!(spec(&per_ip, &[0]).requests_per_unit, 10);
        assert_eq!(per_ip.descriptors[1].value.as_deref(), Some("50.0.0.5"));
        assert_eq!(spec(&per_ip, &[1]).requests_per_unit, 0);

        let nested = ok(r#"
domain: messaging
descriptors:
  # Only allow 5 marketing messages a day
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit:
          unit: day
          requests_per_unit: 5

  # Only allow 100 messages a day to any unique phone number
  - key: to_number
    rate_limit:
      unit: day
      requests_per_unit: 100
"#);
        assert_eq!(spec(&nested, &[0, 0]).requests_per_unit, 5);
        assert_eq!(spec(&nested, &[1]).unit, Unit::Day);

        let wildcard = ok(r#"
domain: example_wildcard
descriptors:
  - key: path
    value: "/foo/*"
    rate_limit:
      unit: minute
      requests_per_unit: 20
  - key: path
    value: "/foo/bar"
    rate_limit:
      unit: minute
      requests_per_unit: 10
"#);
        assert_eq!(wildcard.descriptors[0].value_match, ValueMatch::Wildcard);
        assert_eq!(wildcard.descriptors[1].value_match, ValueMatch::Exact);

        let unlimited = ok(r#"
domain: internal
descriptors:
  - key: ldap
    rate_limit:
      unlimited: true

  - key: azure
    rate_limit:
      unit: minute
      requests_per_unit: 100
"#);
        assert_eq!(
            unlimited.descriptors[0].rate_limits[0].policy,
            LimitPolicy::Unlimited
        );
    }

    #[test]
    fn readme_replaces_example() {
        let c = ok(r#"
domain: example7
descriptors:
  - key: key1
    value: value1
    descriptors:
      - key: key2
        value: value2
        rate_limit:
          requests_per_unit: 10
          unit: second
          name: "ratelimit_1"
  - key: key3
    value: value3
    rate_limit:
      requests_per_unit: 20
      unit: second
      replaces:
        - name: "ratelimit_1"
"#);
        assert_eq!(
            c.descriptors[0].descriptors[0].rate_limits[0].name.as_deref(),
            Some("ratelimit_1")
        );
        assert_eq!(c.descriptors[1].rate_limits[0].replaces, vec!["ratelimit_1"]);
    }

    #[test]
    fn readme_shadow_mode_example() {
        let c = ok(r#"
domain: example5
descriptors:
  - key: key
    value: value
    shadow_mode: true
    rate_limit:
      unit: minute
      requests_per_unit: 5
"#);
        assert!(c.descriptors[0].shadow_mode);
    }

    // ----- Tollgate extensions ---------------------------------------------------------------

    #[test]
    fn extension_rate_limits() {
        let c = ok(r#"
domain: d
descriptors:
  - key: user
    rate_limits:
      - unit: second
        requests_per_unit: 10
        algorithm: GCRA
        burst: 5
        failure_mode: open
      - unit: day
        requests_per_unit: 1000
        unit_multiplier: 7
        algorithm: sliding_window
        name: daily
        failure_mode: Closed
      - unit: day
        requests_per_unit: 100000
        algorithm: sliding_log
"#);
        let limits = &c.descriptors[0].rate_limits;
        assert_eq!(limits.len(), 3);
        assert_eq!(
            limits[0],
            RateLimitConfig {
                name: None,
                replaces: vec![],
                failure_mode: Some(FailureMode::Open),
                policy: LimitPolicy::Limited(LimitSpec {
                    unit: Unit::Second,
                    unit_multiplier: 1,
                    requests_per_unit: 10,
                    algorithm: Some("gcra".into()),
                    burst: Some(5),
                }),
            }
        );
        assert_eq!(limits[1].failure_mode, Some(FailureMode::Closed));
        assert_eq!(limits[1].name.as_deref(), Some("daily"));
        match &limits[1].policy {
            LimitPolicy::Limited(s) => {
                assert_eq!(s.unit_multiplier, 7);
                assert_eq!(s.window_seconds(), 7 * 86_400);
            }
            LimitPolicy::Unlimited => panic!("unlimited"),
        }
    }

    #[test]
    fn extension_rate_limits_errors() {
        assert_descriptor_err(
            "key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n    rate_limits:\n      - {unit: day, requests_per_unit: 1}",
            "descriptor 'd.k' has both rate_limit and rate_limits; use only one of them",
        );
        assert_descriptor_err(
            "key: k\n    rate_limits: []",
            "rate_limits of descriptor 'd.k' must be a non-empty list",
        );
        assert_descriptor_err(
            "key: k\n    rate_limits: ~",
            "rate_limits of descriptor 'd.k' must be a non-empty list",
        );
        assert_descriptor_err(
            "key: k\n    rate_limits: [1]",
            "config error, yaml file contains list of type other than map: 1",
        );
        assert_descriptor_err(
            "key: k\n    rate_limits:\n      - {unlimited: true}",
            "rate_limits of descriptor 'd.k' cannot contain an unlimited entry; use rate_limit with unlimited: true instead",
        );
        assert_descriptor_err(
            "key: k\n    rate_limits:\n      - {unit: minute, requests_per_unit: 1}\n      - {unit: minute, requests_per_unit: 5}",
            "rate_limits of descriptor 'd.k' has two entries with the same algorithm (default), unit (MINUTE) and unit_multiplier (1)",
        );
        assert_descriptor_err(
            "key: k\n    rate_limits:\n      - {unit: minute, requests_per_unit: 1, algorithm: gcra}\n      - {unit: MINUTE, requests_per_unit: 5, algorithm: Gcra, unit_multiplier: 1}",
            "rate_limits of descriptor 'd.k' has two entries with the same algorithm (gcra), unit (MINUTE) and unit_multiplier (1)",
        );
        // Same unit with a different multiplier or algorithm is fine.
        ok(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limits:\n      - {unit: minute, requests_per_unit: 1}\n      - {unit: minute, requests_per_unit: 5, unit_multiplier: 5}\n      - {unit: minute, requests_per_unit: 5, algorithm: gcra}\n",
        );
        // Go checks still apply inside rate_limits.
        assert_descriptor_err(
            "key: k\n    rate_limits:\n      - {unit: fortnight}",
            "invalid rate limit unit 'fortnight'",
        );
    }

    #[test]
    fn extension_limit_errors() {
        let limit =
            |extra: &str| format!("key: k\n    rate_limit: {{unit: second, requests_per_unit: 10, {extra}}}");
        assert_descriptor_err(
            &limit("algorithm: leaky_bucket"),
            "unknown algorithm 'leaky_bucket' in descriptor 'd.k' (valid: fixed_window, sliding_window, sliding_log, token_bucket, gcra)",
        );
        assert_descriptor_err(
            &limit("unit_multiplier: 0"),
            "unit_multiplier must be at least 1 in descriptor 'd.k'",
        );
        assert_descriptor_err(&limit("burst: 0"), "burst must be at least 1 in descriptor 'd.k'");
        assert_descriptor_err(
            &limit("burst: 3, algorithm: fixed_window"),
            "burst is only valid with algorithm token_bucket or gcra (descriptor 'd.k' uses 'fixed_window')",
        );
        assert_descriptor_err(
            &limit("burst: -3"),
            "error loading config file: line 4: cannot unmarshal !!int `-3` into uint32 (burst must be between 0 and 4294967295)",
        );
        assert_descriptor_err(
            &limit("failure_mode: maybe"),
            "invalid failure_mode 'maybe' in descriptor 'd.k' (valid: open, closed)",
        );
        assert_descriptor_err(
            "key: k\n    rate_limit: {unit: second, requests_per_unit: 100001, algorithm: sliding_log}",
            "sliding_log keeps one entry per request: requests_per_unit 100001 in descriptor 'd.k' exceeds MAX_SLIDING_LOG_REQUESTS_PER_UNIT (100000); use sliding_window or gcra",
        );
        for key in ["algorithm: gcra", "burst: 2", "unit_multiplier: 2"] {
            let name = key.split(':').next().unwrap_or_default();
            assert_descriptor_err(
                &format!("key: k\n    rate_limit: {{unlimited: true, {key}}}"),
                &format!("{name} cannot be used with unlimited: true (descriptor 'd.k')"),
            );
        }
        // burst without an algorithm is left to the service default.
        let c = ok(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, burst: 4, algorithm: token_bucket}\n  - key: j\n    rate_limit: {unit: second, requests_per_unit: 1, burst: 4}\n",
        );
        assert_eq!(spec(&c, &[0]).burst, Some(4));
        assert_eq!(spec(&c, &[1]).algorithm, None);
        // Failure mode is allowed on unlimited rules (it is simply never needed).
        let c = ok(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, failure_mode: open}\n",
        );
        assert_eq!(
            c.descriptors[0].rate_limits[0].failure_mode,
            Some(FailureMode::Open)
        );
    }

    #[test]
    fn extension_match_cidr() {
        let c = ok(r#"
domain: d
descriptors:
  - key: remote_address
    value: 10.1.2.3/8
    match: cidr
    share_threshold: true
    rate_limit: {unit: second, requests_per_unit: 100}
  - key: remote_address
    value: 192.168.0.1
    match: CIDR
  - key: remote_address
    value: "2001:db8::/32"
    match: cidr
  - key: remote_address
    value: 10.0.0.1
    match: exact
"#);
        let net = |s: &str| match s.parse::<ipnet::IpNet>() {
            Ok(n) => ValueMatch::Cidr(n),
            Err(e) => panic!("{e}"),
        };
        let m: Vec<_> = c.descriptors.iter().map(|d| d.value_match.clone()).collect();
        assert_eq!(
            m,
            vec![
                net("10.0.0.0/8"),
                net("192.168.0.1/32"),
                net("2001:db8::/32"),
                ValueMatch::Exact
            ]
        );
        assert_eq!(c.descriptors[0].value.as_deref(), Some("10.1.2.3/8"));
        assert!(c.descriptors[0].share_threshold);
    }

    #[test]
    fn extension_match_errors() {
        assert_descriptor_err(
            "key: ip\n    match: cidr",
            "match: cidr requires a value (descriptor 'd.ip')",
        );
        assert_descriptor_err(
            "key: ip\n    value: 10.0.0.0/33\n    match: cidr",
            "value '10.0.0.0/33' is not a CIDR or IP address (match: cidr, descriptor 'd.ip_10.0.0.0/33')",
        );
        assert_descriptor_err(
            "key: ip\n    value: \"10.*\"\n    match: cidr",
            "value '10.*' is not a CIDR or IP address (match: cidr, descriptor 'd.ip_10.*')",
        );
        assert_descriptor_err(
            "key: ip\n    value: \"a*\"\n    match: exact",
            "match: exact cannot be used with a value containing '*' (descriptor 'd.ip_a*')",
        );
        assert_descriptor_err(
            "key: ip\n    value: a\n    match: regex",
            "unknown match 'regex' in descriptor 'd.ip_a' (valid: exact, cidr)",
        );
    }

    #[test]
    fn extension_normalisation() {
        let c = ok(r#"
domain: d
descriptors:
  - key: user
    lowercase: true
    trim: true
    hash: true
  - key: user
    value: admin
    lowercase: true
    trim: true
    hash: true
  - key: user
    value: bob
  - key: ip
    ip_prefix: {v4: 24}
  - key: ip6
    ip_prefix: {v6: 64, v4: 0}
"#);
        let n: Vec<_> = c.descriptors.iter().map(|d| d.normalize.clone()).collect();
        let all = Normalize {
            lowercase: true,
            trim: true,
            ip_prefix: None,
            hash: true,
        };
        assert_eq!(n[0], all);
        assert_eq!(n[1], all);
        assert!(n[2].is_none());
        assert_eq!(n[3].ip_prefix, Some(IpPrefix { v4: 24, v6: 128 }));
        assert_eq!(n[4].ip_prefix, Some(IpPrefix { v4: 0, v6: 64 }));
    }

    #[test]
    fn extension_normalisation_errors() {
        assert_err(
            "domain: d\ndescriptors:\n  - key: user\n    lowercase: true\n  - key: user\n    value: x\n    trim: true\n",
            "conflicting value normalisation for key 'user'",
        );
        // Different keys or different parents do not conflict.
        ok(
            "domain: d\ndescriptors:\n  - key: a\n    lowercase: true\n  - key: b\n    trim: true\n  - key: c\n    descriptors:\n      - key: a\n        trim: true\n",
        );
        assert_descriptor_err(
            "key: ip\n    ip_prefix: {v4: 33}",
            "ip_prefix v4 must be between 0 and 32, got 33 (descriptor 'd.ip')",
        );
        assert_descriptor_err(
            "key: ip\n    ip_prefix: {v6: 300}",
            "ip_prefix v6 must be between 0 and 128, got 300 (descriptor 'd.ip')",
        );
        assert_descriptor_err(
            "key: ip\n    ip_prefix: 24",
            "error loading config file: line 4: cannot unmarshal !!int `24` into a mapping (key 'ip_prefix')",
        );
        assert_descriptor_err(
            "key: ip\n    ip_prefix: {v4: 24, v5: 1}",
            "config error, unknown key 'v5'",
        );
    }

    #[test]
    fn extension_all_or_nothing_must_be_bool() {
        assert_err(
            "domain: d\nall_or_nothing: sometimes\n",
            "error loading config file: line 2: cannot unmarshal !!str `sometimes` into bool (key 'all_or_nothing')",
        );
        // Flat allow-list: accepted (and ignored) below the top level.
        assert!(!ok("domain: d\ndescriptors:\n  - key: k\n    all_or_nothing: true\n").all_or_nothing);
    }
}
