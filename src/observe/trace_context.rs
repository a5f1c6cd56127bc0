//! The caller's trace context, from request metadata: W3C Trace Context (`traceparent`, with
//! `tracestate`), else B3 as Envoy sends it with Zipkin tracing, in its single-header form (`b3`) or
//! its multi-header form (`x-b3-traceid`, `x-b3-spanid`, `x-b3-sampled`, `x-b3-flags`).
//!
//! What comes out is the parent of the server span, when the caller gave one, and the caller's
//! sampling decision, when it made one (B3 may carry a decision with no ids: `b3: 0`).

use opentelemetry::propagation::{Extractor, TextMapPropagator as _};
use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt as _, TraceFlags, TraceId, TraceState};
use opentelemetry_sdk::propagation::TraceContextPropagator;

/// The caller's side of a trace.
#[derive(Debug, Clone, PartialEq)]
pub struct Parent {
    /// The caller's span, to be the server span's parent.
    pub span: Option<SpanContext>,
    /// Whether the caller sampled the trace; `None` leaves the decision to this service.
    pub sampled: Option<bool>,
}

impl Parent {
    /// The context a server span is parented to (empty when the caller gave no span).
    pub fn context(&self) -> opentelemetry::Context {
        match &self.span {
            Some(span) => opentelemetry::Context::new().with_remote_span_context(span.clone()),
            None => opentelemetry::Context::new(),
        }
    }
}

/// Reads the caller's trace context from `headers`; `None` when it sent none that parses.
pub fn extract(headers: &dyn Extractor) -> Option<Parent> {
    if headers.get("traceparent").is_some() {
        let context = TraceContextPropagator::new().extract(headers);
        let span = context.span().span_context().clone();
        if span.is_valid() {
            return Some(Parent {
                sampled: Some(span.is_sampled()),
                span: Some(span),
            });
        }
    }
    match headers.get("b3") {
        Some(single) => b3_single(single),
        None => b3_multi(headers),
    }
}

/// `b3: {trace id}-{span id}[-{sampling}[-{parent span id}]]`, or a sampling decision alone.
fn b3_single(value: &str) -> Option<Parent> {
    let parts: Vec<&str> = value.trim().split('-').collect();
    match parts.as_slice() {
        [decision] => Some(Parent {
            span: None,
            sampled: Some(b3_sampled(decision)?),
        }),
        [trace, span, rest @ ..] => {
            let sampled = match rest.first() {
                Some(decision) => Some(b3_sampled(decision)?),
                None => None,
            };
            Some(Parent {
                span: Some(span_context(trace, span, sampled)?),
                sampled,
            })
        }
        [] => None,
    }
}

/// `x-b3-traceid` and `x-b3-spanid`, with `x-b3-sampled` (`1`/`0`, `true`/`false`) or
/// `x-b3-flags: 1` (debug: sampled).
fn b3_multi(headers: &dyn Extractor) -> Option<Parent> {
    let sampled = match (headers.get("x-b3-flags"), headers.get("x-b3-sampled")) {
        (Some("1"), _) => Some(true),
        (_, Some(decision)) => Some(b3_sampled(decision)?),
        _ => None,
    };
    let span = match (headers.get("x-b3-traceid"), headers.get("x-b3-spanid")) {
        (Some(trace), Some(span)) => Some(span_context(trace, span, sampled)?),
        _ => None,
    };
    (span.is_some() || sampled.is_some()).then_some(Parent { span, sampled })
}

/// B3's sampling states: `1`/`true` and `d` (debug) sample, `0`/`false` do not.
fn b3_sampled(decision: &str) -> Option<bool> {
    match decision.trim() {
        "1" | "true" | "d" => Some(true),
        "0" | "false" => Some(false),
        _ => None,
    }
}

/// A remote span context from B3 ids: a 64-bit trace id is the low half of a 128-bit one.
fn span_context(trace: &str, span: &str, sampled: Option<bool>) -> Option<SpanContext> {
    let trace = trace.trim();
    let trace = match trace.len() {
        16 => format!("{trace:0>32}"),
        32 => trace.to_owned(),
        _ => return None,
    };
    let (trace, span) = (
        TraceId::from_hex(&trace).ok()?,
        SpanId::from_hex(span.trim()).ok()?,
    );
    let flags = if sampled == Some(true) {
        TraceFlags::SAMPLED
    } else {
        TraceFlags::default()
    };
    let context = SpanContext::new(trace, span, flags, true, TraceState::default());
    context.is_valid().then_some(context)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn parent(headers: &[(&str, &str)]) -> Option<Parent> {
        let headers: HashMap<String, String> = headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        extract(&headers)
    }

    fn ids(parent: &Parent) -> (String, String) {
        let span = parent.span.as_ref().expect("a span");
        (span.trace_id().to_string(), span.span_id().to_string())
    }

    #[test]
    fn w3c_comes_first() {
        let found = parent(&[
            (
                "traceparent",
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            ),
            ("b3", "0"),
        ])
        .expect("parent");
        assert_eq!(found.sampled, Some(true));
        assert_eq!(
            ids(&found),
            (
                "4bf92f3577b34da6a3ce929d0e0e4736".into(),
                "00f067aa0ba902b7".into()
            )
        );
        let unsampled = parent(&[(
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00",
        )]);
        assert_eq!(unsampled.expect("parent").sampled, Some(false));
    }

    #[test]
    fn b3_single_header_forms() {
        let found = parent(&[(
            "b3",
            "80f198ee56343ba864fe8b2a57d3eff7-e457b5a2e4d86bd1-1-05e3ac9a4f6e3b90",
        )])
        .expect("parent");
        assert_eq!(found.sampled, Some(true));
        assert_eq!(
            ids(&found),
            (
                "80f198ee56343ba864fe8b2a57d3eff7".into(),
                "e457b5a2e4d86bd1".into()
            )
        );
        let short = parent(&[("b3", "64fe8b2a57d3eff7-e457b5a2e4d86bd1")]).expect("parent");
        assert_eq!(ids(&short).0, "000000000000000064fe8b2a57d3eff7");
        assert_eq!(short.sampled, None, "no decision: this service decides");
        assert_eq!(
            parent(&[("b3", "0")]),
            Some(Parent {
                span: None,
                sampled: Some(false)
            })
        );
        assert_eq!(parent(&[("b3", "d")]).and_then(|p| p.sampled), Some(true));
        assert_eq!(parent(&[("b3", "not-a-trace")]), None);
        assert_eq!(parent(&[("b3", "zz")]), None);
    }

    #[test]
    fn b3_multi_header_forms() {
        let found = parent(&[
            ("x-b3-traceid", "80f198ee56343ba864fe8b2a57d3eff7"),
            ("x-b3-spanid", "e457b5a2e4d86bd1"),
            ("x-b3-sampled", "0"),
        ])
        .expect("parent");
        assert_eq!(found.sampled, Some(false));
        assert_eq!(ids(&found).1, "e457b5a2e4d86bd1");
        let debug = parent(&[
            ("x-b3-traceid", "80f198ee56343ba864fe8b2a57d3eff7"),
            ("x-b3-spanid", "e457b5a2e4d86bd1"),
            ("x-b3-flags", "1"),
        ]);
        assert_eq!(debug.and_then(|p| p.sampled), Some(true));
        assert_eq!(parent(&[]), None);
        assert_eq!(
            parent(&[("x-b3-traceid", "xyz"), ("x-b3-spanid", "e457b5a2e4d86bd1")]),
            None
        );
    }
}
