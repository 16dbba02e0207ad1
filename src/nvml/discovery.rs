//! Loading NVML and reading what does not change while it stays loaded: system versions, the
//! device count, and each device's identity (uuid and `DeviceInfo`).

use std::path::Path;
use std::sync::Arc;

use nvml_wrapper::Device;
use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::Brand;
use nvml_wrapper::error::NvmlError;

use super::error::{ErrorCounter, NvmlUnavailable};
use super::units::cuda_version;
use crate::sample::{DeviceInfo, SystemInfo};

/// Loads the library at `lib` and initialises NVML.
pub fn init(lib: &Path) -> Result<Nvml, NvmlUnavailable> {
    Nvml::builder()
        .lib_path(lib.as_os_str())
        .init()
        .map_err(|source| NvmlUnavailable::Init {
            lib: lib.to_path_buf(),
            source,
        })
}

/// System-wide versions; a version that cannot be read is left empty (and counted).
pub fn system_info(nvml: &Nvml, errors: &ErrorCounter) -> SystemInfo {
    let read = |function: &'static str, r: Result<String, NvmlError>| match r {
        Ok(v) => v,
        Err(NvmlError::NotSupported) => String::new(),
        Err(e) => {
            errors.record(None, function, &e);
            String::new()
        }
    };
    SystemInfo {
        driver_version: read("nvmlSystemGetDriverVersion", nvml.sys_driver_version()),
        nvml_version: read("nvmlSystemGetNVMLVersion", nvml.sys_nvml_version()),
        cuda_driver_version: read(
            "nvmlSystemGetCudaDriverVersion_v2",
            nvml.sys_cuda_driver_version().map(cuda_version),
        ),
    }
}

/// A device's uuid and static identity. Fields that cannot be read are empty strings;
/// NOT_SUPPORTED (e.g. no serial on a consumer card) is normal and not counted.
pub fn device_identity(
    device: &Device,
    index: u32,
    errors: &ErrorCounter,
) -> (String, Arc<DeviceInfo>) {
    let read = |function: &'static str, r: Result<String, NvmlError>| match r {
        Ok(v) => v,
        Err(NvmlError::NotSupported) => String::new(),
        Err(e) => {
            errors.record(Some(index), function, &e);
            String::new()
        }
    };
    let uuid = read("nvmlDeviceGetUUID", device.uuid());
    let info = DeviceInfo {
        name: read("nvmlDeviceGetName", device.name()),
        brand: read("nvmlDeviceGetBrand", device.brand().map(brand_label)),
        architecture: read(
            "nvmlDeviceGetArchitecture",
            device.architecture().map(|a| a.to_string().to_lowercase()),
        ),
        pci_bus_id: read(
            "nvmlDeviceGetPciInfo_v3",
            device.pci_info().map(|p| p.bus_id),
        ),
        serial: read("nvmlDeviceGetSerial", device.serial()),
        vbios_version: read("nvmlDeviceGetVbiosVersion", device.vbios_version()),
        compute_capability: read(
            "nvmlDeviceGetCudaComputeCapability",
            device
                .cuda_compute_capability()
                .map(|c| format!("{}.{}", c.major, c.minor)),
        ),
        minor_number: read(
            "nvmlDeviceGetMinorNumber",
            device.minor_number().map(|m| m.to_string()),
        ),
    };
    (uuid, Arc::new(info))
}

/// The `brand` label: the NVML_BRAND_* suffix in lowercase ("tesla", "nvidia", "geforce_rtx").
pub fn brand_label(brand: Brand) -> String {
    let label = match brand {
        Brand::Unknown => "unknown",
        Brand::Quadro => "quadro",
        Brand::Tesla => "tesla",
        Brand::NVS => "nvs",
        Brand::GRID => "grid",
        Brand::GeForce => "geforce",
        Brand::Titan => "titan",
        Brand::VApps => "nvidia_vapps",
        Brand::VPC => "nvidia_vpc",
        Brand::VCS => "nvidia_vcs",
        Brand::VWS => "nvidia_vws",
        Brand::CloudGaming => "nvidia_cloud_gaming",
        Brand::VGaming => "nvidia_vgaming",
        Brand::QuadroRTX => "quadro_rtx",
        Brand::NvidiaRTX => "nvidia_rtx",
        Brand::Nvidia => "nvidia",
        Brand::GeForceRTX => "geforce_rtx",
        Brand::TitanRTX => "titan_rtx",
    };
    label.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn brand_labels_are_lowercase_nvml_names() {
        assert_eq!(brand_label(Brand::Tesla), "tesla");
        assert_eq!(brand_label(Brand::Nvidia), "nvidia");
        assert_eq!(brand_label(Brand::GeForceRTX), "geforce_rtx");
    }

    #[test]
    fn a_missing_library_is_reported_as_not_found() {
        let err = init(Path::new("/nonexistent/libnvidia-ml.so.1"))
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("NVML library not found: /nonexistent/"),
            "{err}"
        );
    }

    /// The real driver library, on a machine without an NVIDIA kernel driver, must fail with a
    /// clear "driver not loaded" reason (skipped where the Debian package was not unpacked).
    #[test]
    fn the_real_library_without_a_driver_says_driver_not_loaded() {
        let lib =
            Path::new("/work/debs/root/usr/lib/x86_64-linux-gnu/nvidia/current/libnvidia-ml.so.1");
        // /proc/driver/nvidia exists only where the kernel driver is loaded.
        if !lib.exists() || Path::new("/proc/driver/nvidia/version").exists() {
            eprintln!("skipped: {} absent or a driver is loaded", lib.display());
            return;
        }
        let err = init(lib).unwrap_err().to_string();
        assert!(err.contains("driver not loaded"), "{err}");
    }
}
