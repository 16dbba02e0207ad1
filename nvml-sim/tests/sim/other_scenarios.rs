//! The V100 scenario at a pinned t: page retirement (with its INSUFFICIENT_SIZE protocol) instead
//! of row remapping, an older reported driver, and the process-utilization split.

use crate::common::{self, Session};
use nvml_wrapper::enum_wrappers::device::RetirementCause;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper_sys::bindings as b;

fn session() -> Session {
    common::session(&[
        ("NVML_SIM_SCENARIO", Some(&common::scenario("v100x2.toml"))),
        ("NVML_SIM_TIME", Some("60")),
        ("NVML_SIM_START", None),
    ])
}

#[test]
fn retired_pages_before_ampere() {
    let nvml = session();
    let d = nvml.device_by_index(1).unwrap();
    let single = d
        .retired_pages(RetirementCause::MultipleSingleBitEccErrors)
        .unwrap();
    let addresses: Vec<u64> = single.iter().map(|p| p.address).collect();
    assert_eq!(addresses, [0x1a2b3000, 0x1a2b4000]);
    assert_eq!(
        d.retired_pages(RetirementCause::DoubleBitEccError)
            .unwrap()
            .len(),
        1
    );
    // The scenario's GPU 1 has a page waiting for the next reset; GPU 0 none.
    assert!(d.are_pages_pending_retired().unwrap());
    assert!(
        !nvml
            .device_by_index(0)
            .unwrap()
            .are_pages_pending_retired()
            .unwrap()
    );

    let lib = nvml.lib();
    // SAFETY: valid handle; pointers to live locals.
    unsafe {
        let mut count = 1;
        let mut one = [0u64; 1];
        let rc = lib.nvmlDeviceGetRetiredPages(d.handle(), 0, &mut count, one.as_mut_ptr());
        assert_eq!(rc, b::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE);
        assert_eq!(count, 2);
        let (mut a, mut b_, mut c, mut e) = (0, 0, 0, 0);
        let rc = lib.nvmlDeviceGetRemappedRows(d.handle(), &mut a, &mut b_, &mut c, &mut e);
        assert_eq!(rc, b::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED);
    }
}

#[test]
fn scenario_driver_version_and_nvlink_generation() {
    let nvml = session();
    assert_eq!(nvml.sys_driver_version().unwrap(), "535.261.03");
    assert_eq!(nvml.sys_cuda_driver_version().unwrap(), 12020);
    let d = nvml.device_by_index(0).unwrap();
    assert_eq!(d.name().unwrap(), "Tesla V100-SXM2-32GB");
    assert_eq!(d.link_wrapper_for(5).version().unwrap(), 2);
    assert!(matches!(
        d.link_wrapper_for(6).version(),
        Err(NvmlError::InvalidArg)
    ));
}

#[test]
fn process_utilization_follows_the_device() {
    let nvml = session();
    let d = nvml.device_by_index(0).unwrap();
    let samples = d.process_utilization_stats(0).unwrap();
    assert_eq!(samples.len(), 1);
    assert_eq!(samples[0].pid, 856101);
    assert_eq!(samples[0].sm_util, 80);
    // No process on GPU1: nothing to report.
    let idle = nvml.device_by_index(1).unwrap();
    assert!(matches!(
        idle.process_utilization_stats(0),
        Err(NvmlError::NotFound)
    ));
}
