//! The health verdict end to end: the real binary serving `nvml-sim/scenarios/health.toml`
//! (one signal per GPU, timeline in its header). Each GPU reads the state, reason and action of
//! its rule in `health::rules::RULES`; an application XID leaves its GPU healthy; an XID that
//! needs a reset holds until the GPU is seen reset; a condition NVML sees clear clears with it.
//! The simulator's clock starts just before the XIDs at t = 20 s (`NVML_SIM_START`) and the
//! exporter samples every 250 ms, so each test waits seconds.

mod common;

use common::{Exporter, Exposition};
use nvml_exporter::health::rules::{RULES, Rule, Signal};
use nvml_exporter::sample::HealthState;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(30);

/// The exporter on the health scenario, its clock `start` seconds in.
fn start(start: &str) -> Exporter {
    start_with(start, &[])
}

/// [`start`] with `extra` flags.
fn start_with(start: &str, extra: &[&str]) -> Exporter {
    let scenario = common::scenario("health");
    Exporter::start(
        &[
            ("NVML_SIM_SCENARIO", scenario.to_str().unwrap()),
            ("NVML_SIM_START", start),
        ],
        &[&["--interval", "250ms"][..], extra].concat(),
    )
}

/// The table's rule for `signal`.
fn rule(signal: Signal) -> &'static Rule {
    RULES
        .iter()
        .find(|r| r.signal == signal)
        .unwrap_or_else(|| panic!("no rule for {signal:?}"))
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

/// Whether the GPU reads exactly the verdict of `rules` (healthy when empty).
fn reads(m: &Exposition, gpu: u32, rules: &[&Rule]) -> bool {
    let want_state = rules
        .iter()
        .map(|r| r.state)
        .max()
        .unwrap_or(HealthState::Healthy);
    let want: Vec<(String, String)> = rules
        .iter()
        .map(|r| (r.reason.to_string(), r.action.label().to_string()))
        .collect();
    state(m, gpu) == Some(want_state as u8 as f64) && reasons(m, gpu) == want
}

fn timestamp(m: &Exposition) -> f64 {
    m.value("nvml_exporter_last_sample_timestamp_seconds", &[])
        .unwrap_or(0.0)
}

fn xids(m: &Exposition, gpu: u32, xid: &str) -> f64 {
    m.gpu_value("nvidia_gpu_xid_errors_total", gpu, &[("xid", xid)])
        .unwrap_or(0.0)
}

#[test]
fn each_gpu_reads_the_verdict_of_its_rule_and_a_reset_xid_holds() {
    let e = start("19");
    let m = e.wait_metrics(WAIT, "the XIDs of t = 20 s counted", |m| {
        xids(m, 1, "31") >= 1.0 && xids(m, 2, "79") >= 1.0
    });
    // The conditions NVML shows from the start; GPU3 (reset at 26 s) and GPU7 (hot 20–24 s)
    // move, and have tests of their own.
    let expected: [(u32, Vec<&Rule>); 6] = [
        (0, vec![]),
        (1, vec![]),
        (2, vec![rule(Signal::Xid(79))]),
        (4, vec![rule(Signal::NvlinkDown)]),
        (5, vec![rule(Signal::RowRemapFailure)]),
        (6, vec![rule(Signal::PcieWidth)]),
    ];
    // The verdict is that of the tick that counted the XIDs, or of the next one.
    let m = if reads(&m, 2, &expected[2].1) {
        m
    } else {
        e.wait_metrics(WAIT, "GPU2 failed for XID 79", |m| {
            reads(m, 2, &expected[2].1)
        })
    };
    for (gpu, rules) in &expected {
        assert!(
            reads(&m, *gpu, rules),
            "GPU{gpu}: state {:?}, reasons {:?}, want {:?}",
            state(&m, *gpu),
            reasons(&m, *gpu),
            rules.iter().map(|r| r.reason).collect::<Vec<_>>()
        );
    }
    // The XID 31 was seen, and its GPU stays healthy with no reason series.
    assert_eq!(rule(Signal::Xid(31)).state, HealthState::Healthy);
    assert_eq!(state(&m, 1), Some(0.0));
    assert!(
        m.find("nvidia_gpu_health_reason", &[("gpu", "1")])
            .is_empty()
    );

    // XID 79 asks for a reboot: it holds, tick after tick, while GPU2 goes on answering.
    let seen = timestamp(&m);
    let later = e.wait_metrics(WAIT, "ticks 2 s after the XID", |m| {
        timestamp(m) > seen + 2.0
    });
    assert_eq!(later.gpu_value("nvidia_gpu_up", 2, &[]), Some(1.0));
    assert_eq!(xids(&later, 2, "79"), xids(&m, 2, "79"), "no new XID 79");
    assert!(
        reads(&later, 2, &expected[2].1),
        "GPU2 still failed: state {:?}, reasons {:?}",
        state(&later, 2),
        reasons(&later, 2)
    );
}

#[test]
fn an_xid_that_needs_a_reset_holds_until_the_gpu_is_seen_reset() {
    let e = start("19");
    let xid_48 = rule(Signal::Xid(48));
    e.wait_metrics(WAIT, "GPU3 failed for XID 48", |m| reads(m, 3, &[xid_48]));

    // The reset at t = 26 s: NVML answers GPU_IS_LOST, which fails the GPU for its own reason
    // while the XID still holds.
    let during = e.wait_metrics(WAIT, "GPU3 lost and XID 48", |m| {
        reads(m, 3, &[rule(Signal::Lost), xid_48])
    });
    assert_eq!(during.gpu_value("nvidia_gpu_up", 3, &[]), Some(0.0));

    // Answering again after the reset: healthy, no reason left, though the XID count stays.
    let back = e.wait_metrics(WAIT, "GPU3 back and healthy", |m| {
        m.gpu_value("nvidia_gpu_up", 3, &[]) == Some(1.0) && reads(m, 3, &[])
    });
    assert!(
        back.find("nvidia_gpu_health_reason", &[("gpu", "3")])
            .is_empty()
    );
    assert_eq!(xids(&back, 3, "48"), 1.0);
    // A reset of GPU3 is not one of GPU2: its XID 79 still holds.
    assert!(reads(&back, 2, &[rule(Signal::Xid(79))]));
}

#[test]
fn a_condition_nvml_sees_clear_clears_the_verdict() {
    // GPU7 is busy and too hot for its cooling from t = 20 to 24 s, idle and cool around it.
    let e = start("18");
    let m = e.wait_metrics(WAIT, "a first tick", |m| state(m, 7).is_some());
    assert!(
        reads(&m, 7, &[]),
        "GPU7 healthy while idle: state {:?}, reasons {:?}",
        state(&m, 7),
        reasons(&m, 7)
    );
    let thermal = rule(Signal::ThermalSlowdown);
    let hot = e.wait_metrics(WAIT, "GPU7 in thermal slowdown", |m| {
        reads(m, 7, &[thermal])
    });
    let slowdown = |m: &Exposition| m.gpu_value("nvidia_gpu_thermal_slowdown_active", 7, &[]);
    assert_eq!(
        slowdown(&hot),
        Some(1.0),
        "the verdict follows NVML's reason"
    );
    let cleared = e.wait_metrics(WAIT, "GPU7 cool and healthy again", |m| reads(m, 7, &[]));
    assert!(
        cleared
            .find("nvidia_gpu_health_reason", &[("gpu", "7")])
            .is_empty()
    );
    assert_eq!(slowdown(&cleared), Some(0.0));
}

#[test]
fn links_that_come_back_clear_the_verdict() {
    // GPU4's link 3 is down until t = 30 s of each minute, and up for the rest of it.
    let e = start_with("28", &["--collector.nvlink-links"]);
    let link_3 = |m: &Exposition| m.gpu_value("nvidia_gpu_nvlink_up", 4, &[("link", "3")]);
    let down = e.wait_metrics(WAIT, "a first tick", |m| state(m, 4).is_some());
    assert_eq!(link_3(&down), Some(0.0));
    assert!(
        reads(&down, 4, &[rule(Signal::NvlinkDown)]),
        "GPU4 degraded while link 3 is down: state {:?}, reasons {:?}",
        state(&down, 4),
        reasons(&down, 4)
    );
    let up = e.wait_metrics(WAIT, "GPU4's link 3 up", |m| link_3(m) == Some(1.0));
    assert!(
        reads(&up, 4, &[]),
        "GPU4 healthy with every link up: state {:?}, reasons {:?}",
        state(&up, 4),
        reasons(&up, 4)
    );
}
