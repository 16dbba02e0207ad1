//! Time-varying device readings: utilization, memory, power, energy, temperature, fans, clocks,
//! clock-event reasons, violation time and PCIe.

use crate::ffi::{INVALID_ARGUMENT, NOT_SUPPORTED, check_version, device_fns, read, write};
use crate::mig::MEMORY_SLICES;
use crate::physics::{self, SUPPORTED_REASONS};
use crate::scenario::MIB;
use nvml_wrapper_sys::bindings::{
    nvmlBAR1Memory_t, nvmlMemory_t, nvmlMemory_v2_t, nvmlUtilization_t, nvmlViolationTime_t,
};
use std::os::raw::{c_uint, c_ulonglong};

/// NVML's encoder/decoder sampling period, µs (what the real driver reports for its window).
const CODEC_SAMPLING_US: c_uint = 167_000;

fn percent(x: f64) -> c_uint {
    (x * 100.0).round() as c_uint
}

fn mhz(x: f64) -> c_uint {
    x.round() as c_uint
}

fn milli(x: f64) -> c_uint {
    (x * 1000.0).round() as c_uint
}

/// A recorded reading as the call's integer, or `simulated` without a recording.
fn or_sim(recorded: Option<f64>, simulated: impl FnOnce() -> c_uint) -> c_uint {
    recorded.map_or_else(simulated, |v| v as c_uint)
}

fn clock_of(c: &crate::ffi::DeviceCall, clock_type: c_uint) -> Result<f64, u32> {
    let recorded = match clock_type {
        0 => c.replayed(|r| r.graphics_mhz.as_ref())?,
        1 => c.replayed(|r| r.sm_mhz.as_ref())?,
        2 => c.replayed(|r| r.memory_mhz.as_ref())?,
        3 => c.replayed(|r| r.video_mhz.as_ref())?,
        _ => return Err(INVALID_ARGUMENT),
    };
    if let Some(mhz) = recorded {
        return Ok(mhz);
    }
    let s = c.sample();
    Ok(match clock_type {
        0 | 1 => s.sm_mhz,
        2 => s.memory_mhz,
        3 => s.video_mhz,
        _ => return Err(INVALID_ARGUMENT),
    })
}

fn max_clock_of(c: &crate::ffi::DeviceCall, clock_type: c_uint) -> Result<f64, u32> {
    let k = &c.gpu.clocks;
    Ok(match clock_type {
        0 | 1 => k.sm.max,
        2 => k.memory.max,
        3 => k.video.max,
        _ => return Err(INVALID_ARGUMENT),
    })
}

/// Framebuffer in use on the GPU, bytes, reserved memory excluded (a recording's value at most
/// the usable memory, so that free memory never goes negative).
fn memory_used(c: &crate::ffi::DeviceCall) -> Result<u64, u32> {
    let recorded = c.replayed(|r| r.memory_used_bytes.as_ref())?;
    Ok(recorded.map_or_else(
        || c.sample().memory_used,
        |v| (v as u64).min(c.gpu.usable_bytes()),
    ))
}

/// (total, used) bytes of the GPU instance behind a MIG device handle.
fn instance_memory(c: &crate::ffi::DeviceCall) -> Option<(u64, u64)> {
    let d = c.mig?;
    Some((
        d.gi.profile().memory_mib * MIB,
        physics::instance_memory_used(c.gpu, d.gi, c.t),
    ))
}

/// Energy since the driver loaded, mJ.
pub(crate) fn energy_mj(c: &crate::ffi::DeviceCall) -> Result<u64, u32> {
    let recorded = c.replayed_counter(|r| r.energy_mj.as_ref())?;
    Ok(recorded.unwrap_or_else(|| (c.totals().energy_j * 1000.0) as u64))
}

/// The PCIe replay counter.
pub(crate) fn pcie_replays(c: &crate::ffi::DeviceCall) -> Result<u64, u32> {
    let recorded = c.replayed_counter(|r| r.pcie_replays.as_ref())?;
    Ok(recorded.unwrap_or_else(|| c.gpu.pcie.replays.at(c.t)))
}

fn fan_percent(c: &crate::ffi::DeviceCall, fan: c_uint) -> Result<c_uint, u32> {
    let recorded = c.replayed(|r| r.fan_percent.as_ref().map(|f| &f[fan as usize]))?;
    Ok(or_sim(recorded, || {
        c.sample().fan_percent.round() as c_uint
    }))
}

fn pstate_of(c: &crate::ffi::DeviceCall) -> Result<c_uint, u32> {
    let recorded = c.replayed(|r| r.pstate.as_ref())?;
    Ok(or_sim(recorded, || c.sample().pstate))
}

fn reasons_of(c: &crate::ffi::DeviceCall) -> Result<c_ulonglong, u32> {
    let recorded = c.replayed(|r| r.clocks_event_reasons.as_ref())?;
    Ok(recorded.map_or_else(|| c.sample().reasons, |v| v as c_ulonglong))
}

device_fns! {
    /// GPU and memory utilization, percent. NOT_SUPPORTED in MIG mode, on the GPU and on its MIG
    /// devices (`nvml.h`: "On MIG-enabled GPUs, querying device utilization rates is not
    /// currently supported").
    fn nvmlDeviceGetUtilizationRates(utilization: *mut nvmlUtilization_t) |c| {
        c.require_no_mig()?;
        let gpu = c.replayed(|r| r.utilization.as_ref())?;
        let memory = c.replayed(|r| r.memory_utilization.as_ref())?;
        let s = c.sample();
        write(utilization, nvmlUtilization_t {
            gpu: or_sim(gpu, || percent(s.utilization)),
            memory: or_sim(memory, || percent(s.memory_utilization)),
        })
    }
    /// Encoder utilization, percent (NOT_SUPPORTED when the scenario says `encoder = false`, and
    /// in MIG mode).
    fn nvmlDeviceGetEncoderUtilization(utilization: *mut c_uint, sampling_period_us: *mut c_uint) |c| {
        c.require_no_mig()?;
        c.require(c.gpu.encoder)?;
        let recorded = c.replayed(|r| r.encoder.as_ref())?;
        write(utilization, or_sim(recorded, || percent(c.sample().encoder)))?;
        write(sampling_period_us, CODEC_SAMPLING_US)
    }
    /// Decoder utilization, percent (NOT_SUPPORTED in MIG mode).
    fn nvmlDeviceGetDecoderUtilization(utilization: *mut c_uint, sampling_period_us: *mut c_uint) |c| {
        c.require_no_mig()?;
        c.require(c.gpu.decoder)?;
        let recorded = c.replayed(|r| r.decoder.as_ref())?;
        write(utilization, or_sim(recorded, || percent(c.sample().decoder)))?;
        write(sampling_period_us, CODEC_SAMPLING_US)
    }
    /// Framebuffer memory; v1 counts the reserved memory as used. A MIG device answers its GPU
    /// instance's memory; a GPU in MIG mode the sum over its instances.
    fn nvmlDeviceGetMemoryInfo(memory: *mut nvmlMemory_t) |c| {
        if let Some((total, used)) = instance_memory(c) {
            return write(memory, nvmlMemory_t { total, free: total - used, used });
        }
        let total = c.gpu.memory_total_mib * MIB;
        let used = memory_used(c)? + c.gpu.memory_reserved_mib * MIB;
        write(memory, nvmlMemory_t { total, free: total - used, used })
    }
    /// Framebuffer memory with the reserved part separate (versioned struct, version 2).
    fn nvmlDeviceGetMemoryInfo_v2(memory: *mut nvmlMemory_v2_t) |c| {
        let version = read(memory)?.version;
        check_version::<nvmlMemory_v2_t>(version, 2)?;
        if let Some((total, used)) = instance_memory(c) {
            // An instance's size is what it can use: nothing of it is reserved.
            return write(memory, nvmlMemory_v2_t { version, total, reserved: 0, free: total - used, used });
        }
        let total = c.gpu.memory_total_mib * MIB;
        let reserved = c.gpu.memory_reserved_mib * MIB;
        let used = memory_used(c)?;
        write(memory, nvmlMemory_v2_t { version, total, reserved, free: total - reserved - used, used })
    }
    /// BAR1 aperture. A MIG device answers its GPU instance's share: the part of the GPU's
    /// aperture in proportion to its memory slices (`nvml.h`: "Per-instance information can be
    /// queried by using specific MIG device handles").
    fn nvmlDeviceGetBAR1MemoryInfo(bar1: *mut nvmlBAR1Memory_t) |c| {
        let share = |mib: u64| match c.mig {
            Some(d) => mib * MIB * u64::from(d.gi.profile().memory_slices) / u64::from(MEMORY_SLICES),
            None => mib * MIB,
        };
        let total = share(c.gpu.bar1_total_mib);
        let used = share(c.gpu.bar1_used_mib);
        write(bar1, nvmlBAR1Memory_t { bar1Total: total, bar1Free: total - used, bar1Used: used })
    }
    /// Power draw, mW.
    fn nvmlDeviceGetPowerUsage(power: *mut c_uint) |c| {
        let recorded = c.replayed(|r| r.power_mw.as_ref())?;
        write(power, or_sim(recorded, || milli(c.sample().power_w)))
    }
    /// Enforced power limit (after every limiter), mW.
    fn nvmlDeviceGetEnforcedPowerLimit(limit: *mut c_uint) |c| { write(limit, milli(c.gpu.power.enforced_w())) }
    /// Power management limit, mW.
    fn nvmlDeviceGetPowerManagementLimit(limit: *mut c_uint) |c| { write(limit, milli(c.gpu.power.limit_w)) }
    /// Default power management limit, mW.
    fn nvmlDeviceGetPowerManagementDefaultLimit(limit: *mut c_uint) |c| {
        write(limit, milli(c.gpu.power.default_limit_w))
    }
    /// Settable power limit range, mW.
    fn nvmlDeviceGetPowerManagementLimitConstraints(min_limit: *mut c_uint, max_limit: *mut c_uint) |c| {
        if min_limit.is_null() || max_limit.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        write(min_limit, milli(c.gpu.power.min_limit_w))?;
        write(max_limit, milli(c.gpu.power.max_limit_w))
    }
    /// Power management mode (enabled).
    fn nvmlDeviceGetPowerManagementMode(mode: *mut c_uint) |_c| { write(mode, 1) }
    /// Energy since the driver loaded, mJ.
    fn nvmlDeviceGetTotalEnergyConsumption(energy: *mut c_ulonglong) |c| {
        write(energy, energy_mj(c)?)
    }
    /// Temperature of a sensor (only the GPU sensor exists), °C.
    fn nvmlDeviceGetTemperature(sensor: c_uint, temp: *mut c_uint) |c| {
        if sensor != 0 {
            return Err(INVALID_ARGUMENT);
        }
        let recorded = c.replayed(|r| r.temperature_c.as_ref())?;
        write(temp, or_sim(recorded, || c.sample().temperature_c.round() as c_uint))
    }
    /// Temperature thresholds, °C (acoustic/GPS thresholds: NOT_SUPPORTED).
    fn nvmlDeviceGetTemperatureThreshold(threshold_type: c_uint, temp: *mut c_uint) |c| {
        let th = &c.gpu.thermal;
        let value = match threshold_type {
            0 => th.shutdown_c,
            1 => th.slowdown_c,
            2 => th.memory_max_c.ok_or(NOT_SUPPORTED)?,
            3 => th.gpu_max_c,
            4..=7 => return Err(NOT_SUPPORTED),
            _ => return Err(INVALID_ARGUMENT),
        };
        write(temp, value.round() as c_uint)
    }
    /// Number of fans (0 on passively cooled boards).
    fn nvmlDeviceGetNumFans(num_fans: *mut c_uint) |c| { write(num_fans, c.gpu.fans) }
    /// Fan 0 speed, percent.
    fn nvmlDeviceGetFanSpeed(speed: *mut c_uint) |c| {
        c.require(c.gpu.fans > 0)?;
        write(speed, fan_percent(c, 0)?)
    }
    /// Speed of one fan, percent.
    fn nvmlDeviceGetFanSpeed_v2(fan: c_uint, speed: *mut c_uint) |c| {
        c.require(c.gpu.fans > 0)?;
        if fan >= c.gpu.fans {
            return Err(INVALID_ARGUMENT);
        }
        write(speed, fan_percent(c, fan)?)
    }
    /// Target speed of one fan, percent (the fan tracks its target exactly here).
    fn nvmlDeviceGetTargetFanSpeed(fan: c_uint, target_speed: *mut c_uint) |c| {
        c.require(c.gpu.fans > 0)?;
        if fan >= c.gpu.fans {
            return Err(INVALID_ARGUMENT);
        }
        write(target_speed, fan_percent(c, fan)?)
    }
    /// Current clock of a domain (graphics, SM, memory, video), MHz.
    fn nvmlDeviceGetClockInfo(clock_type: c_uint, clock: *mut c_uint) |c| {
        write(clock, mhz(clock_of(c, clock_type)?))
    }
    /// Maximum clock of a domain, MHz.
    fn nvmlDeviceGetMaxClockInfo(clock_type: c_uint, clock: *mut c_uint) |c| {
        write(clock, mhz(max_clock_of(c, clock_type)?))
    }
    /// Clock by id: current, application target/default or customer boost maximum, MHz.
    fn nvmlDeviceGetClock(clock_type: c_uint, clock_id: c_uint, clock_mhz: *mut c_uint) |c| {
        let value = match clock_id {
            0 => clock_of(c, clock_type)?,
            1..=3 => max_clock_of(c, clock_type)?,
            _ => return Err(INVALID_ARGUMENT),
        };
        write(clock_mhz, mhz(value))
    }
    /// Application clock of a domain (the default: the domain's max), MHz.
    fn nvmlDeviceGetApplicationsClock(clock_type: c_uint, clock: *mut c_uint) |c| {
        write(clock, mhz(max_clock_of(c, clock_type)?))
    }
    /// Maximum customer boost clock, MHz.
    fn nvmlDeviceGetMaxCustomerBoostClock(clock_type: c_uint, clock: *mut c_uint) |c| {
        write(clock, mhz(max_clock_of(c, clock_type)?))
    }
    /// Performance state (P0 busy, the board's idle P-state otherwise).
    fn nvmlDeviceGetPerformanceState(pstate: *mut c_uint) |c| { write(pstate, pstate_of(c)?) }
    /// Performance state (older name).
    fn nvmlDeviceGetPowerState(pstate: *mut c_uint) |c| { write(pstate, pstate_of(c)?) }
    /// Active clock-event reasons (bitmask).
    fn nvmlDeviceGetCurrentClocksEventReasons(reasons: *mut c_ulonglong) |c| {
        write(reasons, reasons_of(c)?)
    }
    /// Active clock-event reasons (bitmask; the pre-12.2 name).
    fn nvmlDeviceGetCurrentClocksThrottleReasons(reasons: *mut c_ulonglong) |c| {
        write(reasons, reasons_of(c)?)
    }
    /// Clock-event reasons this board can report.
    fn nvmlDeviceGetSupportedClocksEventReasons(reasons: *mut c_ulonglong) |_c| {
        write(reasons, SUPPORTED_REASONS)
    }
    /// Clock-event reasons this board can report (pre-12.2 name).
    fn nvmlDeviceGetSupportedClocksThrottleReasons(reasons: *mut c_ulonglong) |_c| {
        write(reasons, SUPPORTED_REASONS)
    }
    /// Time spent under a performance policy limit, ns; reference time in µs of simulated time.
    fn nvmlDeviceGetViolationStatus(policy: c_uint, violation: *mut nvmlViolationTime_t) |c| {
        if let Some(replay) = &c.gpu.replay {
            let series = replay.violation_ns.policy(policy).map_err(|()| INVALID_ARGUMENT)?;
            let ns = series.ok_or(NOT_SUPPORTED)?.counter(replay.step, c.t);
            return write(
                violation,
                nvmlViolationTime_t { referenceTime: (c.t * 1e6) as c_ulonglong, violationTime: ns as c_ulonglong },
            );
        }
        let totals = c.totals();
        let seconds = match policy {
            0 => totals.power_s,
            1 => totals.thermal_s,
            2 | 3 | 5 => 0.0,
            4 => totals.low_util_s,
            10 => totals.below_app_s,
            11 => totals.below_base_s,
            _ => return Err(INVALID_ARGUMENT),
        };
        write(
            violation,
            nvmlViolationTime_t {
                referenceTime: (c.t * 1e6) as c_ulonglong,
                violationTime: (seconds * 1e9) as c_ulonglong,
            },
        )
    }
    /// PCIe throughput (0 = TX, 1 = RX), KB/s.
    fn nvmlDeviceGetPcieThroughput(counter: c_uint, value: *mut c_uint) |c| {
        let recorded = match counter {
            0 => c.replayed(|r| r.pcie_tx_kb_s.as_ref())?,
            1 => c.replayed(|r| r.pcie_rx_kb_s.as_ref())?,
            _ => return Err(INVALID_ARGUMENT),
        };
        let s = c.sample();
        let bytes = if counter == 0 { s.pcie_tx } else { s.pcie_rx };
        write(value, or_sim(recorded, || (bytes / 1000.0).round() as c_uint))
    }
    /// PCIe replay counter.
    fn nvmlDeviceGetPcieReplayCounter(value: *mut c_uint) |c| {
        write(value, pcie_replays(c)? as c_uint)
    }
    /// Current PCIe link generation.
    fn nvmlDeviceGetCurrPcieLinkGeneration(gen_: *mut c_uint) |c| {
        write(gen_, c.gpu.pcie.generation.unwrap_or(c.gpu.pcie.max_generation))
    }
    /// Current PCIe link width.
    fn nvmlDeviceGetCurrPcieLinkWidth(width: *mut c_uint) |c| {
        write(width, c.gpu.pcie.width.unwrap_or(c.gpu.pcie.max_width))
    }
    /// Maximum PCIe link generation of the link.
    fn nvmlDeviceGetMaxPcieLinkGeneration(gen_: *mut c_uint) |c| { write(gen_, c.gpu.pcie.max_generation) }
    /// Maximum PCIe link generation the GPU supports.
    fn nvmlDeviceGetGpuMaxPcieLinkGeneration(gen_: *mut c_uint) |c| { write(gen_, c.gpu.pcie.max_generation) }
    /// Maximum PCIe link width.
    fn nvmlDeviceGetMaxPcieLinkWidth(width: *mut c_uint) |c| { write(width, c.gpu.pcie.max_width) }
}
