//! The NVLink fabric (`nvml.h`, "Fabric definitions"): a GPU's registration with Fabric Manager
//! and the fabric's health, from the GPU's `fabric` table; a GPU without one is on no fabric
//! (NOT_SUPPORTED).
//!
//! `nvmlDeviceGetGpuFabricInfo` (R525 and later) answers whatever driver the scenario reports.
//! `nvmlDeviceGetGpuFabricInfoV` answers as the reported driver branch would: before R550 its
//! library lacks the symbol, so it answers FUNCTION_NOT_FOUND; from R550 it takes the v2 struct
//! (CUDA 12.4's `nvml.h`: the health mask), from R580 also the v3 struct (CUDA 13.0's: the health
//! summary); another version word is ARGUMENT_VERSION_MISMATCH.

use crate::fabric::FabricSpec;
use crate::ffi::{
    DeviceCall, INVALID_ARGUMENT, NOT_SUPPORTED, VERSION_MISMATCH, check_version, device_fns, read,
};
use nvml_wrapper_sys::bindings::{
    self as b, nvmlGpuFabricInfo_t, nvmlGpuFabricInfo_v2_t, nvmlGpuFabricInfo_v3_t,
    nvmlGpuFabricInfoV_t,
};

/// The library has no such function (a real one of that branch does not export it).
const FUNCTION_NOT_FOUND: u32 = b::nvmlReturn_enum_NVML_ERROR_FUNCTION_NOT_FOUND;

/// The reported driver's branch: 550 of "550.127.05".
fn branch(c: &DeviceCall) -> u32 {
    let version = &c.sim.scenario.driver.version;
    version
        .split('.')
        .next()
        .and_then(|b| b.parse().ok())
        .unwrap_or(0)
}

/// The GPU's fabric, or NOT_SUPPORTED, with its cluster UUID's bytes (checked at load).
fn fabric<'a>(c: &DeviceCall<'a>) -> Result<(&'a FabricSpec, [u8; 16]), u32> {
    let spec = c.gpu.fabric.as_ref().ok_or(NOT_SUPPORTED)?;
    Ok((spec, spec.cluster_uuid_bytes().unwrap_or_default()))
}

/// Writes the named fields of the struct `$info` points to, one by one: the bytes between them
/// (the padding after `state`, an `unsigned char`) stay as the caller left them, as a C driver's
/// field assignments leave them. A client that reads `state` as a wider integer (NVIDIA's pynvml
/// declares it `c_uint`) then reads its own zeroes there.
macro_rules! write_fields {
    ($info:expr, $($field:ident: $value:expr),+ $(,)?) => {{
        let info = $info;
        if info.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        // SAFETY: non-null, and valid for writes of the whole struct per the NVML contract of the
        // exported function (for a versioned struct, of the size its version word says).
        unsafe { $((&raw mut (*info).$field).write_unaligned($value);)+ }
        Ok(())
    }};
}

device_fns! {
    /// State, status, clique and cluster of the GPU's registration (R525 and later).
    fn nvmlDeviceGetGpuFabricInfo(info: *mut nvmlGpuFabricInfo_t) |c| {
        let (f, uuid) = fabric(c)?;
        write_fields!(
            info,
            clusterUuid: uuid,
            status: f.status,
            cliqueId: f.clique_id,
            state: f.state.code(),
        )
    }
    /// The versioned call: v2 adds the health mask (R550), v3 the health summary (R580).
    fn nvmlDeviceGetGpuFabricInfoV(info: *mut nvmlGpuFabricInfoV_t) |c| {
        let branch = branch(c);
        if branch < 550 {
            return Err(FUNCTION_NOT_FOUND);
        }
        let version = read(info.cast::<u32>())?;
        let v3 = branch >= 580 && check_version::<nvmlGpuFabricInfo_v3_t>(version, 3).is_ok();
        if !v3 && check_version::<nvmlGpuFabricInfo_v2_t>(version, 2).is_err() {
            return Err(VERSION_MISMATCH);
        }
        let (f, uuid) = fabric(c)?;
        if v3 {
            return write_fields!(
                info.cast::<nvmlGpuFabricInfo_v3_t>(),
                clusterUuid: uuid,
                status: f.status,
                cliqueId: f.clique_id,
                state: f.state.code(),
                healthMask: f.health_mask,
                healthSummary: f.health_summary.map_or(0, |s| s.code()),
            );
        }
        write_fields!(
            info.cast::<nvmlGpuFabricInfo_v2_t>(),
            clusterUuid: uuid,
            status: f.status,
            cliqueId: f.clique_id,
            state: f.state.code(),
            healthMask: f.health_mask,
        )
    }
}
