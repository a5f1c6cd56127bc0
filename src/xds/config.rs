//! Rules delivered over xDS: `ratelimit.config.ratelimit.v3.RateLimitConfig` resources, each one
//! domain's tree, turned into the raw form a rules file decodes to and validated by the same code with
//! the same messages (as envoyproxy/ratelimit converts them to its YAML structures). The config's `name`
//! stands where a file name would in errors.
//!
//! Only the Go fields exist in the proto, so Tollgate's extensions (other algorithms, failure modes,
//! normalisation) are not available to rules pushed this way.

use std::collections::BTreeMap;

use prost_types::value::Kind;

use tollgate_core::rules::file::{
    ConfigError, DomainConfig, MetaValue, RawDescriptor, RawLimit, RawRoot, by_domain, validate_raw,
};

use crate::proto::rls_config::{RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit};

/// Validates rule sets pushed over xDS into one config per domain, with the checks and messages of
/// files (each config's `name` standing for the file name) and the same per-domain merging as a rules
/// directory.
///
/// The configs are consumed, each freed once converted.
pub(super) fn load_xds(
    configs: Vec<RateLimitConfig>,
    merge_domains: bool,
) -> Result<Vec<DomainConfig>, ConfigError> {
    let named = configs.into_iter().map(|config| {
        let name = config.name.clone();
        Ok((name, parse_config(config)?))
    });
    by_domain(named, merge_domains)
}

/// Validates one pushed config, as a file is validated.
fn parse_config(config: RateLimitConfig) -> Result<DomainConfig, ConfigError> {
    let raw = RawRoot {
        domain: config.domain,
        all_or_nothing: false,
        descriptors: config.descriptors.into_iter().map(descriptor).collect(),
    };
    validate_raw(raw, &config.name)
}

/// The raw form of `d`, its strings moved, not copied.
fn descriptor(d: RateLimitDescriptor) -> RawDescriptor {
    RawDescriptor {
        key: d.key,
        value: d.value,
        rate_limit: d.rate_limit.as_ref().map(|policy| Some(limit(policy))),
        rate_limits: None,
        concurrency: None,
        shadow_mode: d.shadow_mode,
        quota_mode: d.quota_mode,
        detailed_metric: d.detailed_metric,
        value_to_metric: false,
        share_threshold: false,
        metadata: d.metadata.as_ref().map(|s| map(&s.fields)),
        lowercase: false,
        trim: false,
        hash: false,
        ip_prefix: None,
        match_kind: None,
        descriptors: d.descriptors.into_iter().map(descriptor).collect(),
    }
}

fn limit(policy: &RateLimitPolicy) -> RawLimit {
    // The enum's name, as Go's `Unit.String()` gives it: `UNKNOWN` and numbers outside the enum are then
    // refused by the unit check files go through ("invalid rate limit unit").
    let unit = RateLimitUnit::try_from(policy.unit)
        .map_or_else(|_| policy.unit.to_string(), |u| u.as_str_name().to_owned());
    RawLimit {
        unit,
        requests_per_unit: policy.requests_per_unit,
        unlimited: policy.unlimited,
        name: policy.name.clone(),
        replaces: policy.replaces.iter().map(|r| r.name.clone()).collect(),
        algorithm: None,
        burst: None,
        unit_multiplier: None,
        failure_mode: None,
    }
}

fn map(fields: &BTreeMap<String, prost_types::Value>) -> BTreeMap<String, MetaValue> {
    fields.iter().map(|(k, v)| (k.clone(), value(v))).collect()
}

fn value(v: &prost_types::Value) -> MetaValue {
    match &v.kind {
        None | Some(Kind::NullValue(_)) => MetaValue::Null,
        Some(Kind::BoolValue(b)) => MetaValue::Bool(*b),
        Some(Kind::NumberValue(n)) => MetaValue::Float(*n),
        Some(Kind::StringValue(s)) => MetaValue::String(s.clone()),
        Some(Kind::ListValue(list)) => MetaValue::List(list.values.iter().map(value).collect()),
        Some(Kind::StructValue(s)) => MetaValue::Map(map(&s.fields)),
    }
}
