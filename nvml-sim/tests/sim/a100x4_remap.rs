//! The A100 scenario at a pinned t: row remapping state per GPU (one with a pending remap),
//! ECC counts, NVLink 3 and MIG supported but disabled.

use crate::common::{self, Session};
use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError};
use nvml_wrapper_sys::bindings as b;

fn session() -> Session {
    common::session(&[
        ("NVML_SIM_SCENARIO", Some(&common::scenario("a100x4.toml"))),
        ("NVML_SIM_TIME", Some("60")),
        ("NVML_SIM_START", None),
    ])
}

fn remapped(nvml: &Nvml, i: u32) -> (u32, u32, u32, u32) {
    let d = nvml.device_by_index(i).unwrap();
    let (mut corr, mut unc, mut pending, mut failure) = (0, 0, 0, 0);
    // SAFETY: valid handle and out-pointers.
    let rc = unsafe {
        nvml.lib().nvmlDeviceGetRemappedRows(
            d.handle(),
            &mut corr,
            &mut unc,
            &mut pending,
            &mut failure,
        )
    };
    assert_eq!(rc, b::nvmlReturn_enum_NVML_SUCCESS);
    (corr, unc, pending, failure)
}

#[test]
fn remapped_rows_per_gpu() {
    let nvml = session();
    assert_eq!(remapped(&nvml, 0), (0, 0, 0, 0));
    assert_eq!(remapped(&nvml, 1), (2, 0, 0, 0));
    assert_eq!(remapped(&nvml, 2), (1, 1, 1, 0));
    assert_eq!(remapped(&nvml, 3), (0, 0, 0, 0));
}

#[test]
fn ecc_mig_and_nvlink() {
    let nvml = session();
    let d2 = nvml.device_by_index(2).unwrap();
    assert_eq!(
        d2.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile)
            .unwrap(),
        1
    );
    assert_eq!(
        d2.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Aggregate)
            .unwrap(),
        2
    );
    let d0 = nvml.device_by_index(0).unwrap();
    assert_eq!(d0.name().unwrap(), "NVIDIA A100-SXM4-80GB");
    assert_eq!(d0.memory_info().unwrap().total, 81920 * 1024 * 1024);
    assert_eq!(d0.mig_mode().unwrap().current, 0);
    assert_eq!(d0.link_wrapper_for(0).version().unwrap(), 3);
    // Square load: 1.0 for the first 16 s of every 20 s; t = 60 is at the start of a period.
    assert_eq!(d0.utilization_rates().unwrap().gpu, 100);
}
