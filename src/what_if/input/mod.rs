//! Log lines into [`Record`]s: a request as a proxy saw it (Envoy's and NGINX's access logs, text or
//! JSON), which the rules' `proxy:` block turns into descriptors, or a decision as Tollgate saw it (its
//! own decision log), descriptors and all.
//!
//! A request is presented as the forward-auth endpoint sees one: its method, URI and host as
//! `X-Forwarded-Method`, `-Uri` and `-Host`, `X-Forwarded-For` as logged, and any other header the
//! log holds; where the log names the client's address itself (NGINX's `$remote_addr`), that address
//! is the client.

mod decisions;
mod json;
mod text;

pub(crate) use json::Fields;

use std::borrow::Cow;
use std::net::IpAddr;
use std::sync::Arc;

use tollgate_core::rules::proxy::{AddressSource, BadRequest, ProxiedRequest};

/// The formats `--format` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum LogFormat {
    /// Envoy's default access log format (text).
    Envoy,
    /// NGINX's `combined` format.
    Nginx,
    /// One JSON object per line: Envoy's `json_format`, NGINX's `escape=json`; fields found by name
    /// (`--field` names them).
    Json,
    /// Tollgate's own decision log (`TOLLGATE_DECISION_LOG`): exact descriptors, no `proxy:` block.
    Decisions,
}

/// One line of a log.
#[derive(Debug)]
pub(super) enum Record {
    /// A request a proxy logged.
    Http(HttpRequest),
    /// A decision Tollgate logged.
    Decision(Decision),
}

impl Record {
    /// When it happened, in microseconds since the epoch.
    pub(super) fn time_us(&self) -> u64 {
        match self {
            Record::Http(request) => request.time_us,
            Record::Decision(decision) => decision.time_us,
        }
    }
}

/// A request from an access log, as the `proxy:` block reads one.
#[derive(Debug)]
pub(super) struct HttpRequest {
    pub(super) time_us: u64,
    /// The client's address, when the log names it directly.
    pub(super) client: Option<IpAddr>,
    /// Every header's value, one after another, in one allocation.
    text: String,
    /// (lowercase name, where its value ends in `text`), in the log's order: a value starts where
    /// the one before it ends. Not inline: a record is moved through the reordering, and a larger one
    /// (Envoy's six headers inline) cost more to move than the allocation saved.
    headers: Vec<(Cow<'static, str>, usize)>,
}

impl HttpRequest {
    /// A request at `time_us` without headers yet; `capacity` bytes of values fit without growing.
    pub(super) fn new(time_us: u64, client: Option<IpAddr>, capacity: usize) -> Self {
        Self {
            time_us,
            client,
            text: String::with_capacity(capacity),
            headers: Vec::with_capacity(6),
        }
    }

    /// Adds header `name` with `value`.
    fn push(&mut self, name: impl Into<Cow<'static, str>>, value: &str) {
        self.push_with(name, |values| values.push_str(value));
    }

    /// Adds header `name` with the value `write` appends.
    fn push_with(&mut self, name: impl Into<Cow<'static, str>>, write: impl FnOnce(&mut String)) {
        write(&mut self.text);
        self.headers.push((name.into(), self.text.len()));
    }

    /// Every header, in the log's order.
    fn headers(&self) -> impl Iterator<Item = (&str, &str)> {
        let starts = std::iter::once(0).chain(self.headers.iter().map(|(_, end)| *end));
        self.headers
            .iter()
            .zip(starts)
            .map(|((name, end), start)| (name.as_ref(), &self.text[start..*end]))
    }
}

impl ProxiedRequest for HttpRequest {
    fn values(&self, name: &str) -> impl Iterator<Item = Cow<'_, str>> {
        self.headers()
            .filter(move |(n, _)| *n == name)
            .map(|(_, v)| Cow::Borrowed(v))
    }

    fn client_address(&self, source: &AddressSource) -> Result<IpAddr, BadRequest> {
        match self.client {
            Some(client) => Ok(client),
            None => source.find(self),
        }
    }
}

#[cfg(test)]
impl HttpRequest {
    /// The first value of header `name`, owned, for tests.
    fn header(&self, name: &str) -> Option<String> {
        self.values(name).next().map(Cow::into_owned)
    }
}

/// A decision from Tollgate's decision log.
#[derive(Debug)]
pub(super) struct Decision {
    pub(super) time_us: u64,
    pub(super) domain: Arc<str>,
    pub(super) descriptors: decisions::Descriptors,
}

/// Why a line was not read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum LineError {
    /// The line is not of the format (the reason names what is missing, never the line's text).
    #[error("not {format} format: {reason}")]
    Shape {
        /// The format expected.
        format: &'static str,
        /// What was wrong.
        reason: &'static str,
    },
    /// The line has no timestamp that can be read.
    #[error("no timestamp that can be read")]
    Time,
}

/// Turns lines of one format into records.
#[derive(Debug)]
pub(crate) struct LineReader {
    format: LogFormat,
    /// For JSON: where the fields are.
    fields: Fields,
    /// For the decision log: the domains and keys read so far.
    names: decisions::Names,
}

impl LineReader {
    /// A reader of `format`; JSON lines with `fields`.
    pub(crate) fn new(format: LogFormat, fields: Fields) -> Self {
        Self {
            format,
            fields,
            names: decisions::Names::default(),
        }
    }

    /// The record on `line` (without its newline).
    pub(super) fn read(&mut self, line: &str) -> Result<Record, LineError> {
        match self.format {
            LogFormat::Envoy => text::envoy(line).map(Record::Http),
            LogFormat::Nginx => text::nginx(line).map(Record::Http),
            LogFormat::Json => self.fields.request(line).map(Record::Http),
            LogFormat::Decisions => decisions::read(line, &mut self.names).map(Record::Decision),
        }
    }
}

/// The forwarded request line, as `X-Forwarded-*` headers, from a logged `"GET /path HTTP/1.1"`.
fn request_line(line: &str, request: &mut HttpRequest) -> Option<()> {
    let mut parts = line.split(' ');
    let method = parts.next().filter(|m| !m.is_empty() && *m != "-")?;
    let uri = parts.next()?;
    request.push("x-forwarded-method", method);
    request.push("x-forwarded-uri", uri);
    Some(())
}
