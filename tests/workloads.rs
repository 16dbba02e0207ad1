//! GPU-seconds per workload end to end: the exporter on idle-waste.toml (GPU 0 working, GPUs
//! 1-3 idle), a fake kubelet assigning all four to one pod, and the per-container counters read
//! at two instants against the exporter's own tick timestamps. (Over minutes of a square wave,
//! against a live Prometheus: scripts/e2e-busy.sh.)

mod common;
mod kubelet;

use std::path::Path;
use std::time::Duration;

use common::{Exporter, Exposition, scenario};
use kubelet::{FakeKubelet, pod};
use nvml_exporter::kubernetes::proto::PodResources;

const HELD: &str = "nvidia_gpu_pod_gpu_seconds_total";
const IDLE: &str = "nvidia_gpu_pod_idle_gpu_seconds_total";
const TIMESTAMP: &str = "nvml_exporter_last_sample_timestamp_seconds";

const UUIDS: [&str; 4] = [
    "GPU-7d1e0a00-5b3c-4e2a-9f10-3c5a7e9b1d00",
    "GPU-7d1e0a01-5b3c-4e2a-9f10-3c5a7e9b1d01",
    "GPU-7d1e0a02-5b3c-4e2a-9f10-3c5a7e9b1d02",
    "GPU-7d1e0a03-5b3c-4e2a-9f10-3c5a7e9b1d03",
];

/// The exporter at simulated t = 1 s, frozen (GPU 0 inside its busy 1.5 s), asking the kubelet
/// at `socket`, with `extra` flags.
fn exporter(socket: &Path, extra: &[&str]) -> Exporter {
    let path = scenario("idle-waste");
    let mut args = vec![
        "--interval",
        "250ms",
        "--kubernetes",
        "--pod-resources-socket",
        socket.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    Exporter::start(
        &[
            ("NVML_SIM_SCENARIO", path.to_str().unwrap()),
            ("NVML_SIM_TIME", "1"),
        ],
        &args,
    )
}

fn waste_pod() -> Vec<PodResources> {
    vec![pod("ml", "waste-0", "train", "nvidia.com/gpu", &UUIDS)]
}

/// The pod's value of `name` on GPU `gpu`.
fn of(m: &Exposition, name: &str, gpu: u32) -> Option<f64> {
    m.gpu_value(name, gpu, &[("pod", "waste-0")])
}

fn timestamp(m: &Exposition) -> f64 {
    m.value(TIMESTAMP, &[]).unwrap()
}

#[test]
fn a_pod_holding_four_gpus_of_which_one_works_is_charged_three_idle() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("kubelet.sock");
    let mut kubelet = FakeKubelet::start(&socket, waste_pod());
    let e = exporter(&socket, &[]);
    let first = e.wait_metrics(Duration::from_secs(20), "the pod's counters", |m| {
        (0..4).all(|g| of(m, HELD, g).is_some())
    });
    let t0 = timestamp(&first);
    let second = e.wait_metrics(Duration::from_secs(20), "2 s of ticks", |m| {
        m.value(TIMESTAMP, &[]).is_some_and(|t| t >= t0 + 2.0)
    });
    let window = timestamp(&second) - t0;
    let grew = |name, gpu| of(&second, name, gpu).unwrap() - of(&first, name, gpu).unwrap();
    let near = |got: f64, want: f64, what: &str| {
        assert!(
            (got - want).abs() <= 0.01 * window + 0.02,
            "{what}: {got:.4} GPU-s, want {want:.4} over {window:.3} s"
        )
    };
    for g in 0..4 {
        near(grew(HELD, g), window, &format!("GPU {g} held"));
        let idle = if g == 0 { 0.0 } else { window };
        near(grew(IDLE, g), idle, &format!("GPU {g} idle"));
    }
    // With a frozen clock GPM has no window to average: no SM-active series.
    assert!(
        second
            .find("nvidia_gpu_pod_sm_active_gpu_seconds_total", &[])
            .is_empty()
    );
    // The pod ends: its series end within a refresh.
    kubelet.set_pods(vec![]);
    e.wait_metrics(Duration::from_secs(10), "the pod's series gone", |m| {
        m.find(HELD, &[]).is_empty() && m.find(IDLE, &[]).is_empty()
    });
    kubelet.stop();
}

#[test]
fn with_an_idle_threshold_of_zero_nothing_is_idle() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("kubelet.sock");
    let _kubelet = FakeKubelet::start(&socket, waste_pod());
    let e = exporter(&socket, &["--idle-threshold", "0"]);
    let m = e.wait_metrics(Duration::from_secs(20), "a second held", |m| {
        (0..4).all(|g| of(m, HELD, g).is_some_and(|s| s >= 1.0))
    });
    for g in 0..4 {
        assert_eq!(of(&m, IDLE, g), Some(0.0), "GPU {g}");
    }
}
