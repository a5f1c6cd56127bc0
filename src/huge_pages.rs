//! Transparent huge pages, off for the process unless `TRANSPARENT_HUGE_PAGES` allows them (Linux).
//!
//! mimalloc asks the kernel for transparent huge pages on its arenas (`madvise(MADV_HUGEPAGE)`, which
//! counts even where the system setting is `madvise`), so the first touch of any byte of a 2 MiB
//! region faults in, and zeroes, all of it. What that costs showed in loading rules: on the 2-core VM
//! of docs/performance.md, zeroing huge pages was a third of `check-config`'s time for 100,000 routes
//! (1.3 s of system time, 0.15-0.3 s with 4 KiB pages), and partly used huge pages held 12 MB of idle
//! RSS that depended on how many huge pages the kernel had free. Decisions/s at 64 in flight over
//! those routes did not measurably change either way. Redis recommends the same for latency.

/// Turns transparent huge pages off for this process unless `allowed`, before the rules load. Returns
/// a warning to log when the kernel refused (the process then runs as the system configures it).
pub fn apply(allowed: bool) -> Option<String> {
    if allowed {
        return None;
    }
    disable()
        .err()
        .map(|error| format!("could not turn transparent huge pages off (TRANSPARENT_HUGE_PAGES): {error}"))
}

#[cfg(target_os = "linux")]
fn disable() -> std::io::Result<()> {
    Ok(rustix::thread::disable_transparent_huge_pages(true)?)
}

/// Elsewhere the allocator gets no transparent huge pages to turn off.
#[cfg(not(target_os = "linux"))]
fn disable() -> std::io::Result<()> {
    Ok(())
}
