//! A fake sysfs for `--host-sys`, laid out as the kernel lays it out: each PCI device a
//! directory under `devices/pci0000:00/` with its `vendor`, `device` and `class` attributes, a
//! link to it in `bus/pci/devices/`, and a `driver` link to `bus/pci/drivers/NAME` when a driver
//! is bound.

use std::os::unix::fs::symlink;
use std::path::Path;

/// One PCI function.
pub struct PciDevice<'a> {
    /// "0000:1b:00.0".
    pub address: &'a str,
    pub vendor: u16,
    pub device: u16,
    /// Class, subclass and programming interface, e.g. 0x030200 (a 3D controller).
    pub class: u32,
    /// The bound driver's name.
    pub driver: Option<&'a str>,
}

/// NVIDIA's vendor id.
pub const NVIDIA: u16 = 0x10de;

/// An H100 SXM bound to the nvidia driver at `address`.
pub fn h100(address: &str) -> PciDevice<'_> {
    PciDevice {
        address,
        vendor: NVIDIA,
        device: 0x2330,
        class: 0x030200,
        driver: Some("nvidia"),
    }
}

/// The PCI addresses of the GPUs of `h100x8.toml` (and `fabric.toml`), in sysfs' form.
pub const H100X8: [&str; 8] = [
    "0000:1b:00.0",
    "0000:43:00.0",
    "0000:52:00.0",
    "0000:61:00.0",
    "0000:9d:00.0",
    "0000:c3:00.0",
    "0000:d1:00.0",
    "0000:df:00.0",
];

/// A sysfs holding `devices`, in a directory removed on drop.
pub fn sysfs(devices: &[PciDevice]) -> tempfile::TempDir {
    let root = tempfile::tempdir().expect("temp dir");
    let sys = root.path();
    std::fs::create_dir_all(sys.join("bus/pci/devices")).unwrap();
    for d in devices {
        let dir = sys.join("devices/pci0000:00").join(d.address);
        std::fs::create_dir_all(&dir).unwrap();
        let write = |name: &str, text: String| std::fs::write(dir.join(name), text).unwrap();
        write("vendor", format!("0x{:04x}\n", d.vendor));
        write("device", format!("0x{:04x}\n", d.device));
        write("class", format!("0x{:06x}\n", d.class));
        if let Some(driver) = d.driver {
            std::fs::create_dir_all(sys.join("bus/pci/drivers").join(driver)).unwrap();
            symlink(
                Path::new("../../../bus/pci/drivers").join(driver),
                dir.join("driver"),
            )
            .unwrap();
        }
        symlink(
            Path::new("../../../devices/pci0000:00").join(d.address),
            sys.join("bus/pci/devices").join(d.address),
        )
        .unwrap();
    }
    root
}
