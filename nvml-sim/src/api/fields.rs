//! `nvmlDeviceGetFieldValues`: each requested field gets its own return code, so an unknown or
//! unsupported field never fails the whole call.
//!
//! Field ids are those of drivers before 580.82 (the sim reports 550.x by default); the recovery
//! action (230) is numbered alike in every branch that has it (R565 and newer).

use crate::api::metrics::{energy_mj, pcie_replays};
use crate::api::reliability::ecc_count;
use crate::ffi::{DeviceCall, INVALID_ARGUMENT, NOT_SUPPORTED, SUCCESS, device_fns};
use nvml_wrapper_sys::bindings::{self as b, field_id as f, nvmlFieldValue_t, nvmlValue_t};
use std::os::raw::c_int;

enum Value {
    Uint(u32),
    Ull(u64),
}

fn nvlink_kib(c: &DeviceCall, scope: u32, tx: bool) -> Result<Value, u32> {
    c.require(c.gpu.has_nvlink())?;
    if scope >= c.gpu.nvlink.links {
        return Err(INVALID_ARGUMENT);
    }
    let link = scope as usize;
    let recorded = if tx {
        c.replayed_counter(|r| r.nvlink_tx_kib.as_ref().map(|l| &l[link]))?
    } else {
        c.replayed_counter(|r| r.nvlink_rx_kib.as_ref().map(|l| &l[link]))?
    };
    if let Some(kib) = recorded {
        return Ok(Value::Ull(kib));
    }
    if c.gpu.link_down(scope, c.t) {
        return Ok(Value::Ull(0));
    }
    let totals = c.totals();
    let bytes = if tx {
        totals.nvlink_tx_bytes
    } else {
        totals.nvlink_rx_bytes
    };
    Ok(Value::Ull(
        (bytes / c.gpu.active_links(c.t) as f64 / 1024.0) as u64,
    ))
}

fn field(c: &DeviceCall, id: u32, scope: u32) -> Result<Value, u32> {
    let ecc = |e, k| ecc_count(c, e, k).map(Value::Ull);
    match id {
        f::NVML_FI_DEV_ECC_CURRENT | f::NVML_FI_DEV_ECC_PENDING => {
            Ok(Value::Uint(c.gpu.ecc.enabled as u32))
        }
        f::NVML_FI_DEV_ECC_SBE_VOL_TOTAL => ecc(0, 0),
        f::NVML_FI_DEV_ECC_DBE_VOL_TOTAL => ecc(1, 0),
        f::NVML_FI_DEV_ECC_SBE_AGG_TOTAL => ecc(0, 1),
        f::NVML_FI_DEV_ECC_DBE_AGG_TOTAL => ecc(1, 1),
        f::NVML_FI_DEV_MEMORY_TEMP => match c.replayed(|r| r.memory_temperature_c.as_ref())? {
            Some(recorded) => Ok(Value::Uint(recorded as u32)),
            None => c
                .sample()
                .memory_temperature_c(c.gpu)
                .map(|t| Value::Uint(t.round() as u32))
                .ok_or(NOT_SUPPORTED),
        },
        f::NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION => Ok(Value::Ull(energy_mj(c)?)),
        f::NVML_FI_DEV_PCIE_REPLAY_COUNTER => Ok(Value::Ull(pcie_replays(c)?)),
        f::NVML_FI_DEV_NVLINK_LINK_COUNT => {
            c.require(c.gpu.has_nvlink())?;
            Ok(Value::Uint(c.gpu.nvlink.links))
        }
        f::NVML_FI_DEV_GET_GPU_RECOVERY_ACTION => {
            c.require(c.sim.scenario.driver.branch() >= 565)?;
            Ok(Value::Uint(
                c.gpu.recovery_action.map_or(0, |r| r.at(c.t)) as u32
            ))
        }
        f::NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX => nvlink_kib(c, scope, true),
        f::NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX => nvlink_kib(c, scope, false),
        _ => Err(NOT_SUPPORTED),
    }
}

device_fns! {
    /// Reads `values_count` field values; each entry carries its own `nvmlReturn`.
    fn nvmlDeviceGetFieldValues(values_count: c_int, values: *mut nvmlFieldValue_t) |c| {
        if values.is_null() || values_count < 0 {
            return Err(INVALID_ARGUMENT);
        }
        for i in 0..values_count as usize {
            // SAFETY: the caller passes an array of `values_count` entries (nvml.h contract).
            let entry = unsafe { &mut *values.add(i) };
            entry.timestamp = (c.t * 1e6) as i64;
            entry.latencyUsec = 0;
            match field(c, entry.fieldId, entry.scopeId) {
                Ok(Value::Uint(v)) => {
                    entry.valueType = b::nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_INT;
                    entry.value = nvmlValue_t { uiVal: v };
                    entry.nvmlReturn = SUCCESS;
                }
                Ok(Value::Ull(v)) => {
                    entry.valueType = b::nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
                    entry.value = nvmlValue_t { ullVal: v };
                    entry.nvmlReturn = SUCCESS;
                }
                Err(code) => entry.nvmlReturn = code,
            }
        }
        Ok(())
    }
}
