//! The gathering window's timer (`REDIS_PIPELINE_WINDOW`), to the microsecond.
//!
//! tokio's timers tick in milliseconds: a 150 µs window (the Go service's suggested value) would wait
//! up to a whole millisecond, six times what the operator asked for, on every call. On Linux this timer
//! is a `timerfd` read through tokio's reactor, which wakes the task when the kernel timer expires; the
//! kernel's own slack is a few tens of microseconds. Elsewhere, or if the kernel refuses a `timerfd`,
//! it falls back to tokio's timer (and so to whole milliseconds), with a warning.

use tokio::time::Instant;

/// A one-shot timer, armed for each call that gathers and awaited while it does.
#[derive(Debug)]
pub(super) struct WindowTimer {
    /// When the current window closes.
    until: Instant,
    /// The kernel timer; `None`: tokio's.
    #[cfg(target_os = "linux")]
    precise: Option<tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>>,
}

impl WindowTimer {
    /// A timer, precise where the platform allows.
    pub(super) fn new() -> Self {
        Self {
            until: Instant::now(),
            #[cfg(target_os = "linux")]
            precise: linux::timerfd()
                .inspect_err(|error| {
                    tracing::warn!(%error, "no timerfd: gathering windows are rounded up to whole milliseconds");
                })
                .ok(),
        }
    }

    /// Sets the window to close at `until`.
    pub(super) fn arm(&mut self, until: Instant) {
        self.until = until;
        #[cfg(target_os = "linux")]
        if let Some(fd) = &self.precise
            && let Err(error) = linux::set(fd.get_ref(), until)
        {
            tracing::warn!(%error, "cannot arm the timerfd: this window is rounded up to whole milliseconds");
            self.precise = None;
        }
    }

    /// Returns once the window has closed. Cancel-safe: awaited again, it waits for the same instant.
    pub(super) async fn closed(&self) {
        #[cfg(target_os = "linux")]
        // A read error cannot come from a timerfd that was armed; should it, tokio's timer decides.
        if let Some(fd) = &self.precise
            && linux::expired(fd).await.is_ok()
        {
            return;
        }
        tokio::time::sleep_until(self.until).await;
    }
}

#[cfg(target_os = "linux")]
mod linux {
    use std::io;
    use std::os::fd::OwnedFd;

    use rustix::time::{
        Itimerspec, TimerfdClockId, TimerfdFlags, TimerfdTimerFlags, Timespec, timerfd_create,
        timerfd_settime,
    };
    use tokio::io::Interest;
    use tokio::io::unix::AsyncFd;
    use tokio::time::Instant;

    /// A non-blocking monotonic timerfd, registered with tokio's reactor.
    pub(super) fn timerfd() -> io::Result<AsyncFd<OwnedFd>> {
        let fd = timerfd_create(
            TimerfdClockId::Monotonic,
            TimerfdFlags::NONBLOCK | TimerfdFlags::CLOEXEC,
        )?;
        // tokio deprecates this safe constructor because a type could hand it a descriptor that changes
        // or closes while registered; its replacement is `unsafe`, which this crate forbids. An
        // `OwnedFd` moved into the `AsyncFd` is open, never replaced and closed only when dropped with
        // it, which is the condition that replacement asks its caller to uphold.
        #[allow(deprecated)]
        AsyncFd::with_interest(fd, Interest::READABLE)
    }

    /// Arms `fd` to expire once, at `until`. Re-arming discards an expiry not yet read.
    pub(super) fn set(fd: &OwnedFd, until: Instant) -> io::Result<()> {
        // A zero value would disarm the timer: a window already closed expires in a nanosecond.
        let left = until
            .saturating_duration_since(Instant::now())
            .max(std::time::Duration::from_nanos(1));
        let value = Timespec::try_from(left).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        let zero = Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        let spec = Itimerspec {
            it_interval: zero,
            it_value: value,
        };
        timerfd_settime(fd, TimerfdTimerFlags::empty(), &spec)?;
        Ok(())
    }

    /// Waits until `fd` has expired, and reads the expiry.
    pub(super) async fn expired(fd: &AsyncFd<OwnedFd>) -> io::Result<()> {
        loop {
            let mut ready = fd.readable().await?;
            let mut count = [0u8; 8];
            match ready.try_io(|fd| Ok(rustix::io::read(fd.get_ref(), &mut count)?)) {
                Ok(read) => return read.map(|_| ()),
                // Readiness left over from an expiry that re-arming discarded: wait again.
                Err(_would_block) => continue,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_window_closes_at_its_instant_and_not_before() {
        let mut timer = WindowTimer::new();
        #[cfg(target_os = "linux")]
        assert!(timer.precise.is_some(), "a timerfd on Linux");
        let opened = Instant::now();
        timer.arm(opened + Duration::from_micros(300));
        timer.closed().await;
        assert!(opened.elapsed() >= Duration::from_micros(300));
    }

    #[tokio::test]
    async fn re_arming_discards_an_expiry_not_yet_awaited() {
        let mut timer = WindowTimer::new();
        // A window that closed unobserved (the call filled up first)...
        timer.arm(Instant::now());
        tokio::time::sleep(Duration::from_millis(5)).await;
        // ...must not close the next one early.
        let opened = Instant::now();
        timer.arm(opened + Duration::from_millis(20));
        timer.closed().await;
        assert!(opened.elapsed() >= Duration::from_millis(20));
    }
}
