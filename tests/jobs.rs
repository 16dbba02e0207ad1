//! HPC job attribution end to end: the real exporter on the simulated H100s (GPU 0 in MIG mode
//! with GPU instances 2 to 7, GPU 1 whole) reading a job mapping directory that the test writes as
//! a Slurm prolog and epilog would: jobs appear, change and go with their files, and a bad file
//! leaves only its own GPU without a job, counted and logged once.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{Exporter, Exposition, scenario};

/// (gpu, gpu_instance or "", hpc_job) of every `nvidia_gpu_job_info` series, sorted.
fn jobs(m: &Exposition) -> Vec<(String, String, String)> {
    let mut out: Vec<_> = m
        .find("nvidia_gpu_job_info", &[])
        .iter()
        .map(|s| {
            let l = |k: &str| s.labels.get(k).cloned().unwrap_or_default();
            (l("gpu"), l("gpu_instance"), l("hpc_job"))
        })
        .collect();
    out.sort();
    out
}

fn owned(v: &[(&str, &str, &str)]) -> Vec<(String, String, String)> {
    v.iter()
        .map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()))
        .collect()
}

fn errors(m: &Exposition, reason: &str) -> f64 {
    m.value("nvml_exporter_jobs_errors_total", &[("reason", reason)])
        .unwrap_or(-1.0)
}

/// Writes `text` to `dir/name` by rename, as a prolog should, so no half-written file is read.
fn write(dir: &Path, name: &str, text: &[u8]) {
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, dir.join(name)).unwrap();
}

fn exporter(dir: &Path) -> Exporter {
    let mig = scenario("h100-mig");
    Exporter::start(
        &[("NVML_SIM_SCENARIO", mig.to_str().unwrap())],
        &[
            "--interval",
            "300ms",
            "--hpc-job-mapping-dir",
            dir.to_str().unwrap(),
            "--log-level",
            "info",
        ],
    )
}

const WAIT: Duration = Duration::from_secs(10);

#[test]
fn jobs_appear_change_and_go_with_their_mapping_files() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("job-map");
    std::fs::create_dir(&dir).unwrap();
    let e = exporter(&dir);
    let m = e.wait_metrics(WAIT, "a first tick", |m| {
        m.value(
            "nvml_exporter_jobs_errors_total",
            &[("reason", "malformed")],
        ) == Some(0.0)
    });
    assert!(jobs(&m).is_empty());
    for reason in ["directory", "unreadable", "malformed", "unknown_gpu"] {
        assert_eq!(errors(&m, reason), 0.0, "{reason}");
    }

    // Prologs: two jobs share GPU 1, one runs on GPU 0's instance 2. A prolog's temporary file
    // and a file of another name are not mapping files.
    write(&dir, "1", b"1001\n1002\n");
    write(&dir, "0.2", b"2001\n");
    std::fs::write(dir.join("README"), "job map\n").unwrap();
    let m = e.wait_metrics(WAIT, "three jobs", |m| {
        jobs(m) == owned(&[("0", "2", "2001"), ("1", "", "1001"), ("1", "", "1002")])
    });
    let on_instance = m.find("nvidia_gpu_job_info", &[("hpc_job", "2001")]);
    assert_eq!(
        on_instance[0].labels["mig_profile"], "3g.40gb",
        "{:?}",
        on_instance[0]
    );
    assert_eq!(on_instance[0].value, 1.0);
    let uuid1 = m.find("nvidia_gpu_info", &[("gpu", "1")])[0].labels["uuid"].clone();
    assert_eq!(
        m.find("nvidia_gpu_job_info", &[("hpc_job", "1001")])[0].labels["uuid"],
        uuid1,
        "joinable on gpu and uuid"
    );

    // Job 1001 ends: its ID leaves the file. Then the epilog of the other removes the file.
    write(&dir, "1", b"1002\n");
    e.wait_metrics(WAIT, "1001 gone", |m| {
        jobs(m) == owned(&[("0", "2", "2001"), ("1", "", "1002")])
    });
    std::fs::remove_file(dir.join("1")).unwrap();
    std::fs::remove_file(dir.join("0.2")).unwrap();
    let m = e.wait_metrics(WAIT, "no jobs", |m| jobs(m).is_empty());
    for reason in ["directory", "unreadable", "malformed", "unknown_gpu"] {
        assert_eq!(errors(&m, reason), 0.0, "{reason}");
    }
}

#[test]
fn a_bad_mapping_file_leaves_only_its_gpu_without_a_job_and_says_why_once() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("job-map");
    std::fs::create_dir(&dir).unwrap();
    write(&dir, "0", b"500\n");
    // Binary garbage, a GPU and a GPU instance this node does not have.
    write(&dir, "1", b"\x7fELF\x02\x01\x01\x00\xff\xfe");
    write(&dir, "5", b"600\n");
    write(&dir, "0.40", b"700\n");
    let e = exporter(&dir);
    let m = e.wait_metrics(WAIT, "bad files counted over several reads", |m| {
        errors(m, "malformed") >= 3.0 && errors(m, "unknown_gpu") >= 6.0
    });
    assert_eq!(
        jobs(&m),
        owned(&[("0", "", "500")]),
        "the good file is used"
    );
    assert_eq!(errors(&m, "unreadable"), 0.0);
    assert_eq!(errors(&m, "directory"), 0.0);
    let logs = e.logs();
    let lines = |what: &str| {
        logs.lines()
            .filter(|l| l.contains("HPC job mapping not used") && l.contains(what))
            .count()
    };
    assert_eq!(lines("malformed"), 1, "{logs}");
    assert_eq!(lines("there is no GPU 5"), 1, "{logs}");
    assert_eq!(lines("has no MIG GPU instance 40"), 1, "{logs}");

    // Fixed; then too large (logged anew: the problem came back), then fixed again.
    write(&dir, "1", b"800\n");
    e.wait_metrics(WAIT, "GPU 1's job once fixed", |m| {
        jobs(m) == owned(&[("0", "", "500"), ("1", "", "800")])
    });
    write(&dir, "1", &vec![b'1'; 70 * 1024]);
    e.wait_metrics(WAIT, "too large: left out", |m| {
        jobs(m) == owned(&[("0", "", "500")])
    });
    assert!(e.logs().contains("larger than 64 KiB"), "{}", e.logs());
    write(&dir, "1", b"800\n");
    e.wait_metrics(WAIT, "GPU 1's job again", |m| {
        jobs(m) == owned(&[("0", "", "500"), ("1", "", "800")])
    });

    // An unreadable file (a directory of a mapping file's name cannot be read as one), then the
    // directory itself going away: no jobs, counted.
    std::fs::remove_file(dir.join("0")).unwrap();
    std::fs::create_dir(dir.join("0")).unwrap();
    e.wait_metrics(WAIT, "unreadable counted", |m| {
        errors(m, "unreadable") >= 1.0 && jobs(m) == owned(&[("1", "", "800")])
    });
    std::fs::remove_dir_all(&dir).unwrap();
    let m = e.wait_metrics(WAIT, "directory errors", |m| errors(m, "directory") >= 2.0);
    assert!(jobs(&m).is_empty());
    assert!(
        m.find("nvidia_gpu_up", &[]).iter().all(|s| s.value == 1.0),
        "nothing else changes"
    );
}

#[test]
fn a_file_of_too_many_jobs_is_left_out_and_leading_zero_names_alias_no_gpu() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("job-map");
    std::fs::create_dir(&dir).unwrap();
    let ids = |prefix: &str, n: usize| -> Vec<u8> {
        (0..n)
            .map(|i| format!("{prefix}{i}\n"))
            .collect::<String>()
            .into_bytes()
    };
    write(&dir, "1", b"\xef\xbb\xbf800\n");
    write(&dir, "0.2", &ids("a", 65));
    // Each a second name of GPU 1 or of GPU 0's instance 2, were leading zeros read.
    for name in ["01", "001", "0001", "0.02", "00.2"] {
        write(&dir, name, &ids(name, 64));
    }
    let e = exporter(&dir);
    let m = e.wait_metrics(WAIT, "the file of 65 jobs counted", |m| {
        errors(m, "too_many_jobs") >= 1.0
    });
    assert_eq!(
        jobs(&m),
        owned(&[("1", "", "800")]),
        "the byte-order mark is no part of the job ID; no alias names a GPU"
    );
    for reason in ["directory", "unreadable", "malformed", "unknown_gpu"] {
        assert_eq!(errors(&m, reason), 0.0, "{reason}");
    }
    let logs = e.logs();
    let lines = logs
        .lines()
        .filter(|l| l.contains("HPC job mapping not used") && l.contains("too_many_jobs"))
        .count();
    assert_eq!(lines, 1, "{logs}");
    assert!(logs.contains("more than 64 job IDs"), "{logs}");

    // Down to 64: used.
    write(&dir, "0.2", &ids("a", 64));
    let m = e.wait_metrics(WAIT, "64 jobs on GPU 0's instance 2", |m| {
        jobs(m).len() == 65
    });
    assert_eq!(
        m.find("nvidia_gpu_job_info", &[("gpu_instance", "2")])
            .len(),
        64
    );
}

#[test]
fn thousands_of_bad_mapping_files_log_a_few_lines_and_one_count() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("job-map");
    std::fs::create_dir(&dir).unwrap();
    // 10,000 files naming GPUs this node does not have, there before the exporter starts.
    for gpu in 100..10_100 {
        std::fs::write(dir.join(gpu.to_string()), b"1\n").unwrap();
    }
    write(&dir, "1", b"900\n");
    let e = exporter(&dir);
    let m = e.wait_metrics(WAIT, "two reads of the directory", |m| {
        errors(m, "unknown_gpu") >= 20_000.0
    });
    assert_eq!(
        jobs(&m),
        owned(&[("1", "", "900")]),
        "the good file is used"
    );
    let logs = e.logs();
    let each = logs
        .lines()
        .filter(|l| l.contains("HPC job mapping not used"))
        .count();
    assert_eq!(each, 5, "{logs}");
    let summary: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("more HPC job mappings not used"))
        .collect();
    assert_eq!(summary.len(), 1, "{logs}");
    assert!(summary[0].contains("9995"), "{}", summary[0]);
}
