//! Static device identity: names, ids, PCI info, architecture, persistence and compute modes,
//! driver model, GSP firmware and host vGPU mode.

use crate::ffi::{self, device_fns, write, write_str};
use crate::scenario::{GpuSpec, arch_code, brand_code, parse_bus_id};
use nvml_wrapper_sys::bindings::{
    NVML_GSP_FIRMWARE_VERSION_BUF_SIZE, nvmlBrandType_t, nvmlDeviceArchitecture_t,
    nvmlDriverModel_t, nvmlHostVgpuMode_t, nvmlPciInfo_t,
};
use std::os::raw::{c_char, c_int, c_uint};

/// The pre-v2 `nvmlPciInfo_t`: a 16-byte bus id and four reserved words where v2 has `busId[32]`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PciInfoV1 {
    /// "DDDD:BB:DD.F".
    pub bus_id: [c_char; 16],
    /// PCI domain.
    pub domain: c_uint,
    /// PCI bus.
    pub bus: c_uint,
    /// PCI device.
    pub device: c_uint,
    /// Device id << 16 | vendor id.
    pub pci_device_id: c_uint,
    /// Subsystem id.
    pub pci_subsystem_id: c_uint,
    /// Zero.
    pub reserved: [c_uint; 4],
}

fn fill_c<const N: usize>(s: &str) -> [c_char; N] {
    let mut out = [0 as c_char; N];
    for (o, b) in out.iter_mut().zip(s.bytes().take(N - 1)) {
        *o = b as c_char;
    }
    out
}

fn pci_info(gpu: &GpuSpec) -> nvmlPciInfo_t {
    let (domain, bus, device, function) = parse_bus_id(&gpu.pci_bus_id).unwrap_or_default();
    nvmlPciInfo_t {
        busIdLegacy: fill_c(&format!("{domain:04X}:{bus:02X}:{device:02X}.{function:X}")),
        domain,
        bus,
        device,
        pciDeviceId: gpu.pci_device_id,
        pciSubSystemId: gpu.pci_subsystem_id,
        busId: fill_c(&format!("{domain:08X}:{bus:02X}:{device:02X}.{function:X}")),
    }
}

device_fns! {
    /// NVML index of the device.
    fn nvmlDeviceGetIndex(index: *mut c_uint) |c| {
        if let Some(d) = c.mig {
            // A MIG device's index is its position under the parent (the index
            // nvmlDeviceGetMigDeviceHandleByIndex takes).
            let devices = c.gpu.mig.devices_at(c.t);
            let position = devices
                .iter()
                .position(|m| m.gi.id == d.gi.id && m.ci.id == d.ci.id)
                .ok_or(ffi::INVALID_ARGUMENT)?;
            return write(index, position as c_uint);
        }
        let nvml_index = ffi::nvml_index(c.sim, c.index).ok_or(ffi::GPU_IS_LOST)?;
        write(index, nvml_index as c_uint)
    }
    /// Product name; for a MIG device the parent's name and the profile, e.g.
    /// "NVIDIA H100 80GB HBM3 MIG 1g.10gb".
    fn nvmlDeviceGetName(name: *mut c_char, length: c_uint) |c| {
        match c.mig {
            Some(d) => write_str(name, length, &d.name(&c.gpu.name)),
            None => write_str(name, length, &c.gpu.name),
        }
    }
    /// "GPU-…" UUID; "MIG-…" for a MIG device.
    fn nvmlDeviceGetUUID(uuid: *mut c_char, length: c_uint) |c| {
        match c.mig {
            Some(d) => write_str(uuid, length, &d.uuid(&c.gpu.uuid)),
            None => write_str(uuid, length, &c.gpu.uuid),
        }
    }
    /// Board serial number.
    fn nvmlDeviceGetSerial(serial: *mut c_char, length: c_uint) |c| {
        write_str(serial, length, &c.gpu.serial)
    }
    /// VBIOS version.
    fn nvmlDeviceGetVbiosVersion(version: *mut c_char, length: c_uint) |c| {
        write_str(version, length, &c.gpu.vbios)
    }
    /// Brand.
    fn nvmlDeviceGetBrand(brand: *mut nvmlBrandType_t) |c| {
        write(brand, brand_code(&c.gpu.brand).unwrap_or_default())
    }
    /// Architecture.
    fn nvmlDeviceGetArchitecture(arch: *mut nvmlDeviceArchitecture_t) |c| {
        write(arch, arch_code(&c.gpu.architecture).unwrap_or_default())
    }
    /// CUDA compute capability.
    fn nvmlDeviceGetCudaComputeCapability(major: *mut c_int, minor: *mut c_int) |c| {
        if major.is_null() || minor.is_null() {
            return Err(crate::ffi::INVALID_ARGUMENT);
        }
        write(major, c.gpu.compute_capability[0])?;
        write(minor, c.gpu.compute_capability[1])
    }
    /// /dev/nvidiaN minor number.
    fn nvmlDeviceGetMinorNumber(minor: *mut c_uint) |c| {
        write(minor, c.gpu.minor_number.unwrap_or(c.index as u32))
    }
    /// PCI info, original layout.
    fn nvmlDeviceGetPciInfo(pci: *mut PciInfoV1) |c| {
        let v2 = pci_info(c.gpu);
        write(
            pci,
            PciInfoV1 {
                bus_id: v2.busIdLegacy,
                domain: v2.domain,
                bus: v2.bus,
                device: v2.device,
                pci_device_id: v2.pciDeviceId,
                pci_subsystem_id: v2.pciSubSystemId,
                reserved: [0; 4],
            },
        )
    }
    /// PCI info.
    fn nvmlDeviceGetPciInfo_v2(pci: *mut nvmlPciInfo_t) |c| { write(pci, pci_info(c.gpu)) }
    /// PCI info.
    fn nvmlDeviceGetPciInfo_v3(pci: *mut nvmlPciInfo_t) |c| { write(pci, pci_info(c.gpu)) }
    /// Persistence mode (enabled, as on a typical server).
    fn nvmlDeviceGetPersistenceMode(mode: *mut c_uint) |_c| { write(mode, 1) }
    /// Compute mode (default).
    fn nvmlDeviceGetComputeMode(mode: *mut c_uint) |_c| { write(mode, 0) }
    /// Display mode (no display attached).
    fn nvmlDeviceGetDisplayMode(mode: *mut c_uint) |_c| { write(mode, 0) }
    /// Display active (no).
    fn nvmlDeviceGetDisplayActive(active: *mut c_uint) |_c| { write(active, 0) }
    /// Driver model (WDDM/WDM/MCDM): a Windows notion, NOT_SUPPORTED on Linux as the real
    /// library answers.
    fn nvmlDeviceGetDriverModel(_current: *mut nvmlDriverModel_t, _pending: *mut nvmlDriverModel_t) |c| {
        c.require(false)
    }
    /// GSP firmware mode (enabled, default); NOT_SUPPORTED on boards without a GSP.
    fn nvmlDeviceGetGspFirmwareMode(is_enabled: *mut c_uint, default_mode: *mut c_uint) |c| {
        let on = c.gpu.gsp_firmware().ok_or(ffi::NOT_SUPPORTED)?;
        if is_enabled.is_null() || default_mode.is_null() {
            return Err(ffi::INVALID_ARGUMENT);
        }
        write(is_enabled, on as c_uint)?;
        // The mode is the default one: nothing here models `NVreg_EnableGpuFirmware`.
        write(default_mode, on as c_uint)
    }
    /// GSP firmware version: the driver's version, as the firmware ships with the driver;
    /// NOT_SUPPORTED when the GPU does not run GSP firmware. The caller's buffer holds
    /// `NVML_GSP_FIRMWARE_VERSION_BUF_SIZE` bytes (the call takes no length).
    fn nvmlDeviceGetGspFirmwareVersion(version: *mut c_char) |c| {
        c.require(c.gpu.gsp_firmware() == Some(true))?;
        write_str(version, NVML_GSP_FIRMWARE_VERSION_BUF_SIZE, &c.sim.scenario.driver.version)
    }
    /// Host vGPU mode (SR-IOV or not): NOT_SUPPORTED, as on bare metal without the vGPU host
    /// driver.
    fn nvmlDeviceGetHostVgpuMode(_mode: *mut nvmlHostVgpuMode_t) |c| {
        c.require(false)
    }
}
