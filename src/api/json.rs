//! The proto3 JSON form of Envoy's rate limit messages (camelCase names, enum names, zero values
//! omitted, durations as `"58s"`), as envoyproxy/ratelimit's `/json` endpoint speaks it. Requests are
//! read leniently, as proto3 JSON parsers do: original snake_case names as well as camelCase, 64-bit
//! integers as strings or numbers, enums by name or number.

use base64::Engine as _;
use prost_types::value::Kind;
use serde_json::{Map, Value, json};

use crate::proto::descriptor::RateLimitDescriptor;
use crate::proto::descriptor::rate_limit_descriptor::{Entry, RateLimitOverride};
use crate::proto::envoy::r#type::v3::RateLimitUnit;
use crate::proto::rls::rate_limit_response::rate_limit::Unit as WireUnit;
use crate::proto::rls::rate_limit_response::{Code as WireCode, DescriptorStatus};
use crate::proto::rls::{RateLimitRequest, RateLimitResponse};

/// Why a JSON request could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid RateLimitRequest JSON: {0}")]
pub struct JsonRequestError(String);

/// Reads a proto3 JSON `RateLimitRequest`.
pub fn request_from_json(body: &[u8]) -> Result<RateLimitRequest, JsonRequestError> {
    let value: Value = serde_json::from_slice(body).map_err(|e| JsonRequestError(e.to_string()))?;
    let object = value
        .as_object()
        .ok_or_else(|| JsonRequestError("expected a JSON object".into()))?;
    let descriptors = match field(object, "descriptors", "descriptors") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(items)) => items.iter().map(descriptor_from_json).collect::<Result<_, _>>()?,
        Some(_) => return Err(JsonRequestError("descriptors must be a list".into())),
    };
    Ok(RateLimitRequest {
        domain: string_field(object, "domain", "domain")?,
        descriptors,
        hits_addend: u32_field(object, "hitsAddend", "hits_addend")?,
    })
}

fn field<'a>(object: &'a Map<String, Value>, camel: &str, snake: &str) -> Option<&'a Value> {
    object.get(camel).or_else(|| object.get(snake))
}

fn string_field(object: &Map<String, Value>, camel: &str, snake: &str) -> Result<String, JsonRequestError> {
    match field(object, camel, snake) {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(_) => Err(JsonRequestError(format!("{camel} must be a string"))),
    }
}

/// A proto3 JSON integer: a number or a decimal string.
fn integer(value: &Value, name: &str) -> Result<u64, JsonRequestError> {
    let parsed = match value {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.parse().ok(),
        _ => None,
    };
    parsed.ok_or_else(|| JsonRequestError(format!("{name} must be a non-negative integer")))
}

fn u32_field(object: &Map<String, Value>, camel: &str, snake: &str) -> Result<u32, JsonRequestError> {
    match field(object, camel, snake) {
        None | Some(Value::Null) => Ok(0),
        Some(value) => u32::try_from(integer(value, camel)?)
            .map_err(|_| JsonRequestError(format!("{camel} does not fit in 32 bits"))),
    }
}

fn descriptor_from_json(value: &Value) -> Result<RateLimitDescriptor, JsonRequestError> {
    let object = value
        .as_object()
        .ok_or_else(|| JsonRequestError("a descriptor must be an object".into()))?;
    let entries = match field(object, "entries", "entries") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(items)) => items
            .iter()
            .map(|item| {
                let entry = item
                    .as_object()
                    .ok_or_else(|| JsonRequestError("an entry must be an object".into()))?;
                Ok(Entry {
                    key: string_field(entry, "key", "key")?,
                    value: string_field(entry, "value", "value")?,
                })
            })
            .collect::<Result<_, JsonRequestError>>()?,
        Some(_) => return Err(JsonRequestError("entries must be a list".into())),
    };
    let limit = match field(object, "limit", "limit") {
        None | Some(Value::Null) => None,
        Some(Value::Object(limit)) => Some(RateLimitOverride {
            requests_per_unit: u32_field(limit, "requestsPerUnit", "requests_per_unit")?,
            unit: unit_from_json(field(limit, "unit", "unit"))?,
        }),
        Some(_) => return Err(JsonRequestError("limit must be an object".into())),
    };
    let hits_addend = match field(object, "hitsAddend", "hits_addend") {
        None | Some(Value::Null) => None,
        Some(value) => Some(integer(value, "hitsAddend")?),
    };
    Ok(RateLimitDescriptor {
        entries,
        limit,
        hits_addend,
    })
}

fn unit_from_json(value: Option<&Value>) -> Result<i32, JsonRequestError> {
    match value {
        None | Some(Value::Null) => Ok(0),
        Some(Value::String(name)) => RateLimitUnit::from_str_name(name)
            .map(|u| u as i32)
            .ok_or_else(|| JsonRequestError(format!("unknown unit {name:?}"))),
        Some(value) => i32::try_from(integer(value, "unit")?)
            .map_err(|_| JsonRequestError("unit is out of range".into())),
    }
}

/// A response as proto3 JSON.
pub fn response_to_json(response: &RateLimitResponse) -> Value {
    let mut out = Map::new();
    if response.overall_code != 0 {
        out.insert("overallCode".into(), code_name(response.overall_code));
    }
    if !response.statuses.is_empty() {
        out.insert(
            "statuses".into(),
            response.statuses.iter().map(status_to_json).collect(),
        );
    }
    for (name, headers) in [
        ("responseHeadersToAdd", &response.response_headers_to_add),
        ("requestHeadersToAdd", &response.request_headers_to_add),
    ] {
        if !headers.is_empty() {
            let list = headers
                .iter()
                .map(|h| json!({"key": h.key, "value": h.value}))
                .collect();
            out.insert(name.into(), Value::Array(list));
        }
    }
    if !response.raw_body.is_empty() {
        let body = base64::engine::general_purpose::STANDARD.encode(&response.raw_body);
        out.insert("rawBody".into(), Value::String(body));
    }
    if let Some(metadata) = &response.dynamic_metadata {
        out.insert("dynamicMetadata".into(), struct_to_json(metadata));
    }
    Value::Object(out)
}

fn status_to_json(status: &DescriptorStatus) -> Value {
    let mut out = Map::new();
    if status.code != 0 {
        out.insert("code".into(), code_name(status.code));
    }
    if let Some(limit) = &status.current_limit {
        let mut l = Map::new();
        if !limit.name.is_empty() {
            l.insert("name".into(), Value::String(limit.name.clone()));
        }
        if limit.requests_per_unit != 0 {
            l.insert("requestsPerUnit".into(), json!(limit.requests_per_unit));
        }
        if limit.unit != 0 {
            let unit =
                WireUnit::try_from(limit.unit).map_or_else(|_| json!(limit.unit), |u| json!(u.as_str_name()));
            l.insert("unit".into(), unit);
        }
        out.insert("currentLimit".into(), Value::Object(l));
    }
    if status.limit_remaining != 0 {
        out.insert("limitRemaining".into(), json!(status.limit_remaining));
    }
    if let Some(d) = &status.duration_until_reset {
        out.insert("durationUntilReset".into(), Value::String(duration_text(d)));
    }
    Value::Object(out)
}

fn code_name(code: i32) -> Value {
    WireCode::try_from(code).map_or_else(|_| json!(code), |c| json!(c.as_str_name()))
}

/// A duration as proto3's JSON mapping writes it: seconds with a fractional part only when needed
/// (`"12s"`, `"1.5s"`).
pub fn duration_text(d: &prost_types::Duration) -> String {
    if d.nanos == 0 {
        return format!("{}s", d.seconds);
    }
    let fraction = format!("{:09}", d.nanos);
    format!("{}.{}s", d.seconds, fraction.trim_end_matches('0'))
}

fn struct_to_json(s: &prost_types::Struct) -> Value {
    Value::Object(
        s.fields
            .iter()
            .map(|(k, v)| (k.clone(), value_to_json(v)))
            .collect(),
    )
}

fn value_to_json(v: &prost_types::Value) -> Value {
    match &v.kind {
        None | Some(Kind::NullValue(_)) => Value::Null,
        Some(Kind::NumberValue(n)) => json!(n),
        Some(Kind::StringValue(s)) => Value::String(s.clone()),
        Some(Kind::BoolValue(b)) => Value::Bool(*b),
        Some(Kind::StructValue(s)) => struct_to_json(s),
        Some(Kind::ListValue(l)) => l.values.iter().map(value_to_json).collect(),
    }
}
