//! Envoy's rate limit messages (`envoy.service.ratelimit.v3`) ↔ the [`Limiter`], with no transport:
//! the gRPC service ([`crate::grpc`]) and the HTTP `/json` endpoint ([`crate::http`]) both call
//! [`EnvoyApi`], so both decide and answer exactly alike; each maps a [`LimiterError`] to its own
//! status codes.
//!
//! This is where the neutral verdict takes Envoy's shape, exactly as envoyproxy/ratelimit's, because
//! Envoy derives its `x-ratelimit-*` headers from it: `current_limit` and `duration_until_reset` are
//! present exactly when a limit applied; `limit_remaining` is clamped to `u32`, 0 when over or
//! unmatched and `u32::MAX` when unlimited; `duration_until_reset` is rounded up to whole seconds.

use std::collections::BTreeMap;
use std::sync::Arc;

use prost_types::{ListValue, Struct, Value, value::Kind};

use super::headers::{HeaderOptions, headers, raw_body};
use super::whole_seconds;
use crate::proto::descriptor::RateLimitDescriptor;
use crate::proto::descriptor::rate_limit_descriptor::Entry;
use crate::proto::envoy::config::core::v3::HeaderValue;
use crate::proto::rls::rate_limit_response::{self, DescriptorStatus as WireStatus, RateLimit};
use crate::proto::rls::{RateLimitRequest, RateLimitResponse};
use tollgate_core::limiter::{
    Code, DescriptorStatus, LimitOverride, Limiter, LimiterError, RequestDescriptor, Verdict,
};
use tollgate_core::rules::DescriptorEntry;
use tollgate_core::rules::file::MetaValue;
use tollgate_core::store::Store;

/// What the Envoy front end adds to a verdict.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EnvoyOptions {
    /// Rate-limit headers and the 429 body to hand Envoy.
    pub headers: HeaderOptions,
    /// Return dynamic metadata (`RESPONSE_DYNAMIC_METADATA`).
    pub dynamic_metadata: bool,
}

/// Envoy's `ShouldRateLimit` over a limiter.
#[derive(Debug)]
pub struct EnvoyApi<S> {
    limiter: Arc<Limiter<S>>,
    options: EnvoyOptions,
}

impl<S> EnvoyApi<S> {
    /// Serves `limiter` to Envoy; answers carry what `options` adds (headers, dynamic metadata).
    pub fn new(limiter: Arc<Limiter<S>>, options: EnvoyOptions) -> Self {
        Self { limiter, options }
    }
}

impl<S: Store> EnvoyApi<S> {
    /// `ShouldRateLimit`: decide every descriptor of `request` and answer as envoyproxy/ratelimit does.
    pub async fn should_rate_limit(
        &self,
        request: &RateLimitRequest,
    ) -> Result<RateLimitResponse, LimiterError> {
        let verdict = self
            .limiter
            .should_rate_limit(&request.domain, &request.descriptors, request.hits_addend)
            .await?;
        Ok(build_response(request, verdict, &self.options))
    }
}

impl RequestDescriptor for RateLimitDescriptor {
    type Entry = Entry;

    fn entries(&self) -> &[Entry] {
        &self.entries
    }

    fn limit_override(&self) -> Option<LimitOverride> {
        self.limit.as_ref().map(|l| LimitOverride {
            requests_per_unit: l.requests_per_unit,
            unit: l.unit,
        })
    }

    fn hits_addend(&self) -> Option<u64> {
        self.hits_addend
    }
}

impl DescriptorEntry for Entry {
    fn key(&self) -> &str {
        &self.key
    }
    fn value(&self) -> &str {
        &self.value
    }
}

/// Builds the wire response for a verdict.
fn build_response(request: &RateLimitRequest, verdict: Verdict, options: &EnvoyOptions) -> RateLimitResponse {
    let response_headers_to_add = headers(verdict.overall, &verdict.statuses, &options.headers)
        .into_iter()
        .map(|(key, value)| HeaderValue {
            key,
            value,
            raw_value: Vec::new(),
        })
        .collect();
    let raw_body = raw_body(verdict.overall, &verdict.statuses, &options.headers);
    let dynamic_metadata = options
        .dynamic_metadata
        .then(|| dynamic_metadata(request, &verdict.statuses));
    RateLimitResponse {
        overall_code: wire_code(verdict.overall),
        statuses: verdict.statuses.iter().map(wire_status).collect(),
        response_headers_to_add,
        raw_body,
        dynamic_metadata,
        ..Default::default()
    }
}

fn wire_code(code: Code) -> i32 {
    match code {
        Code::Ok => rate_limit_response::Code::Ok as i32,
        Code::OverLimit => rate_limit_response::Code::OverLimit as i32,
    }
}

/// One descriptor's status as Envoy reads it.
pub fn wire_status(status: &DescriptorStatus) -> WireStatus {
    WireStatus {
        code: wire_code(status.code),
        current_limit: status.current_limit().map(|limit| RateLimit {
            name: limit.name.as_deref().unwrap_or_default().to_owned(),
            requests_per_unit: limit.requests_per_unit,
            // Tollgate's Unit uses the numbering of RateLimitResponse.RateLimit.Unit.
            unit: limit.unit as i32,
        }),
        limit_remaining: u32::try_from(status.remaining).unwrap_or(u32::MAX),
        duration_until_reset: status.until_reset().map(|d| prost_types::Duration {
            seconds: i64::try_from(whole_seconds(d)).unwrap_or(i64::MAX),
            nanos: 0,
        }),
        quota: None,
    }
}

/// envoyproxy/ratelimit's dynamic metadata: the domain, each descriptor's entries (`k=v`), override and
/// hits, the request-level hits, and the merged `metadata` of the rules whose descriptors passed
/// (first value wins on conflicts, nested maps merged).
fn dynamic_metadata(request: &RateLimitRequest, statuses: &[DescriptorStatus]) -> Struct {
    let mut fields = BTreeMap::new();
    fields.insert("domain".to_owned(), string_value(&request.domain));
    let descriptors = request.descriptors.iter().map(descriptor_metadata).collect();
    fields.insert("descriptors".to_owned(), list_value(descriptors));
    if request.hits_addend != 0 {
        fields.insert(
            "hitsAddend".to_owned(),
            number_value(f64::from(request.hits_addend)),
        );
    }
    let mut merged = BTreeMap::new();
    for status in statuses.iter().filter(|s| s.code == Code::Ok) {
        if let Some(metadata) = status.rule.as_ref().and_then(|r| r.metadata.as_ref()) {
            merge_first_wins(&mut merged, metadata);
        }
    }
    if !merged.is_empty() {
        fields.insert("metadata".to_owned(), struct_value(meta_struct(&merged)));
    }
    Struct {
        fields: fields.into_iter().collect(),
    }
}

fn descriptor_metadata(d: &RateLimitDescriptor) -> Value {
    let mut fields = BTreeMap::new();
    let entries = d
        .entries
        .iter()
        .map(|e| string_value(&format!("{}={}", e.key, e.value)))
        .collect();
    fields.insert("entries".to_owned(), list_value(entries));
    if let Some(limit) = &d.limit {
        let unit = crate::proto::envoy::r#type::v3::RateLimitUnit::try_from(limit.unit)
            .map_or_else(|_| limit.unit.to_string(), |u| u.as_str_name().to_owned());
        let text = format!("requests_per_unit:{} unit:{unit}", limit.requests_per_unit);
        fields.insert("limit".to_owned(), string_value(&text));
    }
    if let Some(hits) = d.hits_addend {
        // Struct numbers are doubles; counts beyond 2^53 lose precision, as in any JSON consumer.
        fields.insert("hitsAddend".to_owned(), number_value(hits as f64));
    }
    struct_value(Struct {
        fields: fields.into_iter().collect(),
    })
}

fn merge_first_wins(into: &mut BTreeMap<String, MetaValue>, from: &BTreeMap<String, MetaValue>) {
    for (key, value) in from {
        match (into.get_mut(key), value) {
            (Some(MetaValue::Map(existing)), MetaValue::Map(incoming)) => {
                merge_first_wins(existing, incoming)
            }
            (Some(_), _) => {}
            (None, _) => {
                into.insert(key.clone(), value.clone());
            }
        }
    }
}

fn meta_struct(map: &BTreeMap<String, MetaValue>) -> Struct {
    Struct {
        fields: map.iter().map(|(k, v)| (k.clone(), meta_value(v))).collect(),
    }
}

fn meta_value(value: &MetaValue) -> Value {
    let kind = match value {
        MetaValue::Null => Kind::NullValue(0),
        MetaValue::Bool(b) => Kind::BoolValue(*b),
        MetaValue::Int(i) => Kind::NumberValue(*i as f64),
        MetaValue::Float(f) => Kind::NumberValue(*f),
        MetaValue::String(s) => Kind::StringValue(s.clone()),
        MetaValue::List(items) => Kind::ListValue(ListValue {
            values: items.iter().map(meta_value).collect(),
        }),
        MetaValue::Map(map) => Kind::StructValue(meta_struct(map)),
    };
    Value { kind: Some(kind) }
}

fn string_value(s: &str) -> Value {
    Value {
        kind: Some(Kind::StringValue(s.to_owned())),
    }
}

fn number_value(n: f64) -> Value {
    Value {
        kind: Some(Kind::NumberValue(n)),
    }
}

fn list_value(values: Vec<Value>) -> Value {
    Value {
        kind: Some(Kind::ListValue(ListValue { values })),
    }
}

fn struct_value(s: Struct) -> Value {
    Value {
        kind: Some(Kind::StructValue(s)),
    }
}
