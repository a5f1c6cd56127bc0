//! The rules file's `proxy:` block (Tollgate): read from the YAML tree, checked and compiled into
//! [`ProxyRules`]. Envoy's field names and defaults, strictly: an unknown key, an action a proxy's
//! request cannot answer, a bad regex or a bound passed is an error naming where it is
//! (`proxy.rate_limits[1].actions[0].header_value_match: descriptor_value is required`).

use crate::rules::proxy::{
    Action, AddressSource, BadRequestAnswer, Cost, HeaderMatcher, MAX_ACTIONS, MAX_HITS_ADDEND,
    MAX_RATE_LIMITS, MAX_TRUSTED_HOPS, Pattern, ProxyRules, QueryMatcher, RateLimitActions, TextKind,
    TextMatch, ValueRule,
};

use super::yaml::{Node, Value};

/// Longest regex source accepted, and the most memory one compiled regex may take.
const MAX_REGEX_LEN: usize = 4096;
const MAX_REGEX_BYTES: usize = 1 << 20;

/// Most matchers in one `headers:` or `query_parameters:` list.
const MAX_MATCHERS: usize = 64;

type Read<T> = Result<T, String>;

/// The `proxy:` block at the root, if there is one.
pub(super) fn decode(block: Option<&Node>) -> Read<Option<ProxyRules>> {
    let Some(block) = block else {
        return Ok(None);
    };
    let map = Map::new(
        block,
        "proxy".into(),
        &["client_address", "failure_mode", "route_header", "rate_limits"],
    )?;
    let client_address = match map.get("client_address") {
        None => AddressSource::default(),
        Some(node) => client_address(node, map.child("client_address"))?,
    };
    let failure_mode = match map.string("failure_mode")?.as_deref() {
        None => None,
        Some("open") => Some(BadRequestAnswer::Open),
        Some("closed") => Some(BadRequestAnswer::Closed),
        Some(other) => {
            return Err(map.error(format!("failure_mode '{other}': expected open or closed")));
        }
    };
    let route_header = map
        .string("route_header")?
        .map(|name| header_name(&name, &map.child("route_header")))
        .transpose()?;
    let items = map.list("rate_limits")?.unwrap_or_default();
    if items.is_empty() {
        return Err(map.error("rate_limits is required: the descriptors a request makes".into()));
    }
    if items.len() > MAX_RATE_LIMITS {
        return Err(map.error(format!("rate_limits has more than {MAX_RATE_LIMITS} entries")));
    }
    let rate_limits = items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            rate_limit(
                item,
                map.child(&format!("rate_limits[{i}]")),
                route_header.is_some(),
            )
        })
        .collect::<Read<_>>()?;
    Ok(Some(ProxyRules {
        client_address,
        failure_mode,
        route_header,
        rate_limits,
    }))
}

fn client_address(node: &Node, path: String) -> Read<AddressSource> {
    let map = Map::new(node, path, &["x_forwarded_for", "header"])?;
    match (map.get("x_forwarded_for"), map.string("header")?) {
        (Some(xff), None) => {
            let xff = Map::new(xff, map.child("x_forwarded_for"), &["trusted_hops"])?;
            let hops = xff.int("trusted_hops")?.unwrap_or(1);
            match u8::try_from(hops) {
                Ok(hops @ 1..=MAX_TRUSTED_HOPS) => Ok(AddressSource::ForwardedFor { trusted_hops: hops }),
                _ => Err(xff.error(format!(
                    "trusted_hops must be between 1 (the proxy that asks Tollgate) and {MAX_TRUSTED_HOPS}"
                ))),
            }
        }
        (None, Some(name)) => Ok(AddressSource::Header(header_name(&name, &map.child("header"))?)),
        _ => Err(map.error("expected one of x_forwarded_for or header".into())),
    }
}

fn rate_limit(node: &Node, path: String, has_route_header: bool) -> Read<RateLimitActions> {
    let map = Map::new(
        node,
        path,
        &[
            "actions",
            "hits_addend",
            "stage",
            "disable_key",
            "limit",
            "apply_on_stream_done",
        ],
    )?;
    for envoy_only in ["stage", "disable_key", "limit", "apply_on_stream_done"] {
        if map.get(envoy_only).is_some() {
            return Err(map.error(format!(
                "{envoy_only} is Envoy's alone: a proxy's request cannot use it"
            )));
        }
    }
    let items = map.list("actions")?.unwrap_or_default();
    if items.is_empty() {
        return Err(map.error("actions is required and may not be empty".into()));
    }
    if items.len() > MAX_ACTIONS {
        return Err(map.error(format!("actions has more than {MAX_ACTIONS} entries")));
    }
    let actions = items
        .iter()
        .enumerate()
        .map(|(i, item)| action(item, map.child(&format!("actions[{i}]")), has_route_header))
        .collect::<Read<_>>()?;
    let hits_addend = map
        .get("hits_addend")
        .map(|node| cost(node, map.child("hits_addend")))
        .transpose()?;
    Ok(RateLimitActions { actions, hits_addend })
}

fn cost(node: &Node, path: String) -> Read<Cost> {
    let map = Map::new(node, path, &["number", "format"])?;
    match (map.int("number")?, map.string("format")?) {
        (Some(n), None) => u64::try_from(n)
            .ok()
            .filter(|n| *n <= MAX_HITS_ADDEND)
            .map(Cost::Number)
            .ok_or_else(|| map.error(format!("number must be between 0 and {MAX_HITS_ADDEND}"))),
        (None, Some(format)) => {
            let name = format
                .strip_prefix("%REQ(")
                .and_then(|rest| rest.strip_suffix(")%"))
                .filter(|name| !name.contains(['(', ')', '%', ':', '?']))
                .ok_or_else(|| {
                    map.error(
                        "format: only %REQ(header-name)% is supported (a request header's value)".into(),
                    )
                })?;
            Ok(Cost::Header(header_name(name, &map.child("format"))?))
        }
        _ => Err(map.error("hits_addend must contain either a format or a number".into())),
    }
}

/// Actions only Envoy can answer: a proxy's request carries none of what they read.
const ENVOY_ONLY_ACTIONS: [&str; 4] = ["source_cluster", "metadata", "dynamic_metadata", "extension"];

fn action(node: &Node, path: String, has_route_header: bool) -> Read<Action> {
    let Value::Map(entries) = &node.value else {
        return Err(format!("{path}: an action is a mapping with one key, its kind"));
    };
    let [(kind, body)] = entries.as_slice() else {
        return Err(format!("{path}: an action is a mapping with one key, its kind"));
    };
    let kind = kind.scalar_text().unwrap_or_default();
    let path = format!("{path}.{kind}");
    match kind.as_str() {
        "remote_address" => Map::new(body, path, &[]).map(|_| Action::RemoteAddress),
        "masked_remote_address" => {
            let map = Map::new(body, path, &["v4_prefix_mask_len", "v6_prefix_mask_len"])?;
            let len = |key: &str, max: u8| -> Read<u8> {
                match map.int(key)? {
                    None => Ok(max),
                    Some(n) => u8::try_from(n)
                        .ok()
                        .filter(|n| *n <= max)
                        .ok_or_else(|| map.error(format!("{key} must be between 0 and {max}"))),
                }
            };
            Ok(Action::MaskedRemoteAddress {
                v4: len("v4_prefix_mask_len", 32)?,
                v6: len("v6_prefix_mask_len", 128)?,
            })
        }
        "generic_key" => {
            let map = Map::new(body, path, &["descriptor_key", "descriptor_value"])?;
            Ok(Action::GenericKey {
                key: map
                    .string("descriptor_key")?
                    .unwrap_or_else(|| "generic_key".into()),
                value: map.required("descriptor_value")?,
            })
        }
        "request_headers" => {
            let map = Map::new(body, path, &["header_name", "descriptor_key", "skip_if_absent"])?;
            Ok(Action::RequestHeaders {
                header: header_name(&map.required("header_name")?, &map.child("header_name"))?,
                key: map.required("descriptor_key")?,
                skip_if_absent: map.bool("skip_if_absent")?.unwrap_or(false),
            })
        }
        "header_value_match" => {
            let (key, value, expect_match, headers) =
                match_action(body, path, "header_match", "headers", header_matcher)?;
            Ok(Action::HeaderValueMatch {
                key,
                value,
                expect_match,
                headers,
            })
        }
        "query_parameters" => {
            let map = Map::new(
                body,
                path,
                &["query_parameter_name", "descriptor_key", "skip_if_absent"],
            )?;
            Ok(Action::QueryParameters {
                name: map.required("query_parameter_name")?,
                key: map.required("descriptor_key")?,
                skip_if_absent: map.bool("skip_if_absent")?.unwrap_or(false),
            })
        }
        "query_parameter_value_match" => {
            let (key, value, expect_match, parameters) =
                match_action(body, path, "query_match", "query_parameters", query_matcher)?;
            Ok(Action::QueryParameterValueMatch {
                key,
                value,
                expect_match,
                parameters,
            })
        }
        "destination_cluster" => {
            Map::new(body, path.clone(), &[])?;
            if !has_route_header {
                return Err(format!(
                    "{path}: needs proxy.route_header, the header in which the proxy names its upstream"
                ));
            }
            Ok(Action::DestinationCluster)
        }
        envoy_only if ENVOY_ONLY_ACTIONS.contains(&envoy_only) => Err(format!(
            "{path}: reads what only Envoy knows; a proxy's request has none (docs/proxies.md lists the actions)"
        )),
        _ => Err(format!(
            "{path}: unknown action (remote_address, masked_remote_address, generic_key, request_headers, \
             header_value_match, query_parameters, query_parameter_value_match, destination_cluster)"
        )),
    }
}

/// What `header_value_match` and `query_parameter_value_match` hold: `descriptor_key` (`default_key`
/// when unset), `descriptor_value`, `expect_match` and the matchers under `list`, each read by `read`.
fn match_action<T>(
    body: &Node,
    path: String,
    default_key: &str,
    list: &str,
    read: fn(&Node, String) -> Read<T>,
) -> Read<(String, String, bool, Vec<T>)> {
    let map = Map::new(
        body,
        path,
        &["descriptor_key", "descriptor_value", "expect_match", list],
    )?;
    Ok((
        map.string("descriptor_key")?
            .unwrap_or_else(|| default_key.into()),
        map.required("descriptor_value")?,
        map.bool("expect_match")?.unwrap_or(true),
        map.matchers(list, read)?,
    ))
}

/// The forwarded headers Envoy's pseudo-headers are read from.
const PSEUDO_HEADERS: [(&str, &str); 4] = [
    (":method", "x-forwarded-method"),
    (":path", "x-forwarded-uri"),
    (":authority", "x-forwarded-host"),
    (":scheme", "x-forwarded-proto"),
];

fn header_matcher(node: &Node, path: String) -> Read<HeaderMatcher> {
    let map = Map::new(
        node,
        path,
        &[
            "name",
            "exact_match",
            "prefix_match",
            "suffix_match",
            "contains_match",
            "safe_regex_match",
            "range_match",
            "present_match",
            "string_match",
            "invert_match",
            "treat_missing_header_as_empty",
        ],
    )?;
    let name = map.required("name")?;
    let name = match PSEUDO_HEADERS.iter().find(|(pseudo, _)| *pseudo == name) {
        Some((_, forwarded)) => (*forwarded).to_owned(),
        None if name.starts_with(':') => {
            return Err(map.error(format!(
                "name '{name}': a proxy forwards only :method, :path, :authority and :scheme"
            )));
        }
        None => header_name(&name, &map.child("name"))?,
    };
    let text = |kind: fn(String) -> TextKind, key: &str| -> Read<Option<ValueRule>> {
        Ok(map.string(key)?.map(|p| {
            ValueRule::Text(TextMatch {
                kind: kind(p),
                ignore_case: false,
            })
        }))
    };
    let rules = [
        text(TextKind::Exact, "exact_match")?,
        text(TextKind::Prefix, "prefix_match")?,
        text(TextKind::Suffix, "suffix_match")?,
        text(TextKind::Contains, "contains_match")?,
        map.get("safe_regex_match")
            .map(|n| regex(n, map.child("safe_regex_match")))
            .transpose()?
            .map(|kind| {
                ValueRule::Text(TextMatch {
                    kind,
                    ignore_case: false,
                })
            }),
        map.get("string_match")
            .map(|n| string_match(n, map.child("string_match")).map(ValueRule::Text))
            .transpose()?,
        map.get("range_match")
            .map(|n| range(n, map.child("range_match")))
            .transpose()?,
        map.bool("present_match")?.map(ValueRule::Present),
    ];
    let mut given = rules.into_iter().flatten();
    // Envoy: a matcher with a name alone checks that the header is there.
    let rule = given.next().unwrap_or(ValueRule::Present(true));
    if given.next().is_some() {
        return Err(map.error("more than one way to match the header".into()));
    }
    Ok(HeaderMatcher {
        name,
        rule,
        invert: map.bool("invert_match")?.unwrap_or(false),
        treat_missing_as_empty: map.bool("treat_missing_header_as_empty")?.unwrap_or(false),
    })
}

fn query_matcher(node: &Node, path: String) -> Read<QueryMatcher> {
    let map = Map::new(node, path, &["name", "string_match", "present_match"])?;
    let name = map.required("name")?;
    let rule = match (map.get("string_match"), map.bool("present_match")?) {
        (Some(n), None) => Some(string_match(n, map.child("string_match"))?),
        (None, Some(true)) => None,
        _ => {
            return Err(map.error("expected one of string_match or present_match: true".into()));
        }
    };
    Ok(QueryMatcher { name, rule })
}

fn string_match(node: &Node, path: String) -> Read<TextMatch> {
    let map = Map::new(
        node,
        path,
        &[
            "exact",
            "prefix",
            "suffix",
            "contains",
            "safe_regex",
            "ignore_case",
        ],
    )?;
    let ignore_case = map.bool("ignore_case")?.unwrap_or(false);
    let folded = |p: String| if ignore_case { p.to_ascii_lowercase() } else { p };
    let kinds = [
        map.string("exact")?.map(|p| TextKind::Exact(folded(p))),
        map.string("prefix")?.map(|p| TextKind::Prefix(folded(p))),
        map.string("suffix")?.map(|p| TextKind::Suffix(folded(p))),
        map.string("contains")?.map(|p| TextKind::Contains(folded(p))),
        map.get("safe_regex")
            .map(|n| regex(n, map.child("safe_regex")))
            .transpose()?,
    ];
    let mut given = kinds.into_iter().flatten();
    let (Some(kind), None) = (given.next(), given.next()) else {
        return Err(map.error("expected one of exact, prefix, suffix, contains or safe_regex".into()));
    };
    Ok(TextMatch { kind, ignore_case })
}

fn regex(node: &Node, path: String) -> Read<TextKind> {
    let map = Map::new(node, path, &["regex", "google_re2"])?;
    let source = map.required("regex")?;
    if source.len() > MAX_REGEX_LEN {
        return Err(map.error(format!("regex is longer than {MAX_REGEX_LEN} bytes")));
    }
    // Envoy's regexes match the whole value.
    let regex = regex::RegexBuilder::new(&format!("^(?:{source})$"))
        .size_limit(MAX_REGEX_BYTES)
        .build()
        .map_err(|e| map.error(format!("regex does not compile: {e}")))?;
    Ok(TextKind::Regex(Pattern { source, regex }))
}

fn range(node: &Node, path: String) -> Read<ValueRule> {
    let map = Map::new(node, path, &["start", "end"])?;
    let (Some(start), Some(end)) = (map.int("start")?, map.int("end")?) else {
        return Err(map.error("start and end are required".into()));
    };
    if start >= end {
        return Err(map.error("start must be below end (the range is [start, end))".into()));
    }
    Ok(ValueRule::Range { start, end })
}

/// A header name as HTTP allows it (a token), lowercase.
fn header_name(name: &str, path: &str) -> Read<String> {
    let token = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    if name.is_empty() || !name.bytes().all(token) {
        return Err(format!("{path}: '{name}' is not a header name"));
    }
    Ok(name.to_ascii_lowercase())
}

/// A mapping of the block, with the keys it allows and its place for messages. Null stands for an
/// empty mapping (`remote_address:` with nothing after it is `remote_address: {}`).
struct Map<'n> {
    entries: &'n [(Node, Node)],
    path: String,
}

impl<'n> Map<'n> {
    fn new(node: &'n Node, path: String, allowed: &[&str]) -> Read<Self> {
        let entries: &[(Node, Node)] = match &node.value {
            Value::Map(entries) => entries,
            Value::Null => &[],
            _ => return Err(format!("{path}: expected a mapping")),
        };
        for (key, _) in entries {
            let known = matches!(&key.value, Value::Str(k) if allowed.contains(&k.as_str()));
            if !known {
                let key = key.scalar_text().unwrap_or_default();
                return Err(format!("{path}: unknown key '{key}'"));
            }
        }
        Ok(Self { entries, path })
    }

    fn get(&self, key: &str) -> Option<&'n Node> {
        super::yaml::lookup(self.entries, key)
    }

    fn child(&self, key: &str) -> String {
        format!("{}.{key}", self.path)
    }

    fn error(&self, message: String) -> String {
        format!("{}: {message}", self.path)
    }

    /// A scalar as text (`2024` is `"2024"`); null is absent.
    fn string(&self, key: &str) -> Read<Option<String>> {
        match self.get(key) {
            None => Ok(None),
            Some(n) if n.value == Value::Null => Ok(None),
            Some(n) => n
                .scalar_text()
                .map(Some)
                .ok_or_else(|| self.error(format!("{key} must be a string"))),
        }
    }

    /// A non-empty string that must be there.
    fn required(&self, key: &str) -> Read<String> {
        self.string(key)?
            .filter(|s| !s.is_empty())
            .ok_or_else(|| self.error(format!("{key} is required")))
    }

    fn bool(&self, key: &str) -> Read<Option<bool>> {
        match self.get(key).map(|n| &n.value) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(_) => Err(self.error(format!("{key} must be true or false"))),
        }
    }

    fn int(&self, key: &str) -> Read<Option<i64>> {
        match self.get(key).map(|n| &n.value) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Int(i)) => Ok(Some(*i)),
            Some(_) => Err(self.error(format!("{key} must be a whole number"))),
        }
    }

    fn list(&self, key: &str) -> Read<Option<&'n [Node]>> {
        match self.get(key).map(|n| &n.value) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Seq(items)) => Ok(Some(items)),
            Some(_) => Err(self.error(format!("{key} must be a list"))),
        }
    }

    /// The non-empty list of matchers under `key`, each read by `read`.
    fn matchers<T>(&self, key: &str, read: fn(&Node, String) -> Read<T>) -> Read<Vec<T>> {
        let items = self.list(key)?.unwrap_or_default();
        if items.is_empty() || items.len() > MAX_MATCHERS {
            return Err(self.error(format!("{key} needs between 1 and {MAX_MATCHERS} entries")));
        }
        items
            .iter()
            .enumerate()
            .map(|(i, item)| read(item, format!("{}.{key}[{i}]", self.path)))
            .collect()
    }
}
