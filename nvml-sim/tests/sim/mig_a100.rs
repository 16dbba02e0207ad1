//! The a100-mig scenario at a pinned t = 90 s (after its reconfiguration): seven MIG devices,
//! GI 13 replaced by GI 14 (1g.20gb), per-instance memory, and no GPM on Ampere.

use crate::common::{self, Session};
use nvml_wrapper::error::NvmlError;

const MIB: u64 = 1024 * 1024;

fn session() -> Session {
    let scenario = common::scenario("a100-mig.toml");
    common::session(&[
        ("NVML_SIM_SCENARIO", Some(scenario.as_str())),
        ("NVML_SIM_TIME", Some("90")),
        ("NVML_SIM_START", None),
    ])
}

#[test]
fn seven_instances_after_the_reconfiguration() {
    let nvml = session();
    let gpu = nvml.device_by_index(0).unwrap();
    assert_eq!(gpu.mig_device_count().unwrap(), 7);
    let mut names = Vec::new();
    for i in 0..7 {
        let d = gpu.mig_device_by_index(i).unwrap();
        let gi = 7 + i + u32::from(i == 6); // GI 7..12, then GI 14 (13 was destroyed at 60 s)
        assert_eq!(
            d.uuid().unwrap(),
            format!("MIG-5c1e9a3d-4b7f-5a2c-8d6e-0f2a4c6e8a{gi:02}")
        );
        names.push(d.name().unwrap());
    }
    assert_eq!(names[0], "NVIDIA A100-SXM4-80GB MIG 1g.10gb");
    assert_eq!(names[6], "NVIDIA A100-SXM4-80GB MIG 1g.20gb");
    let m = gpu.mig_device_by_index(0).unwrap().memory_info().unwrap();
    assert_eq!(
        (m.total, m.used),
        (9728 * MIB, (0.9 * (9728 * MIB) as f64) as u64)
    );
    let m = gpu.mig_device_by_index(6).unwrap().memory_info().unwrap();
    assert_eq!((m.total, m.used), (19968 * MIB, 16384 * MIB));
    let empty = gpu.mig_device_by_index(2).unwrap().memory_info().unwrap();
    assert_eq!(empty.used, 0);
}

#[test]
fn no_gpm_and_no_utilization() {
    let nvml = session();
    let gpu = nvml.device_by_index(0).unwrap();
    assert!(matches!(
        gpu.gpm_mig_sample(7),
        Err(NvmlError::NotSupported)
    ));
    assert!(matches!(
        gpu.utilization_rates(),
        Err(NvmlError::NotSupported)
    ));
    let d = gpu.mig_device_by_index(0).unwrap();
    assert!(matches!(
        d.utilization_rates(),
        Err(NvmlError::NotSupported)
    ));
}
