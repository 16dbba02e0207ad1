//! GPM on boards older than Hopper (the a100x4 scenario): the support query answers "no" and
//! every sampling call answers NOT_SUPPORTED, so a client exports no GPM series for them.

use crate::common::{self, Session};
use nvml_wrapper::error::NvmlError;

fn session() -> Session {
    let scenario = common::scenario("a100x4.toml");
    common::session(&[
        ("NVML_SIM_SCENARIO", Some(scenario.as_str())),
        ("NVML_SIM_TIME", Some("10")),
        ("NVML_SIM_START", None),
    ])
}

#[test]
fn a100_reports_gpm_unsupported() {
    let nvml = session();
    let count = nvml.device_count().unwrap();
    assert_eq!(count, 4);
    for i in 0..count {
        let device = nvml.device_by_index(i).unwrap();
        assert!(!device.gpm_support().unwrap(), "GPU{i}");
        for r in [
            device.gpm_sample().map(drop),
            device.gpm_mig_sample(0).map(drop),
            device.gpm_streaming_enabled().map(drop),
            device.set_gpm_streaming_enabled(true),
        ] {
            assert!(matches!(r, Err(NvmlError::NotSupported)), "GPU{i}: {r:?}");
        }
    }
}
