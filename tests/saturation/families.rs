//! Which catalog families come from NVML GPM (METRICS.md "Saturation metrics"), shared by the
//! tests that treat them apart.

#![allow(dead_code)] // each test binary uses a different subset

/// The GPM families, by name: the saturation table of METRICS.md.
pub const GPM_FAMILIES: &[&str] = &[
    "nvidia_gpu_gpm_supported",
    "nvidia_gpu_graphics_engine_active_ratio",
    "nvidia_gpu_sm_active_ratio",
    "nvidia_gpu_sm_occupancy_ratio",
    "nvidia_gpu_tensor_active_ratio",
    "nvidia_gpu_dram_active_ratio",
    "nvidia_gpu_pipe_active_ratio",
    "nvidia_gpu_pcie_gpm_transmit_bytes_per_second",
    "nvidia_gpu_pcie_gpm_receive_bytes_per_second",
    "nvidia_gpu_nvlink_gpm_transmit_bytes_per_second",
    "nvidia_gpu_nvlink_gpm_receive_bytes_per_second",
    "nvidia_gpu_media_engine_active_ratio",
    // Their time integrals, from the same readings.
    "nvidia_gpu_sm_active_seconds_total",
    "nvidia_gpu_sm_occupancy_seconds_total",
    "nvidia_gpu_tensor_active_seconds_total",
    "nvidia_gpu_dram_active_seconds_total",
];

pub fn is_gpm_family(name: &str) -> bool {
    GPM_FAMILIES.contains(&name)
}
