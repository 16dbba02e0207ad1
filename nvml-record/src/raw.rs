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
