//! Rules files as the `RateLimitConfig`s a management server would push for them: what
//! `tollgate xds-serve` serves (so the same rules can be measured from a file and over xDS), and what
//! the wire-level test suites push when they run with their rules over xDS. Tooling beside
//! `loadgen`, not part of the server: the xDS client (`crate::xds`) never reads files.
//!
//! Only envoyproxy/ratelimit's fields exist in the proto. A file that uses anything else (a Tollgate
//! extension, metadata) has no xDS form: [`configs`] returns `None`.

use std::path::Path;

use crate::proto::rls_config::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitReplace, RateLimitUnit,
};
use serde_json::{Map, Value};

/// Every `*.yaml` file of `dir`, in name order, as a `RateLimitConfig` named after its file; `None` if
/// one of them has no xDS form.
pub fn configs(dir: &Path) -> Option<Vec<RateLimitConfig>> {
    let mut paths: Vec<_> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    paths.sort();
    paths
        .iter()
        .map(|path| {
            let text = std::fs::read_to_string(path).ok()?;
            let options = tollgate_core::rules::file::parser_options(text.len());
            let doc: Value = serde_saphyr::from_str_with_options(&text, options).ok()?;
            let root = only(&doc, &["domain", "descriptors"])?;
            Some(RateLimitConfig {
                name: path.file_name()?.to_string_lossy().into_owned(),
                domain: string(root.get("domain"))?,
                descriptors: descriptors(root.get("descriptors"))?,
            })
        })
        .collect()
}

/// The object's fields, if it has no others than `allowed`.
fn only<'a>(value: &'a Value, allowed: &[&str]) -> Option<&'a Map<String, Value>> {
    let map = value.as_object()?;
    map.keys().all(|k| allowed.contains(&k.as_str())).then_some(map)
}

/// A scalar as the Go service reads it into a string field; absent is empty.
fn string(value: Option<&Value>) -> Option<String> {
    match value {
        None | Some(Value::Null) => Some(String::new()),
        Some(Value::String(s)) => Some(s.clone()),
        Some(Value::Number(n)) => Some(n.to_string()),
        Some(Value::Bool(b)) => Some(b.to_string()),
        Some(_) => None,
    }
}

fn flag(value: Option<&Value>) -> Option<bool> {
    match value {
        None => Some(false),
        Some(v) => v.as_bool(),
    }
}

fn descriptors(value: Option<&Value>) -> Option<Vec<RateLimitDescriptor>> {
    let Some(value) = value else {
        return Some(Vec::new());
    };
    value
        .as_array()?
        .iter()
        .map(|d| {
            let d = only(
                d,
                &[
                    "key",
                    "value",
                    "rate_limit",
                    "descriptors",
                    "shadow_mode",
                    "detailed_metric",
                    "quota_mode",
                ],
            )?;
            Some(RateLimitDescriptor {
                key: string(d.get("key"))?,
                value: string(d.get("value"))?,
                rate_limit: match d.get("rate_limit") {
                    None | Some(Value::Null) => None,
                    Some(limit) => Some(policy(limit)?),
                },
                descriptors: descriptors(d.get("descriptors"))?,
                shadow_mode: flag(d.get("shadow_mode"))?,
                detailed_metric: flag(d.get("detailed_metric"))?,
                quota_mode: flag(d.get("quota_mode"))?,
                metadata: None,
            })
        })
        .collect()
}

fn policy(value: &Value) -> Option<RateLimitPolicy> {
    let limit = only(
        value,
        &["unit", "requests_per_unit", "unlimited", "name", "replaces"],
    )?;
    let unit = string(limit.get("unit"))?;
    let replaces = match limit.get("replaces") {
        None => Vec::new(),
        Some(list) => list
            .as_array()?
            .iter()
            .map(|r| {
                Some(RateLimitReplace {
                    name: string(only(r, &["name"])?.get("name"))?,
                })
            })
            .collect::<Option<_>>()?,
    };
    Some(RateLimitPolicy {
        unit: RateLimitUnit::from_str_name(&unit.to_ascii_uppercase())? as i32,
        requests_per_unit: match limit.get("requests_per_unit") {
            None => 0,
            Some(n) => u32::try_from(n.as_u64()?).ok()?,
        },
        unlimited: flag(limit.get("unlimited"))?,
        name: string(limit.get("name"))?,
        replaces,
    })
}
