//! The health verdict end to end: the real binary serving `nvml-sim/scenarios/health.toml` (a
//! driver before R565, one signal per GPU, timeline in its header) and `recovery.toml` (the
//! driver's recovery action, R590). Each GPU reads the state, reason and action NVIDIA's sources
//! give (written out here, not read from the rule table); an XID that needs a reset holds until
//! the GPU is seen reset, and across a restart of the exporter with a state file; a condition
//! NVML sees clear clears with it. The simulator's clock starts just before the XIDs at t = 20 s
//! (`NVML_SIM_START`) and the exporter samples every 250 ms, so each test waits seconds.

mod common;

use common::{Exporter, Exposition, eventually, run_once, scenario};
use std::path::Path;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(30);

/// The exporter on scenario `name`, its clock `start` seconds in, with `extra` flags.
fn start_on(name: &str, start: &str, extra: &[&str]) -> Exporter {
    let scenario = scenario(name);
    Exporter::start(
        &[
            ("NVML_SIM_SCENARIO", scenario.to_str().unwrap()),
            ("NVML_SIM_START", start),
        ],
        &[&["--interval", "250ms"][..], extra].concat(),
    )
}

/// The exporter on the health scenario.
fn start(start: &str) -> Exporter {
    start_on("health", start, &[])
}

/// The exporter on the health scenario keeping its held verdicts in `file`.
fn start_keeping(start: &str, file: &Path) -> Exporter {
    start_on(
        "health",
        start,
        &["--health-state-file", file.to_str().unwrap()],
    )
}

fn state(m: &Exposition, gpu: u32) -> Option<f64> {
    m.gpu_value("nvidia_gpu_health_state", gpu, &[])
}

/// The GPU's `(reason, action)` series, in the order served.
fn reasons(m: &Exposition, gpu: u32) -> Vec<(String, String)> {
    m.find("nvidia_gpu_health_reason", &[("gpu", &gpu.to_string())])
        .into_iter()
        .map(|s| {
            assert_eq!(s.value, 1.0, "{s:?}");
            (s.labels["reason"].clone(), s.labels["action"].clone())
        })
        .collect()
}

/// A verdict: the state (0 healthy, 1 degraded, 2 failed) and each (reason, action).
type Verdict = (f64, &'static [(&'static str, &'static str)]);

const HEALTHY: Verdict = (0.0, &[]);

/// Whether the GPU reads exactly `verdict`.
fn reads(m: &Exposition, gpu: u32, (want_state, want): Verdict) -> bool {
    let want: Vec<(String, String)> = want
        .iter()
        .map(|(r, a)| (r.to_string(), a.to_string()))
        .collect();
    state(m, gpu) == Some(want_state) && reasons(m, gpu) == want
}

fn xids(m: &Exposition, gpu: u32, xid: &str) -> f64 {
    m.gpu_value("nvidia_gpu_xid_errors_total", gpu, &[("xid", xid)])
        .unwrap_or(0.0)
}

fn describe(m: &Exposition, gpu: u32) -> String {
    format!(
        "GPU{gpu}: state {:?}, reasons {:?}",
        state(m, gpu),
        reasons(m, gpu)
    )
}

/// Waits until every GPU of `expected` reads its verdict, and says which did not.
fn wait_for_verdicts(e: &Exporter, expected: &[(u32, Verdict)]) -> Exposition {
    let all = |m: &Exposition| expected.iter().all(|(gpu, v)| reads(m, *gpu, *v));
    let mut last = None;
    common::poll_until(WAIT, || {
        let m = e.metrics();
        let done = all(&m);
        last = Some(m);
        done.then_some(())
    });
    let m = last.unwrap();
    for (gpu, v) in expected {
        assert!(reads(&m, *gpu, *v), "{}, want {v:?}", describe(&m, *gpu));
    }
    m
}

/// What NVIDIA's sources give for each GPU of health.toml while every signal shows (t = 22 to
/// 30 s); GPU3 (reset at 26 s) and GPU7 (hot 20–24 s) move, and have tests of their own.
const HEALTH_VERDICTS: [(u32, Verdict); 14] = [
    (0, HEALTHY),
    // XIDs 31 (an application fault), 43, 63 and 92 (the catalogue: ignore).
    (1, HEALTHY),
    (2, (2.0, &[("xid_79", "reboot_node")])),
    (4, (2.0, &[("nvlink_down", "reset_gpu")])),
    (5, (2.0, &[("row_remap_failure", "drain_and_service")])),
    // A narrow PCIe link is only reported.
    (6, HEALTHY),
    (8, (2.0, &[("xid_140", "reset_gpu")])),
    (9, (1.0, &[("xid_unlisted", "investigate")])),
    (10, (2.0, &[("ecc_uncorrectable", "reset_gpu")])),
    (11, (2.0, &[("sram_threshold", "drain_and_service")])),
    (12, (2.0, &[("retired_pages_limit", "drain_and_service")])),
    (13, (1.0, &[("pcie_replay_rate", "drain_and_service")])),
    (14, (2.0, &[("reset_required", "reset_gpu")])),
    (15, (1.0, &[("xid_94", "restart_workload")])),
];

#[test]
fn each_gpu_reads_the_verdict_nvidia_s_sources_give() {
    let e = start("19");
    let m = wait_for_verdicts(&e, &HEALTH_VERDICTS);
    // The XIDs were seen, those that leave a GPU healthy too.
    for (gpu, xid) in [
        (1, "31"),
        (1, "43"),
        (1, "63"),
        (1, "92"),
        (2, "79"),
        (9, "151"),
    ] {
        assert_eq!(xids(&m, gpu, xid), 1.0, "GPU{gpu} XID {xid}");
    }
    assert!(
        m.find("nvidia_gpu_health_reason", &[("gpu", "1")])
            .is_empty()
    );

    // XID 79 asks for a reboot and XID 140 for a reset: they hold, tick after tick, while their
    // GPUs go on answering.
    let seen = m
        .value("nvml_exporter_last_sample_timestamp_seconds", &[])
        .unwrap();
    let later = e.wait_metrics(WAIT, "ticks 2 s after the XIDs", |m| {
        m.value("nvml_exporter_last_sample_timestamp_seconds", &[])
            .is_some_and(|t| t > seen + 2.0)
    });
    for gpu in [2, 8] {
        assert_eq!(later.gpu_value("nvidia_gpu_up", gpu, &[]), Some(1.0));
        let (_, verdict) = HEALTH_VERDICTS.iter().find(|(g, _)| *g == gpu).unwrap();
        assert!(reads(&later, gpu, *verdict), "{}", describe(&later, gpu));
    }
}

#[test]
fn an_xid_that_needs_a_reset_holds_until_the_gpu_is_seen_reset() {
    let e = start("19");
    let xid_48: Verdict = (2.0, &[("xid_48", "reset_gpu")]);
    e.wait_metrics(WAIT, "GPU3 failed for XID 48", |m| reads(m, 3, xid_48));

    // The reset at t = 26 s: NVML answers GPU_IS_LOST, which fails the GPU for its own reason
    // while the XID still holds.
    let lost: Verdict = (2.0, &[("lost", "reboot_node"), ("xid_48", "reset_gpu")]);
    let during = e.wait_metrics(WAIT, "GPU3 lost and XID 48", |m| reads(m, 3, lost));
    assert_eq!(during.gpu_value("nvidia_gpu_up", 3, &[]), Some(0.0));

    // Answering again after the reset: healthy, no reason left, though the XID count stays.
    let back = e.wait_metrics(WAIT, "GPU3 back and healthy", |m| {
        m.gpu_value("nvidia_gpu_up", 3, &[]) == Some(1.0) && reads(m, 3, HEALTHY)
    });
    assert_eq!(xids(&back, 3, "48"), 1.0);
    // A reset of GPU3 is not one of GPU2: its XID 79 still holds.
    assert!(reads(&back, 2, (2.0, &[("xid_79", "reboot_node")])));
}

#[test]
fn a_condition_nvml_sees_clear_clears_the_verdict() {
    // GPU7 is busy and too hot for its cooling from t = 20 to 24 s, idle and cool around it.
    let e = start("18");
    let m = e.wait_metrics(WAIT, "a first tick", |m| state(m, 7).is_some());
    assert!(reads(&m, 7, HEALTHY), "{}", describe(&m, 7));
    let hot = e.wait_metrics(WAIT, "GPU7 in thermal slowdown", |m| {
        reads(m, 7, (1.0, &[("thermal_slowdown", "none")]))
    });
    let slowdown = |m: &Exposition| m.gpu_value("nvidia_gpu_thermal_slowdown_active", 7, &[]);
    assert_eq!(
        slowdown(&hot),
        Some(1.0),
        "the verdict follows NVML's reason"
    );
    let cleared = e.wait_metrics(WAIT, "GPU7 cool and healthy again", |m| {
        reads(m, 7, HEALTHY)
    });
    assert_eq!(slowdown(&cleared), Some(0.0));
}

#[test]
fn links_that_come_back_clear_the_verdict() {
    // GPU4's link 3 is down until t = 30 s of each minute, and up for the rest of it.
    let e = start_on("health", "28", &["--collector.nvlink-links"]);
    let link_3 = |m: &Exposition| m.gpu_value("nvidia_gpu_nvlink_up", 4, &[("link", "3")]);
    let down = e.wait_metrics(WAIT, "a first tick", |m| state(m, 4).is_some());
    assert_eq!(link_3(&down), Some(0.0));
    assert!(
        reads(&down, 4, (2.0, &[("nvlink_down", "reset_gpu")])),
        "{}",
        describe(&down, 4)
    );
    let up = e.wait_metrics(WAIT, "GPU4's link 3 up", |m| link_3(m) == Some(1.0));
    assert!(reads(&up, 4, HEALTHY), "{}", describe(&up, 4));
}

#[test]
fn a_mig_gpu_whose_links_all_read_down_is_healthy() {
    // h100-mig.toml: GPU0 in MIG mode, its 18 NVLink links reported down as drivers do.
    let scenario = scenario("h100-mig");
    let out = run_once(
        &[
            ("NVML_SIM_SCENARIO", scenario.to_str().unwrap()),
            ("NVML_SIM_TIME", "30"),
        ],
        &["--collector.nvlink-links"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let m = Exposition::parse(&String::from_utf8(out.stdout).unwrap());
    let links = m.find("nvidia_gpu_nvlink_up", &[("gpu", "0")]);
    assert_eq!(links.len(), 18);
    assert!(links.iter().all(|l| l.value == 0.0), "{links:?}");
    assert_eq!(m.gpu_value("nvidia_gpu_nvlink_links_up", 0, &[]), Some(0.0));
    for gpu in [0, 1] {
        assert!(reads(&m, gpu, HEALTHY), "{}", describe(&m, gpu));
    }
}

#[test]
fn the_driver_s_recovery_action_decides_where_present() {
    let e = start_on("recovery", "19", &[]);
    // XIDs 48 (GPU1), 95 (GPU6) and 149 (GPU7) are the driver's to judge; XID 140 (GPU6) is
    // not linked to its recovery action and counts on its own.
    let m = wait_for_verdicts(
        &e,
        &[
            (0, HEALTHY),
            (1, (2.0, &[("recovery_action_gpu_reset", "reset_gpu")])),
            (2, (2.0, &[("recovery_action_node_reboot", "reboot_node")])),
            (3, (1.0, &[("recovery_action_drain_p2p", "drain_p2p")])),
            (
                4,
                (2.0, &[("recovery_action_drain_and_reset", "reset_gpu")]),
            ),
            (5, (2.0, &[("recovery_action_other", "investigate")])),
            (
                6,
                (
                    2.0,
                    &[
                        ("recovery_action_gpu_reset", "reset_gpu"),
                        ("xid_140", "reset_gpu"),
                    ],
                ),
            ),
            (7, (2.0, &[("unrepairable_memory", "drain_and_service")])),
        ],
    );
    for (gpu, xid) in [(1, "48"), (6, "95"), (6, "140"), (7, "149")] {
        assert_eq!(xids(&m, gpu, xid), 1.0, "GPU{gpu} XID {xid}");
    }
    // At t = 24 s the driver's action goes back to none: the reset was done, and XID 140 goes
    // with it.
    e.wait_metrics(WAIT, "GPU6 reset by the driver's account", |m| {
        reads(m, 6, HEALTHY)
    });
}

#[test]
fn a_held_verdict_survives_a_restart_until_the_gpu_is_reset() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("health.json");
    let failed_79: Verdict = (2.0, &[("xid_79", "reboot_node")]);
    let failed_48: Verdict = (2.0, &[("xid_48", "reset_gpu")]);
    let failed_140: Verdict = (2.0, &[("xid_140", "reset_gpu")]);
    {
        let e = start_keeping("19", &file);
        e.wait_metrics(WAIT, "the XIDs of t = 20 s held", |m| {
            reads(m, 2, failed_79) && reads(m, 3, failed_48) && reads(m, 8, failed_140)
        });
        // Dropped: killed, as an OOM kill or a node drain would.
    }
    let first_tick =
        |e: &Exporter| e.wait_metrics(WAIT, "a first tick", |m| state(m, 15).is_some());

    // Without the file a new exporter never sees those XIDs (events are not replayed).
    let forgetful = first_tick(&start("22"));
    for gpu in [2, 3, 8] {
        assert!(
            reads(&forgetful, gpu, HEALTHY),
            "{}",
            describe(&forgetful, gpu)
        );
    }

    // With it, the new exporter holds them from its first tick, before GPU3's reset at 26 s.
    let e = start_keeping("22", &file);
    let m = first_tick(&e);
    for (gpu, verdict) in [(2, failed_79), (3, failed_48), (8, failed_140)] {
        assert!(reads(&m, gpu, verdict), "{}", describe(&m, gpu));
        assert_eq!(
            xids(&m, gpu, "79") + xids(&m, gpu, "48"),
            0.0,
            "no event seen"
        );
    }
    for op in ["read", "write"] {
        assert_eq!(
            m.value(
                "nvml_exporter_health_state_errors_total",
                &[("operation", op)]
            ),
            Some(0.0)
        );
    }
    e.wait_metrics(WAIT, "GPU3 reset and healthy", |m| {
        m.gpu_value("nvidia_gpu_up", 3, &[]) == Some(1.0) && reads(m, 3, HEALTHY)
    });
    drop(e);

    // The reset is in the file too: the next exporter holds only what still needs a reset.
    let m = first_tick(&start_keeping("30", &file));
    assert!(reads(&m, 3, HEALTHY), "{}", describe(&m, 3));
    assert!(reads(&m, 2, failed_79), "{}", describe(&m, 2));
}

#[test]
fn a_state_file_that_cannot_be_read_or_written_is_counted_and_never_fatal() {
    let dir = tempfile::tempdir().unwrap();
    let corrupt = dir.path().join("corrupt.json");
    std::fs::write(&corrupt, "{ not json").unwrap();
    let unwritable = dir.path().join("no-such-directory").join("health.json");
    let mut a = start_keeping("19", &corrupt);
    let mut b = start_keeping("19", &unwritable);
    let errors = |m: &Exposition, op: &str| {
        m.value(
            "nvml_exporter_health_state_errors_total",
            &[("operation", op)],
        )
    };
    let failed_79: Verdict = (2.0, &[("xid_79", "reboot_node")]);

    // A corrupt file is said at once, and replaced once there is something to hold.
    let m = a.wait_metrics(WAIT, "GPU2 failed", |m| reads(m, 2, failed_79));
    assert_eq!(errors(&m, "read"), Some(1.0));
    let text = eventually(WAIT, "the file rewritten", || {
        std::fs::read_to_string(&corrupt)
            .ok()
            .filter(|t| t.contains("GPU-5e0a7c31-2b4d-4f68-9a1c-3d5e7f9b1c22"))
    });
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert!(json["gpus"]["GPU-5e0a7c31-2b4d-4f68-9a1c-3d5e7f9b1c22"]["xids"]["79"].is_number());

    // A file that cannot be written: the verdict holds in memory, and every failed write is said.
    let m = b.wait_metrics(WAIT, "GPU2 failed and a write failed", |m| {
        reads(m, 2, failed_79) && errors(m, "write").is_some_and(|n| n >= 1.0)
    });
    assert_eq!(errors(&m, "read"), Some(0.0));
    assert!(a.alive() && b.alive());
    assert!(
        b.logs().contains("cannot write the held health verdicts"),
        "{}",
        b.logs()
    );
}
