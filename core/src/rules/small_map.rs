//! The matcher's map from descriptor keys and values to what they select, sized for what rules hold:
//! most levels of a rules tree hold one to a few keys (a route's selector, a client key below it), and
//! a hash table holding one entry costs several hundred bytes (four buckets and their control bytes)
//! where the entry itself needs a few dozen. Up to [`MAX_FEW`] entries live in a vector searched in
//! order, which for a handful of short keys is also faster than hashing; past that, a hash table with
//! hashbrown's seeded foldhash (a level of 100,000 routes hashes each route's key several times to
//! build, and a request's value once per lookup: SipHash was 3 % of loading such a file). Its keys come
//! from the rules, not from requests, so a caller cannot choose keys that collide.

use hashbrown::HashMap;

/// Most entries kept in a vector before the map becomes a hash table.
pub(crate) const MAX_FEW: usize = 8;

/// A map from strings, a vector while small.
#[derive(Debug)]
pub(crate) enum SmallMap<V> {
    /// At most [`MAX_FEW`] entries, in insertion order.
    Few(Vec<(Box<str>, V)>),
    /// More. Boxed: a vector is half a hash table's size inline, and most maps stay vectors, so the
    /// rare large map pays one more allocation for every small one to be 24 bytes smaller.
    #[allow(clippy::box_collection)]
    Many(Box<HashMap<Box<str>, V>>),
}

impl<V> Default for SmallMap<V> {
    fn default() -> Self {
        Self::Few(Vec::new())
    }
}

impl<V> SmallMap<V> {
    /// The value for `key`.
    pub(crate) fn get(&self, key: &str) -> Option<&V> {
        match self {
            Self::Few(entries) => entries.iter().find(|(k, _)| &**k == key).map(|(_, v)| v),
            Self::Many(map) => map.get(key),
        }
    }

    /// The value for `key`, inserted as `V::default()` when absent.
    pub(crate) fn get_or_default(&mut self, key: &str) -> &mut V
    where
        V: Default,
    {
        self.make_room(key);
        match self {
            Self::Few(entries) => {
                let at = match entries.iter().position(|(k, _)| &**k == key) {
                    Some(at) => at,
                    None => {
                        entries.push((key.into(), V::default()));
                        entries.len() - 1
                    }
                };
                &mut entries[at].1
            }
            Self::Many(map) => map.entry_ref(key).or_default(),
        }
    }

    /// Sets `key` to `value`, returning the value it replaced.
    pub(crate) fn insert(&mut self, key: Box<str>, value: V) -> Option<V> {
        self.make_room(&key);
        match self {
            Self::Few(entries) => match entries.iter_mut().find(|(k, _)| *k == key) {
                Some((_, old)) => Some(std::mem::replace(old, value)),
                None => {
                    entries.push((key, value));
                    None
                }
            },
            Self::Many(map) => map.insert(key, value),
        }
    }

    /// Turns a full vector that lacks `key` into a hash table, so that `key` can be added.
    fn make_room(&mut self, key: &str) {
        if let Self::Few(entries) = self
            && entries.len() >= MAX_FEW
            && !entries.iter().any(|(k, _)| &**k == key)
        {
            let map: HashMap<Box<str>, V> = std::mem::take(entries).into_iter().collect();
            *self = Self::Many(Box::new(map));
        }
    }

    /// Gives back what growing left unused: a compiled rule set lives until the next reload.
    pub(crate) fn shrink_to_fit(&mut self) {
        match self {
            Self::Few(entries) => entries.shrink_to_fit(),
            Self::Many(map) => map.shrink_to_fit(),
        }
    }

    /// Every value, for a pass over the compiled tree.
    pub(crate) fn values_mut(&mut self) -> impl Iterator<Item = &mut V> {
        let (few, many) = match self {
            Self::Few(entries) => (Some(entries.iter_mut().map(|(_, v)| v)), None),
            Self::Many(map) => (None, Some(map.values_mut())),
        };
        few.into_iter().flatten().chain(many.into_iter().flatten())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_map_finds_what_it_holds_small_and_large() {
        let mut map: SmallMap<usize> = SmallMap::default();
        for i in 0..MAX_FEW {
            assert_eq!(map.insert(i.to_string().into(), i), None);
        }
        assert!(matches!(map, SmallMap::Few(_)));
        assert_eq!(map.insert("3".into(), 30), Some(3), "a repeated key replaces");
        map.insert("many".into(), 99);
        assert!(
            matches!(map, SmallMap::Many(_)),
            "past {MAX_FEW} entries, a hash table"
        );
        for i in (0..MAX_FEW).filter(|&i| i != 3) {
            assert_eq!(map.get(&i.to_string()), Some(&i));
        }
        assert_eq!(
            (map.get("3"), map.get("many"), map.get("none")),
            (Some(&30), Some(&99), None)
        );
        *map.get_or_default("new") += 5;
        *map.get_or_default("new") += 5;
        assert_eq!(map.get("new"), Some(&10));
        let mut grown: SmallMap<usize> = SmallMap::default();
        for round in 1..=2 {
            for i in 0..=MAX_FEW {
                *grown.get_or_default(&i.to_string()) += i * round;
            }
        }
        assert!(
            matches!(grown, SmallMap::Many(_)),
            "past {MAX_FEW} entries, a hash table"
        );
        assert!((0..=MAX_FEW).all(|i| grown.get(&i.to_string()) == Some(&(i * 3))));
        map.shrink_to_fit();
        assert_eq!(map.values_mut().count(), MAX_FEW + 2);
    }
}
