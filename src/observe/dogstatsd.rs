//! DogStatsD's dialect of the Go stats (`USE_DOG_STATSD`): what the Go service's DogStatsD sink makes of
//! a Go stat name, so a Datadog agent keeps the metrics and tags it had.
//!
//! A line is `name:value|c` (or `|g`) followed by `|#tag,tag` when the stat has tags. The tags are
//! the DogStatsD client's global ones first (`DD_ENV` and its siblings), then `EXTRA_TAGS` (cleaned and
//! sorted as gostats writes them into names, which the Go sink then splits back out), then those of
//! the first mogrifier whose pattern matches the name: a mogrifier
//! (`USE_DOG_STATSD_MOGRIFIERS`) rewrites the name and adds tags, with `$0`, `$1`… standing for the
//! pattern's match and groups (a `$n` past the last group stays as written, as in Go).

use regex::Captures;

use crate::settings::{ExtraTags, Mogrifier};

/// Names Go stats as the Go service's DogStatsD sink names them.
#[derive(Debug)]
pub struct Namer {
    /// The global tags, then `key:value` per extra tag in gostats' order.
    extra: Vec<String>,
    mogrifiers: Vec<Mogrifier>,
}

impl Namer {
    /// A namer adding `global` (`tag:value`s, as given) and `tags` to every stat and applying
    /// `mogrifiers` in their order.
    pub fn new(global: &[String], tags: &ExtraTags, mogrifiers: Vec<Mogrifier>) -> Self {
        let cleaned = super::go_stats::clean_tags(tags);
        let extra = global
            .iter()
            .cloned()
            .chain(cleaned.into_iter().map(|(key, value)| format!("{key}:{value}")))
            .collect();
        Self { extra, mogrifiers }
    }

    /// The DogStatsD name of the Go stat `name`, and what follows its value and type on the line:
    /// `|#tag,…`, or nothing without tags.
    pub fn name(&self, name: &str) -> (String, String) {
        let mut tags = self.extra.clone();
        let name = match self
            .mogrifiers
            .iter()
            .find_map(|m| Some((m, m.pattern.captures(name)?)))
        {
            Some((mogrifier, groups)) => {
                tags.extend(
                    (mogrifier.tags.0.iter()).map(|(key, value)| format!("{key}:{}", expand(value, &groups))),
                );
                expand(&mogrifier.name, &groups)
            }
            None => name.to_owned(),
        };
        let tail = if tags.is_empty() {
            String::new()
        } else {
            format!("|#{}", tags.join(","))
        };
        (name, tail)
    }
}

/// `template` with each `$n` replaced by group `n` of `groups` (empty when that group did not take
/// part in the match); a `$n` past the last group stays as written.
fn expand(template: &str, groups: &Captures<'_>) -> String {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let digits = after.len() - after.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        let group = after[..digits]
            .parse::<usize>()
            .ok()
            .filter(|&n| n < groups.len());
        match group {
            Some(n) => out.push_str(groups.get(n).map_or("", |m| m.as_str())),
            None => out.push_str(&rest[at..at + 1 + digits]),
        }
        rest = &after[digits..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use regex::Regex;

    use super::*;

    fn tags(pairs: &[(&str, &str)]) -> ExtraTags {
        ExtraTags(pairs.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect())
    }

    /// The Go sink's own example: a rule's domain and key become tags of one metric per stat.
    fn by_domain() -> Mogrifier {
        Mogrifier {
            pattern: Regex::new(r"^ratelimit\.service\.rate_limit\.(.*)\.(.*)\.(.*)$").expect("regex"),
            name: "ratelimit.service.rate_limit.$3".into(),
            tags: tags(&[("domain", "$1"), ("descriptor", "$2")]),
        }
    }

    #[test]
    fn a_mogrifier_turns_parts_of_the_name_into_tags_after_the_extra_tags() {
        let global = ["env:staging".to_owned()];
        let namer = Namer::new(
            &global,
            &tags(&[("region", "eu.west"), ("env", "prod")]),
            vec![by_domain()],
        );
        assert_eq!(
            namer.name("ratelimit.service.rate_limit.mongo_cps.database_users.within_limit"),
            (
                "ratelimit.service.rate_limit.within_limit".into(),
                "|#env:staging,env:prod,region:eu_west,domain:mongo_cps,descriptor:database_users".into()
            )
        );
    }

    #[test]
    fn a_name_no_mogrifier_matches_keeps_its_name_and_the_extra_tags() {
        let namer = Namer::new(&[], &tags(&[("env", "prod")]), vec![by_domain()]);
        assert_eq!(
            namer.name("ratelimit.service.config_load_success"),
            (
                "ratelimit.service.config_load_success".into(),
                "|#env:prod".into()
            )
        );
        let bare = Namer::new(&[], &ExtraTags::default(), Vec::new());
        assert_eq!(bare.name("a.b"), ("a.b".into(), String::new()));
    }

    #[test]
    fn the_first_matching_mogrifier_wins() {
        let first = Mogrifier {
            pattern: Regex::new(r"total_hits$").expect("regex"),
            name: "hits".into(),
            tags: ExtraTags::default(),
        };
        let namer = Namer::new(&[], &ExtraTags::default(), vec![first, by_domain()]);
        assert_eq!(
            namer.name("ratelimit.service.rate_limit.d.k.total_hits").0,
            "hits"
        );
        assert_eq!(
            namer.name("ratelimit.service.rate_limit.d.k.over_limit").0,
            "ratelimit.service.rate_limit.over_limit"
        );
    }

    #[test]
    fn groups_past_the_last_stay_as_written_and_absent_ones_are_empty() {
        let groups = Regex::new(r"^(a)(x)?(b)$").expect("regex");
        let groups = groups.captures("ab").expect("matches");
        assert_eq!(expand("$0-$1-$2-$3-$4-$12-$-$$1", &groups), "ab-a--b-$4-$12-$-$a");
    }
}
