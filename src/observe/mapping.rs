//! statsd_exporter's mapping format (`PROMETHEUS_MAPPER_YAML`), as envoyproxy/ratelimit's Prometheus
//! sink applies it to the Go stat names ([`super::go_stats`]): which Prometheus name and labels each
//! statsd name becomes, or that it is dropped.
//!
//! Matching as statsd_exporter matches: every glob rule is tried first, in file order, the first match
//! winning; only if none matches are the regex rules tried, in file order. A glob's `*` stands for
//! exactly one dot-separated component (possibly empty), and a glob matches only names with as many
//! components as it has. A regex is unanchored, as Go's `regexp` finds it. `$1`, `${1}` in `name` and
//! `labels` are a glob's `*`s or a regex's groups; one that does not exist is empty. `match_metric_type`
//! (`counter`, `gauge`, `observer`, or `timer`) limits a rule to that kind of stat. `action: drop`
//! drops what it matches. A mapped name is made a valid Prometheus name as statsd_exporter makes it.
//!
//! Fields statsd_exporter reads that change nothing here (`help`, `ttl`, `quantiles`, `buckets`,
//! `summary_options`, `histogram_options`, `honor_labels`, `glob_disable_ordering`) are accepted and
//! named in a startup warning. An unknown field, a glob that statsd_exporter would refuse, or a regex
//! that does not compile stops startup with the file, the line where it can, and the reason.

use std::collections::BTreeMap;
use std::path::Path;

use regex::Regex;
use serde::Deserialize;

/// What a statsd stat is, for `match_metric_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatKind {
    /// A counter.
    Counter,
    /// A gauge.
    Gauge,
    /// A timer or histogram observation.
    Observer,
}

/// A mapping file, compiled.
#[derive(Debug)]
pub struct Mapping {
    globs: Vec<Rule>,
    regexes: Vec<Rule>,
}

/// What a statsd name becomes.
#[derive(Debug, Clone, PartialEq)]
pub enum Mapped {
    /// This Prometheus name and labels; observations multiplied by `scale`.
    To {
        /// The metric name.
        name: String,
        /// The labels, in the file's order.
        labels: Vec<(String, String)>,
        /// `scale` (1 when not given).
        scale: f64,
        /// `timer_type` / `observer_type`: `histogram` or `summary` (empty: not given).
        observer: String,
    },
    /// `action: drop`.
    Dropped,
    /// No rule matched: the name made Prometheus-safe, no labels.
    Unmatched(String),
}

/// A mapping file that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("PROMETHEUS_MAPPER_YAML {file}: {reason}")]
pub struct MappingError {
    /// The file, as given.
    pub file: String,
    /// What is wrong, with the line where the parser knows it.
    pub reason: String,
}

#[derive(Debug)]
struct Rule {
    pattern: Pattern,
    name: String,
    labels: Vec<(String, String)>,
    kind: Option<StatKind>,
    drop: bool,
    scale: f64,
    observer: String,
}

#[derive(Debug)]
enum Pattern {
    /// The components of a glob; `None` is a `*`.
    Glob(Vec<Option<String>>),
    Regex(Regex),
}

/// The file as statsd_exporter reads it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    defaults: Defaults,
    #[serde(default)]
    mappings: Vec<RuleText>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Defaults {
    #[serde(default)]
    match_type: Option<String>,
    #[serde(default, alias = "observer_type")]
    timer_type: Option<String>,
    #[serde(default)]
    buckets: Option<Vec<f64>>,
    #[serde(default)]
    quantiles: Option<serde::de::IgnoredAny>,
    #[serde(default)]
    ttl: Option<String>,
    #[serde(default)]
    glob_disable_ordering: Option<bool>,
    #[serde(default)]
    summary_options: Option<serde::de::IgnoredAny>,
    #[serde(default)]
    histogram_options: Option<serde::de::IgnoredAny>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleText {
    #[serde(rename = "match")]
    pattern: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    match_type: Option<String>,
    #[serde(default)]
    match_metric_type: Option<String>,
    #[serde(default)]
    action: Option<String>,
    #[serde(default, alias = "observer_type")]
    timer_type: Option<String>,
    #[serde(default)]
    scale: Option<f64>,
    #[serde(default)]
    help: Option<String>,
    #[serde(default)]
    ttl: Option<String>,
    #[serde(default)]
    buckets: Option<Vec<f64>>,
    #[serde(default)]
    quantiles: Option<serde::de::IgnoredAny>,
    #[serde(default)]
    summary_options: Option<serde::de::IgnoredAny>,
    #[serde(default)]
    histogram_options: Option<serde::de::IgnoredAny>,
    #[serde(default)]
    honor_labels: Option<bool>,
}

impl Mapping {
    /// Reads and compiles the mapping file at `path`; the warnings name fields that change nothing here.
    pub fn load(path: &Path) -> Result<(Self, Vec<String>), MappingError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| MappingError {
            file: file.clone(),
            reason: e.to_string(),
        })?;
        Self::parse(&text).map_err(|reason| MappingError { file, reason })
    }

    /// Compiles a mapping file's text.
    pub fn parse(text: &str) -> Result<(Self, Vec<String>), String> {
        let parsed: File = serde_saphyr::from_str(text).map_err(|e| e.to_string())?;
        let mut unused = Vec::new();
        let defaults = &parsed.defaults;
        for (field, given) in [
            ("buckets", defaults.buckets.is_some()),
            ("quantiles", defaults.quantiles.is_some()),
            ("ttl", defaults.ttl.is_some()),
            ("glob_disable_ordering", defaults.glob_disable_ordering.is_some()),
            ("summary_options", defaults.summary_options.is_some()),
            ("histogram_options", defaults.histogram_options.is_some()),
        ] {
            if given {
                unused.push(format!("defaults.{field}"));
            }
        }
        let mut mapping = Mapping {
            globs: Vec::new(),
            regexes: Vec::new(),
        };
        for (at, rule) in parsed.mappings.into_iter().enumerate() {
            let which = format!("mapping {} ({:?})", at + 1, rule.pattern);
            for (field, given) in [
                ("help", rule.help.is_some()),
                ("ttl", rule.ttl.is_some()),
                ("buckets", rule.buckets.is_some()),
                ("quantiles", rule.quantiles.is_some()),
                ("summary_options", rule.summary_options.is_some()),
                ("histogram_options", rule.histogram_options.is_some()),
                ("honor_labels", rule.honor_labels.is_some()),
            ] {
                if given {
                    unused.push(format!("{which}: {field}"));
                }
            }
            let match_type = rule.match_type.as_deref().or(defaults.match_type.as_deref());
            let pattern = match match_type.unwrap_or("glob") {
                "glob" => Pattern::Glob(glob(&rule.pattern).map_err(|e| format!("{which}: {e}"))?),
                "regex" => Pattern::Regex(Regex::new(&rule.pattern).map_err(|e| format!("{which}: {e}"))?),
                other => return Err(format!("{which}: match_type {other:?}: expected glob or regex")),
            };
            let kind = match rule.match_metric_type.as_deref() {
                None => None,
                Some("counter") => Some(StatKind::Counter),
                Some("gauge") => Some(StatKind::Gauge),
                Some("observer" | "timer" | "histogram" | "summary") => Some(StatKind::Observer),
                Some(other) => {
                    return Err(format!(
                        "{which}: match_metric_type {other:?} is not a metric type"
                    ));
                }
            };
            let drop = match rule.action.as_deref() {
                None | Some("map") => false,
                Some("drop") => true,
                Some(other) => return Err(format!("{which}: action {other:?}: expected map or drop")),
            };
            if !drop && rule.name.is_empty() {
                return Err(format!("{which}: no name"));
            }
            let compiled = Rule {
                pattern,
                name: rule.name,
                labels: rule.labels.into_iter().collect(),
                kind,
                drop,
                scale: rule.scale.unwrap_or(1.0),
                observer: rule
                    .timer_type
                    .or_else(|| defaults.timer_type.clone())
                    .unwrap_or_default(),
            };
            match compiled.pattern {
                Pattern::Glob(_) => mapping.globs.push(compiled),
                Pattern::Regex(_) => mapping.regexes.push(compiled),
            }
        }
        Ok((mapping, unused))
    }

    /// What the statsd name `name`, a stat of `kind`, becomes.
    pub fn map(&self, name: &str, kind: StatKind) -> Mapped {
        let applies = |rule: &&Rule| rule.kind.is_none_or(|k| k == kind);
        let components: Vec<&str> = name.split('.').collect();
        for rule in self.globs.iter().filter(applies) {
            let Pattern::Glob(parts) = &rule.pattern else {
                continue;
            };
            if let Some(captures) = glob_captures(parts, &components) {
                return rule.apply(|n| captures.get(n.wrapping_sub(1)).copied());
            }
        }
        for rule in self.regexes.iter().filter(applies) {
            let Pattern::Regex(regex) = &rule.pattern else {
                continue;
            };
            if let Some(captures) = regex.captures(name) {
                return rule.apply(|n| captures.get(n).map(|m| m.as_str()));
            }
        }
        Mapped::Unmatched(metric_name(name))
    }
}

impl Rule {
    /// The rule's result, `$n` standing for `capture(n)` (`None`: empty).
    fn apply<'a>(&self, capture: impl Fn(usize) -> Option<&'a str>) -> Mapped {
        if self.drop {
            return Mapped::Dropped;
        }
        Mapped::To {
            name: metric_name(&expand(&self.name, &capture)),
            labels: self
                .labels
                .iter()
                .map(|(label, template)| (label.clone(), expand(template, &capture)))
                .collect(),
            scale: self.scale,
            observer: self.observer.clone(),
        }
    }
}

/// A glob's components, checked as statsd_exporter checks them: `*` or a name of letters, digits, `_`
/// and `-` (the first not a digit or `-`) per component.
fn glob(pattern: &str) -> Result<Vec<Option<String>>, String> {
    pattern
        .split('.')
        .enumerate()
        .map(|(at, part)| {
            if part == "*" {
                return Ok(None);
            }
            let mut chars = part.chars();
            let first_ok = chars
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || (at > 0 && c.is_ascii_digit()));
            if first_ok && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
                Ok(Some(part.to_owned()))
            } else {
                Err(format!("invalid glob {pattern:?}: component {part:?}"))
            }
        })
        .collect()
}

/// The `*` captures of a glob matching `components`, or `None`.
fn glob_captures<'a>(parts: &[Option<String>], components: &[&'a str]) -> Option<Vec<&'a str>> {
    if parts.len() != components.len() {
        return None;
    }
    let mut captures = Vec::new();
    for (part, component) in parts.iter().zip(components) {
        match part {
            None => captures.push(*component),
            Some(literal) if literal == component => {}
            _ => return None,
        }
    }
    Some(captures)
}

/// `template` with `$n` and `${n}` replaced by `capture(n)` (empty when there is none).
fn expand<'a>(template: &str, capture: &impl Fn(usize) -> Option<&'a str>) -> String {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let (digits, consumed) = match after.strip_prefix('{') {
            Some(braced) => match braced.find('}') {
                Some(end) => (&braced[..end], end + 2),
                None => ("", 0),
            },
            None => {
                let end = after.find(|c: char| !c.is_ascii_digit()).unwrap_or(after.len());
                (&after[..end], end)
            }
        };
        match digits.parse::<usize>() {
            Ok(n) if consumed > 0 => {
                out.push_str(capture(n).unwrap_or_default());
                rest = &after[consumed..];
            }
            _ => {
                out.push('$');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// A statsd name as a Prometheus metric name, as statsd_exporter makes it: every character but ASCII
/// letters, digits and `_` becomes `_`, and a leading digit gets a `_` before it.
pub fn metric_name(statsd: &str) -> String {
    let mut name: String = statsd
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if name.starts_with(|c: char| c.is_ascii_digit()) {
        name.insert(0, '_');
    }
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A mapping shaped like Envoy Gateway's: globs for rules one level deep, regexes for deeper ones,
    /// the service counters, the response time, and a drop.
    const GATEWAY_LIKE: &str = r#"
mappings:
  - match: "ratelimit.service.rate_limit.*.*.total_hits"
    name: "ratelimit_service_rate_limit_total_hits"
    timer_type: "histogram"
    labels:
      domain: "$1"
      key1: "$2"
  - match: "ratelimit\\.service\\.rate_limit\\.([^\\.]*)\\.([^\\.]*)\\.([^\\.]*)(\\..*)?\\.total_hits"
    match_type: "regex"
    name: "ratelimit_service_rate_limit_total_hits"
    labels:
      domain: "$1"
      key1: "$2"
      key2: "${3}"
  - match: "ratelimit.service.call.should_rate_limit.*"
    name: "ratelimit_service_should_rate_limit_error"
    match_metric_type: counter
    labels:
      err_type: "$1"
  - match: "ratelimit_server.*.response_time"
    name: "ratelimit_service_response_time_seconds"
    timer_type: "histogram"
    scale: 0.001
    buckets: [0.005, 0.01]
    labels:
      grpc_method: "$1"
  - match: "ratelimit.service.global_shadow_mode"
    action: drop
"#;

    fn to(name: &str, labels: &[(&str, &str)]) -> Mapped {
        to_observed(name, labels, "")
    }

    fn to_observed(name: &str, labels: &[(&str, &str)], observer: &str) -> Mapped {
        Mapped::To {
            name: name.into(),
            labels: labels.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect(),
            scale: 1.0,
            observer: observer.into(),
        }
    }

    #[test]
    fn names_map_as_statsd_exporter_maps_them() {
        let (mapping, unused) = Mapping::parse(GATEWAY_LIKE).expect("parses");
        assert_eq!(
            unused,
            vec!["mapping 4 (\"ratelimit_server.*.response_time\"): buckets".to_owned()]
        );
        let hits = "ratelimit_service_rate_limit_total_hits";
        assert_eq!(
            mapping.map("ratelimit.service.rate_limit.d.a.total_hits", StatKind::Counter),
            to_observed(hits, &[("domain", "d"), ("key1", "a")], "histogram")
        );
        assert_eq!(
            mapping.map(
                "ratelimit.service.rate_limit.d.a.b.c.total_hits",
                StatKind::Counter
            ),
            to(hits, &[("domain", "d"), ("key1", "a"), ("key2", "b")]),
            "regexes after globs; deeper levels dropped"
        );
        assert_eq!(
            mapping.map(
                "ratelimit.service.call.should_rate_limit.redis_error",
                StatKind::Counter
            ),
            to(
                "ratelimit_service_should_rate_limit_error",
                &[("err_type", "redis_error")]
            )
        );
        assert_eq!(
            mapping.map(
                "ratelimit.service.call.should_rate_limit.redis_error",
                StatKind::Gauge
            ),
            Mapped::Unmatched("ratelimit_service_call_should_rate_limit_redis_error".into()),
            "match_metric_type"
        );
        let Mapped::To { scale, .. } = mapping.map(
            "ratelimit_server.ShouldRateLimit.response_time",
            StatKind::Observer,
        ) else {
            panic!("maps");
        };
        assert!((scale - 0.001).abs() < f64::EPSILON);
        assert_eq!(
            mapping.map("ratelimit.service.global_shadow_mode", StatKind::Counter),
            Mapped::Dropped
        );
        assert_eq!(
            mapping.map(
                "ratelimit.service.rate_limit.d.domain_not_found",
                StatKind::Counter
            ),
            Mapped::Unmatched("ratelimit_service_rate_limit_d_domain_not_found".into())
        );
    }

    #[test]
    fn templates_expand_captures_and_leave_the_rest() {
        let capture = |n: usize| ["x", "y"].get(n.wrapping_sub(1)).copied();
        assert_eq!(expand("a_$1_${2}_$3_$$_${x}", &capture), "a_x_y__$$_${x}");
    }

    #[test]
    fn files_that_cannot_be_used_say_why() {
        for (text, says) in [
            ("mappings:\n  - match: a.b\n    nmae: x\n", "nmae"),
            ("mappings:\n  - match: \"a..b\"\n    name: x\n", "invalid glob"),
            (
                "mappings:\n  - match: \"(\"\n    match_type: regex\n    name: x\n",
                "mapping 1",
            ),
            ("mappings:\n  - match: a.b\n", "no name"),
            (
                "mappings:\n  - match: a.b\n    name: x\n    action: keep\n",
                "action",
            ),
        ] {
            let error = Mapping::parse(text).expect_err(text);
            assert!(error.contains(says), "{text}: {error}");
        }
    }

    #[test]
    fn names_are_made_prometheus_safe() {
        assert_eq!(
            metric_name("ratelimit.go.numGoroutine"),
            "ratelimit_go_numGoroutine"
        );
        assert_eq!(metric_name("1a.b-c"), "_1a_b_c");
    }
}
