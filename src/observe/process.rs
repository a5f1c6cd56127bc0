//! The standard `process_*` metrics (CPU, resident memory, open and maximum file descriptors, start
//! time), read from `/proc/self` at each scrape, as Prometheus' client libraries export them. On other
//! systems nothing is written.

use std::fmt::Write as _;

/// Kernel clock ticks per second in `/proc/self/stat` (`USER_HZ`): 100 on every architecture Linux
/// exports to user space with that interface. Reading it with `sysconf` would take `unsafe`.
const TICKS_PER_SECOND: f64 = 100.0;

/// Appends the `process_*` series to `out`.
pub(super) fn render(out: &mut String) {
    let Some(process) = Process::read() else {
        return;
    };
    let series: [(&str, &str, &str, f64); 5] = [
        (
            "process_cpu_seconds_total",
            "counter",
            "User and system CPU time spent, in seconds.",
            process.cpu_seconds,
        ),
        (
            "process_resident_memory_bytes",
            "gauge",
            "Resident memory size in bytes.",
            process.resident_bytes,
        ),
        (
            "process_open_fds",
            "gauge",
            "Open file descriptors.",
            process.open_fds,
        ),
        (
            "process_max_fds",
            "gauge",
            "Most open file descriptors allowed.",
            process.max_fds,
        ),
        (
            "process_start_time_seconds",
            "gauge",
            "Start time of the process since the Unix epoch, in seconds.",
            process.start_time_seconds,
        ),
    ];
    for (name, kind, help, value) in series {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}");
    }
}

/// The process's soft limit on open files, from `/proc/self/limits` (`None` where there is none, or
/// when it is unlimited).
pub fn open_file_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    max_open_files(&limits).map(|files| files as u64)
}

/// One reading of `/proc/self`.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Process {
    cpu_seconds: f64,
    resident_bytes: f64,
    open_fds: f64,
    max_fds: f64,
    start_time_seconds: f64,
}

impl Process {
    fn read() -> Option<Self> {
        let read = |path: &str| std::fs::read_to_string(path).ok();
        let (cpu_seconds, start_ticks) = stat_times(&read("/proc/self/stat")?)?;
        let boot_time = read("/proc/stat")?
            .lines()
            .find_map(|line| line.strip_prefix("btime "))?
            .trim()
            .parse::<f64>()
            .ok()?;
        Some(Self {
            cpu_seconds,
            resident_bytes: resident_kib(&read("/proc/self/status")?)? * 1024.0,
            open_fds: std::fs::read_dir("/proc/self/fd").ok()?.count() as f64,
            max_fds: max_open_files(&read("/proc/self/limits")?)?,
            start_time_seconds: boot_time + start_ticks / TICKS_PER_SECOND,
        })
    }
}

/// (user + system CPU seconds, start time in ticks after boot) from `/proc/self/stat`. The command
/// name (field 2) may hold spaces and parentheses, so fields are counted after its last `)`.
fn stat_times(stat: &str) -> Option<(f64, f64)> {
    let fields: Vec<&str> = stat.get(stat.rfind(')')? + 1..)?.split_whitespace().collect();
    // After the name, field 3 (state) is index 0: utime is field 14, stime 15, starttime 22.
    let field = |n: usize| fields.get(n - 3)?.parse::<f64>().ok();
    Some(((field(14)? + field(15)?) / TICKS_PER_SECOND, field(22)?))
}

/// `VmRSS` from `/proc/self/status`, in KiB.
fn resident_kib(status: &str) -> Option<f64> {
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The soft limit of "Max open files" from `/proc/self/limits`.
fn max_open_files(limits: &str) -> Option<f64> {
    let line = limits.lines().find(|line| line.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_files_are_read_field_by_field() {
        let stat = "4242 (tollgate (x) y) S 1 4242 4242 0 -1 4194560 1000 0 0 0 250 150 0 0 20 0 3 0 12345 \
                    100000000 2000 18446744073709551615";
        assert_eq!(stat_times(stat), Some((4.0, 12345.0)));
        assert_eq!(
            resident_kib("Name:\ttollgate\nVmRSS:\t   20480 kB\n"),
            Some(20480.0)
        );
        let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                      Max open files            1024                 524288               files\n";
        assert_eq!(max_open_files(limits), Some(1024.0));
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn this_process_is_measured() {
        let process = Process::read().expect("/proc/self");
        assert!(
            process.resident_bytes > 0.0 && process.open_fds >= 3.0,
            "{process:?}"
        );
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after the epoch")
            .as_secs_f64();
        assert!(
            (now - 3600.0..=now + 1.0).contains(&process.start_time_seconds),
            "started within the hour: {process:?}"
        );
    }
}
