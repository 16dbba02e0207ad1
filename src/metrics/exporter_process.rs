//! The exporter's own `process_*` metrics (Linux): the families, names and help texts of the
//! `prometheus` crate's process collector, each value read with one system call on a descriptor
//! opened once, every tick (a `/proc` file is generated anew by every read from its start).
//!
//! That collector lists `/proc/<pid>/fd` and has the kernel format and then parses
//! `/proc/<pid>/limits` and the 52 fields of `/proc/<pid>/stat` on every call, a large part of a
//! tick's own work. Here:
//! - CPU time: `clock_gettime(CLOCK_PROCESS_CPUTIME_ID)`, exact to the nanosecond (the collector
//!   truncated it to whole seconds); the file limit: `getrlimit`.
//! - Memory: `/proc/self/statm`. Not `/proc/self/stat`, whose every read makes the kernel check
//!   ptrace access (through any BPF security hooks installed) and format 52 fields.
//! - Threads: the link count of `/proc/self/task` (the kernel adds one per thread to the
//!   directory's two); `/proc/self/stat` where that reads less than three.
//! - Open descriptors: the size of `/proc/self/fd` (Linux 6.2 and later); its listing on older
//!   kernels, which report 0.
//! - Start time: `/proc/self/stat`, once.

#![allow(
    unsafe_code,
    reason = "libc calls: CPU time, the open-file limit, page size and clock ticks"
)]

use std::fs::{self, File};
use std::os::unix::fs::{FileExt, MetadataExt};

use super::text;
use crate::processes::procfs::{parse_start_time, stat_fields};

/// (name, help, type) of each family, in the order they are served (by name, as the registry
/// served them).
const FAMILIES: [(&str, &str, &str); 7] = [
    (
        "process_cpu_seconds_total",
        "Total user and system CPU time spent in seconds.",
        "counter",
    ),
    (
        "process_max_fds",
        "Maximum number of open file descriptors.",
        "gauge",
    ),
    (
        "process_open_fds",
        "Number of open file descriptors.",
        "gauge",
    ),
    (
        "process_resident_memory_bytes",
        "Resident memory size in bytes.",
        "gauge",
    ),
    (
        "process_start_time_seconds",
        "Start time of the process since unix epoch in seconds.",
        "gauge",
    ),
    (
        "process_threads",
        "Number of OS threads in the process.",
        "gauge",
    ),
    (
        "process_virtual_memory_bytes",
        "Virtual memory size in bytes.",
        "gauge",
    ),
];

/// Reads and writes this process's metrics.
#[derive(Debug)]
pub(super) struct ProcessMetrics {
    /// Seconds since the Unix epoch at which the process started; `None` if unreadable.
    start_time: Option<f64>,
    /// Bytes per page (`statm` counts memory in pages).
    page_size: f64,
    /// `/proc/self/statm`, `/proc/self/task` and `/proc/self/fd`, open for the process's life
    /// (`fd_dir` counts itself, as a listing does); `None` where one could not be opened.
    statm: Option<File>,
    task_dir: Option<File>,
    fd_dir: Option<File>,
}

impl ProcessMetrics {
    pub(super) fn new() -> ProcessMetrics {
        // SAFETY: sysconf only reads configuration values.
        let page_size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        let stat = fs::read("/proc/self/stat").ok();
        ProcessMetrics {
            start_time: stat
                .as_deref()
                .and_then(parse_start_time)
                .and_then(start_time),
            page_size: if page_size > 0 {
                page_size as f64
            } else {
                4096.0
            },
            statm: File::open("/proc/self/statm").ok(),
            task_dir: File::open("/proc/self/task").ok(),
            fd_dir: File::open("/proc/self/fd").ok(),
        }
    }

    /// Appends every family that could be read, in [`FAMILIES`] order.
    pub(super) fn write(&self, out: &mut text::Text) {
        let memory = self.memory();
        let values = [
            cpu_seconds(),
            max_fds(),
            self.open_fds(),
            memory.map(|(_, resident)| resident),
            self.start_time,
            self.threads(),
            memory.map(|(size, _)| size),
        ];
        for ((name, help, kind), value) in FAMILIES.iter().zip(values) {
            if let Some(v) = value {
                text::header(out, name, help, kind);
                text::line(out, name, "", [], v);
            }
        }
    }

    /// (virtual, resident) bytes: the first two fields of `/proc/self/statm`, read again from
    /// offset 0 of the open file.
    fn memory(&self) -> Option<(f64, f64)> {
        let mut buffer = [0u8; 128];
        let n = self.statm.as_ref()?.read_at(&mut buffer, 0).ok()?;
        let mut pages = std::str::from_utf8(&buffer[..n])
            .ok()?
            .split_ascii_whitespace();
        let mut next = || pages.next()?.parse::<f64>().ok();
        Some((next()? * self.page_size, next()? * self.page_size))
    }

    /// The number of threads: the link count of `/proc/self/task` less its own two, or field 20
    /// of `/proc/self/stat` where that is not how the kernel counts.
    fn threads(&self) -> Option<f64> {
        let links = self
            .task_dir
            .as_ref()
            .and_then(|d| d.metadata().ok())
            .map(|m| m.nlink());
        thread_count(links, || fs::read("/proc/self/stat").ok())
    }

    /// The number of open descriptors: the size of `/proc/self/fd` where the kernel reports it,
    /// else the length of its listing.
    fn open_fds(&self) -> Option<f64> {
        let counted = self.fd_dir.as_ref()?.metadata().ok()?.len();
        if counted > 0 {
            return Some(counted as f64);
        }
        listed_fds()
    }
}

/// Threads from the link count of the task directory when it counts them, else from a `stat`
/// line (field 20).
fn thread_count(task_links: Option<u64>, stat: impl FnOnce() -> Option<Vec<u8>>) -> Option<f64> {
    match task_links {
        Some(links) if links > 2 => Some((links - 2) as f64),
        _ => stat_fields(&stat()?)?.nth(17)?.parse().ok(),
    }
}

/// User and system CPU time of all threads, seconds.
fn cpu_seconds() -> Option<f64> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid clock id and a valid out-pointer.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    (rc == 0).then(|| ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9)
}

/// The soft limit on open files; `None` when unlimited or unreadable.
fn max_fds() -> Option<f64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: a valid resource and a valid out-pointer.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    (rc == 0 && limit.rlim_cur != libc::RLIM_INFINITY).then_some(limit.rlim_cur as f64)
}

/// The number of entries in `/proc/self/fd` (its own descriptor included).
fn listed_fds() -> Option<f64> {
    fs::read_dir("/proc/self/fd").ok().map(|d| d.count() as f64)
}

/// Seconds since the Unix epoch of a start `ticks` clock ticks after boot (`/proc/self/stat`
/// field 22): the boot time (`btime` in `/proc/stat`) plus those ticks.
fn start_time(ticks: u64) -> Option<f64> {
    let boot: f64 = fs::read_to_string("/proc/stat")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    // SAFETY: sysconf only reads configuration values.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (hz > 0).then(|| boot + ticks as f64 / hz as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read() -> String {
        let mut out = text::Text::default();
        ProcessMetrics::new().write(&mut out);
        String::from_utf8(out.bytes).unwrap()
    }

    fn value(text: &str, name: &str) -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
            .unwrap_or_else(|| panic!("{name} missing in\n{text}"))
            .parse()
            .unwrap()
    }

    #[test]
    fn help_texts_hold_nothing_to_escape() {
        for (name, help, _) in FAMILIES {
            assert!(!help.contains(['\\', '\n']), "{name}");
        }
    }

    #[test]
    fn every_family_is_served_with_plausible_values() {
        let t = read();
        for (name, _, kind) in FAMILIES {
            assert!(t.contains(&format!("# TYPE {name} {kind}\n")), "{name}");
        }
        let rss = value(&t, "process_resident_memory_bytes");
        let vsize = value(&t, "process_virtual_memory_bytes");
        assert!(rss > 1e6 && rss < vsize, "rss {rss}, vsize {vsize}");
        assert!(
            value(&t, "process_open_fds") >= 3.0,
            "stdin, stdout, stderr"
        );
        assert!(value(&t, "process_max_fds") >= value(&t, "process_open_fds"));
        assert!(value(&t, "process_threads") >= 1.0);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        let start = value(&t, "process_start_time_seconds");
        assert!(
            start <= now + 1.0 && start > now - 86_400.0,
            "{start} vs {now}"
        );
    }

    #[test]
    fn threads_come_from_the_task_links_or_else_from_stat() {
        let stat = || Some(crate::processes::procfs::tests::stat_line(7, "x", 99));
        assert_eq!(thread_count(Some(14), stat), Some(12.0));
        // `stat_line` says 8 threads (field 20).
        assert_eq!(thread_count(Some(2), stat), Some(8.0));
        assert_eq!(thread_count(None, stat), Some(8.0));
        assert_eq!(thread_count(None, || None), None);
    }

    #[test]
    fn memory_agrees_with_the_kernels_status_file() {
        let t = read();
        let status = fs::read_to_string("/proc/self/status").unwrap();
        let kib = |field: &str| -> f64 {
            let line = status.lines().find_map(|l| l.strip_prefix(field)).unwrap();
            line.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<f64>()
                .unwrap()
                * 1024.0
        };
        let near = |a: f64, b: f64| (a - b).abs() <= 0.2 * b;
        let rss = value(&t, "process_resident_memory_bytes");
        let vsize = value(&t, "process_virtual_memory_bytes");
        assert!(near(rss, kib("VmRSS:")), "rss {rss}");
        assert!(near(vsize, kib("VmSize:")), "vsize {vsize}");
    }

    #[test]
    fn the_open_files_give_fresh_values_each_tick() {
        let metrics = ProcessMetrics::new();
        let threads_now = || {
            let mut out = text::Text::default();
            metrics.write(&mut out);
            value(&String::from_utf8(out.bytes).unwrap(), "process_threads")
        };
        let before = threads_now();
        let barrier = std::sync::Arc::new(std::sync::Barrier::new(4));
        let spawned: Vec<_> = (0..3)
            .map(|_| {
                let b = barrier.clone();
                std::thread::spawn(move || {
                    b.wait();
                })
            })
            .collect();
        let during = threads_now();
        barrier.wait();
        spawned.into_iter().for_each(|t| t.join().unwrap());
        assert!(during >= before + 3.0, "{before} → {during}");
    }

    #[test]
    fn open_descriptors_are_counted_as_they_open_and_close() {
        let metrics = ProcessMetrics::new();
        let counts = || (metrics.open_fds().unwrap(), listed_fds().unwrap());
        let (before, listed_before) = counts();
        let files: Vec<File> = (0..200)
            .map(|_| File::open("/proc/self/stat").unwrap())
            .collect();
        let (during, listed_during) = counts();
        drop(files);
        let (after, _) = counts();
        // Other tests of this binary open and close files meanwhile, hence the margins.
        assert!(during >= before + 150.0, "{before} → {during}");
        assert!(
            listed_during >= listed_before + 150.0,
            "{listed_before} → {listed_during}"
        );
        assert!(after <= during - 150.0, "{during} → {after}");
    }

    #[test]
    fn cpu_time_grows_with_work_and_is_not_truncated_to_seconds() {
        let before = value(&read(), "process_cpu_seconds_total");
        // Burn a little CPU: the clock is per process, so the test's own work moves it.
        let mut x = 0u64;
        for i in 0..20_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        let after = value(&read(), "process_cpu_seconds_total");
        assert!(after > before, "{before} → {after}");
        assert!(after.fract() != 0.0, "whole seconds only: {after}");
    }
}
