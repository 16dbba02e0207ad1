//! Unit conversions from what NVML reports to the base units of `sample.rs`.
//!
//! Conventions (from the comments in `nvml.h`):
//! - clocks are MHz → Hz (×10⁶);
//! - power is mW → W, energy mJ → J (÷10³);
//! - utilization and fan speed are percent → ratio 0..1 (÷100);
//! - violation (throttle) time is ns → s (÷10⁹);
//! - PCIe throughput is "KB/s" and NVLink throughput "KiB": both are taken as 1024-byte units
//!   (NVML uses KB for 1024 bytes, as in its memory APIs), so ×1024;
//! - memory sizes are already bytes;
//! - GPM reports `*_UTIL` metrics as percent (0.0–100.0, a float) → ratio, and its PCIe/NVLink
//!   rates in MiB/s → bytes/s (×2²⁰).

/// MHz → Hz.
pub fn mhz_to_hz(mhz: u32) -> f64 {
    f64::from(mhz) * 1e6
}

/// Milliwatts → watts.
pub fn mw_to_w(mw: u32) -> f64 {
    f64::from(mw) / 1e3
}

/// Millijoules → joules.
pub fn mj_to_j(mj: u64) -> f64 {
    mj as f64 / 1e3
}

/// Percent (0..100) → ratio (0..1).
pub fn percent_to_ratio(percent: u32) -> f64 {
    f64::from(percent) / 100.0
}

/// Percent as a float (GPM metrics) → ratio (0..1).
pub fn percent_to_ratio_f64(percent: f64) -> f64 {
    percent / 100.0
}

/// MiB (2²⁰ bytes) → bytes; used for GPM's MiB/s transfer rates.
pub fn mib_to_bytes_f64(mib: f64) -> f64 {
    mib * 1_048_576.0
}

/// Nanoseconds → seconds.
pub fn ns_to_s(ns: u64) -> f64 {
    ns as f64 / 1e9
}

/// KiB (1024 bytes) → bytes; used for PCIe KB/s and NVLink KiB counters.
pub fn kib_to_bytes(kib: u64) -> u64 {
    kib.saturating_mul(1024)
}

/// CUDA driver version as NVML encodes it (1000 × major + 10 × minor, e.g. 12040) → "12.4".
pub fn cuda_version(encoded: i32) -> String {
    format!("{}.{}", encoded / 1000, (encoded % 1000) / 10)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversions_land_in_base_units() {
        assert_eq!(mhz_to_hz(1980), 1.98e9);
        assert_eq!(mw_to_w(700_000), 700.0);
        assert_eq!(mj_to_j(1_500), 1.5);
        assert_eq!(percent_to_ratio(45), 0.45);
        assert_eq!(ns_to_s(2_500_000_000), 2.5);
        assert_eq!(kib_to_bytes(3), 3072);
        assert_eq!(percent_to_ratio_f64(15.0), 0.15);
        assert_eq!(mib_to_bytes_f64(1.5), 1_572_864.0);
        assert_eq!(kib_to_bytes(u64::MAX), u64::MAX);
    }

    #[test]
    fn cuda_versions_are_major_dot_minor() {
        assert_eq!(cuda_version(12040), "12.4");
        assert_eq!(cuda_version(11080), "11.8");
        assert_eq!(cuda_version(13000), "13.0");
    }
}
