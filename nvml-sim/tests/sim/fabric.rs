//! The NVLink fabric calls on fabric.toml (R580) at a pinned t, and what the older driver
//! branches of other scenarios answer: the versioned call and its struct versions as each branch
//! has them, NOT_SUPPORTED on a GPU on no fabric.

use crate::common::{self, Session};
use nvml_wrapper::Nvml;
use nvml_wrapper_sys::bindings::{
    self as b, nvmlGpuFabricInfo_t, nvmlGpuFabricInfo_v2_t, nvmlGpuFabricInfo_v3_t,
};
use std::mem::size_of;

fn session(scenario: &str) -> Session {
    common::session(&[
        ("NVML_SIM_SCENARIO", Some(&common::scenario(scenario))),
        ("NVML_SIM_TIME", Some("60")),
        ("NVML_SIM_START", None),
    ])
}

fn plain(nvml: &Nvml, i: u32) -> (u32, nvmlGpuFabricInfo_t) {
    let d = nvml.device_by_index(i).unwrap();
    // SAFETY: plain old data; all-zero is valid.
    let mut info: nvmlGpuFabricInfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: valid handle and out-pointer.
    let rc = unsafe { nvml.lib().nvmlDeviceGetGpuFabricInfo(d.handle(), &mut info) };
    (rc, info)
}

/// The versioned call with the v3 struct and `version` as its version word.
fn versioned(nvml: &Nvml, i: u32, version: u32) -> (u32, nvmlGpuFabricInfo_v3_t) {
    let d = nvml.device_by_index(i).unwrap();
    // SAFETY: plain old data; all-zero is valid.
    let mut info: nvmlGpuFabricInfo_v3_t = unsafe { std::mem::zeroed() };
    info.version = version;
    // SAFETY: valid handle; the v3 struct is at least as large as any version asked for here.
    let rc = unsafe {
        nvml.lib()
            .nvmlDeviceGetGpuFabricInfoV(d.handle(), &mut info)
    };
    (rc, info)
}

const V2: u32 = size_of::<nvmlGpuFabricInfo_v2_t>() as u32 | (2 << 24);
const V3: u32 = size_of::<nvmlGpuFabricInfo_v3_t>() as u32 | (3 << 24);

#[test]
fn fabric_toml_answers_every_call_and_version() {
    let nvml = session("fabric.toml");
    let (rc, g0) = plain(&nvml, 0);
    assert_eq!(rc, b::nvmlReturn_enum_NVML_SUCCESS);
    assert_eq!(
        (u32::from(g0.state), g0.status, g0.cliqueId),
        (b::NVML_GPU_FABRIC_STATE_COMPLETED, 0, 1)
    );
    assert_eq!((g0.clusterUuid[0], g0.clusterUuid[15]), (0x8b, 0x16));
    assert_eq!(
        u32::from(plain(&nvml, 2).1.state),
        b::NVML_GPU_FABRIC_STATE_IN_PROGRESS
    );

    let (rc, g5) = versioned(&nvml, 5, V3);
    assert_eq!(rc, b::nvmlReturn_enum_NVML_SUCCESS);
    assert_eq!((g5.healthMask, g5.healthSummary), (0x1a9, 3));
    let (rc, g0) = versioned(&nvml, 0, V2);
    assert_eq!(rc, b::nvmlReturn_enum_NVML_SUCCESS);
    assert_eq!(g0.healthMask, 0x1aa);
    assert_eq!(
        versioned(&nvml, 0, V3 + 1).0,
        b::nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH
    );
}

#[test]
fn older_branches_and_gpus_on_no_fabric() {
    // h100x8.toml: R550, no fabric. The v3 struct is newer than the branch; v2 reaches the GPU,
    // which is on no fabric.
    let nvml = session("h100x8.toml");
    assert_eq!(
        versioned(&nvml, 0, V3).0,
        b::nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH
    );
    assert_eq!(
        versioned(&nvml, 0, V2).0,
        b::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED
    );
    assert_eq!(
        plain(&nvml, 0).0,
        b::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED
    );
    drop(nvml);
    // v100x2.toml: R535, whose library has no versioned call.
    let nvml = session("v100x2.toml");
    assert_eq!(
        versioned(&nvml, 0, V2).0,
        b::nvmlReturn_enum_NVML_ERROR_FUNCTION_NOT_FOUND
    );
}
