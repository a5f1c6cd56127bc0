//! Rules delivered over xDS: `ratelimit.config.ratelimit.v3.RateLimitConfig` resources, each one
//! domain's tree, turned into the raw form a rules file decodes to and validated by the same code with
//! the same messages (as envoyproxy/ratelimit converts them to its YAML structures). The config's `name`
//! stands where a file name would in errors.
//!
//! Only the Go fields exist in the proto, so Tollgate's extensions (other algorithms, failure modes,
//! normalisation) are not available to rules pushed this way.

use std::collections::BTreeMap;

use prost::Message as _;
use prost_types::value::Kind;

use tollgate_core::rules::file::{DomainConfig, MetaValue, RawDescriptor, RawLimit, by_domain, validate_raw};

use crate::proto::rls_config::{RateLimitDescriptor, RateLimitPolicy, RateLimitUnit};

/// A `RateLimitConfig` decoded one level deep: its top-level descriptors stay encoded (slices of the
/// pushed bytes), to be decoded one at a time as they are validated. The same fields and wire format
/// as the generated message; the whole decoded tree of 100,000 routes would be some 80 MB.
#[derive(prost::Message)]
struct ShallowConfig {
    /// `name`.
    #[prost(string, tag = "1")]
    name: String,
    /// `domain`.
    #[prost(string, tag = "2")]
    domain: String,
    /// `descriptors`, each still encoded.
    #[prost(bytes = "bytes", repeated, tag = "3")]
    descriptors: Vec<bytes::Bytes>,
}

/// Decodes and validates pushed configs (`RateLimitConfig` messages as encoded) into one config per
/// domain, with the checks and messages of files (each config's `name` standing for the file name) and
/// the same per-domain merging as a rules directory. Each top-level descriptor is decoded, converted
/// and validated before the next is decoded, and each config's bytes are freed once it is validated.
/// So a descriptor that does not decode is reported when it is reached: an invalid descriptor before
/// it is reported first.
pub(super) fn load_encoded(
    configs: impl IntoIterator<Item = bytes::Bytes>,
    merge_domains: bool,
) -> Result<Vec<DomainConfig>, String> {
    let mut failed = None;
    let named = configs.into_iter().map(|bytes| {
        let config = ShallowConfig::decode(bytes).map_err(|e| undecodable(&e))?;
        let descriptors = config.descriptors.into_iter().map(|bytes| {
            RateLimitDescriptor::decode(bytes).map_or_else(
                |e| {
                    failed.get_or_insert(e);
                    // Refused by validation ("empty key"), which stops there; the decode error is
                    // what is reported.
                    RawDescriptor::default()
                },
                descriptor,
            )
        });
        let validated = validate_raw(config.domain, false, descriptors, &config.name);
        match failed.take() {
            Some(e) => Err(undecodable(&e)),
            None => validated
                .map(|domain| (config.name, domain))
                .map_err(|e| e.to_string()),
        }
    });
    let named: Vec<_> = named.collect::<Result<_, String>>()?;
    by_domain(named.into_iter().map(Ok), merge_domains).map_err(|e| e.to_string())
}

fn undecodable(error: &prost::DecodeError) -> String {
    format!("cannot decode a RateLimitConfig: {error}")
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
