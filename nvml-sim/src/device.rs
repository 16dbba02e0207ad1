//! Enumerations of a GPU's static identity (architecture, brand) and the per-model support
//! matrix: which queries a real board of that kind answers with NOT_SUPPORTED.

use crate::scenario::GpuSpec;
use nvml_wrapper_sys::bindings as b;

/// The `nvmlDeviceArchitecture_t` value for an architecture name.
pub fn arch_code(name: &str) -> Option<u32> {
    Some(match name {
        "kepler" => b::NVML_DEVICE_ARCH_KEPLER,
        "maxwell" => b::NVML_DEVICE_ARCH_MAXWELL,
        "pascal" => b::NVML_DEVICE_ARCH_PASCAL,
        "volta" => b::NVML_DEVICE_ARCH_VOLTA,
        "turing" => b::NVML_DEVICE_ARCH_TURING,
        "ampere" => b::NVML_DEVICE_ARCH_AMPERE,
        "ada" => b::NVML_DEVICE_ARCH_ADA,
        "hopper" => b::NVML_DEVICE_ARCH_HOPPER,
        "blackwell" => b::NVML_DEVICE_ARCH_BLACKWELL,
        _ => return None,
    })
}

/// The `nvmlBrandType_t` value for a brand name.
pub fn brand_code(name: &str) -> Option<u32> {
    Some(match name {
        "quadro" => b::nvmlBrandType_enum_NVML_BRAND_QUADRO,
        "tesla" => b::nvmlBrandType_enum_NVML_BRAND_TESLA,
        "geforce" => b::nvmlBrandType_enum_NVML_BRAND_GEFORCE,
        "titan" => b::nvmlBrandType_enum_NVML_BRAND_TITAN,
        "nvidia_rtx" => b::nvmlBrandType_enum_NVML_BRAND_NVIDIA_RTX,
        "nvidia" => b::nvmlBrandType_enum_NVML_BRAND_NVIDIA,
        _ => return None,
    })
}

impl GpuSpec {
    /// The architecture as NVML reports it (validated at parse time).
    pub fn arch(&self) -> u32 {
        arch_code(&self.architecture).unwrap_or(b::NVML_DEVICE_ARCH_UNKNOWN)
    }

    /// Ampere and newer replace page retirement by row remapping.
    pub fn has_row_remapping(&self) -> bool {
        self.arch() >= b::NVML_DEVICE_ARCH_AMPERE && self.arch() != b::NVML_DEVICE_ARCH_UNKNOWN
    }

    /// Page retirement exists only before Ampere (and only with ECC).
    pub fn has_page_retirement(&self) -> bool {
        !self.has_row_remapping() && self.ecc.enabled
    }

    /// Index-checked NVLink presence.
    pub fn has_nvlink(&self) -> bool {
        self.nvlink.links > 0
    }

    /// Number of NVLink links that are up.
    pub fn active_links(&self) -> u32 {
        (0..self.nvlink.links)
            .filter(|l| !self.nvlink.down.contains(l))
            .count() as u32
    }

    /// Usable framebuffer (total − reserved), bytes.
    pub fn usable_bytes(&self) -> u64 {
        (self.memory_total_mib - self.memory_reserved_mib) * MIB
    }
}

/// Bytes in a MiB.
pub const MIB: u64 = 1024 * 1024;
