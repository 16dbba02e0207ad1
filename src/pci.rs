//! The PCI bus as sysfs lists it (`--host-sys`, the `inventory` group): the NVIDIA GPUs on it,
//! so that a GPU the bus has but NVML does not enumerate (the driver lost it, or failed to set it
//! up) is seen. Only the sampler calls it; it imports nothing of the exporter's but the plain
//! data of [`crate::sample`].
//!
//! A GPU is a device of vendor 0x10de whose class is a display controller, VGA (0x0300) or 3D
//! (0x0302): NVSwitches (a bridge, 0x0680), the GPUs' audio functions and other vendors' devices
//! are not. A GPU is expected in NVML's list when its `driver` link names `nvidia`, or when no
//! driver is bound to it (the nvidia driver's probe failed): one bound to another driver
//! (`vfio-pci` to pass it to a virtual machine, `pci-stub`, `nouveau`) was set aside on purpose
//! and is never missing.

use std::io;
use std::path::Path;

use crate::sample::PciGpu;

/// NVIDIA's PCI vendor id.
const NVIDIA_VENDOR: u32 = 0x10de;

/// The PCI classes (class and subclass) of a GPU: a VGA-compatible and a 3D controller.
const GPU_CLASSES: [u32; 2] = [0x0300, 0x0302];

/// The kernel driver NVML reaches its GPUs through.
pub const NVIDIA_DRIVER: &str = "nvidia";

/// The NVIDIA GPUs below `sys` (the host's `/sys`) that NVML should enumerate: bound to the
/// nvidia driver or to none, sorted by address. An error when the bus cannot be listed or a
/// device's attributes cannot be read: the caller then knows nothing, rather than too little.
pub fn expected_gpus(sys: &Path) -> io::Result<Vec<PciGpu>> {
    let mut gpus = Vec::new();
    for entry in std::fs::read_dir(sys.join("bus/pci/devices"))? {
        let device = entry?.path();
        match gpu(&device) {
            Ok(Some(g)) if g.driver.is_empty() || g.driver == NVIDIA_DRIVER => gpus.push(g),
            Ok(_) => {}
            // Removed since the listing (a hot unplug): it is not on the bus any more.
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    gpus.sort();
    Ok(gpus)
}

/// The device at `path` when it is an NVIDIA GPU.
fn gpu(path: &Path) -> io::Result<Option<PciGpu>> {
    if hex(&path.join("vendor"))? != NVIDIA_VENDOR
        || !GPU_CLASSES.contains(&(hex(&path.join("class"))? >> 8))
    {
        return Ok(None);
    }
    let driver = match std::fs::read_link(path.join("driver")) {
        Ok(target) => target
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e),
    };
    let address = path
        .file_name()
        .and_then(|n| normalise(&n.to_string_lossy()))
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "not a PCI address"))?;
    Ok(Some(PciGpu {
        address,
        device_id: format!("0x{:04x}", hex(&path.join("device"))?),
        driver,
    }))
}

/// A sysfs attribute holding one hex number ("0x10de\n").
fn hex(path: &Path) -> io::Result<u32> {
    let text = std::fs::read_to_string(path)?;
    let digits = text.trim();
    u32::from_str_radix(digits.strip_prefix("0x").unwrap_or(digits), 16).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: not a hex number", path.display()),
        )
    })
}

/// A PCI address in sysfs' form, "0000:1b:00.0", from NVML's ("00000000:1B:00.0"), sysfs' own
/// or one without a domain ("1b:00.0"); `None` when it is none of these.
pub fn normalise(address: &str) -> Option<String> {
    let (rest, function) = address.rsplit_once('.')?;
    let mut parts = rest.rsplitn(3, ':');
    let device = parts.next()?;
    let bus = parts.next()?;
    let domain = parts.next().unwrap_or("0");
    let field = |s: &str, max: u32| u32::from_str_radix(s, 16).ok().filter(|v| *v <= max);
    Some(format!(
        "{:04x}:{:02x}:{:02x}.{:x}",
        field(domain, u32::MAX)?,
        field(bus, 0xff)?,
        field(device, 0x1f)?,
        field(function, 7)?
    ))
}

/// The GPUs of `bus` whose address is none of `enumerated` (NVML's bus ids); `None` when an
/// enumerated id cannot be read as an address (an empty one: NVML did not give it), since a GPU
/// could then be counted missing that NVML does list.
pub fn missing<'a>(
    bus: &[PciGpu],
    enumerated: impl IntoIterator<Item = &'a str>,
) -> Option<Vec<PciGpu>> {
    let listed = enumerated
        .into_iter()
        .map(normalise)
        .collect::<Option<Vec<String>>>()?;
    Some(
        bus.iter()
            .filter(|g| !listed.contains(&g.address))
            .cloned()
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_normalise_to_sysfs_form() {
        for (given, want) in [
            ("00000000:1B:00.0", "0000:1b:00.0"),
            ("0000:1b:00.0", "0000:1b:00.0"),
            ("1B:00.0", "0000:1b:00.0"),
            ("00010000:C1:1F.7", "10000:c1:1f.7"),
        ] {
            assert_eq!(normalise(given).as_deref(), Some(want), "{given}");
        }
        for bad in [
            "",
            "1b:00",
            "0000:1g:00.0",
            "0000:1b:20.0",
            "0000:1b:00.8",
            "x:y:z.w",
        ] {
            assert_eq!(normalise(bad), None, "{bad}");
        }
    }

    fn gpu(address: &str) -> PciGpu {
        PciGpu {
            address: address.into(),
            device_id: "0x2330".into(),
            driver: NVIDIA_DRIVER.into(),
        }
    }

    #[test]
    fn missing_is_the_bus_less_what_nvml_lists_and_unknown_without_an_address() {
        let bus = [gpu("0000:1b:00.0"), gpu("0000:43:00.0")];
        assert_eq!(
            missing(&bus, ["00000000:1B:00.0"]),
            Some(vec![gpu("0000:43:00.0")])
        );
        assert_eq!(
            missing(&bus, ["00000000:1B:00.0", "00000000:43:00.0"]),
            Some(vec![])
        );
        assert_eq!(missing(&bus, ["00000000:1B:00.0", ""]), None);
    }
}
