//! The instantaneous state of a GPU at time t: load patterns in, power, temperature, clocks and
//! clock-event reasons out. Everything here is a pure function of (GPU spec, t).
//!
//! The chain is: utilization/power intensity → power demand → power (clipped at the enforced
//! limit; clipping sets SW power cap and lowers the SM clock) → temperature (linear in power) →
//! thermal reasons (above the max operating temperature: SW thermal slowdown; above the slowdown
//! threshold: HW thermal slowdown) → further clock reduction.

use crate::mig::GpuInstanceSpec;
use crate::pattern::Pattern;
use crate::scenario::{GpuSpec, MIB};

/// `nvmlClocksEventReasonGpuIdle`.
pub const REASON_GPU_IDLE: u64 = 0x1;
/// `nvmlClocksEventReasonApplicationsClocksSetting`.
pub const REASON_APP_CLOCKS: u64 = 0x2;
/// `nvmlClocksEventReasonSwPowerCap`.
pub const REASON_SW_POWER_CAP: u64 = 0x4;
/// `nvmlClocksThrottleReasonHwSlowdown`.
pub const REASON_HW_SLOWDOWN: u64 = 0x8;
/// `nvmlClocksEventReasonSyncBoost`.
pub const REASON_SYNC_BOOST: u64 = 0x10;
/// `nvmlClocksEventReasonSwThermalSlowdown`.
pub const REASON_SW_THERMAL: u64 = 0x20;
/// `nvmlClocksThrottleReasonHwThermalSlowdown`.
pub const REASON_HW_THERMAL: u64 = 0x40;
/// `nvmlClocksThrottleReasonHwPowerBrakeSlowdown`.
pub const REASON_HW_POWER_BRAKE: u64 = 0x80;
/// `nvmlClocksEventReasonDisplayClockSetting`.
pub const REASON_DISPLAY_CLOCK: u64 = 0x100;
/// Every reason a simulated board can report (`nvmlDeviceGetSupportedClocksEventReasons`); the
/// simulation itself raises only some of them.
pub const SUPPORTED_REASONS: u64 = REASON_GPU_IDLE
    | REASON_APP_CLOCKS
    | REASON_SW_POWER_CAP
    | REASON_HW_SLOWDOWN
    | REASON_SYNC_BOOST
    | REASON_SW_THERMAL
    | REASON_HW_THERMAL
    | REASON_HW_POWER_BRAKE
    | REASON_DISPLAY_CLOCK;

/// Below this utilization the GPU counts as idle (gpu_idle reason, idle clocks).
const IDLE_UTILIZATION: f64 = 0.01;
/// SW thermal slowdown trims the SM clock by this factor.
const SW_THERMAL_CLOCK_FACTOR: f64 = 0.9;
/// HW thermal slowdown cuts the SM clock by this factor (on top of SW).
const HW_THERMAL_CLOCK_FACTOR: f64 = 0.5;

/// A GPU's state at one instant.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Kernel-time ratio 0..1.
    pub utilization: f64,
    /// Memory-controller ratio 0..1.
    pub memory_utilization: f64,
    /// Encoder ratio 0..1.
    pub encoder: f64,
    /// Decoder ratio 0..1.
    pub decoder: f64,
    /// Framebuffer used (excluding reserved), bytes.
    pub memory_used: u64,
    /// Power draw, W.
    pub power_w: f64,
    /// GPU temperature, °C.
    pub temperature_c: f64,
    /// SM (and graphics) clock, MHz.
    pub sm_mhz: f64,
    /// Memory clock, MHz.
    pub memory_mhz: f64,
    /// Video clock, MHz.
    pub video_mhz: f64,
    /// Performance state 0..15.
    pub pstate: u32,
    /// Active clock-event reasons (bitmask).
    pub reasons: u64,
    /// Fan duty, percent (0 when there is no fan).
    pub fan_percent: f64,
    /// PCIe transmit/receive, bytes/s.
    pub pcie_tx: f64,
    /// PCIe receive, bytes/s.
    pub pcie_rx: f64,
    /// NVLink transmit over all links, bytes/s.
    pub nvlink_tx: f64,
    /// NVLink receive over all links, bytes/s.
    pub nvlink_rx: f64,
}

/// Clamps a load ratio to 0..1 (NaN: 0).
pub(crate) fn ratio(x: f64) -> f64 {
    if x.is_nan() { 0.0 } else { x.clamp(0.0, 1.0) }
}

fn non_negative(x: f64) -> f64 {
    if x.is_nan() { 0.0 } else { x.max(0.0) }
}

/// A PCIe rate pattern (MB/s) at `t`, in bytes/s. Shared by the instantaneous throughput query
/// and the GPM counters so that both views of the link agree.
pub(crate) fn pcie_bytes_per_s(rate_mb_s: &Pattern, t: f64) -> f64 {
    non_negative(rate_mb_s.at(t)) * 1e6
}

/// Memory MIG GPU instance `gi` of `gpu` uses at `t` (bytes): its load's `memory_used` share of
/// the instance's size, never less than its processes hold, never more than the size.
pub fn instance_memory_used(gpu: &GpuSpec, gi: &GpuInstanceSpec, t: f64) -> u64 {
    let total = gi.profile().memory_mib * MIB;
    let held: u64 = gpu
        .processes
        .iter()
        .filter(|p| p.gpu_instance == Some(gi.id) && p.alive(t))
        .map(|p| p.used_memory_mib * MIB)
        .sum();
    if let Some(replay) = &gi.replay {
        return replay.memory_used(t).min(total);
    }
    let share = ratio(gi.activity.memory_used.at(t));
    ((share * total as f64) as u64).max(held).min(total)
}

impl Sample {
    /// The state of `gpu` at time `t`.
    pub fn at(gpu: &GpuSpec, t: f64) -> Sample {
        let load = &gpu.load;
        let utilization = ratio(load.utilization.at(t));
        let idle = utilization < IDLE_UTILIZATION;
        let intensity = non_negative(load.power.as_ref().unwrap_or(&load.utilization).at(t));

        let p = &gpu.power;
        let limit_w = p.enforced_w();
        let demand = p.idle_w + intensity * (p.default_limit_w - p.idle_w);
        let power_w = demand.min(limit_w);
        let power_capped = demand > limit_w;

        let th = &gpu.thermal;
        let temperature_c = th.ambient_c
            + power_w / p.default_limit_w * (th.at_tdp_c - th.ambient_c) * th.heat_factor;
        let sw_thermal = temperature_c >= th.gpu_max_c;
        let hw_thermal = temperature_c >= th.slowdown_c;

        let c = &gpu.clocks;
        let mut reasons = 0;
        let (mut sm_mhz, memory_mhz, video_mhz, pstate);
        if idle {
            reasons |= REASON_GPU_IDLE;
            sm_mhz = c.sm.idle;
            memory_mhz = c.memory.idle;
            video_mhz = c.video.idle;
            pstate = gpu.idle_pstate;
        } else {
            // Uncapped, the board boosts to its max clock; under the power cap it settles where
            // the allowed share of the dynamic power range puts it between base and max.
            let share = if power_capped {
                ((limit_w - p.idle_w) / (demand - p.idle_w)).clamp(0.0, 1.0)
            } else {
                1.0
            };
            sm_mhz = c.sm.base + (c.sm.max - c.sm.base) * share;
            memory_mhz = c.memory.max;
            video_mhz = c.video.base + (c.video.max - c.video.base) * share;
            pstate = 0;
        }
        if power_capped {
            reasons |= REASON_SW_POWER_CAP;
        }
        if sw_thermal {
            reasons |= REASON_SW_THERMAL;
            sm_mhz *= SW_THERMAL_CLOCK_FACTOR;
        }
        if hw_thermal {
            reasons |= REASON_HW_THERMAL | REASON_HW_SLOWDOWN;
            sm_mhz *= HW_THERMAL_CLOCK_FACTOR;
        }
        let fan_percent = if gpu.fans > 0 {
            let rise = ratio((temperature_c - th.ambient_c) / (th.gpu_max_c - th.ambient_c));
            gpu.fan_min_percent + (100.0 - gpu.fan_min_percent) * rise
        } else {
            0.0
        };

        let held: u64 = gpu
            .processes
            .iter()
            .filter(|pr| pr.alive(t))
            .map(|pr| pr.used_memory_mib * MIB)
            .sum();
        let usable = gpu.usable_bytes();
        let memory_used = if gpu.mig.enabled {
            // With MIG the framebuffer belongs to the instances: the device total is their sum.
            gpu.mig
                .instances_at(t)
                .map(|(_, gi)| instance_memory_used(gpu, gi, t))
                .sum::<u64>()
                .min(usable)
        } else {
            let by_pattern = (ratio(load.memory_used.at(t)) * usable as f64) as u64;
            by_pattern.max(held).min(usable)
        };

        let active_links = gpu.active_links(t) > 0;
        let link_rate = |x: f64| {
            if active_links {
                non_negative(x) * 1e9
            } else {
                0.0
            }
        };
        Sample {
            utilization,
            memory_utilization: ratio(load.memory_utilization.at(t)),
            encoder: if gpu.encoder {
                ratio(load.encoder.at(t))
            } else {
                0.0
            },
            decoder: if gpu.decoder {
                ratio(load.decoder.at(t))
            } else {
                0.0
            },
            memory_used,
            power_w,
            temperature_c,
            sm_mhz: sm_mhz.round(),
            memory_mhz: memory_mhz.round(),
            video_mhz: video_mhz.round(),
            pstate,
            reasons,
            fan_percent,
            pcie_tx: pcie_bytes_per_s(&load.pcie_tx_mb_s, t),
            pcie_rx: pcie_bytes_per_s(&load.pcie_rx_mb_s, t),
            nvlink_tx: link_rate(load.nvlink_tx_gb_s.at(t)),
            nvlink_rx: link_rate(load.nvlink_rx_gb_s.at(t)),
        }
    }

    /// The memory temperature, if the board has a memory sensor.
    pub fn memory_temperature_c(&self, gpu: &GpuSpec) -> Option<f64> {
        gpu.thermal.memory_offset_c.map(|o| self.temperature_c + o)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::Scenario;

    fn gpu(extra: &str) -> GpuSpec {
        let text = format!(
            "[[gpu]]\nmodel = \"H100-SXM5-80GB\"\nuuid = \"GPU-1\"\npci_bus_id = \"01:00.0\"\nserial = \"1\"\n{extra}"
        );
        Scenario::parse(&text).unwrap().gpus.remove(0)
    }

    #[test]
    fn power_follows_load_and_is_clipped_at_the_limit() {
        let half = Sample::at(&gpu("load = { utilization = 0.5 }"), 0.0);
        assert!((half.power_w - (72.0 + 0.5 * 628.0)).abs() < 1e-9);
        assert_eq!(half.reasons, 0);
        assert_eq!(half.sm_mhz, 1980.0);

        let capped = Sample::at(
            &gpu("power = { limit_w = 400 }\nload = { utilization = 1.0 }"),
            0.0,
        );
        assert_eq!(capped.power_w, 400.0);
        assert_eq!(capped.reasons, REASON_SW_POWER_CAP);
        assert!(
            capped.sm_mhz < 1980.0 && capped.sm_mhz >= 1590.0,
            "{}",
            capped.sm_mhz
        );

        // Another limiter below the management limit caps the board at its own limit.
        let limited = Sample::at(
            &gpu("power = { limit_w = 700, enforced_limit_w = 400 }\nload = { utilization = 1.0 }"),
            0.0,
        );
        assert_eq!(limited.power_w, 400.0);
        assert_eq!(limited.reasons, REASON_SW_POWER_CAP);
        assert_eq!(limited.sm_mhz, capped.sm_mhz);
    }

    #[test]
    fn heat_causes_thermal_reasons_and_lower_clocks() {
        let sw = Sample::at(
            &gpu("thermal = { heat_factor = 1.55 }\nload = { utilization = 1.0 }"),
            0.0,
        );
        assert!(
            sw.temperature_c >= 87.0 && sw.temperature_c < 89.0,
            "{}",
            sw.temperature_c
        );
        assert_eq!(sw.reasons, REASON_SW_THERMAL);
        assert_eq!(sw.sm_mhz, (1980.0f64 * 0.9).round());

        let hw = Sample::at(
            &gpu("thermal = { heat_factor = 2 }\nload = { utilization = 1.0 }"),
            0.0,
        );
        assert_eq!(
            hw.reasons,
            REASON_SW_THERMAL | REASON_HW_THERMAL | REASON_HW_SLOWDOWN
        );
        assert!(hw.sm_mhz < sw.sm_mhz);
    }

    #[test]
    fn every_reason_bit_up_to_display_clock_is_supported() {
        assert_eq!(SUPPORTED_REASONS, 0x1FF);
    }

    #[test]
    fn idle_gpu_reports_idle_reason_and_idle_clocks() {
        let s = Sample::at(&gpu("load = { utilization = 0.0 }"), 5.0);
        assert_eq!(s.reasons, REASON_GPU_IDLE);
        assert_eq!((s.sm_mhz, s.video_mhz, s.power_w), (345.0, 765.0, 72.0));
    }

    #[test]
    fn memory_used_never_below_the_processes() {
        let g = gpu(
            "load = { memory_used = 0.01 }\n[[gpu.process]]\npid = 1\nname = \"p\"\nused_memory_mib = 4096\nto = 10",
        );
        assert_eq!(Sample::at(&g, 5.0).memory_used, 4096 * MIB);
        // After the process exits at t = 10 only the pattern remains.
        let pattern = (0.01 * g.usable_bytes() as f64) as u64;
        assert_eq!(Sample::at(&g, 10.0).memory_used, pattern);
    }
}
