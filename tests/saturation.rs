//! Saturation (NVML GPM) against the running exporter: the values appear from the second tick, on
//! Hopper only, and tell the busy-but-unsaturated GPU of the default node from the saturated ones.

mod common;
#[path = "saturation/families.rs"]
mod families;

use common::{Exporter, Exposition};
use families::gpm_families;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(20);

fn sm(m: &Exposition, gpu: u32) -> Option<f64> {
    m.gpu_value("nvidia_gpu_sm_active_ratio", gpu, &[])
}

#[test]
fn busy_is_told_from_saturated_on_the_default_node() {
    // Every group: the pipes and the GPM bandwidth are opt-in.
    let every_group = common::every_group();
    let e = Exporter::start(
        &[],
        &common::with_every_group(&every_group, &["--interval", "250ms"]),
    );
    let m = e.wait_metrics(WAIT, "GPM values on all 8 GPUs", |m| {
        (0..8).all(|g| sm(m, g).is_some())
    });
    for g in 0..8 {
        assert_eq!(
            m.gpu_value("nvidia_gpu_gpm_supported", g, &[]),
            Some(1.0),
            "H100 supports GPM"
        );
        for name in gpm_families().into_iter().filter(|n| n.ends_with("_ratio")) {
            for s in m.find(name, &[("gpu", &g.to_string())]) {
                assert!(
                    (0.0..=1.0).contains(&s.value),
                    "{name} on GPU {g} is a ratio: {}",
                    s.value
                );
            }
        }
    }
    let util = |g| m.gpu_value("nvidia_gpu_utilization_ratio", g, &[]).unwrap();
    let occupancy = |g| {
        m.gpu_value("nvidia_gpu_sm_occupancy_ratio", g, &[])
            .unwrap()
    };
    let tensor = |g| {
        m.gpu_value("nvidia_gpu_tensor_active_ratio", g, &[])
            .unwrap()
    };

    // GPU 1: the trap. nvidia-smi says ~100 %, yet few SMs have work.
    assert!(util(1) >= 0.9, "GPU 1 utilization {}", util(1));
    assert!(
        sm(&m, 1).unwrap() < 0.3 && occupancy(1) < 0.2,
        "GPU 1 SM {:?} occ {}",
        sm(&m, 1),
        occupancy(1)
    );
    // GPUs 2 and 3 train: saturated.
    for g in [2, 3] {
        assert!(
            sm(&m, g).unwrap() > 0.7 && tensor(g) > 0.4,
            "GPU {g} SM {:?} tensor {}",
            sm(&m, g),
            tensor(g)
        );
    }
    // GPU 4 is memory-bound: DRAM busy.
    assert!(m.gpu_value("nvidia_gpu_dram_active_ratio", 4, &[]).unwrap() > 0.7);
    // GPU 7 holds memory but does nothing.
    assert!(sm(&m, 7).unwrap() < 0.05);
    // Pipes carry their label; NVLink traffic shows on the training GPUs.
    assert!(
        m.gpu_value("nvidia_gpu_pipe_active_ratio", 2, &[("pipe", "fp16")])
            .is_some()
    );
    assert!(
        m.gpu_value("nvidia_gpu_nvlink_gpm_transmit_bytes_per_second", 2, &[])
            .unwrap()
            > 1e9
    );
    assert_eq!(
        m.value(
            "nvml_exporter_nvml_errors_total",
            &[("function", "nvmlGpmMetricsGet")]
        ),
        None,
        "no GPM errors"
    );
}

#[test]
fn gpus_without_gpm_say_so_and_serve_no_gpm_values() {
    let scenario = common::scenario("a100x4");
    let e = Exporter::start(
        &[("NVML_SIM_SCENARIO", scenario.to_str().unwrap())],
        &["--interval", "250ms"],
    );
    let first = e.wait_metrics(WAIT, "a tick", |m| {
        m.find("nvidia_gpu_gpm_supported", &[]).len() == 4
    });
    let t = first
        .value("nvml_exporter_last_sample_timestamp_seconds", &[])
        .unwrap();
    // Several ticks later there are still no GPM values: unsupported, not "not yet".
    let m = e.wait_metrics(WAIT, "three more ticks", |m| {
        m.value("nvml_exporter_last_sample_timestamp_seconds", &[])
            .unwrap_or(0.0)
            > t + 0.7
    });
    assert!(
        m.find("nvidia_gpu_gpm_supported", &[])
            .iter()
            .all(|s| s.value == 0.0)
    );
    for name in gpm_families()
        .into_iter()
        .filter(|n| *n != "nvidia_gpu_gpm_supported")
    {
        assert!(m.find(name, &[]).is_empty(), "{name} served on an A100");
    }
}

#[test]
fn the_first_tick_has_no_gpm_values() {
    let out = common::run_once(&[("NVML_SIM_TIME", "60")], &[]);
    let m = Exposition::parse(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(m.find("nvidia_gpu_gpm_supported", &[]).len(), 8);
    assert!(
        m.find("nvidia_gpu_sm_active_ratio", &[]).is_empty(),
        "one sample is not an average"
    );
}
