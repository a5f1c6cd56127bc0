//! Tollgate's own decision log: one JSON object a line, `{"time": RFC 3339, "domain": …,
//! "descriptors": [{"entries": [{"key": …, "value": …}], "hits_addend": N}]}`, the shape of Envoy's
//! request in proto3 JSON. A line is read with its strings borrowed and its lists inline, then made into
//! the descriptors the limiter decides: one allocation per value, while the domains and entry keys,
//! which repeat on every line, are shared rather than allocated.

use std::borrow::Cow;
use std::sync::Arc;

use smallvec::SmallVec;
use tollgate_core::limiter::{LimitOverride, RequestDescriptor};

use super::{Decision, LineError};
use crate::observe::decision_log::{Line, LineDescriptor, LineEntry};
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

/// The decision on `line`, its names shared through `names`. A line spelled as the decision log
/// writes it is read by [`read_written`]; any other spelling of the same JSON (spaces, escapes,
/// fields in another order or added) by serde.
pub(super) fn read(line: &str, names: &mut Names) -> Result<Decision, LineError> {
    if let Some(written) = read_written(line) {
        return decision(written, names);
    }
    let shape = LineError::Shape {
        format: "Tollgate's decision log",
        reason: "not a decision (time, domain, descriptors)",
    };
    let read: Line<'_> = serde_json::from_str(line).map_err(|_| shape)?;
    decision(read, names)
}

/// The decision a read line holds.
fn decision(read: Line<'_>, names: &mut Names) -> Result<Decision, LineError> {
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

/// `line` read as the decision log writes it (`src/observe/decision_log.rs`): these fields in this
/// order, no space, no escape in a string. A general JSON parser costs as much as the replay's two
/// decisions together; this reads the log's own lines several times faster. `None` for anything
/// else, which serde then reads (or refuses) as JSON: a line is never refused here.
fn read_written(line: &str) -> Option<Line<'_>> {
    let mut at = Cursor(line);
    at.eat(r#"{"time":""#)?;
    let time = at.string()?;
    at.eat(r#","domain":""#)?;
    let domain = at.string()?;
    at.eat(r#","descriptors":["#)?;
    let mut descriptors = SmallVec::new();
    while at.eat("]").is_none() {
        at.eat(if descriptors.is_empty() {
            r#"{"entries":["#
        } else {
            r#",{"entries":["#
        })?;
        let mut entries = SmallVec::new();
        while at.eat("]").is_none() {
            at.eat(if entries.is_empty() {
                r#"{"key":""#
            } else {
                r#",{"key":""#
            })?;
            let key = at.string()?;
            at.eat(r#","value":""#)?;
            let value = at.string()?;
            at.eat("}")?;
            entries.push(LineEntry { key, value });
        }
        let hits_addend = match at.eat(r#","hits_addend":"#) {
            Some(()) => Some(at.number()?),
            None => None,
        };
        at.eat("}")?;
        descriptors.push(LineDescriptor { entries, hits_addend });
    }
    at.eat("}")?;
    at.0.is_empty().then_some(Line {
        time,
        domain,
        descriptors,
    })
}

/// What is left of a line being read by [`read_written`].
struct Cursor<'a>(&'a str);

impl<'a> Cursor<'a> {
    /// Steps over `text`, if the line goes on with it.
    fn eat(&mut self, text: &str) -> Option<()> {
        self.0 = self.0.strip_prefix(text)?;
        Some(())
    }

    /// A string's text up to its closing quote (stepped over); `None` at an escape or a control
    /// character, which only JSON's full reading handles (or refuses).
    fn string(&mut self) -> Option<Cow<'a, str>> {
        let end = self.0.bytes().position(|b| b == b'"' || b == b'\\' || b < 0x20)?;
        let (text, rest) = self.0.split_at(end);
        self.0 = rest.strip_prefix('"')?;
        Some(Cow::Borrowed(text))
    }

    /// A whole number as JSON writes one (no sign, no leading zero) that fits a `u64`.
    fn number(&mut self) -> Option<u64> {
        let end = self
            .0
            .bytes()
            .position(|b| !b.is_ascii_digit())
            .unwrap_or(self.0.len());
        let (digits, rest) = self.0.split_at(end);
        if digits.len() > 1 && digits.starts_with('0') {
            return None;
        }
        self.0 = rest;
        digits.parse().ok()
    }
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

    #[test]
    fn lines_the_decision_log_writes_are_read_back_exactly() {
        use tollgate_core::limiter::{Recorded, RecordedDescriptor};
        let descriptor = |entries: &[(&str, &str)], hits_addend| RecordedDescriptor {
            entries: entries
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            hits_addend,
        };
        let requests = [
            (
                vec![descriptor(&[("remote_address", "2001:db8::1")], None)],
                "api",
            ),
            (
                vec![
                    descriptor(&[("path", "/a_b%2F"), ("user", "ad\u{e9}")], Some(0)),
                    descriptor(&[("k", "")], Some(u64::MAX)),
                ],
                "api",
            ),
            (
                vec![descriptor(
                    &[("quote", "say \"hi\""), ("slash", "a\\b\u{1}")],
                    Some(2),
                )],
                "d_1",
            ),
            (vec![descriptor(&[("key", "v")], None)], "caf\u{e9} \"x\""),
        ];
        let mut names = Names::default();
        for (at, (descriptors, domain)) in requests.into_iter().enumerate() {
            let recorded = Recorded {
                time_us: 1_796_532_131_310_123 + at as u64,
                domain: domain.to_owned(),
                descriptors,
            };
            let mut line = Vec::new();
            crate::observe::decision_log::write_line(&recorded, &mut line).expect("write");
            let line = std::str::from_utf8(&line).expect("utf-8").trim_end();
            // Only a line with an escape needs JSON's full reading.
            assert_eq!(read_written(line).is_some(), !line.contains('\\'), "{line}");
            let read = read(line, &mut names).expect(line);
            let entries = |d: &LoggedDescriptor| -> Vec<(String, String)> {
                d.entries()
                    .iter()
                    .map(|e| (e.key().to_owned(), e.value().to_owned()))
                    .collect()
            };
            let back = Recorded {
                time_us: read.time_us,
                domain: read.domain.to_string(),
                descriptors: read
                    .descriptors
                    .iter()
                    .map(|d| RecordedDescriptor {
                        entries: entries(d),
                        hits_addend: d.hits_addend(),
                    })
                    .collect(),
            };
            assert_eq!(back, recorded, "{line}");
        }
    }

    #[test]
    fn the_written_spelling_is_read_as_json_reads_it_or_left_to_json() {
        let written = r#"{"time":"2026-12-06T04:42:11Z","domain":"api","descriptors":[{"entries":[{"key":"a","value":"1"},{"key":"b","value":"2"}],"hits_addend":3},{"entries":[{"key":"c","value":""}]}]}"#;
        let mut lines = vec![written.to_owned()];
        // Every shorter line, and every line with one byte changed to another of JSON's, is read
        // either as JSON reads it or not at all (then JSON reads it, or refuses it).
        for end in 0..written.len() {
            lines.push(written[..end].to_owned());
        }
        for at in 0..written.len() {
            for b in [" ", "0", "-", "\\", "}", "]", ",", "\"", "x"] {
                let mut line = written.to_owned();
                line.replace_range(at..=at, b);
                lines.push(line);
            }
        }
        for line in [
            written.replace(r#""hits_addend":3"#, r#""hits_addend":03"#),
            written.replace(r#""hits_addend":3"#, r#""hits_addend":18446744073709551616"#),
            written.replace(r#""hits_addend":3"#, r#""hits_addend":3.0"#),
            written.replace(
                "[{\"entries\":[{\"key\":\"c\"",
                "[{\"entries\":[],\"x\":[{\"key\":\"c\"",
            ),
            written.replace(r#""value":"1""#, "\"value\":\"\u{1}\""),
            written.to_owned() + " ",
        ] {
            lines.push(line);
        }
        let mut fast = 0;
        for line in &lines {
            let json = serde_json::from_str::<Line<'_>>(line).ok();
            if let Some(read) = read_written(line) {
                fast += 1;
                assert_eq!(Some(read), json, "{line}");
            }
        }
        assert!(
            fast >= 5,
            "the written spelling and a few of its neighbours are read here"
        );
    }
}
