//! HPC job attribution (`--hpc-job-mapping-dir`): which scheduler jobs run on each GPU.
//!
//! The format is dcgm-exporter's: a directory holding one file per GPU, named by its NVML index
//! (`0`, `1`, …), or per MIG GPU instance, named `<gpu>.<gpu_instance>` (`2.1`), each holding the
//! IDs of the jobs on it, one a line. A Slurm prolog writes the file, the epilog removes it.
//! Other names (a prolog's temporary file, a README, a number with a leading zero such as `00`)
//! are not mapping files and are passed over, so that each GPU has one file name at most.
//!
//! [`JobReader::read`] reads the directory whenever a tick is published: a directory listing and
//! a few small files, on tmpfs in the usual `/run` location. So a job appears or goes with the
//! next tick after its file does. A file that cannot be used (naming a GPU or GPU instance this
//! exporter does not see; unreadable; larger than [`MAX_FILE_BYTES`], not text, or with a job ID
//! over [`MAX_JOB_ID_BYTES`]; more than [`MAX_JOBS_PER_FILE`] IDs, or IDs that would take the
//! node past [`MAX_JOBS_PER_NODE`]) is left out whole: its GPU has no job, the read counts it
//! under its [`JobsError`] reason, and one line is logged when the problem starts (again only
//! when it changes or comes back after being fixed), not on every tick. A read that finds many
//! new problems at once logs the first [`MAX_LOGGED_PER_READ`] and one line with the count of
//! the others.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::files::read_bounded_file;
use crate::sample::{DeviceSample, JobAssignment, JobsError, JobsState};

/// The largest mapping file read: a few job IDs take a few dozen bytes, and a cap bounds what a
/// stray file in the directory costs every tick.
pub const MAX_FILE_BYTES: u64 = 64 * 1024;

/// The longest job ID kept (Slurm's are a few digits, with `_<task>` for array jobs).
pub const MAX_JOB_ID_BYTES: usize = 256;

/// The most job IDs one file may hold: a GPU runs a handful of jobs at once, and each ID is a
/// series.
pub const MAX_JOBS_PER_FILE: usize = 64;

/// The most job IDs of all the node's files together, so that the job series of a node stay
/// bounded whatever its number of GPUs and GPU instances.
pub const MAX_JOBS_PER_NODE: usize = 1024;

/// New problems logged one by one per read; the rest are logged as one count.
pub const MAX_LOGGED_PER_READ: usize = 5;

/// Reads the mapping directory and keeps the error counts between reads.
#[derive(Debug)]
pub struct JobReader {
    dir: PathBuf,
    errors: BTreeMap<JobsError, u64>,
    /// The problems logged and not yet cleared, by file name ("" for the directory itself).
    failing: BTreeMap<String, JobsError>,
}

/// Why one file (or the directory) was not used: the counter's reason and what to log.
struct Problem {
    reason: JobsError,
    message: String,
}

impl Problem {
    fn new(reason: JobsError, message: impl Into<String>) -> Problem {
        Problem {
            reason,
            message: message.into(),
        }
    }
}

/// A file whose name is a GPU or GPU instance this exporter sees, to be read.
struct Candidate {
    gpu: u32,
    gpu_instance: Option<u32>,
    name: String,
    path: PathBuf,
}

impl JobReader {
    /// A reader of `dir`; nothing is read until [`read`](Self::read).
    pub fn new(dir: PathBuf) -> JobReader {
        JobReader {
            dir,
            errors: JobsError::ALL.iter().map(|r| (*r, 0)).collect(),
            failing: BTreeMap::new(),
        }
    }

    /// The directory read.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Reads the directory now: the jobs of every usable file that names one of `devices` (or
    /// one of their MIG GPU instances), and the error counts so far.
    pub fn read(&mut self, devices: &[Arc<DeviceSample>]) -> JobsState {
        let mut jobs = BTreeSet::new();
        let mut seen = BTreeSet::new();
        let mut started = Vec::new();
        match std::fs::read_dir(&self.dir) {
            Ok(entries) => {
                self.clear("");
                let mut candidates = Vec::new();
                for entry in entries.flatten() {
                    let name = entry.file_name();
                    let Some(name) = name.to_str() else { continue };
                    let Some((gpu, gpu_instance)) = parse_name(name) else {
                        continue;
                    };
                    seen.insert(name.to_owned());
                    // The name is checked first, so that files naming no GPU cost no read.
                    match check_target(devices, gpu, gpu_instance) {
                        Ok(()) => candidates.push(Candidate {
                            gpu,
                            gpu_instance,
                            name: name.to_owned(),
                            path: entry.path(),
                        }),
                        Err(problem) => self.fail(name, problem, &mut started),
                    }
                }
                // In GPU order, so that which files pass the node's bound does not depend on the
                // order of the listing.
                candidates.sort_by_key(|c| (c.gpu, c.gpu_instance));
                let mut total = 0;
                for c in candidates {
                    match read_file(&c.path).and_then(|ids| within_node_bound(total, ids)) {
                        Ok(ids) => {
                            self.clear(&c.name);
                            total += ids.len();
                            jobs.extend(ids.into_iter().map(|job| JobAssignment {
                                gpu: c.gpu,
                                gpu_instance: c.gpu_instance,
                                job,
                            }));
                        }
                        Err(problem) => self.fail(&c.name, problem, &mut started),
                    }
                }
            }
            Err(e) => {
                seen.insert(String::new());
                let problem =
                    Problem::new(JobsError::Directory, format!("reading the directory: {e}"));
                self.fail("", problem, &mut started);
            }
        }
        self.log_started(&started);
        // A file that went away takes its problem with it: a new one of that name is logged.
        self.failing.retain(|name, _| seen.contains(name));
        JobsState {
            jobs: jobs.into_iter().collect(),
            errors: self.errors.clone(),
        }
    }

    /// Counts `problem` of file `name`; a problem that was not already known for it goes into
    /// `started`, to be logged.
    fn fail(&mut self, name: &str, problem: Problem, started: &mut Vec<(String, Problem)>) {
        *self.errors.entry(problem.reason).or_default() += 1;
        if self.failing.get(name) != Some(&problem.reason) {
            self.failing.insert(name.to_owned(), problem.reason);
            started.push((name.to_owned(), problem));
        }
    }

    /// Logs the problems that started in one read: the first few each on a line, the others as
    /// one count, so that a directory of thousands of bad files does not flood the log.
    fn log_started(&self, started: &[(String, Problem)]) {
        for (name, problem) in started.iter().take(MAX_LOGGED_PER_READ) {
            tracing::warn!(
                path = %self.dir.join(name).display(),
                reason = problem.reason.label(),
                error = problem.message,
                "HPC job mapping not used: its GPU shows no job until this is fixed \
                 (counted in nvml_exporter_jobs_errors_total every tick, logged once)"
            );
        }
        let more = started.len().saturating_sub(MAX_LOGGED_PER_READ);
        if more > 0 {
            tracing::warn!(
                dir = %self.dir.display(),
                files = more,
                "more HPC job mappings not used, not logged one by one \
                 (counted in nvml_exporter_jobs_errors_total by reason)"
            );
        }
    }

    fn clear(&mut self, name: &str) {
        if self.failing.remove(name).is_some() {
            tracing::info!(path = %self.dir.join(name).display(), "HPC job mapping used again");
        }
    }
}

/// `"3"` → GPU 3; `"2.1"` → GPU 2, GPU instance 1; anything else is not a mapping file, a number
/// with a leading zero included (`00` would otherwise be a second file of GPU 0).
fn parse_name(name: &str) -> Option<(u32, Option<u32>)> {
    let number = |s: &str| {
        let canonical = s == "0" || (!s.is_empty() && !s.starts_with('0'));
        (canonical && s.bytes().all(|b| b.is_ascii_digit()))
            .then(|| s.parse().ok())
            .flatten()
    };
    match name.split_once('.') {
        None => Some((number(name)?, None)),
        Some((gpu, instance)) => Some((number(gpu)?, Some(number(instance)?))),
    }
}

/// The job IDs of one file: its lines, trimmed, without the empty ones.
fn read_file(path: &Path) -> Result<Vec<String>, Problem> {
    // Opened without waiting, so that a FIFO of a mapping file's name cannot stall the tick.
    let bytes = read_bounded_file(path, MAX_FILE_BYTES).map_err(|e| {
        let reason = if e.kind() == std::io::ErrorKind::InvalidData {
            JobsError::Malformed
        } else {
            JobsError::Unreadable
        };
        Problem::new(reason, e.to_string())
    })?;
    parse_jobs(&bytes)
}

/// Job IDs from a file's bytes (at most [`MAX_FILE_BYTES`]: [`read_file`] reads no more):
/// UTF-8 text without control characters, one ID a line, at most [`MAX_JOBS_PER_FILE`]; a
/// leading byte-order mark (an editor's) is not part of the first ID.
fn parse_jobs(bytes: &[u8]) -> Result<Vec<String>, Problem> {
    let malformed = |what: String| Problem::new(JobsError::Malformed, what);
    let text =
        std::str::from_utf8(bytes).map_err(|e| malformed(format!("not UTF-8 text ({e})")))?;
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut ids = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let id = line.trim();
        if id.is_empty() {
            continue;
        }
        if id.chars().any(char::is_control) {
            return Err(malformed(format!("line {}: a control character", n + 1)));
        }
        if id.len() > MAX_JOB_ID_BYTES {
            return Err(malformed(format!(
                "line {}: a job ID longer than {MAX_JOB_ID_BYTES} bytes",
                n + 1
            )));
        }
        if ids.len() == MAX_JOBS_PER_FILE {
            return Err(Problem::new(
                JobsError::TooManyJobs,
                format!("more than {MAX_JOBS_PER_FILE} job IDs"),
            ));
        }
        ids.push(id.to_owned());
    }
    Ok(ids)
}

/// `ids`, unless with the `used` IDs of the files read before they pass [`MAX_JOBS_PER_NODE`].
fn within_node_bound(used: usize, ids: Vec<String>) -> Result<Vec<String>, Problem> {
    if used + ids.len() > MAX_JOBS_PER_NODE {
        return Err(Problem::new(
            JobsError::TooManyJobs,
            format!(
                "its {} job IDs would take the node past {MAX_JOBS_PER_NODE} \
                 (the files before it in GPU order hold {used})",
                ids.len()
            ),
        ));
    }
    Ok(ids)
}

/// Whether `devices` has GPU `gpu` (and, for an instance, that GPU instance).
fn check_target(
    devices: &[Arc<DeviceSample>],
    gpu: u32,
    gpu_instance: Option<u32>,
) -> Result<(), Problem> {
    let unknown = |what: String| Problem::new(JobsError::UnknownGpu, what);
    let Some(device) = devices.iter().find(|d| d.index == gpu) else {
        return Err(unknown(format!("there is no GPU {gpu}")));
    };
    match gpu_instance {
        Some(gi) if !device.mig_instances.iter().any(|m| m.gpu_instance == gi) => {
            Err(unknown(format!("GPU {gpu} has no MIG GPU instance {gi}")))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sample::MigInstanceSample;

    #[test]
    fn file_names_are_gpu_indexes_or_gpu_instances() {
        assert_eq!(parse_name("0"), Some((0, None)));
        assert_eq!(parse_name("17"), Some((17, None)));
        assert_eq!(parse_name("2.1"), Some((2, Some(1))));
        assert_eq!(parse_name("10.0"), Some((10, Some(0))));
        for other in [
            "",
            ".1",
            "1.",
            "1.2.3",
            "a",
            "+1",
            "-1",
            " 1",
            ".0.tmp",
            "99999999999",
            "00",
            "01",
            "000",
            "1.01",
            "01.1",
            "1.00",
        ] {
            assert_eq!(parse_name(other), None, "{other:?}");
        }
    }

    #[test]
    fn job_ids_are_trimmed_lines_and_garbage_is_malformed() {
        assert_eq!(
            parse_jobs(b"1234\n\n  5678_3 \r\n").ok().unwrap(),
            ["1234", "5678_3"]
        );
        assert!(parse_jobs(b"").ok().unwrap().is_empty());
        let reason = |b: &[u8]| parse_jobs(b).err().map(|p| (p.reason, p.message));
        let (r, m) = reason(b"\x7fELF\x02\x01\x00\x00").unwrap();
        assert_eq!(r, JobsError::Malformed);
        assert!(m.contains("control character"), "{m}");
        let (_, m) = reason(b"12\xff\xfe").unwrap();
        assert!(m.contains("not UTF-8"), "{m}");
        let (_, m) = reason(&vec![b'7'; MAX_JOB_ID_BYTES + 1]).unwrap();
        assert!(m.contains("longer than 256"), "{m}");
    }

    #[test]
    fn a_leading_byte_order_mark_is_not_part_of_the_first_id() {
        assert_eq!(
            parse_jobs(b"\xef\xbb\xbf1234\n5678\n").ok().unwrap(),
            ["1234", "5678"]
        );
        assert_eq!(parse_jobs(b"\xef\xbb\xbf").ok().unwrap(), [] as [&str; 0]);
    }

    #[test]
    fn a_file_of_more_than_64_ids_is_too_many_jobs() {
        let ids = |n: usize| (0..n).map(|i| format!("{i}\n")).collect::<String>();
        assert_eq!(
            parse_jobs(ids(MAX_JOBS_PER_FILE).as_bytes())
                .ok()
                .unwrap()
                .len(),
            64
        );
        let problem = parse_jobs(ids(MAX_JOBS_PER_FILE + 1).as_bytes())
            .err()
            .unwrap();
        assert_eq!(problem.reason, JobsError::TooManyJobs);
        assert!(
            problem.message.contains("more than 64"),
            "{}",
            problem.message
        );
    }

    #[test]
    fn a_file_over_the_limit_is_malformed_and_not_read_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("0");
        std::fs::write(&path, vec![b'\n'; MAX_FILE_BYTES as usize + 1]).unwrap();
        let problem = read_file(&path).err().unwrap();
        assert_eq!(problem.reason, JobsError::Malformed);
        assert!(
            problem.message.contains("larger than 64 KiB"),
            "{}",
            problem.message
        );
    }

    fn device(index: u32, instances: &[u32]) -> Arc<DeviceSample> {
        Arc::new(DeviceSample {
            index,
            mig_instances: instances
                .iter()
                .map(|gi| MigInstanceSample {
                    gpu_instance: *gi,
                    ..MigInstanceSample::default()
                })
                .collect(),
            ..DeviceSample::default()
        })
    }

    #[test]
    fn a_read_keeps_good_files_leaves_out_bad_ones_and_counts_them() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, text: &[u8]| std::fs::write(dir.path().join(name), text).unwrap();
        write("0", b"100\n101\n");
        write("1.2", b"200\n");
        write("1.5", b"201\n");
        write("7", b"700\n");
        write("3", b"\x00\x01garbage");
        write("0.tmp", b"not a mapping file");
        std::fs::create_dir(dir.path().join("4")).unwrap();
        let devices = [
            device(0, &[]),
            device(1, &[2]),
            device(3, &[]),
            device(4, &[]),
        ];
        let mut reader = JobReader::new(dir.path().to_owned());
        let state = reader.read(&devices);
        let job = |gpu, gpu_instance, job: &str| JobAssignment {
            gpu,
            gpu_instance,
            job: job.into(),
        };
        assert_eq!(
            *state.jobs,
            [
                job(0, None, "100"),
                job(0, None, "101"),
                job(1, Some(2), "200")
            ]
        );
        let errors = |s: &JobsState| {
            s.errors
                .iter()
                .map(|(r, n)| (r.label(), *n))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            errors(&state),
            [
                ("directory", 0),
                ("unreadable", 1),
                ("malformed", 1),
                ("unknown_gpu", 2),
                ("too_many_jobs", 0)
            ]
        );

        // Fixed and removed files stop counting; counts are kept.
        write("3", b"300\n");
        for name in ["1.5", "7"] {
            std::fs::remove_file(dir.path().join(name)).unwrap();
        }
        std::fs::remove_dir(dir.path().join("4")).unwrap();
        let state = reader.read(&devices);
        assert_eq!(state.jobs.len(), 4);
        assert!(state.jobs.contains(&job(3, None, "300")));
        assert_eq!(
            errors(&state),
            [
                ("directory", 0),
                ("unreadable", 1),
                ("malformed", 1),
                ("unknown_gpu", 2),
                ("too_many_jobs", 0)
            ]
        );
        assert!(reader.failing.is_empty());

        // No directory: no jobs, counted.
        let mut reader = JobReader::new(dir.path().join("absent"));
        let state = reader.read(&devices);
        assert!(state.jobs.is_empty());
        assert_eq!(state.errors[&JobsError::Directory], 1);
    }

    #[test]
    fn leading_zero_names_never_alias_a_gpu_and_are_not_counted() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["0", "00", "000", "0.1", "00.1", "0.01"] {
            std::fs::write(dir.path().join(name), format!("job-{name}\n")).unwrap();
        }
        let mut reader = JobReader::new(dir.path().to_owned());
        let state = reader.read(&[device(0, &[1])]);
        let names: Vec<_> = state.jobs.iter().map(|j| j.job.as_str()).collect();
        assert_eq!(names, ["job-0", "job-0.1"]);
        assert!(state.errors.values().all(|n| *n == 0), "{:?}", state.errors);
    }

    #[test]
    fn files_past_the_node_bound_are_left_out_in_gpu_order_and_counted() {
        let dir = tempfile::tempdir().unwrap();
        // 20 GPUs of 60 jobs each: the first 17 fit in 1024 (1020 jobs), the last 3 do not.
        let devices: Vec<_> = (0..20).map(|i| device(i, &[])).collect();
        for gpu in 0..20 {
            let ids: String = (0..60).map(|j| format!("{gpu}-{j}\n")).collect();
            std::fs::write(dir.path().join(gpu.to_string()), ids).unwrap();
        }
        // One file over the per-file bound, which costs the others nothing.
        std::fs::write(
            dir.path().join("5"),
            (0..=MAX_JOBS_PER_FILE)
                .map(|j| format!("5-{j}\n"))
                .collect::<String>(),
        )
        .unwrap();
        let mut reader = JobReader::new(dir.path().to_owned());
        let state = reader.read(&devices);
        assert!(state.jobs.len() <= MAX_JOBS_PER_NODE);
        let gpus: BTreeSet<u32> = state.jobs.iter().map(|j| j.gpu).collect();
        let expected: BTreeSet<u32> = (0..18).filter(|g| *g != 5).collect();
        assert_eq!(gpus, expected);
        assert_eq!(state.jobs.len(), 17 * 60);
        // GPU 5 (its file) and GPUs 18 and 19 (the node's bound).
        assert_eq!(state.errors[&JobsError::TooManyJobs], 3);
        assert_eq!(
            reader
                .failing
                .keys()
                .map(String::as_str)
                .collect::<Vec<_>>(),
            ["18", "19", "5"]
        );
    }
}
