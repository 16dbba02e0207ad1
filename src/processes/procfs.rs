//! Reading `<host-proc>/<pid>/{stat,comm,cgroup}` for the processes NVML lists, with a cache so
//! that a process that keeps running costs one small read (`stat`) per tick.
//!
//! A pid is reused by the kernel once its process exits, so the cache key is the pair (pid, start
//! time): a new process behind an old pid has another start time and is read anew.
//!
//! Every file is read as bytes: a process names itself (`prctl(PR_SET_NAME)`, no privilege
//! needed) with any bytes, which would otherwise make its `stat` unreadable as text and hide it
//! from attribution. Names are converted lossily.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};

use super::cgroup::{self, ProcessCgroup};

/// What procfs says about one process.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcInfo {
    /// `comm`: the executable name, at most 15 bytes, bytes that are not UTF-8 replaced by
    /// U+FFFD. `None` when unreadable.
    pub name: Option<String>,
    /// The pod and container from `cgroup`; `None` when the file could not be read.
    pub cgroup: Option<ProcessCgroup>,
}

/// The processes seen on one GPU, cached by (pid, start time).
#[derive(Debug)]
pub struct ProcTable {
    root: PathBuf,
    cache: HashMap<u32, (u64, ProcInfo)>,
}

impl ProcTable {
    /// A table reading below `root` (the host's `/proc`, e.g. `/host/proc` in a container).
    pub fn new(root: impl Into<PathBuf>) -> ProcTable {
        ProcTable {
            root: root.into(),
            cache: HashMap::new(),
        }
    }

    /// The procfs this table reads.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// What procfs says about `pid`; `None` when the process is not visible (exited, another
    /// pid namespace, no procfs mounted at the root). Reads `comm` and `cgroup` only for a
    /// process not seen before.
    pub fn lookup(&mut self, pid: u32) -> Option<&ProcInfo> {
        let dir = self.root.join(pid.to_string());
        let Some(start) = read_start_time(&dir) else {
            self.cache.remove(&pid);
            return None;
        };
        let stale = self.cache.get(&pid).is_none_or(|(s, _)| *s != start);
        if stale {
            let info = ProcInfo {
                name: fs::read(dir.join("comm"))
                    .ok()
                    .map(|b| {
                        String::from_utf8_lossy(b.strip_suffix(b"\n").unwrap_or(&b)).into_owned()
                    })
                    .filter(|s| !s.is_empty()),
                cgroup: fs::read(dir.join("cgroup"))
                    .ok()
                    .map(|b| cgroup::parse(&String::from_utf8_lossy(&b))),
            };
            self.cache.insert(pid, (start, info));
        }
        self.cache.get(&pid).map(|(_, info)| info)
    }

    /// Forgets every process for which `alive` is false (called with this tick's pids, so the
    /// cache never outgrows the processes on the GPU).
    pub fn retain(&mut self, alive: impl Fn(u32) -> bool) {
        self.cache.retain(|pid, _| alive(*pid));
    }

    /// Number of cached processes.
    pub fn len(&self) -> usize {
        self.cache.len()
    }

    /// Whether no process is cached.
    pub fn is_empty(&self) -> bool {
        self.cache.is_empty()
    }
}

/// Field 22 of `<dir>/stat` (start time in clock ticks after boot).
fn read_start_time(dir: &Path) -> Option<u64> {
    parse_start_time(&fs::read(dir.join("stat")).ok()?)
}

/// The fields of a `stat` line from field 3 (state) on. The name (field 2) is in parentheses and
/// may itself contain any bytes, parentheses and spaces included, so fields are counted after the
/// *last* `)`; what follows it is the kernel's numbers, always ASCII.
pub fn stat_fields(stat: &[u8]) -> Option<std::str::SplitAsciiWhitespace<'_>> {
    let close = stat.iter().rposition(|&b| b == b')')?;
    Some(
        std::str::from_utf8(&stat[close + 1..])
            .ok()?
            .split_ascii_whitespace(),
    )
}

/// The start time in a `stat` line (field 22, the 20th of [`stat_fields`]).
pub fn parse_start_time(stat: &[u8]) -> Option<u64> {
    stat_fields(stat)?.nth(19)?.parse().ok()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A `stat` line of `name` (any bytes, as the kernel writes it) started at `start`, shaped
    /// like the kernel's.
    pub(crate) fn stat_line(pid: u32, name: impl AsRef<[u8]>, start: u64) -> Vec<u8> {
        let mut line = format!("{pid} (").into_bytes();
        line.extend_from_slice(name.as_ref());
        line.extend_from_slice(format!(
            ") S 1 {pid} {pid} 0 -1 4194560 1234 0 0 0 50 12 0 0 20 0 8 0 {start} 1234567 890 18446744073709551615 0 0 0 0 0 0 0 4096 0 0 0 0 17 3 0 0 0 0 0\n"
        ).as_bytes());
        line
    }

    fn write_proc(root: &Path, pid: u32, name: impl AsRef<[u8]>, start: u64, cgroup: &str) {
        let dir = root.join(pid.to_string());
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("stat"), stat_line(pid, &name, start)).unwrap();
        fs::write(dir.join("comm"), [name.as_ref(), b"\n"].concat()).unwrap();
        fs::write(dir.join("cgroup"), cgroup).unwrap();
    }

    #[test]
    fn start_time_is_field_22_whatever_the_name() {
        assert_eq!(
            parse_start_time(&stat_line(7, "python", 98765)),
            Some(98765)
        );
        assert_eq!(
            parse_start_time(&stat_line(7, "a) b (c", 42)),
            Some(42),
            "a name with spaces and parentheses"
        );
        assert_eq!(
            parse_start_time(&stat_line(7, b"\xff) (\xfe", 43)),
            Some(43),
            "a name that is not UTF-8"
        );
        assert_eq!(parse_start_time(b"7 (x) S 1 2"), None);
        assert_eq!(parse_start_time(b""), None);
    }

    #[test]
    fn a_process_named_with_bytes_that_are_not_utf8_keeps_its_pod() {
        let dir = tempfile::tempdir().unwrap();
        let id = "b".repeat(64);
        write_proc(
            dir.path(),
            400,
            b"evil\xff\xfe)x",
            7,
            &format!("0::/kubepods/pod11111111-2222-3333-4444-555555555555/{id}\n"),
        );
        let mut table = ProcTable::new(dir.path());
        let info = table.lookup(400).expect("the process is visible").clone();
        assert_eq!(info.name.as_deref(), Some("evil\u{fffd}\u{fffd})x"));
        let cg = info.cgroup.unwrap();
        assert_eq!(
            cg.pod_uid.as_deref(),
            Some("11111111-2222-3333-4444-555555555555")
        );
        assert_eq!(cg.container_id.as_deref(), Some(id.as_str()));
    }

    #[test]
    fn a_cgroup_path_with_bytes_that_are_not_utf8_still_names_the_pod() {
        let dir = tempfile::tempdir().unwrap();
        let id = "c".repeat(64);
        write_proc(dir.path(), 500, "python3", 9, "");
        // A sub-cgroup the container made for itself, named with any bytes.
        let mut cgroup =
            format!("0::/kubepods/pod11111111-2222-3333-4444-555555555555/{id}/").into_bytes();
        cgroup.extend_from_slice(b"w\xff\n");
        fs::write(dir.path().join("500/cgroup"), cgroup).unwrap();
        let cg = ProcTable::new(dir.path())
            .lookup(500)
            .unwrap()
            .cgroup
            .clone()
            .unwrap();
        assert_eq!(
            cg.pod_uid.as_deref(),
            Some("11111111-2222-3333-4444-555555555555")
        );
        assert_eq!(cg.container_id.as_deref(), Some(id.as_str()));
    }

    #[test]
    fn reads_name_and_cgroup_of_a_visible_process() {
        let dir = tempfile::tempdir().unwrap();
        let id = "a".repeat(64);
        write_proc(
            dir.path(),
            100,
            "python3",
            5,
            &format!("0::/kubepods/pod11111111-2222-3333-4444-555555555555/{id}\n"),
        );
        let mut table = ProcTable::new(dir.path());
        let info = table.lookup(100).unwrap().clone();
        assert_eq!(info.name.as_deref(), Some("python3"));
        let cg = info.cgroup.unwrap();
        assert_eq!(
            cg.pod_uid.as_deref(),
            Some("11111111-2222-3333-4444-555555555555")
        );
        assert_eq!(cg.container_id.as_deref(), Some(id.as_str()));
        assert_eq!(table.lookup(101), None, "no such process");
        assert_eq!(ProcTable::new("/nonexistent-proc-root").lookup(100), None);
    }

    #[test]
    fn an_unchanged_process_is_not_read_again_and_a_reused_pid_is() {
        let dir = tempfile::tempdir().unwrap();
        write_proc(dir.path(), 200, "trainer", 10, "0::/\n");
        let mut table = ProcTable::new(dir.path());
        assert_eq!(table.lookup(200).unwrap().name.as_deref(), Some("trainer"));
        // Same start time: the cached entry is served, the changed comm is not read.
        fs::write(dir.path().join("200/comm"), "renamed\n").unwrap();
        assert_eq!(table.lookup(200).unwrap().name.as_deref(), Some("trainer"));
        // The pid now belongs to another process: read anew.
        write_proc(dir.path(), 200, "other", 11, "0::/\n");
        assert_eq!(table.lookup(200).unwrap().name.as_deref(), Some("other"));
    }

    #[test]
    fn exited_processes_leave_the_cache() {
        let dir = tempfile::tempdir().unwrap();
        write_proc(dir.path(), 1, "a", 1, "0::/\n");
        write_proc(dir.path(), 2, "b", 1, "0::/\n");
        let mut table = ProcTable::new(dir.path());
        table.lookup(1);
        table.lookup(2);
        assert_eq!(table.len(), 2);
        table.retain(|pid| pid == 2);
        assert_eq!(table.len(), 1);
        // A process whose directory vanished is dropped on lookup too.
        fs::remove_dir_all(dir.path().join("2")).unwrap();
        assert_eq!(table.lookup(2), None);
        assert!(table.is_empty());
    }

    #[test]
    fn unreadable_files_give_none_not_a_guess() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("300");
        fs::create_dir_all(&p).unwrap();
        fs::write(p.join("stat"), stat_line(300, "x", 3)).unwrap();
        let mut table = ProcTable::new(dir.path());
        assert_eq!(table.lookup(300), Some(&ProcInfo::default()));
    }
}
