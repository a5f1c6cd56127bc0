//! What the server tells its allocator. mimalloc (the global allocator, src/main.rs) returns free
//! pages to the kernel only once they have been free for its purge delay (`MIMALLOC_PURGE_DELAY`,
//! 1 s), and only from inside a later free of a whole page: it has no thread of its own. A rules load
//! frees the rules it replaced all at once, and an idle server kept what a load had freed until
//! traffic came: at 100,000 routes, 160-180 MB of RSS instead of 132 (docs/performance.md). The
//! server installs [`return_freed_memory_soon`] as the core's hook after a rules load
//! (`tollgate_core::rules::reload::after_rules_freed`).

use std::time::Duration;

/// How long after a load (and after the rules it replaced are freed) the allocator is asked to give
/// back what that freed: past mimalloc's purge delay.
const RETURN_FREED_AFTER: Duration = Duration::from_secs(2);

/// Once [`RETURN_FREED_AFTER`] has passed, frees a whole page, so that mimalloc gives back the pages
/// whose purge delay has passed. Called on a Tokio runtime (the reload hook is); elsewhere it does
/// nothing.
pub(crate) fn return_freed_memory_soon() {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    runtime.spawn(async {
        tokio::time::sleep(RETURN_FREED_AFTER).await;
        return_freed_memory();
    });
}

/// Frees a whole page, which is when mimalloc gives back the pages whose purge delay has passed: a
/// block this large gets a page of its own (checked by the RSS it brought down, docs/performance.md),
/// and is never touched, so it costs address space, not memory.
fn return_freed_memory() {
    let page: Vec<u8> = Vec::with_capacity(8 << 20);
    drop(std::hint::black_box(page));
}
