//! Work split over the machine's cores: a large rules file's top-level descriptors are read in
//! consecutive parts, one per core, on scoped threads ([`super::file`]); the parts' results come back in
//! order, so what is built is what one thread would have built.

use std::num::NonZeroUsize;
use std::sync::{Mutex, PoisonError};

/// The most threads one piece of work is split over.
const MAX_THREADS: usize = 8;

/// Each thread's stack: a main thread's, for the YAML parser's recursion at the deepest nesting its
/// budget allows (only what is used is ever backed by memory).
const STACK_BYTES: usize = 8 << 20;

/// How many parts work of `size` (in any unit) is split into, each of at least `min_part`: as many as
/// the cores this process may use (a container's CPU quota counts), at most [`MAX_THREADS`]. The cores
/// are only asked for when the work is large enough to split: asking reads the cgroup's files.
pub(crate) fn parts_for(size: usize, min_part: usize) -> usize {
    let most = size / min_part.max(1);
    if most < 2 {
        return 1;
    }
    std::thread::available_parallelism()
        .map_or(1, NonZeroUsize::get)
        .min(MAX_THREADS)
        .min(most)
}

/// `work` applied to each of `parts`: the first on this thread, each other on a scoped thread of its own.
/// The results are in the parts' order. A part whose thread cannot start is worked on here once the
/// others have started; a panic in a part is resumed here.
pub(crate) fn each_in_order<P: Send, R: Send>(parts: Vec<P>, work: impl Fn(P) -> R + Sync) -> Vec<R> {
    // Each part waits in a slot that exactly one of its thread or this one empties: a thread that
    // cannot start drops what it was given, so it is given only the slot.
    let slots: Vec<Mutex<Option<P>>> = parts.into_iter().map(|part| Mutex::new(Some(part))).collect();
    let take = |slot: &Mutex<Option<P>>| slot.lock().unwrap_or_else(PoisonError::into_inner).take();
    let (work, take) = (&work, &take);
    std::thread::scope(|scope| {
        let Some((first, others)) = slots.split_first() else {
            return Vec::new();
        };
        let threads: Vec<_> = others
            .iter()
            .map(|slot| {
                std::thread::Builder::new()
                    .name("tollgate-load".to_owned())
                    .stack_size(STACK_BYTES)
                    .spawn_scoped(scope, move || take(slot).map(work))
                    .ok()
            })
            .collect();
        let mut results = vec![take(first).map(work)];
        for (slot, thread) in others.iter().zip(threads) {
            results.push(match thread {
                Some(thread) => thread
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
                None => take(slot).map(work),
            });
        }
        // Every slot was emptied once, by the thread that worked on it: no result is missing.
        results.into_iter().flatten().collect()
    })
}

#[cfg(test)]
mod tests {
    use super::{MAX_THREADS, each_in_order, parts_for};

    #[test]
    fn work_is_split_only_when_each_part_gets_its_share() {
        assert_eq!(parts_for(0, 10), 1);
        assert_eq!(parts_for(19, 10), 1);
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        assert_eq!(parts_for(20, 10), cores.min(2));
        assert_eq!(parts_for(usize::MAX, 1), cores.min(MAX_THREADS));
    }

    #[test]
    fn parts_come_back_in_order_whatever_finishes_first() {
        let parts: Vec<u64> = (0..6).collect();
        let results = each_in_order(parts, |part| {
            // The first parts take longest.
            std::thread::sleep(std::time::Duration::from_millis(30 - 5 * part));
            (part, std::thread::current().name().map(str::to_owned))
        });
        assert_eq!(
            results.iter().map(|(part, _)| *part).collect::<Vec<_>>(),
            (0..6).collect::<Vec<_>>()
        );
        assert!(
            results[1..]
                .iter()
                .all(|(_, name)| name.as_deref() == Some("tollgate-load"))
        );
        assert!(each_in_order(Vec::<u8>::new(), |part| part).is_empty());
    }

    #[test]
    fn a_panic_in_a_part_is_resumed_by_the_caller() {
        let outcome = std::panic::catch_unwind(|| each_in_order(vec![1, 2, 3], |part| assert_ne!(part, 3)));
        assert!(outcome.is_err());
    }
}
