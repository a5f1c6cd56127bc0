//! Time order within a bounded window. Access logs are written as requests end, so their start times
//! are a little out of order; each record is held until the log has moved on by the window, then
//! released in time order (ties in line order). A record earlier than one already released would
//! have to be replayed in the past: it is refused ([`Late`]), so that a log out of order by more than
//! the window is never replayed wrong without a word.
//!
//! The held records are a deque kept sorted: a log is nearly in order, so a record goes at the back or
//! near it (and a reversed one at the front), and leaves from the front, without the moves a heap
//! makes.

use std::collections::VecDeque;

use super::input::Record;

/// Most records held at once: past this the earliest is released early (a later record earlier than
/// it is then [`Late`]), so memory stays bounded however dense the log.
const MAX_HELD: usize = 1 << 20;

/// The reordering buffer.
pub(super) struct Reorder {
    window_us: u64,
    held: VecDeque<Held>,
    /// The newest time seen.
    newest_us: u64,
    /// The time of the last record released.
    released_us: u64,
}

/// A record waiting, with its line.
struct Held {
    time_us: u64,
    line: u64,
    record: Record,
}

/// A record earlier than one already replayed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Late {
    /// Its line.
    pub(super) line: u64,
    /// How much earlier than the last record replayed, in microseconds.
    pub(super) by_us: u64,
}

impl Reorder {
    /// A buffer that holds records for `window_us`.
    pub(super) fn new(window_us: u64) -> Self {
        Self {
            window_us,
            held: VecDeque::new(),
            newest_us: 0,
            released_us: 0,
        }
    }

    /// Takes `record`, read on `line`.
    pub(super) fn push(&mut self, record: Record, line: u64) -> Result<(), Late> {
        let time_us = record.time_us();
        if time_us < self.released_us {
            return Err(Late {
                line,
                by_us: self.released_us - time_us,
            });
        }
        self.newest_us = self.newest_us.max(time_us);
        let held = Held {
            time_us,
            line,
            record,
        };
        // Most records are not earlier than the last one held: they go at the back, without a search.
        if self.held.back().is_none_or(|last| last.time_us <= time_us) {
            self.held.push_back(held);
            return Ok(());
        }
        // After every record not later than it (ties stay in line order); moving the shorter side.
        let at = self.held.partition_point(|h| h.time_us <= time_us);
        self.held.insert(at, held);
        Ok(())
    }

    /// Hands `step` each record whose time has come (the log is past it by the window, or too much
    /// is held), or with `all` every record held (the log has ended), in order. Each is read where
    /// it is held, not moved out: held records are cold, and moving each cost 3 % of a replay.
    pub(super) fn release<E>(
        &mut self,
        all: bool,
        mut step: impl FnMut(u64, &Record) -> Result<(), E>,
    ) -> Result<(), E> {
        while let Some(earliest) = self.held.front() {
            let due = earliest.time_us.saturating_add(self.window_us) <= self.newest_us;
            if !(all || due || self.held.len() > MAX_HELD) {
                break;
            }
            self.released_us = earliest.time_us;
            let stepped = step(earliest.line, &earliest.record);
            self.held.pop_front();
            stepped?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::what_if::input::{HttpRequest, Record};

    fn at(time_us: u64) -> Record {
        Record::Http(HttpRequest::new(time_us, None, 0))
    }

    /// A step that notes each record's line and time in `out`.
    fn step(out: &mut Vec<(u64, u64)>) -> impl FnMut(u64, &Record) -> Result<(), ()> + '_ {
        |line, record| {
            out.push((line, record.time_us()));
            Ok(())
        }
    }

    #[test]
    fn records_come_out_sorted_within_the_window_and_a_later_early_one_is_late() {
        let mut order = Reorder::new(10);
        let mut out = Vec::new();
        for (line, time) in [(1, 100), (2, 95), (3, 103), (4, 100), (5, 112), (6, 120)] {
            order.push(at(time), line).expect("within the window");
            order.release(false, step(&mut out)).expect("stepped");
        }
        assert_eq!(out, [(2, 95), (1, 100), (4, 100), (3, 103)]);
        assert_eq!(order.push(at(99), 7), Err(Late { line: 7, by_us: 4 }));
        order.release(true, step(&mut out)).expect("stepped");
        assert_eq!(
            out.iter().map(|(_, t)| *t).collect::<Vec<_>>(),
            [95, 100, 100, 103, 112, 120]
        );
    }
}
