//! Redis Cluster: which master serves each hash slot, as the link last read it (`CLUSTER SLOTS`), and
//! a connection of the link's own to each master.
//!
//! Concurrent requests' keys rarely share a slot (16,384 of them), but they share a few masters, so
//! the store sends what they share as one pipeline per master, each command carrying its own key
//! (`pipeline.rs`, `cluster_scripts.rs` beside this folder), and the map says which keys go together.
//!
//! Each pipeline goes to its master over a connection of its own, not through redis-rs' cluster
//! connection: that one sends a whole pipeline again wherever any of its replies says `MOVED` or
//! `ASK`, which would count again the counters the first master had counted. Where the map is out of
//! date (a slot moved), the master answers `MOVED` or `ASK` for the commands it does not serve, without
//! running them, and runs the others; the store sends those again through the cluster connection,
//! which redis-rs routes by key, and the map is read again.
//!
//! The link reads the map in the background, at most once a second, and opens a connection to each
//! master with the seed nodes' credentials and TLS settings (prepared by the link's user: see
//! [`super::Prepare`]) before it uses the map.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use redis::aio::ConnectionManager;

use super::{Connections, RedisLink, RedisMode, address, within};

/// Hash slots of a Redis Cluster.
pub(crate) const SLOTS: u16 = 16_384;

/// A slot no master serves, as far as the map knows.
const NOBODY: u16 = u16::MAX;

/// The master serving each hash slot.
#[derive(Debug)]
pub(crate) struct SlotMap {
    /// Per slot, an index into `masters`.
    owner: Box<[u16]>,
    /// Each master's address (host, port), as the cluster announces it.
    masters: Vec<(String, u16)>,
}

impl SlotMap {
    /// Reads a `CLUSTER SLOTS` reply: one entry per range, `[first, last, [ip, port, ...], replicas...]`.
    /// `None` if the reply has another shape.
    pub(super) fn parse(reply: &redis::Value) -> Option<Self> {
        let redis::Value::Array(ranges) = reply else {
            return None;
        };
        let mut owner = vec![NOBODY; usize::from(SLOTS)].into_boxed_slice();
        let mut masters: Vec<(String, u16)> = Vec::new();
        for range in ranges {
            let redis::Value::Array(fields) = range else {
                return None;
            };
            let [
                redis::Value::Int(first),
                redis::Value::Int(last),
                redis::Value::Array(master),
                ..,
            ] = fields.as_slice()
            else {
                return None;
            };
            let [redis::Value::BulkString(ip), redis::Value::Int(port), ..] = master.as_slice() else {
                return None;
            };
            let address = (String::from_utf8(ip.clone()).ok()?, u16::try_from(*port).ok()?);
            let index = match masters.iter().position(|known| *known == address) {
                Some(index) => index,
                None => {
                    masters.push(address);
                    masters.len() - 1
                }
            };
            let index = u16::try_from(index).ok().filter(|&index| index != NOBODY)?;
            let first = usize::try_from(*first).ok()?;
            let last = usize::try_from(*last)
                .ok()
                .filter(|&last| last < usize::from(SLOTS) && first <= last)?;
            owner[first..=last].fill(index);
        }
        Some(Self { owner, masters })
    }

    /// The master serving `slot` (an index into [`SlotMap::masters`]), if the map knows one.
    pub(super) fn master_of(&self, slot: u16) -> Option<u16> {
        Some(self.owner[usize::from(slot % SLOTS)]).filter(|&master| master != NOBODY)
    }

    /// Each master's address (host, port), by master index.
    pub(super) fn masters(&self) -> &[(String, u16)] {
        &self.masters
    }

    /// `slots` (ascending) grouped by the master serving them, for the masters `link` gives a link to
    /// (asked once per master): each such master with its link and its slots, in order of first
    /// appearance; then the other slots (no master known, or no link).
    fn group<L>(&self, slots: impl Iterator<Item = u16>, link: impl Fn(u16) -> Option<L>) -> Routes<L> {
        let (mut linked, mut others): (Vec<(u16, L, Vec<u16>)>, _) = (Vec::new(), Vec::new());
        // Masters found without a link, so that each is asked once.
        let mut unlinked_masters: Vec<u16> = Vec::new();
        for slot in slots {
            let Some(master) = self.master_of(slot) else {
                others.push(slot);
                continue;
            };
            // A handful of masters: short lists.
            if let Some((_, _, of_master)) = linked.iter_mut().find(|(m, _, _)| *m == master) {
                of_master.push(slot);
            } else if unlinked_masters.contains(&master) {
                others.push(slot);
            } else if let Some(found) = link(master) {
                linked.push((master, found, vec![slot]));
            } else {
                unlinked_masters.push(master);
                others.push(slot);
            }
        }
        Routes {
            linked,
            unlinked: others,
        }
    }
}

/// The slot map, with a connection to each of its masters (in [`SlotMap::masters`] order).
pub(crate) struct Masters {
    /// Which master serves each slot.
    pub(super) map: SlotMap,
    /// A connection to each master.
    links: Vec<ConnectionManager>,
    /// Per master, whether a call over its link has failed: from then on its slots go through the
    /// cluster connection, until a newer map replaces this one. The other masters keep their links, so
    /// the requests they serve do not wait for the cluster connection to find its way around the
    /// failed one.
    failed: Vec<AtomicBool>,
}

impl Masters {
    /// The links of `map`'s masters, in [`SlotMap::masters`] order, none failed yet.
    fn new(map: SlotMap, links: Vec<ConnectionManager>) -> Self {
        let failed = links.iter().map(|_| AtomicBool::new(false)).collect();
        Self { map, links, failed }
    }

    /// The link to `master`, unless a call over it has failed.
    pub(super) fn link(&self, master: u16) -> Option<&ConnectionManager> {
        let at = usize::from(master);
        let failed = self.failed.get(at)?.load(Ordering::Relaxed);
        (!failed).then(|| self.links.get(at)).flatten()
    }
}

/// Where the hash slots of a call go in a Redis Cluster ([`RedisLink::route`]); `L`, a link to a master.
pub(crate) struct Routes<L = ConnectionManager> {
    /// Each master with a usable link: its index (for [`RedisLink::link_failed`]), the link, and the
    /// slots it serves, ascending.
    pub(crate) linked: Vec<(u16, L, Vec<u16>)>,
    /// The slots without a usable link (the map not read yet, a master whose link failed, a slot no
    /// master serves), ascending: they go through redis-rs' cluster connection, one script call each.
    pub(crate) unlinked: Vec<u16>,
}

impl RedisLink {
    /// A call over the link to `master` (of the map in force) failed: the master may have gone (a
    /// failover). Its slots go through the cluster connection, which follows the cluster, and the map
    /// is read again (at most once a second) until a newer one replaces it.
    pub(crate) fn link_failed(&self, master: u16) {
        if let Some(masters) = self.slot_map.load_full()
            && let Some(failed) = masters.failed.get(usize::from(master))
        {
            failed.store(true, Ordering::Relaxed);
        }
        self.read_slot_map();
    }

    /// `slots` (ascending) by the master serving them, with the link to each, per the map in force. A
    /// slot without a usable link has the map read again (at most once a second): the map may not be
    /// read yet, or be out of date.
    pub(crate) fn route(&self, slots: impl Iterator<Item = u16>) -> Routes {
        let masters = self.slot_map.load_full();
        let routes = match &masters {
            Some(masters) => masters.map.group(slots, |master| masters.link(master).cloned()),
            None => Routes {
                linked: Vec::new(),
                unlinked: slots.collect(),
            },
        };
        if !routes.unlinked.is_empty() {
            self.read_slot_map();
        }
        routes
    }

    /// Reads the cluster's slot map in the background, at most once a second, for the next pipelines
    /// to group their commands by master (until then, [`RedisLink::route`] routes every slot unlinked).
    /// Also called when a master answers `MOVED` or `ASK`: the map in force stays (the other slots are
    /// still where it says) until the newer one replaces it.
    pub(crate) fn read_slot_map(&self) {
        const EVERY_US: u64 = 1_000_000;
        let now = self.clock.now_us();
        let tried = self.slot_map_tried_us.load(Ordering::Relaxed);
        if now.saturating_sub(tried) < EVERY_US
            || self
                .slot_map_tried_us
                .compare_exchange(tried, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        let Some(link) = self.me.upgrade() else {
            return;
        };
        let connections = self.connections.load_full();
        let Some(Connections::Cluster(conn)) = connections.as_deref() else {
            return;
        };
        let mut conn = conn.clone();
        tokio::spawn(async move {
            let command = redis::cmd("CLUSTER").arg("SLOTS").clone();
            let reply = within(
                Duration::from_micros(EVERY_US),
                command.query_async::<redis::Value>(&mut conn),
            )
            .await;
            let map = match reply.map(|reply| SlotMap::parse(&reply)) {
                Ok(Some(map)) => map,
                Ok(None) => {
                    tracing::warn!(
                        "unexpected CLUSTER SLOTS reply: fixed windows go to the script, one call per slot"
                    );
                    return;
                }
                Err(error) => {
                    let error = error.into_store_error(link.options.deadline);
                    tracing::warn!(%error, "cannot read CLUSTER SLOTS: fixed windows go to the script, one call per slot");
                    return;
                }
            };
            match link.link_masters(&map).await {
                Ok(links) => link.slot_map.store(Some(Arc::new(Masters::new(map, links)))),
                Err(error) => {
                    tracing::warn!(%error, "cannot connect to every cluster master: fixed windows go to the script, one call per slot");
                }
            }
        });
    }

    /// A connection to each master of `map`, with the seed nodes' credentials and TLS settings.
    async fn link_masters(&self, map: &SlotMap) -> Result<Vec<ConnectionManager>, redis::RedisError> {
        let unusable =
            |why: &'static str| redis::RedisError::from((redis::ErrorKind::InvalidClientConfig, why));
        let RedisMode::Cluster(seeds) = &self.options.target.mode else {
            return Err(unusable("not a cluster"));
        };
        let seed = seeds.first().ok_or_else(|| unusable("no seed node"))?;
        let mut links = Vec::with_capacity(map.masters().len());
        for (host, port) in map.masters() {
            let info =
                address::node_at(seed, host, *port).ok_or_else(|| unusable("a seed on a unix socket"))?;
            let client = self.node_client(info)?;
            let link = ConnectionManager::new_with_config(client, self.manager_config()).await?;
            self.prepare.master_linked(link.clone()).await;
            links.push(link);
        }
        Ok(links)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(first: i64, last: i64, port: i64) -> redis::Value {
        redis::Value::Array(vec![
            redis::Value::Int(first),
            redis::Value::Int(last),
            redis::Value::Array(vec![
                redis::Value::BulkString(b"127.0.0.1".to_vec()),
                redis::Value::Int(port),
                redis::Value::BulkString(b"node-id".to_vec()),
            ]),
        ])
    }

    #[test]
    fn slots_are_grouped_by_the_master_serving_them() {
        // Three masters, one of them serving two ranges and one without a link; slot 16383 served by
        // nobody.
        let reply = redis::Value::Array(vec![
            range(0, 99, 7000),
            range(100, 199, 7001),
            range(200, 299, 7002),
            range(300, 16382, 7000),
        ]);
        let map = SlotMap::parse(&reply).expect("a CLUSTER SLOTS reply");
        assert_eq!(
            map.masters(),
            [
                ("127.0.0.1".to_owned(), 7000),
                ("127.0.0.1".to_owned(), 7001),
                ("127.0.0.1".to_owned(), 7002)
            ]
        );
        let asked = std::cell::RefCell::new(Vec::new());
        let link = |master: u16| {
            asked.borrow_mut().push(master);
            (master != 2).then(|| format!("link to {master}"))
        };
        let slots = [5, 150, 250, 260, 300, 16383].into_iter();
        let routes = map.group(slots, link);
        assert_eq!(
            routes.linked,
            [
                (0, "link to 0".to_owned(), vec![5, 300]),
                (1, "link to 1".to_owned(), vec![150])
            ]
        );
        assert_eq!(routes.unlinked, [250, 260, 16383]);
        assert_eq!(*asked.borrow(), [0, 1, 2], "each master asked once");
    }

    #[test]
    fn replies_of_another_shape_are_no_map() {
        assert!(SlotMap::parse(&redis::Value::Nil).is_none());
        assert!(SlotMap::parse(&redis::Value::Array(vec![redis::Value::Int(1)])).is_none());
        let beyond = redis::Value::Array(vec![range(0, 16384, 7000)]);
        assert!(SlotMap::parse(&beyond).is_none(), "no slot 16384");
        let backwards = redis::Value::Array(vec![range(10, 9, 7000)]);
        assert!(SlotMap::parse(&backwards).is_none());
    }
}
