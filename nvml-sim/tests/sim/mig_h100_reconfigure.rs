//! The h100-mig reconfiguration at t = 60 s with a running clock started at 58 s: a handle of
//! the destroyed instance turns invalid, the new instance appears under the same index, and GPM
//! metrics are computed per GPU instance from each instance's own activity.
//!
//! The steps share one running clock, so they run in order in one test: the reconfiguration
//! first, while t is still before 60 s. No other test uses this environment, so the session
//! starts a new simulation and its clock at 58 s.

use crate::common::{self, Session};
use nvml_wrapper::Nvml;
use nvml_wrapper::enums::gpm::GpmMetricId as M;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::gpm::gpm_metrics_get;
use std::time::Duration;

fn session() -> Session {
    let scenario = common::scenario("h100-mig.toml");
    common::session(&[
        ("NVML_SIM_SCENARIO", Some(scenario.as_str())),
        ("NVML_SIM_TIME", None),
        ("NVML_SIM_START", Some("58")),
    ])
}

/// SM_UTIL and DRAM_BW_UTIL (percent) of GPU instance `gi` of GPU0 over a 300 ms window.
fn instance_window(nvml: &Nvml, gi: u32) -> Vec<Result<f64, NvmlError>> {
    let device = nvml.device_by_index(0).unwrap();
    let s1 = device.gpm_mig_sample(gi).unwrap();
    // A real wait: the GPM unit refreshes every 100 ms, and the clock is running.
    std::thread::sleep(Duration::from_millis(300));
    let s2 = device.gpm_mig_sample(gi).unwrap();
    gpm_metrics_get(nvml, &s1, &s2, &[M::SmUtil, M::DramBwUtil, M::PcieTxPerSec])
        .unwrap()
        .into_iter()
        .map(|r| r.map(|m| m.value))
        .collect()
}

#[test]
fn the_reconfiguration_at_60_s() {
    let nvml = session();
    the_layout_changes_at_60_s_and_stale_handles_become_invalid(&nvml);
    gpm_is_per_instance(&nvml);
    a_mig_device_handle_samples_its_gpu_instance(&nvml);
}

fn the_layout_changes_at_60_s_and_stale_handles_become_invalid(nvml: &Nvml) {
    let gpu = nvml.device_by_index(0).unwrap();
    // Before 60 s (the clock started at 58 s; 2 s of margin): index 1 is GI 3, the 2g.20gb.
    let old = gpu.mig_device_by_index(1).unwrap();
    assert_eq!(old.name().unwrap(), "NVIDIA H100 80GB HBM3 MIG 2g.20gb");
    // Wait (really) until the simulated clock has passed the reconfiguration.
    std::thread::sleep(Duration::from_millis(2500));
    assert!(matches!(old.name(), Err(NvmlError::InvalidArg)));
    assert!(matches!(old.memory_info(), Err(NvmlError::InvalidArg)));
    let new = gpu.mig_device_by_index(1).unwrap();
    assert_eq!(new.name().unwrap(), "NVIDIA H100 80GB HBM3 MIG 1g.20gb");
    assert_eq!(
        new.uuid().unwrap(),
        "MIG-2b5f3e61-7a0c-5d4e-9f1b-6c8a2e4d0b05"
    );
    assert_eq!(new.memory_info().unwrap().total, 20096 * 1024 * 1024);
    let uuids: Vec<String> = (0..4)
        .map(|i| gpu.mig_device_by_index(i).unwrap().uuid().unwrap())
        .collect();
    assert!(!uuids.iter().any(|u| u.ends_with("0b02")), "{uuids:?}");
    assert!(matches!(gpu.gpm_mig_sample(3), Err(NvmlError::InvalidArg)));
}

fn gpm_is_per_instance(nvml: &Nvml) {
    // GI 2 (3g.40gb) trains: SM 85 %, DRAM 50 %. GI 9 (1g.10gb) is idle. Both constant.
    let busy = instance_window(nvml, 2);
    let idle = instance_window(nvml, 9);
    let close = |v: &Result<f64, NvmlError>, want: f64| {
        let v = *v.as_ref().unwrap();
        assert!((v - want).abs() < 1e-6, "{v} vs {want}");
    };
    close(&busy[0], 85.0);
    close(&busy[1], 50.0);
    close(&idle[0], 0.0);
    close(&idle[1], 0.0);
    // PCIe is the board's: not reported per instance.
    assert!(matches!(busy[2], Err(NvmlError::NotSupported)));
}

fn a_mig_device_handle_samples_its_gpu_instance(nvml: &Nvml) {
    let gpu = nvml.device_by_index(0).unwrap();
    let d = gpu.mig_device_by_index(0).unwrap(); // GI 2 at every time of this test
    let s1 = d.gpm_sample().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let s2 = d.gpm_sample().unwrap();
    let v = gpm_metrics_get(nvml, &s1, &s2, &[M::SmUtil]).unwrap();
    assert!((v[0].as_ref().unwrap().value - 85.0).abs() < 1e-6);
    // A sample of the GPU and one of an instance do not make a window.
    let whole = gpu.gpm_sample().unwrap();
    std::thread::sleep(Duration::from_millis(150));
    let part = gpu.gpm_mig_sample(2).unwrap();
    assert!(matches!(
        gpm_metrics_get(nvml, &whole, &part, &[M::SmUtil]),
        Err(NvmlError::InvalidArg)
    ));
}
