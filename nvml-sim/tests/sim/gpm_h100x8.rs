//! GPM on the default h100x8 scenario with a running clock: two samples a real 300 ms apart give
//! the average of each GPU's activity over that window, in NVML's units.
//!
//! Every GPM input of h100x8 is constant, so the averages are exact whatever the window.

use crate::common::{self, Session};
use nvml_wrapper::Nvml;
use nvml_wrapper::enums::gpm::GpmMetricId as M;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::gpm::gpm_metrics_get;
use std::time::Duration;

const MIB: f64 = 1024.0 * 1024.0;

fn session() -> Session {
    common::session(&[
        ("NVML_SIM_SCENARIO", None),
        ("NVML_SIM_TIME", None),
        // Away from t = 0 so the window lies well inside the scenario (and past XID 79 at 30 s).
        ("NVML_SIM_START", Some("100")),
    ])
}

/// Metric values (or their per-metric errors) of GPU `index` over a 300 ms window.
fn window(nvml: &Nvml, index: u32, ids: &[M]) -> Vec<Result<f64, NvmlError>> {
    let device = nvml.device_by_index(index).unwrap();
    let s1 = device.gpm_sample().unwrap();
    // A real wait: the GPM unit refreshes every 100 ms, and the clock is running.
    std::thread::sleep(Duration::from_millis(300));
    let s2 = device.gpm_sample().unwrap();
    gpm_metrics_get(nvml, &s1, &s2, ids)
        .unwrap()
        .into_iter()
        .map(|r| r.map(|m| m.value))
        .collect()
}

fn close(value: f64, expected: f64, what: &str) {
    assert!(
        (value - expected).abs() < 1e-6 * expected.abs().max(1.0),
        "{what}: {value} vs {expected}"
    );
}

#[test]
fn every_h100_supports_gpm() {
    let nvml = session();
    for i in 0..nvml.device_count().unwrap() {
        assert!(nvml.device_by_index(i).unwrap().gpm_support().unwrap());
    }
}

#[test]
fn the_trap_gpu_is_busy_but_not_saturated() {
    let nvml = session();
    let device = nvml.device_by_index(1).unwrap();
    let utilization = device.utilization_rates().unwrap().gpu;
    assert!(utilization >= 97, "GPU1 utilization {utilization} %");
    let v = window(
        &nvml,
        1,
        &[
            M::GraphicsUtil,
            M::SmUtil,
            M::SmOccupancy,
            M::AnyTensorUtil,
            M::DramBwUtil,
        ],
    );
    let v: Vec<f64> = v.into_iter().map(Result::unwrap).collect();
    assert!(v[0] >= 97.0 && v[0] <= 100.0, "graphics engine {} %", v[0]);
    close(v[1], 15.0, "SM activity");
    close(v[2], 10.0, "SM occupancy");
    close(v[3], 5.0, "tensor activity");
    close(v[4], 10.0, "DRAM activity");
}

#[test]
fn saturated_training_gpu_and_its_link_rates() {
    let nvml = session();
    let v = window(
        &nvml,
        2,
        &[
            M::SmUtil,
            M::SmOccupancy,
            M::AnyTensorUtil,
            M::HmmaTensorUtil,
            M::DramBwUtil,
            M::PcieTxPerSec,
            M::PcieRxPerSec,
            M::NvlinkTotalTxPerSec,
            M::NvlinkL0RxPerSec,
        ],
    );
    let v: Vec<f64> = v.into_iter().map(Result::unwrap).collect();
    close(v[0], 90.0, "SM activity");
    close(v[1], 55.0, "SM occupancy");
    close(v[2], 65.0, "tensor activity");
    close(v[3], 65.0, "HMMA defaults to tensor activity");
    close(v[4], 50.0, "DRAM activity");
    // The same rates the scenario gives the PCIe/NVLink queries (MB/s, GB/s), in MiB/s.
    close(v[5], 3000e6 / MIB, "PCIe TX");
    close(v[6], 6000e6 / MIB, "PCIe RX");
    close(v[7], 150e9 / MIB, "NVLink TX");
    close(v[8], 150e9 / 18.0 / MIB, "NVLink link 0 RX");
}

#[test]
fn idle_and_allocated_idle_gpus_show_no_activity() {
    let nvml = session();
    for index in [0, 7] {
        for (value, what) in window(
            &nvml,
            index,
            &[M::SmUtil, M::GraphicsUtil, M::AnyTensorUtil],
        )
        .into_iter()
        .zip(["SM", "graphics", "tensor"])
        {
            assert_eq!(value.unwrap(), 0.0, "GPU{index} {what}");
        }
    }
}

#[test]
fn missing_engines_answer_not_supported_per_metric() {
    let nvml = session();
    // H100: 7 NVDEC (0..6), 7 NVJPG, 1 NVOFA; the call itself succeeds.
    let v = window(
        &nvml,
        4,
        &[
            M::Nvdec6Util,
            M::Nvdec7Util,
            M::Nvjpg7Util,
            M::Nvofa1Util,
            M::SmUtil,
        ],
    );
    assert_eq!(v[0].as_ref().unwrap(), &0.0);
    for r in &v[1..4] {
        assert!(matches!(r, Err(NvmlError::NotSupported)), "{r:?}");
    }
    close(*v[4].as_ref().unwrap(), 60.0, "GPU4 SM activity");
}

#[test]
fn metric_info_names_the_metric_and_its_unit() {
    let nvml = session();
    let device = nvml.device_by_index(3).unwrap();
    let s1 = device.gpm_sample().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let s2 = device.gpm_sample().unwrap();
    let r = gpm_metrics_get(&nvml, &s1, &s2, &[M::SmOccupancy, M::PcieRxPerSec]).unwrap();
    let occupancy = r[0].as_ref().unwrap();
    assert_eq!(occupancy.metric_info.short_name, "SM_OCCUPANCY");
    assert_eq!(occupancy.metric_info.unit, "%");
    assert_eq!(r[1].as_ref().unwrap().metric_info.unit, "MiB/s");
}

#[test]
fn samples_of_different_gpus_are_rejected() {
    let nvml = session();
    let s1 = nvml.device_by_index(2).unwrap().gpm_sample().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let s2 = nvml.device_by_index(3).unwrap().gpm_sample().unwrap();
    let r = gpm_metrics_get(&nvml, &s1, &s2, &[M::SmUtil]);
    assert!(matches!(r, Err(NvmlError::InvalidArg)), "{r:?}");
}

#[test]
fn reversed_or_identical_samples_are_rejected() {
    let nvml = session();
    let device = nvml.device_by_index(2).unwrap();
    let s1 = device.gpm_sample().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let s2 = device.gpm_sample().unwrap();
    for (a, b) in [(&s2, &s1), (&s1, &s1)] {
        let r = gpm_metrics_get(&nvml, a, b, &[M::SmUtil]);
        assert!(matches!(r, Err(NvmlError::InvalidArg)), "{r:?}");
    }
}
