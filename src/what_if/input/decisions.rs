//! Tollgate's own decision log: one JSON object a line, `{"time": RFC 3339, "domain": …,
//! "descriptors": [{"entries": [{"key": …, "value": …}], "hits_addend": N}]}`, the shape of Envoy's
//! request in proto3 JSON. A line is read straight into the descriptors the limiter decides, with no
//! intermediate copy, and the domains and entry keys, which repeat on every line, are shared rather
//! than allocated: this reader is what the replay's speed on a decision log rests on.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
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
    let mut deserializer = serde_json::Deserializer::from_str(line);
    let (time, domain, descriptors) = LineSeed { names }
        .deserialize(&mut deserializer)
        .and_then(|read| deserializer.end().map(|()| read))
        .map_err(|_| shape)?;
    Ok(Decision {
        time_us: time::parse(&time).ok_or(LineError::Time)?,
        domain,
        descriptors,
    })
}

/// A JSON string, borrowed from the line when it has no escape.
struct Text<'de>(Cow<'de, str>);

impl<'de> de::Deserialize<'de> for Text<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Expect;
        impl<'de> Visitor<'de> for Expect {
            type Value = Text<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, text: &'de str) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Borrowed(text)))
            }
            fn visit_str<E: de::Error>(self, text: &str) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Owned(text.to_owned())))
            }
            fn visit_string<E: de::Error>(self, text: String) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Owned(text)))
            }
        }
        deserializer.deserialize_str(Expect)
    }
}

/// Reads a whole line: its time (as written), domain and descriptors.
struct LineSeed<'n> {
    names: &'n mut Names,
}

impl<'de> DeserializeSeed<'de> for LineSeed<'_> {
    type Value = (Cow<'de, str>, Arc<str>, Descriptors);

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for LineSeed<'_> {
    type Value = (Cow<'de, str>, Arc<str>, Descriptors);

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a decision")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let (mut time, mut domain, mut descriptors) = (None, None, None);
        while let Some(Text(field)) = map.next_key::<Text<'de>>()? {
            match field.as_ref() {
                "time" => once(&mut time, "time", map.next_value::<Text<'de>>()?.0)?,
                "domain" => {
                    let Text(text) = map.next_value()?;
                    once(&mut domain, "domain", self.names.get(&text))?;
                }
                "descriptors" => {
                    let read = map.next_value_seed(DescriptorsSeed { names: self.names })?;
                    once(&mut descriptors, "descriptors", read)?;
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok((
            time.ok_or_else(|| de::Error::missing_field("time"))?,
            domain.ok_or_else(|| de::Error::missing_field("domain"))?,
            descriptors.ok_or_else(|| de::Error::missing_field("descriptors"))?,
        ))
    }
}

/// Sets a field read once; a second time is an error, as it is for a derived reader.
fn once<T, E: de::Error>(slot: &mut Option<T>, name: &'static str, value: T) -> Result<(), E> {
    if slot.replace(value).is_some() {
        return Err(E::duplicate_field(name));
    }
    Ok(())
}

/// Reads `descriptors`.
struct DescriptorsSeed<'n> {
    names: &'n mut Names,
}

impl<'de> DeserializeSeed<'de> for DescriptorsSeed<'_> {
    type Value = Descriptors;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Descriptors, D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for DescriptorsSeed<'_> {
    type Value = Descriptors;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of descriptors")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Descriptors, A::Error> {
        let mut descriptors = Descriptors::new();
        while let Some(descriptor) = seq.next_element_seed(DescriptorSeed { names: self.names })? {
            descriptors.push(descriptor);
        }
        Ok(descriptors)
    }
}

/// Reads one descriptor: `entries` and `hits_addend`.
struct DescriptorSeed<'n> {
    names: &'n mut Names,
}

impl<'de> DeserializeSeed<'de> for DescriptorSeed<'_> {
    type Value = LoggedDescriptor;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<LoggedDescriptor, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for DescriptorSeed<'_> {
    type Value = LoggedDescriptor;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a descriptor")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<LoggedDescriptor, A::Error> {
        let (mut entries, mut hits_addend) = (None, None);
        while let Some(Text(field)) = map.next_key::<Text<'de>>()? {
            match field.as_ref() {
                "entries" => {
                    let read = map.next_value_seed(EntriesSeed { names: self.names })?;
                    once(&mut entries, "entries", read)?;
                }
                "hits_addend" => once(&mut hits_addend, "hits_addend", map.next_value::<Option<u64>>()?)?,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(LoggedDescriptor {
            entries: entries.ok_or_else(|| de::Error::missing_field("entries"))?,
            hits_addend: hits_addend.flatten(),
        })
    }
}

/// Reads a descriptor's `entries`.
struct EntriesSeed<'n> {
    names: &'n mut Names,
}

impl<'de> DeserializeSeed<'de> for EntriesSeed<'_> {
    type Value = Entries;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for EntriesSeed<'_> {
    type Value = Entries;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of entries")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut entries = SmallVec::new();
        while let Some(entry) = seq.next_element_seed(EntrySeed { names: self.names })? {
            entries.push(entry);
        }
        Ok(entries)
    }
}

/// Reads one entry: `key` and `value` (empty when absent).
struct EntrySeed<'n> {
    names: &'n mut Names,
}

impl<'de> DeserializeSeed<'de> for EntrySeed<'_> {
    type Value = (Arc<str>, Box<str>);

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for EntrySeed<'_> {
    type Value = (Arc<str>, Box<str>);

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an entry")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let (mut key, mut value) = (None, None);
        while let Some(Text(field)) = map.next_key::<Text<'de>>()? {
            match field.as_ref() {
                "key" => {
                    let Text(text) = map.next_value()?;
                    once(&mut key, "key", self.names.get(&text))?;
                }
                "value" => {
                    let Text(text) = map.next_value()?;
                    once(&mut value, "value", Box::<str>::from(text))?;
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok((
            key.ok_or_else(|| de::Error::missing_field("key"))?,
            value.unwrap_or_default(),
        ))
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
}
