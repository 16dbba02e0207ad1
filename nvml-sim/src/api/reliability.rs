//! Reliability: ECC counts and mode, row remapping (Ampere+), page retirement (pre-Ampere),
//! NVLink state and error counters.

use crate::ffi::{
    DeviceCall, INVALID_ARGUMENT, NO_PERMISSION, NOT_SUPPORTED, check_version, device_fns, read,
    write, write_array,
};
use crate::scenario::Counter;
use nvml_wrapper_sys::bindings::{
    self as b, nvmlEccSramErrorStatus_v1_t, nvmlIntNvLinkDeviceType_t,
};
use std::os::raw::{c_uint, c_ulonglong};

/// `nvmlUnrepairableMemoryStatus_v1_t` of nvml.h (R590), which nvml-wrapper-sys 0.10 predates.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct UnrepairableMemoryStatusV1 {
    /// `NVML_STRUCT_VERSION(UnrepairableMemoryStatus, 1)`.
    pub version: c_uint,
    /// 1 when the GPU has memory it cannot repair.
    pub unrepairable_memory: c_uint,
}

/// NVLink generation by architecture (NVLink 2 on Volta, 3 on Ampere, 4 on Hopper).
fn nvlink_version(arch: u32) -> c_uint {
    match arch {
        b::NVML_DEVICE_ARCH_VOLTA => 2,
        b::NVML_DEVICE_ARCH_AMPERE => 3,
        _ => 4,
    }
}

fn link(c: &DeviceCall, link: c_uint) -> Result<u32, u32> {
    c.require(c.gpu.has_nvlink())?;
    if link >= c.gpu.nvlink.links {
        return Err(INVALID_ARGUMENT);
    }
    Ok(link)
}

fn retired<'a>(c: &DeviceCall<'a>, cause: c_uint) -> Result<&'a [u64], u32> {
    c.require(c.gpu.has_page_retirement())?;
    match cause {
        0 => Ok(&c.gpu.retired_pages.single_bit),
        1 => Ok(&c.gpu.retired_pages.double_bit),
        _ => Err(INVALID_ARGUMENT),
    }
}

/// Volatile (since driver load) count of an ECC error type, if ECC is on.
pub(crate) fn ecc_count(
    c: &DeviceCall,
    error_type: c_uint,
    counter_type: c_uint,
) -> Result<u64, u32> {
    let ecc = &c.gpu.ecc;
    c.require(ecc.enabled)?;
    if c.mig.is_some() {
        // A MIG device counts only the uncorrectable volatile errors of its own slices' SRAM
        // (`nvml.h`, nvmlDeviceGetMemoryErrorCounter); the scenario's counts are the board's
        // DRAM errors, so an instance has none.
        return match (error_type, counter_type) {
            (1, 0) => Ok(0),
            (0 | 1, 0 | 1) => Err(NOT_SUPPORTED),
            _ => Err(INVALID_ARGUMENT),
        };
    }
    let (volatile, lifetime): (&Counter, u64) = match error_type {
        0 => (&ecc.corrected, ecc.lifetime_corrected),
        1 => (&ecc.uncorrected, ecc.lifetime_uncorrected),
        _ => return Err(INVALID_ARGUMENT),
    };
    let recorded = if error_type == 0 {
        c.replayed_counter(|r| r.ecc_corrected.as_ref())?
    } else {
        c.replayed_counter(|r| r.ecc_uncorrected.as_ref())?
    };
    let volatile = recorded.unwrap_or_else(|| volatile.at(c.t));
    match counter_type {
        0 => Ok(volatile),
        1 => Ok(lifetime + volatile),
        _ => Err(INVALID_ARGUMENT),
    }
}

device_fns! {
    /// ECC error total (0 corrected / 1 uncorrected; 0 volatile / 1 aggregate).
    fn nvmlDeviceGetTotalEccErrors(error_type: c_uint, counter_type: c_uint, ecc_counts: *mut c_ulonglong) |c| {
        write(ecc_counts, ecc_count(c, error_type, counter_type)?)
    }
    /// ECC mode (current, pending).
    fn nvmlDeviceGetEccMode(current: *mut c_uint, pending: *mut c_uint) |c| {
        if current.is_null() || pending.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        write(current, c.gpu.ecc.enabled as c_uint)?;
        write(pending, c.gpu.ecc.enabled as c_uint)
    }
    /// Default ECC mode.
    fn nvmlDeviceGetDefaultEccMode(default_mode: *mut c_uint) |c| {
        write(default_mode, c.gpu.ecc.enabled as c_uint)
    }
    /// Remapped rows (Ampere and newer).
    fn nvmlDeviceGetRemappedRows(
        corr_rows: *mut c_uint,
        unc_rows: *mut c_uint,
        is_pending: *mut c_uint,
        failure_occurred: *mut c_uint,
    ) |c| {
        c.require(c.gpu.has_row_remapping())?;
        if corr_rows.is_null() || unc_rows.is_null() || is_pending.is_null() || failure_occurred.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        let r = &c.gpu.remapped_rows;
        write(corr_rows, r.correctable)?;
        write(unc_rows, r.uncorrectable)?;
        write(is_pending, r.pending as c_uint)?;
        write(failure_occurred, r.failure as c_uint)
    }
    /// Retired page addresses for a cause (pre-Ampere only).
    fn nvmlDeviceGetRetiredPages(cause: c_uint, page_count: *mut c_uint, addresses: *mut c_ulonglong) |c| {
        write_array(page_count, addresses, retired(c, cause)?)
    }
    /// Retired page addresses and retirement times (pre-Ampere only).
    fn nvmlDeviceGetRetiredPages_v2(
        cause: c_uint,
        page_count: *mut c_uint,
        addresses: *mut c_ulonglong,
        timestamps: *mut c_ulonglong,
    ) |c| {
        let pages = retired(c, cause)?;
        let capacity = read(page_count)?;
        write_array(page_count, addresses, pages)?;
        if !timestamps.is_null() {
            // Retired before the simulation started: time 0.
            write(page_count, capacity)?;
            write_array(page_count, timestamps, &vec![0u64; pages.len()])?;
        }
        Ok(())
    }
    /// Whether a page retirement waits for a reboot (pre-Ampere only).
    fn nvmlDeviceGetRetiredPagesPendingStatus(is_pending: *mut c_uint) |c| {
        c.require(c.gpu.has_page_retirement())?;
        write(is_pending, c_uint::from(c.gpu.retired_pages.pending))
    }
    /// SRAM ECC error status (Ampere and newer; nvml.h: root only, so NO_PERMISSION for an
    /// unprivileged caller): no error counts, and the field diagnostic's threshold flag from the
    /// scenario.
    fn nvmlDeviceGetSramEccErrorStatus(status: *mut nvmlEccSramErrorStatus_v1_t) |c| {
        c.require(c.gpu.has_row_remapping())?;
        if !c.sim.privileged {
            return Err(NO_PERMISSION);
        }
        let version = read(status.cast::<c_uint>().cast_const())?;
        check_version::<nvmlEccSramErrorStatus_v1_t>(version, 1)?;
        // SAFETY: plain old data; all-zero is a valid value.
        let mut answer: nvmlEccSramErrorStatus_v1_t = unsafe { std::mem::zeroed() };
        answer.version = version;
        answer.bThresholdExceeded = c_uint::from(c.gpu.sram_threshold_exceeded);
        write(status, answer)
    }
    /// The unrepairable-memory flag (nvml.h: R590 and newer, Hopper and newer).
    fn nvmlDeviceGetUnrepairableMemoryFlag_v1(status: *mut UnrepairableMemoryStatusV1) |c| {
        c.require(
            c.sim.scenario.driver.branch() >= 590
                && c.gpu.arch() >= b::NVML_DEVICE_ARCH_HOPPER
                && c.gpu.arch() != b::NVML_DEVICE_ARCH_UNKNOWN,
        )?;
        let version = read(status.cast::<c_uint>().cast_const())?;
        check_version::<UnrepairableMemoryStatusV1>(version, 1)?;
        write(status, UnrepairableMemoryStatusV1 {
            version,
            unrepairable_memory: c_uint::from(c.gpu.unrepairable_memory),
        })
    }
    /// NVLink link state (1 = up).
    fn nvmlDeviceGetNvLinkState(link_index: c_uint, is_active: *mut c_uint) |c| {
        let l = link(c, link_index)?;
        write(is_active, !c.gpu.link_down(l, c.t) as c_uint)
    }
    /// NVLink version of a link.
    fn nvmlDeviceGetNvLinkVersion(link_index: c_uint, version: *mut c_uint) |c| {
        link(c, link_index)?;
        write(version, nvlink_version(c.gpu.arch()))
    }
    /// What the far end of a link is (a GPU or an NVSwitch, see `GpuSpec::nvlink_remote_type`).
    fn nvmlDeviceGetNvLinkRemoteDeviceType(link_index: c_uint, device_type: *mut nvmlIntNvLinkDeviceType_t) |c| {
        link(c, link_index)?;
        write(device_type, c.gpu.nvlink_remote_type())
    }
    /// NVLink error counter (0 replay, 1 recovery, 2 CRC flit, 3 CRC data, 4 ECC data).
    fn nvmlDeviceGetNvLinkErrorCounter(link_index: c_uint, counter: c_uint, counter_value: *mut c_ulonglong) |c| {
        let l = link(c, link_index)? as usize;
        let recorded = match counter {
            0 => c.replayed_counter(|r| r.nvlink_replay.as_ref().map(|s| &s[l]))?,
            1 => c.replayed_counter(|r| r.nvlink_recovery.as_ref().map(|s| &s[l]))?,
            2 => c.replayed_counter(|r| r.nvlink_crc_flit.as_ref().map(|s| &s[l]))?,
            3 => c.replayed_counter(|r| r.nvlink_crc_data.as_ref().map(|s| &s[l]))?,
            _ => None,
        };
        if let Some(value) = recorded {
            return write(counter_value, value);
        }
        let e = &c.gpu.nvlink.errors;
        let value = match counter {
            0 => e.replay.at(c.t),
            1 => e.recovery.at(c.t),
            2 => e.crc_flit.at(c.t),
            3 => e.crc_data.at(c.t),
            4 => 0,
            _ => return Err(INVALID_ARGUMENT),
        };
        write(counter_value, value)
    }
}
