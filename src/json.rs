//! The proto3 JSON form of Envoy's rate limit messages (camelCase names, enum names, zero values
//! omitted, durations as `"58s"`), as envoyproxy/ratelimit's `/json` endpoint speaks it.

use base64::Engine as _;
use prost_types::value::Kind;
use serde_json::{Map, Value, json};

use crate::proto::rls::RateLimitResponse;
use crate::proto::rls::rate_limit_response::rate_limit::Unit as WireUnit;
use crate::proto::rls::rate_limit_response::{Code as WireCode, DescriptorStatus};

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

fn duration_text(d: &prost_types::Duration) -> String {
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
