//! Envoy's header and query-parameter matchers, as `header_value_match` and
//! `query_parameter_value_match` use them: the same fields and the same answers, down to the corners
//! (a header sent several times is matched as its values joined by `,`; an absent header matches only
//! `present_match: false`, or `present_match: true` inverted; a regex must match the whole value).

use std::borrow::Cow;

use super::ProxiedRequest;

/// The forwarded header the pseudo-header `:path` reads, and where query parameters are found.
pub(super) const FORWARDED_URI: &str = "x-forwarded-uri";

/// One entry of `headers:` in `header_value_match`.
#[derive(Debug, Clone, PartialEq)]
pub struct HeaderMatcher {
    /// The header read (lowercase; a pseudo-header already mapped to its forwarded header).
    pub name: String,
    /// What its value must be.
    pub rule: ValueRule,
    /// `invert_match`: the matcher matches when the rule does not (an absent header still does not
    /// match a value rule, as in Envoy).
    pub invert: bool,
    /// `treat_missing_header_as_empty`: an absent header is matched as the empty value.
    pub treat_missing_as_empty: bool,
}

/// What a header's value must be.
#[derive(Debug, Clone, PartialEq)]
pub enum ValueRule {
    /// `present_match`: `true`, the header is there; `false`, it is not.
    Present(bool),
    /// `range_match: {start, end}`: a whole number in `[start, end)`.
    Range {
        /// Lowest accepted.
        start: i64,
        /// First refused above.
        end: i64,
    },
    /// `exact_match`, `prefix_match`, `suffix_match`, `contains_match`, `safe_regex_match` or
    /// `string_match`.
    Text(TextMatch),
}

/// Envoy's `StringMatcher`: one way to compare text, optionally ignoring ASCII case.
#[derive(Debug, Clone, PartialEq)]
pub struct TextMatch {
    /// How the text is compared.
    pub kind: TextKind,
    /// `ignore_case` (not for regexes, as in Envoy). The pattern is then stored lowercase.
    pub ignore_case: bool,
}

/// The comparisons of a [`TextMatch`].
#[derive(Debug, Clone, PartialEq)]
pub enum TextKind {
    /// The whole value.
    Exact(String),
    /// Its start.
    Prefix(String),
    /// Its end.
    Suffix(String),
    /// Anywhere in it.
    Contains(String),
    /// A regular expression (RE2 syntax, Rust's `regex`) matching the whole value.
    Regex(Pattern),
}

/// A compiled regular expression, compared by its source.
#[derive(Debug, Clone)]
pub struct Pattern {
    /// As written in the rules.
    pub source: String,
    /// Anchored at both ends.
    pub regex: regex::Regex,
}

impl PartialEq for Pattern {
    fn eq(&self, other: &Self) -> bool {
        self.source == other.source
    }
}

/// One entry of `query_parameters:` in `query_parameter_value_match`.
#[derive(Debug, Clone, PartialEq)]
pub struct QueryMatcher {
    /// The parameter's name, as sent (after percent-decoding).
    pub name: String,
    /// What its first value must be; `None` for `present_match: true` (it must be there).
    pub rule: Option<TextMatch>,
}

impl HeaderMatcher {
    /// Whether `request` matches.
    pub fn matches<R: ProxiedRequest + ?Sized>(&self, request: &R) -> bool {
        let value = match joined(request, &self.name) {
            Some(value) => value,
            None if self.treat_missing_as_empty => Cow::Borrowed(""),
            None => {
                let present_wanted = matches!(self.rule, ValueRule::Present(true));
                let absent_wanted = matches!(self.rule, ValueRule::Present(false));
                return if self.invert {
                    present_wanted
                } else {
                    absent_wanted
                };
            }
        };
        let matched = match &self.rule {
            ValueRule::Present(present) => *present,
            ValueRule::Range { start, end } => value.parse::<i64>().is_ok_and(|n| *start <= n && n < *end),
            ValueRule::Text(text) => text.matches(&value),
        };
        matched != self.invert
    }
}

impl QueryMatcher {
    /// Whether `request`'s URI has the parameter, with a value that matches.
    pub fn matches<R: ProxiedRequest + ?Sized>(&self, request: &R) -> bool {
        match (query_parameter(request, &self.name), &self.rule) {
            (None, _) => false,
            (Some(_), None) => true,
            (Some(value), Some(rule)) => rule.matches(&value),
        }
    }
}

impl TextMatch {
    /// Whether `value` matches.
    pub fn matches(&self, value: &str) -> bool {
        let fold = self.ignore_case;
        match &self.kind {
            TextKind::Exact(p) if fold => value.eq_ignore_ascii_case(p),
            TextKind::Exact(p) => value == p,
            TextKind::Prefix(p) => value
                .as_bytes()
                .get(..p.len())
                .is_some_and(|start| same(start, p.as_bytes(), fold)),
            TextKind::Suffix(p) => value
                .len()
                .checked_sub(p.len())
                .is_some_and(|at| same(&value.as_bytes()[at..], p.as_bytes(), fold)),
            TextKind::Contains(p) if fold => value
                .as_bytes()
                .windows(p.len().max(1))
                .any(|w| w.eq_ignore_ascii_case(p.as_bytes())),
            TextKind::Contains(p) => value.contains(p.as_str()),
            TextKind::Regex(pattern) => pattern.regex.is_match(value),
        }
    }
}

fn same(a: &[u8], b: &[u8], fold: bool) -> bool {
    if fold { a.eq_ignore_ascii_case(b) } else { a == b }
}

/// Every value of header `name` joined by `,`, as Envoy matches a header sent several times; borrowed
/// when it was sent once.
fn joined<'r, R: ProxiedRequest + ?Sized>(request: &'r R, name: &str) -> Option<Cow<'r, str>> {
    let mut values = request.values(name);
    let first = values.next()?;
    let Some(second) = values.next() else {
        return Some(first);
    };
    let mut all = first.into_owned();
    for value in std::iter::once(second).chain(values) {
        all.push(',');
        all.push_str(&value);
    }
    Some(Cow::Owned(all))
}

/// The first value of query parameter `name` in the forwarded URI, percent-decoded (`+` is a space).
pub(super) fn query_parameter<R: ProxiedRequest + ?Sized>(request: &R, name: &str) -> Option<String> {
    let uri = request.values(FORWARDED_URI).next()?;
    let (_, query) = uri.split_once('?')?;
    let query = query.split_once('#').map_or(query, |(q, _)| q);
    query.split('&').find_map(|pair| {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        (decode(key) == name).then(|| decode(value))
    })
}

/// Percent-decoding of one query component; invalid UTF-8 is replaced, never refused.
fn decode(component: &str) -> String {
    let bytes = component.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = bytes
                    .get(i + 1..i + 3)
                    .filter(|h| h.iter().all(u8::is_ascii_hexdigit))
                    .and_then(|h| std::str::from_utf8(h).ok());
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(byte) => {
                        out.push(byte);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            byte => out.push(byte),
        }
        i += 1;
    }
    String::from_utf8(out).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}
