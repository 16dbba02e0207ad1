//! Reliability of the real binary under the heavier faults of the simulated driver: driver
//! restarts that change the device set (no leaked threads or series), bursts (an XID storm and a
//! function failing on every call: memory bounded, logs rate-limited), and readiness when no
//! device answers for longer than the staleness limit.

mod common;

use common::{Exporter, Exposition, eventually};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(30);

/// faults.toml's GPU 3, which its driver restart drops.
const GPU3_UUID: &str = "GPU-c3d4e5f6-a7b8-493a-9c2d-3e4f5a6b7c54";

fn start_faults(start: &str, args: &[&str]) -> Exporter {
    let scenario = common::scenario("faults");
    Exporter::start(
        &[
            ("NVML_SIM_SCENARIO", scenario.to_str().unwrap()),
            ("NVML_SIM_START", start),
        ],
        args,
    )
}

/// A numeric field of /proc/<pid>/status, e.g. "Threads" or "VmRSS" (kB).
fn proc_status(e: &Exporter, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", e.child.id()))
        .expect("read /proc/<pid>/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc status"))
}

/// Writes scenario `toml` into a fresh temporary directory named after `tag`: (directory, file).
fn write_scenario(tag: &str, toml: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("nvml-exporter-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("scenario.toml");
    std::fs::write(&path, toml).unwrap();
    (dir, path)
}

fn gpus(m: &Exposition) -> Option<f64> {
    m.value("nvml_exporter_gpus", &[])
}

fn nvml_up(m: &Exposition) -> Option<f64> {
    m.value("nvml_exporter_nvml_up", &[])
}

/// The uuids of the `nvidia_gpu_info` series.
fn info_uuids(m: &Exposition) -> BTreeSet<String> {
    m.find("nvidia_gpu_info", &[])
        .iter()
        .map(|s| s.labels["uuid"].clone())
        .collect()
}

/// Every (name, labels) of a per-GPU series (one with a `uuid` label), values left out.
fn gpu_series(m: &Exposition) -> BTreeSet<String> {
    m.series
        .iter()
        .filter(|s| s.labels.contains_key("uuid"))
        .map(|s| format!("{}{:?}", s.name, s.labels))
        .collect()
}

#[test]
fn a_driver_restart_rediscovers_the_devices_and_drops_a_vanished_gpu() {
    // faults.toml: the driver restarts from t = 45 s to 48 s and GPU 3 is gone afterwards.
    let mut e = start_faults("43", &["--interval", "250ms"]);
    let before = e.wait_metrics(WAIT, "all four GPUs up", |m| {
        (0..4).all(|g| m.gpu_value("nvidia_gpu_up", g, &[]) == Some(1.0))
    });
    assert_eq!(gpus(&before), Some(4.0));
    assert!(info_uuids(&before).contains(GPU3_UUID));

    let during = e.wait_metrics(WAIT, "NVML down during the restart", |m| {
        nvml_up(m) == Some(0.0)
    });
    assert!(
        during.find("nvidia_gpu_info", &[]).is_empty(),
        "no GPU series while NVML is down"
    );
    let r = e.get("/readyz");
    assert_eq!(r.status, 503, "{}", r.text());

    let after = e.wait_metrics(WAIT, "NVML back with three GPUs", |m| {
        nvml_up(m) == Some(1.0)
            && gpus(m) == Some(3.0)
            && (0..3).all(|g| m.gpu_value("nvidia_gpu_up", g, &[]) == Some(1.0))
    });
    let uuids = info_uuids(&after);
    assert_eq!(uuids.len(), 3, "{uuids:?}");
    assert!(!uuids.contains(GPU3_UUID));
    assert!(
        uuids.iter().all(|u| info_uuids(&before).contains(u)),
        "the three others are the same GPUs"
    );
    let leftovers: Vec<&str> = after
        .series
        .iter()
        .filter(|s| {
            s.labels.get("uuid").map(String::as_str) == Some(GPU3_UUID)
                || s.labels.get("gpu").map(String::as_str) == Some("3")
        })
        .map(|s| s.name.as_str())
        .collect();
    assert!(
        leftovers.is_empty(),
        "series of the vanished GPU: {leftovers:?}"
    );
    assert!(
        e.logs().contains("NVML initialised"),
        "re-initialised without a restart"
    );
    assert!(e.alive());
}

/// Two H100s; the driver restarts every 3 s (1 s down) and the second GPU is gone after every
/// odd-numbered restart.
const RESTARTS: &str = r#"
[[gpu]]
model = "H100-SXM5-80GB"
uuid = "GPU-11111111-0000-4000-8000-000000000001"
pci_bus_id = "00000000:1B:00.0"
serial = "1"

[[gpu]]
model = "H100-SXM5-80GB"
uuid = "GPU-22222222-0000-4000-8000-000000000002"
pci_bus_id = "00000000:43:00.0"
serial = "2"

[[fault]]
kind = "driver_restart"
from = 3
to = 4
repeat = 3
drop_gpus = [1]

[[event]]
t = 1
gpu = 1
xid = 79
repeat = 1
"#;

/// Waits until the process has exactly `want` threads besides its device readers (the threads
/// of a finished NVML session may take up to their stop bound to end), and one or two readers
/// (a second is started when a tick is slow, as on a loaded machine, and ends after 10 s idle),
/// failing with the last counts.
fn wait_threads(e: &Exporter, want: usize, what: &str) {
    let mut last = (0, 0);
    common::poll_until(Duration::from_secs(10), || {
        last = common::thread_counts(e);
        let (all, readers) = last;
        (all - readers == want && (1..=2).contains(&readers)).then_some(())
    })
    .unwrap_or_else(|| {
        let (all, readers) = last;
        panic!(
            "{what}: {all} threads of which {readers} readers, want {want} besides 1 or 2 readers"
        )
    })
}

#[test]
fn repeated_driver_restarts_leak_no_threads_and_no_series() {
    let (dir, path) = write_scenario("restarts", RESTARTS);
    let e = Exporter::start(
        &[("NVML_SIM_SCENARIO", path.to_str().unwrap())],
        &["--interval", "250ms"],
    );
    // Before the first restart (t < 3 s): both GPUs, and an XID seen on the second.
    let first = e.wait_metrics(WAIT, "both GPUs up with an XID", |m| {
        gpus(m) == Some(2.0)
            && (0..2).all(|g| m.gpu_value("nvidia_gpu_up", g, &[]) == Some(1.0))
            && m.gpu_value("nvidia_gpu_xid_errors_total", 1, &[("xid", "79")])
                .is_some()
    });
    let (all, readers) = common::thread_counts(&e);
    let baseline_threads = all - readers;
    eprintln!("threads with two GPUs before any restart: {all}, of which {readers} readers");
    let mut baseline_series = gpu_series(&first);
    // XID series come and go with the events; compare the rest.
    baseline_series.retain(|s| !s.contains("xid"));

    let mut restarts_seen = 0;
    let mut last_count = 2.0;
    let deadline = Instant::now() + Duration::from_secs(60);
    // Follow the device set through four restarts: 2 → 1 → 2 → 1 → 2 GPUs.
    while restarts_seen < 4 {
        assert!(
            Instant::now() < deadline,
            "only {restarts_seen} restarts seen"
        );
        let want = if last_count == 2.0 { 1.0 } else { 2.0 };
        let m = e.wait_metrics(WAIT, &format!("{want} GPUs after a restart"), |m| {
            nvml_up(m) == Some(1.0)
                && gpus(m) == Some(want)
                && m.find("nvidia_gpu_up", &[]).iter().all(|s| s.value == 1.0)
        });
        let uuids = info_uuids(&m);
        assert_eq!(uuids.len(), want as usize, "{uuids:?}");
        if want == 1.0 {
            assert!(!uuids.contains("GPU-22222222-0000-4000-8000-000000000002"));
            assert!(
                m.series
                    .iter()
                    .all(|s| s.labels.get("gpu").is_none_or(|g| g == "0")),
                "only GPU 0's series remain"
            );
            // The same threads with one GPU: readers do not grow with the GPUs, and the
            // previous session's have ended.
            wait_threads(&e, baseline_threads, "one GPU");
        }
        last_count = want;
        restarts_seen += 1;
    }
    // Back to two GPUs: the same threads and per-GPU series as before any restart.
    wait_threads(&e, baseline_threads, "after four restarts");
    // GPM averages need two ticks of the new session: allow a few for the set to fill in.
    let mut series = BTreeSet::new();
    common::poll_until(Duration::from_secs(10), || {
        series = gpu_series(&e.metrics());
        series.retain(|s| !s.contains("xid"));
        (series == baseline_series).then_some(())
    })
    .unwrap_or_else(|| {
        panic!(
            "per-GPU series differ after the restarts; new: {:?}; gone: {:?}",
            series.difference(&baseline_series).collect::<Vec<_>>(),
            baseline_series.difference(&series).collect::<Vec<_>>()
        )
    });
    let _ = std::fs::remove_dir_all(&dir);
}

/// The three L4s of the scenarios below (a literal, so that `concat!` can join it).
macro_rules! three_l4 {
    () => {
        r#"
[[gpu]]
model = "L4"
uuid = "GPU-aaaaaaaa-0000-4000-8000-00000000000a"
pci_bus_id = "01:00.0"
serial = "1"

[[gpu]]
model = "L4"
uuid = "GPU-bbbbbbbb-0000-4000-8000-00000000000b"
pci_bus_id = "02:00.0"
serial = "2"

[[gpu]]
model = "L4"
uuid = "GPU-cccccccc-0000-4000-8000-00000000000c"
pci_bus_id = "03:00.0"
serial = "3"
"#
    };
}

/// Three GPUs; on the last, an nvmlDeviceGetTemperature call made at t = 2–3 s blocks 4 s.
const ONE_HANG: &str = concat!(
    three_l4!(),
    r#"
[[fault]]
kind = "hang"
gpu = 2
function = "nvmlDeviceGetTemperature"
seconds = 4
from = 2
to = 3
"#
);

#[test]
fn a_hung_call_holds_one_reader_and_the_spare_ends_after_it_returns() {
    let (dir, path) = write_scenario("hang", ONE_HANG);
    let e = Exporter::start(
        &[("NVML_SIM_SCENARIO", path.to_str().unwrap())],
        &["--interval", "250ms", "--stale-grace", "1s"],
    );
    let up = |m: &Exposition, g| m.gpu_value("nvidia_gpu_up", g, &[]);
    e.wait_metrics(WAIT, "GPU 2 down while its call hangs", |m| {
        up(m, 2) == Some(0.0)
    });
    let during = common::reader_threads(&e);
    let m = e.metrics();
    assert!(
        up(&m, 0) == Some(1.0) && up(&m, 1) == Some(1.0),
        "the other GPUs stay up"
    );
    // Held by the hung call, and reading the others (a loaded machine may add a spare).
    assert!(
        (2..=3).contains(&during),
        "{during} readers during the hang"
    );
    e.wait_metrics(WAIT, "GPU 2 back once its call returned", |m| {
        up(m, 2) == Some(1.0)
    });
    // Only one reader has work each tick; the other is idle and ends after 10 s.
    eventually(
        Duration::from_secs(20),
        "the spare reader to end after the hang (one reader left)",
        || (common::reader_threads(&e) == 1).then_some(()),
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Three GPUs; from t = 2 s to 3 s every call answers GPU_IS_LOST (no UNINITIALIZED to say the
/// driver went away) and afterwards the middle GPU is gone, so the last one is now index 1.
const LOST_RESTART: &str = concat!(
    three_l4!(),
    r#"
[[fault]]
kind = "driver_restart"
error = "GPU_IS_LOST"
from = 2
to = 3
drop_gpus = [1]
"#
);

#[test]
fn a_restart_seen_as_lost_gpus_renumbers_and_rediscovers() {
    let (dir, path) = write_scenario("lost", LOST_RESTART);
    let mut e = Exporter::start(
        &[("NVML_SIM_SCENARIO", path.to_str().unwrap())],
        &["--interval", "250ms"],
    );
    e.wait_metrics(WAIT, "three GPUs up", |m| {
        gpus(m) == Some(3.0) && (0..3).all(|g| m.gpu_value("nvidia_gpu_up", g, &[]) == Some(1.0))
    });
    e.wait_metrics(WAIT, "every GPU lost", |m| {
        m.find("nvidia_gpu_up", &[]).iter().all(|s| s.value == 0.0)
    });
    let m = e.wait_metrics(WAIT, "two GPUs after the restart", |m| {
        gpus(m) == Some(2.0) && m.find("nvidia_gpu_up", &[]).iter().all(|s| s.value == 1.0)
    });
    let by_index: Vec<(String, String)> = m
        .find("nvidia_gpu_info", &[])
        .iter()
        .map(|s| (s.labels["gpu"].clone(), s.labels["uuid"].clone()))
        .collect();
    assert_eq!(
        by_index,
        [
            (
                "0".to_string(),
                "GPU-aaaaaaaa-0000-4000-8000-00000000000a".to_string()
            ),
            (
                "1".to_string(),
                "GPU-cccccccc-0000-4000-8000-00000000000c".to_string()
            ),
        ],
        "the third GPU is now index 1; the second is gone"
    );
    assert!(
        !m.text.contains("GPU-bbbbbbbb"),
        "no series of the vanished GPU"
    );
    assert!(e.alive());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_xid_storm_and_a_failing_function_keep_memory_and_logs_bounded() {
    // faults.toml, t = 12–17 s: 2000 XID 31 a second on GPU 0 (10 000 in all), and
    // nvmlDeviceGetClockInfo failing on every call of every GPU (the clocks group, opt-in).
    let e = start_faults("10", &["--interval", "250ms", "--collector.clocks"]);
    e.wait_metrics(WAIT, "all four GPUs up", |m| {
        (0..4).all(|g| m.gpu_value("nvidia_gpu_up", g, &[]) == Some(1.0))
    });
    let rss_before = proc_status(&e, "VmRSS");
    let lines_before = e.logs().lines().count();

    let m = e.wait_metrics(WAIT, "all 10 000 XIDs of the storm counted", |m| {
        m.gpu_value("nvidia_gpu_xid_errors_total", 0, &[("xid", "31")]) == Some(10_000.0)
    });
    let failed = m
        .value(
            "nvml_exporter_nvml_errors_total",
            &[("function", "nvmlDeviceGetClockInfo"), ("error", "unknown")],
        )
        .unwrap_or(0.0);
    // Four GPUs, four ticks a second, several clock domains each, for five seconds.
    assert!(failed >= 100.0, "only {failed} failed calls counted");
    let rss_after = proc_status(&e, "VmRSS");
    let logs = e.logs();
    let storm_lines: Vec<&str> = logs.lines().skip(lines_before).collect();
    eprintln!(
        "VmRSS before {rss_before} kB, after {rss_after} kB; {} log lines during the storm",
        storm_lines.len()
    );
    // Rate-limited: one XID line per (GPU, code) and one error line per (function, error) a
    // minute, instead of 10 000 XID lines and hundreds of error lines.
    assert!(
        storm_lines.len() <= 20,
        "{} log lines:\n{}",
        storm_lines.len(),
        storm_lines.join("\n")
    );
    assert_eq!(
        storm_lines
            .iter()
            .filter(|l| l.contains("XID event") && l.contains("xid=31"))
            .count(),
        1
    );
    // 10 000 events and a few hundred failed calls: if anything were kept per event or per
    // failure (a queue, a log buffer, a label set), this is where it would show. The bound is
    // generous against allocator noise (thread arenas, HTTP buffers of the polling scrapes).
    assert!(
        rss_after < rss_before + 16 * 1024,
        "VmRSS grew from {rss_before} kB to {rss_after} kB during the storm"
    );
}

#[test]
fn readyz_turns_503_while_no_device_answers_and_healthz_stays_fast() {
    // faults.toml: every GPU's nvmlDeviceGetTemperature call made at t = 22–23 s blocks 15 s,
    // so from then until about 37 s no tick completes. The limit is max(3 × 1 s, 10 s) = 10 s.
    let e = start_faults("19", &[]);
    e.wait_ready(WAIT);
    let healthz = || {
        let asked = Instant::now();
        let r = e.get("/healthz");
        assert_eq!(r.status, 200);
        let took = asked.elapsed();
        assert!(took < Duration::from_millis(500), "/healthz took {took:?}");
    };
    // Not ready once the last complete tick is over 10 s old.
    let reason = eventually(WAIT, "/readyz to turn 503", || {
        healthz();
        let r = e.get("/readyz");
        (r.status == 503).then(|| r.text())
    });
    assert!(reason.contains("limit 10 s"), "{reason}");
    let m = e.metrics();
    let age = unix_now()
        - m.value("nvml_exporter_last_sample_timestamp_seconds", &[])
            .unwrap();
    assert!(age > 10.0, "503 with a tick only {age:.1} s old");
    assert!(
        m.find("nvidia_gpu_up", &[]).iter().all(|s| s.value == 0.0),
        "every GPU is reported down while none answers"
    );
    // Ready again once the calls return, without a restart; /healthz fast throughout.
    eventually(WAIT, "/readyz to answer 200 again", || {
        healthz();
        (e.get("/readyz").status == 200).then_some(())
    });
    let m = e.wait_metrics(WAIT, "GPUs up again", |m| {
        m.find("nvidia_gpu_up", &[]).iter().all(|s| s.value == 1.0)
    });
    assert_eq!(gpus(&m), Some(4.0));
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}
