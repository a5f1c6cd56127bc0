//! What a call is limited by: a descriptor, as the rules file matches it.

use crate::proto::v1;

/// One descriptor: `(key, value)` entries matched in order against the rules (as Envoy's are), and
/// optionally a cost of its own instead of the call's.
///
/// ```
/// use tollgate_client::Descriptor;
///
/// let otp = Descriptor::new([("path", "/auth/otp"), ("phone", "5550100")]);
/// let tokens = Descriptor::from([("model", "large")]).with_cost(1_200);
/// assert_eq!(otp.entries()[1], ("phone".to_owned(), "5550100".to_owned()));
/// assert_eq!(tokens.cost(), Some(1_200));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Descriptor {
    entries: Vec<(String, String)>,
    cost: Option<u64>,
}

impl Descriptor {
    /// A descriptor of these entries, in order.
    pub fn new<K: Into<String>, V: Into<String>>(entries: impl IntoIterator<Item = (K, V)>) -> Self {
        Self {
            entries: entries.into_iter().map(|(k, v)| (k.into(), v.into())).collect(),
            cost: None,
        }
    }

    /// Appends an entry.
    pub fn entry(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.entries.push((key.into(), value.into()));
        self
    }

    /// Charges this descriptor `cost` units instead of the call's cost.
    pub fn with_cost(mut self, cost: u64) -> Self {
        self.cost = Some(cost);
        self
    }

    /// The entries, in order.
    pub fn entries(&self) -> &[(String, String)] {
        &self.entries
    }

    /// The descriptor's own cost, if it has one.
    pub fn cost(&self) -> Option<u64> {
        self.cost
    }

    pub(crate) fn to_wire(&self) -> v1::Descriptor {
        v1::Descriptor {
            entries: self
                .entries
                .iter()
                .map(|(key, value)| v1::Entry {
                    key: key.clone(),
                    value: value.clone(),
                })
                .collect(),
            cost: self.cost,
        }
    }
}

impl<K: Into<String>, V: Into<String>, const N: usize> From<[(K, V); N]> for Descriptor {
    fn from(entries: [(K, V); N]) -> Self {
        Self::new(entries)
    }
}

pub(crate) fn to_wire(descriptors: &[Descriptor]) -> Vec<v1::Descriptor> {
    descriptors.iter().map(Descriptor::to_wire).collect()
}
