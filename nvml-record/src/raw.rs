//! The NVML calls nvml-wrapper 0.13 does not wrap, or wraps without a parameter the recorder
//! needs (a field's scope, the full clock-event bitmask, row remapping), made through
//! `nvml.lib()` the way the wrapper makes its own: look the symbol up, call, check the return.

#![allow(
    unsafe_code,
    reason = "the NVML C calls nvml-wrapper does not make for us"
)]

use std::mem;

use nvml_wrapper::Device;
use nvml_wrapper::error::{NvmlError, nvml_sym, nvml_try};
use nvml_wrapper_sys::bindings::{self as sys, nvmlFieldValue_t};

/// `nvmlDeviceGetFieldValues` for (field id, scope id) pairs; each answer has its own result.
/// Only integer values are kept (every field the recorder asks for is one).
pub fn field_values(
    device: &Device,
    requests: &[(u32, u32)],
) -> Result<Vec<Result<u64, NvmlError>>, NvmlError> {
    let sym = nvml_sym(device.nvml().lib().nvmlDeviceGetFieldValues.as_ref())?;
    let mut values: Vec<nvmlFieldValue_t> = requests
        .iter()
        .map(|&(field, scope)| {
            // SAFETY: nvmlFieldValue_t is plain old data; all-zero is a valid value.
            let mut v: nvmlFieldValue_t = unsafe { mem::zeroed() };
            v.fieldId = field;
            v.scopeId = scope;
            v
        })
        .collect();
    let count = i32::try_from(values.len()).map_err(|_| NvmlError::InvalidArg)?;
    // SAFETY: the handle comes from a live `Device`; the buffer holds `count` entries.
    unsafe { nvml_try(sym(device.handle(), count, values.as_mut_ptr()))? };
    Ok(values
        .iter()
        .map(|v| {
            nvml_try(v.nvmlReturn)?;
            // SAFETY: the union member read is the one `valueType` names.
            unsafe {
                match v.valueType {
                    sys::nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_INT => {
                        Ok(u64::from(v.value.uiVal))
                    }
                    sys::nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_LONG => Ok(v.value.ulVal),
                    sys::nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_LONG_LONG => {
                        Ok(v.value.ullVal)
                    }
                    sys::nvmlValueType_enum_NVML_VALUE_TYPE_SIGNED_INT => {
                        u64::try_from(v.value.siVal).map_err(|_| NvmlError::Unknown)
                    }
                    sys::nvmlValueType_enum_NVML_VALUE_TYPE_SIGNED_LONG_LONG => {
                        u64::try_from(v.value.sllVal).map_err(|_| NvmlError::Unknown)
                    }
                    sys::nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_SHORT => {
                        Ok(u64::from(v.value.usVal))
                    }
                    _ => Err(NvmlError::UnexpectedVariant(v.valueType)),
                }
            }
        })
        .collect())
}

/// The active clock-event reasons as the raw bitmask (`nvmlDeviceGetCurrentClocksEventReasons`,
/// or its pre-12.2 name where the library lacks it): nvml-wrapper's flags would drop bits it
/// does not know.
pub fn clocks_event_reasons(device: &Device) -> Result<u64, NvmlError> {
    let lib = device.nvml().lib();
    let sym = nvml_sym(lib.nvmlDeviceGetCurrentClocksEventReasons.as_ref())
        .or_else(|_| nvml_sym(lib.nvmlDeviceGetCurrentClocksThrottleReasons.as_ref()))?;
    let mut mask: u64 = 0;
    // SAFETY: valid handle and out-pointer.
    unsafe { nvml_try(sym(device.handle(), &mut mask))? };
    Ok(mask)
}

/// `nvmlDeviceGetRemappedRows`: (correctable, uncorrectable, pending, failure occurred).
pub fn remapped_rows(device: &Device) -> Result<(u32, u32, bool, bool), NvmlError> {
    let sym = nvml_sym(device.nvml().lib().nvmlDeviceGetRemappedRows.as_ref())?;
    let (mut corr, mut unc, mut pending, mut failed) = (0u32, 0u32, 0u32, 0u32);
    // SAFETY: valid handle and four out-pointers.
    unsafe {
        nvml_try(sym(
            device.handle(),
            &mut corr,
            &mut unc,
            &mut pending,
            &mut failed,
        ))?
    };
    Ok((corr, unc, pending != 0, failed != 0))
}

/// (GPU instance id, compute instance id) of a MIG device handle.
pub fn mig_ids(mig: &Device) -> Result<(u32, u32), NvmlError> {
    let lib = mig.nvml().lib();
    let gi_sym = nvml_sym(lib.nvmlDeviceGetGpuInstanceId.as_ref())?;
    let ci_sym = nvml_sym(lib.nvmlDeviceGetComputeInstanceId.as_ref())?;
    let (mut gi, mut ci) = (0, 0);
    // SAFETY: valid MIG device handle and out-pointers.
    unsafe {
        nvml_try(gi_sym(mig.handle(), &mut gi))?;
        nvml_try(ci_sym(mig.handle(), &mut ci))?;
    }
    Ok((gi, ci))
}

/// (profile id, placement start) of GPU instance `gi` of `device`.
pub fn gpu_instance_placement(device: &Device, gi: u32) -> Result<(u32, u32), NvmlError> {
    let lib = device.nvml().lib();
    let by_id = nvml_sym(lib.nvmlDeviceGetGpuInstanceById.as_ref())?;
    let get_info = nvml_sym(lib.nvmlGpuInstanceGetInfo.as_ref())?;
    let mut instance: sys::nvmlGpuInstance_t = std::ptr::null_mut();
    // SAFETY: valid device handle and out-pointer.
    unsafe { nvml_try(by_id(device.handle(), gi, &mut instance))? };
    // SAFETY: plain old data; all-zero is a valid value.
    let mut info: sys::nvmlGpuInstanceInfo_t = unsafe { mem::zeroed() };
    // SAFETY: the instance handle was just returned by NVML; the out-pointer is valid.
    unsafe { nvml_try(get_info(instance, &mut info))? };
    Ok((info.profileId, info.placement.start))
}

/// The GPU-instance profiles of `device` (MIG mode on): profile id → name without the "MIG "
/// prefix ("1g.10gb"), from `nvmlDeviceGetGpuInstanceProfileInfoV`.
pub fn gpu_instance_profiles(device: &Device) -> Vec<(u32, String)> {
    let Ok(sym) = nvml_sym(
        device
            .nvml()
            .lib()
            .nvmlDeviceGetGpuInstanceProfileInfoV
            .as_ref(),
    ) else {
        return Vec::new();
    };
    (0..sys::NVML_GPU_INSTANCE_PROFILE_COUNT)
        .filter_map(|profile| {
            // SAFETY: plain old data; all-zero is a valid value.
            let mut info: sys::nvmlGpuInstanceProfileInfo_v2_t = unsafe { mem::zeroed() };
            // NVML_STRUCT_VERSION(GpuInstanceProfileInfo, 2): the size, version in the top byte.
            info.version =
                (mem::size_of::<sys::nvmlGpuInstanceProfileInfo_v2_t>() | (2 << 24)) as u32;
            // SAFETY: valid handle; out-pointer to a struct of the size its version word says.
            unsafe { nvml_try(sym(device.handle(), profile, &mut info)).ok()? };
            let name: Vec<u8> = info
                .name
                .iter()
                .take_while(|&&c| c != 0)
                .map(|&c| c as u8)
                .collect();
            let name = String::from_utf8_lossy(&name).into_owned();
            Some((info.id, name.trim_start_matches("MIG ").to_owned()))
        })
        .collect()
}
