//! What a scenario GPU offers, derived from its spec: its architecture as NVML reports it, the
//! per-model support matrix (which queries a real board of that kind answers with
//! NOT_SUPPORTED), its usable memory and its active links.

use crate::scenario::{GpuSpec, MIB, arch_code};
use nvml_wrapper_sys::bindings as b;

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

    /// Whether NVLink link `link` is down at `t`. In MIG mode drivers report every link down
    /// (DCGM works around it as its bug 200682374).
    pub fn link_down(&self, link: u32, t: f64) -> bool {
        self.mig.enabled
            || (self.nvlink.down.contains(&link)
                && self.nvlink.down_window.is_none_or(|w| w.active(t)))
    }

    /// Number of NVLink links that are up at `t`.
    pub fn active_links(&self, t: f64) -> u32 {
        (0..self.nvlink.links)
            .filter(|l| !self.link_down(*l, t))
            .count() as u32
    }

    /// Whether the GPU runs GSP firmware, or None on boards without a GSP (before Turing). The
    /// driver moves data-center boards (brand `nvidia`/`tesla`) onto GSP firmware by default;
    /// workstation and consumer boards stay off it on the driver branches simulated here (< 555).
    pub fn gsp_firmware(&self) -> Option<bool> {
        let arch = self.arch();
        if arch < b::NVML_DEVICE_ARCH_TURING || arch == b::NVML_DEVICE_ARCH_UNKNOWN {
            return None;
        }
        Some(matches!(self.brand.as_str(), "nvidia" | "tesla"))
    }

    /// What the far end of an NVLink link is: a DGX-1/HGX-1 (Volta) cabling links GPU to GPU,
    /// HGX A100 and H100 boards route every link through NVSwitches.
    pub fn nvlink_remote_type(&self) -> u32 {
        if self.arch() <= b::NVML_DEVICE_ARCH_VOLTA {
            b::nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_GPU
        } else {
            b::nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_SWITCH
        }
    }

    /// Usable framebuffer (total − reserved), bytes.
    pub fn usable_bytes(&self) -> u64 {
        (self.memory_total_mib - self.memory_reserved_mib) * MIB
    }
}
