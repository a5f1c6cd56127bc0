//! Tollgate's own decision log: one JSON object a line, `{"time": RFC 3339, "domain": …,
//! "descriptors": [{"entries": [{"key": …, "value": …}], "hits_addend": N}]}`, the shape of Envoy's
//! request in proto3 JSON. A line is read with its strings borrowed and its lists inline, then made into
//! the descriptors the limiter decides: one allocation per value, while the domains and entry keys,
//! which repeat on every line, are shared rather than allocated.

use std::borrow::Cow;
use std::sync::Arc;

use serde::Deserialize;
use smallvec::SmallVec;
use tollgate_core::limiter::{LimitOverride, RequestDescriptor};

use super::{Decision, LineError};
use crate::what_if::time;

/// Most distinct domains and keys shared; past these, each is allocated per line (a log whose
/// keys are all different is read correctly, only slower).
const MAX_NAMES: usize = 256;

/// The domains and entry keys seen so far, each held once.
#[derive(Debug, Default)]
pub(crate) struct Names {
    known: Vec<Arc<str>>,
}

impl Names {
    /// `text` as a shared name: the one held if it was seen before.
    fn get(&mut self, text: &str) -> Arc<str> {
        if let Some(known) = self.known.iter().find(|k| ***k == *text) {
            return Arc::clone(known);
        }
        let name: Arc<str> = Arc::from(text);
        if self.known.len() < MAX_NAMES {
            self.known.push(Arc::clone(&name));
        }
        name
    }
}

/// Descriptors of a logged request. Most have one, kept beside the request rather than allocated;
/// more would make every record larger to move (records wait in the reordering buffer).
pub(crate) type Descriptors = SmallVec<[LoggedDescriptor; 1]>;

/// A descriptor's entries, one kept inline as [`Descriptors`] keeps one descriptor.
type Entries = SmallVec<[(Arc<str>, Box<str>); 1]>;

/// One descriptor of a logged request.
#[derive(Debug)]
pub(crate) struct LoggedDescriptor {
    /// (key, value), in order; the values as they entered the keys (hashed ones stay hashed).
    entries: Entries,
    /// The descriptor's own cost, if it had one.
    hits_addend: Option<u64>,
}

impl RequestDescriptor for LoggedDescriptor {
    type Entry = (Arc<str>, Box<str>);

    fn entries(&self) -> &[Self::Entry] {
        &self.entries
    }

    fn limit_override(&self) -> Option<LimitOverride> {
        None
    }

    fn hits_addend(&self) -> Option<u64> {
        self.hits_addend
    }
}

/// The decision on `line`, its names shared through `names`.
pub(super) fn read(line: &str, names: &mut Names) -> Result<Decision, LineError> {
    let shape = LineError::Shape {
        format: "Tollgate's decision log",
        reason: "not a decision (time, domain, descriptors)",
    };
    let read: Line<'_> = serde_json::from_str(line).map_err(|_| shape)?;
    let time_us = time::parse(&read.time).ok_or(LineError::Time)?;
    let descriptors = read
        .descriptors
        .into_iter()
        .map(|d| LoggedDescriptor {
            entries: d
                .entries
                .into_iter()
                .map(|e| (names.get(&e.key), e.value.into()))
                .collect(),
            hits_addend: d.hits_addend,
        })
        .collect();
    Ok(Decision {
        time_us,
        domain: names.get(&read.domain),
        descriptors,
    })
}

/// A line as written: its strings borrowed from it unless escaped, its lists inline.
#[derive(Deserialize)]
struct Line<'a> {
    #[serde(borrow)]
    time: Cow<'a, str>,
    #[serde(borrow)]
    domain: Cow<'a, str>,
    #[serde(borrow)]
    descriptors: SmallVec<[LineDescriptor<'a>; 1]>,
}

#[derive(Deserialize)]
struct LineDescriptor<'a> {
    #[serde(borrow)]
    entries: SmallVec<[LineEntry<'a>; 1]>,
    #[serde(default)]
    hits_addend: Option<u64>,
}

#[derive(Deserialize)]
struct LineEntry<'a> {
    #[serde(borrow)]
    key: Cow<'a, str>,
    #[serde(borrow, default)]
    value: Cow<'a, str>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_core::rules::DescriptorEntry as _;

    #[test]
    fn a_decision_line_has_its_descriptors_and_costs() {
        let mut names = Names::default();
        let line = r#"{"time":"2026-12-06T04:42:11.310Z","domain":"api","descriptors":[{"entries":[{"key":"user","value":"ada"}],"hits_addend":3},{"entries":[{"key":"path","value":"/x\u0041"},{"key":"flag"}]}],"extra":[1]}"#;
        let read = read(line, &mut names).expect("read");
        assert_eq!((read.time_us, &*read.domain), (1_796_532_131_310_000, "api"));
        let entries: Vec<Vec<(&str, &str)>> = read
            .descriptors
            .iter()
            .map(|d| d.entries().iter().map(|e| (e.key(), e.value())).collect())
            .collect();
        assert_eq!(
            entries,
            [vec![("user", "ada")], vec![("path", "/xA"), ("flag", "")]]
        );
        let costs: Vec<Option<u64>> = read.descriptors.iter().map(|d| d.hits_addend()).collect();
        assert_eq!(costs, [Some(3), None]);
    }

    #[test]
    fn names_repeated_on_every_line_are_held_once() {
        let mut names = Names::default();
        let line = r#"{"time":"2026-12-06T04:42:11Z","domain":"api","descriptors":[{"entries":[{"key":"user","value":"ada"}]}]}"#;
        let first = read(line, &mut names).expect("read");
        let second = read(line, &mut names).expect("read");
        assert!(Arc::ptr_eq(&first.domain, &second.domain));
        let key = |d: &Decision| Arc::clone(&d.descriptors[0].entries()[0].0);
        assert!(Arc::ptr_eq(&key(&first), &key(&second)));
    }

    #[test]
    fn what_is_not_a_decision_is_refused_and_a_bad_time_says_so() {
        let mut names = Names::default();
        for bad in [
            "",
            "[]",
            "{}",
            r#"{"time":"2026-12-06T04:42:11Z","domain":"api"}"#,
            r#"{"time":"2026-12-06T04:42:11Z","domain":"api","descriptors":[{"entries":[{"value":"x"}]}]}"#,
            r#"{"time":"2026-12-06T04:42:11Z","domain":"api","domain":"b","descriptors":[]}"#,
            r#"{"time":"2026-12-06T04:42:11Z","domain":"api","descriptors":[]} trailing"#,
            r#"{"time":"2026-12-06T04:42:11Z","domain":7,"descriptors":[]}"#,
        ] {
            assert!(
                matches!(read(bad, &mut names), Err(LineError::Shape { .. })),
                "{bad}"
            );
        }
        assert_eq!(
            read(r#"{"time":"x","domain":"api","descriptors":[]}"#, &mut names).err(),
            Some(LineError::Time)
        );
    }
}
