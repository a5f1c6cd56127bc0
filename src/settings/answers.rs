//! What answers carry besides the decision: rate-limit headers, Envoy's dynamic metadata, a body for
//! 429s.

use super::HeaderStyles;
use super::SettingsError;
use super::source::{Go, Reader};

/// The answer settings.
#[derive(Debug, Clone)]
pub struct AnswerSettings {
    /// `LIMIT_RESPONSE_HEADERS_ENABLED`: the `RateLimit-Limit/Remaining/Reset` trio.
    pub limit_response_headers_enabled: bool,
    /// `LIMIT_LIMIT_HEADER`: the trio's limit header.
    pub limit_limit_header: String,
    /// `LIMIT_REMAINING_HEADER`: the trio's remaining header.
    pub limit_remaining_header: String,
    /// `LIMIT_RESET_HEADER`: the trio's reset header.
    pub limit_reset_header: String,
    /// Header styles to add, comma-separated: `ratelimit` (the trio), `x-ratelimit`, `ietf`,
    /// `retry-after`.
    pub response_headers: HeaderStyles,
    /// `RESPONSE_DYNAMIC_METADATA`: add dynamic metadata to Envoy's answers.
    pub response_dynamic_metadata: bool,
    /// A JSON body for 429 answers: `{"error":"rate_limited","retry_after":N}`.
    pub raw_body: bool,
}

impl AnswerSettings {
    pub(super) fn read(r: &mut Reader<'_>) -> Result<Self, SettingsError> {
        Ok(Self {
            limit_response_headers_enabled: r.get("limit_response_headers_enabled", Go::Same, false)?,
            limit_limit_header: r.get("limit_limit_header", Go::Same, "RateLimit-Limit".into())?,
            limit_remaining_header: r.get(
                "limit_remaining_header",
                Go::Same,
                "RateLimit-Remaining".into(),
            )?,
            limit_reset_header: r.get("limit_reset_header", Go::Same, "RateLimit-Reset".into())?,
            response_headers: r.get("response_headers", Go::None, HeaderStyles::default())?,
            response_dynamic_metadata: r.get("response_dynamic_metadata", Go::Same, false)?,
            raw_body: r.get("raw_body", Go::None, false)?,
        })
    }
}
