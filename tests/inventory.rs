//! The GPUs the PCI bus lists that NVML does not enumerate (`--host-sys`, the inventory group),
//! end to end: the real binary with `--once` on the default scenario (eight H100s) and a fake
//! sysfs built here. A GPU of the bus that NVML lacks is counted and named; an NVSwitch, another
//! vendor's display controller and a GPU bound to vfio-pci are not; a bus that cannot be read
//! says nothing rather than "none missing".

mod common;

use common::sysfs::{H100X8, NVIDIA, PciDevice, h100, sysfs};
use common::{Exposition, run_once};

/// `--once` with the PCI bus of `sys`.
fn once(sys: &std::path::Path) -> Exposition {
    let out = run_once(&[("NVML_EXPORTER_HOST_SYS", sys.to_str().unwrap())], &[]);
    assert!(out.status.success(), "{out:?}");
    Exposition::parse(&String::from_utf8(out.stdout).unwrap())
}

/// The default scenario's eight GPUs, bound to the nvidia driver.
fn scenario_gpus() -> Vec<PciDevice<'static>> {
    H100X8.iter().map(|a| h100(a)).collect()
}

#[test]
fn a_gpu_the_bus_lists_and_nvml_does_not_is_counted_and_named() {
    let mut devices = scenario_gpus();
    devices.extend([
        // The GPU the driver lost.
        h100("0000:ca:00.0"),
        // An NVSwitch (a bridge), bound to its own driver.
        PciDevice {
            address: "0000:05:00.0",
            vendor: NVIDIA,
            device: 0x22a3,
            class: 0x068000,
            driver: Some("nvidia-nvswitch"),
        },
        // The BMC's VGA controller (ASPEED).
        PciDevice {
            address: "0000:03:00.0",
            vendor: 0x1a03,
            device: 0x2000,
            class: 0x030000,
            driver: Some("ast"),
        },
        // A GPU passed to a virtual machine on purpose.
        PciDevice {
            driver: Some("vfio-pci"),
            ..h100("0000:e5:00.0")
        },
        // An NVIDIA audio function of a display board.
        PciDevice {
            address: "0000:c3:00.1",
            vendor: NVIDIA,
            device: 0x22ba,
            class: 0x040300,
            driver: Some("snd_hda_intel"),
        },
    ]);
    let sys = sysfs(&devices);
    let m = once(sys.path());
    assert_eq!(m.value("nvidia_node_gpus_missing", &[]), Some(1.0));
    let named = m.find("nvidia_node_missing_gpu_info", &[]);
    assert_eq!(named.len(), 1, "{}", m.text);
    assert_eq!(
        named[0].labels.get("pci_bus_id").map(String::as_str),
        Some("0000:ca:00.0")
    );
    assert_eq!(
        (
            named[0].labels["device_id"].as_str(),
            named[0].labels["driver"].as_str()
        ),
        ("0x2330", "nvidia")
    );
}

#[test]
fn a_gpu_no_driver_took_is_missing_and_one_on_the_bus_alone_is_not() {
    // Only the scenario's GPUs: none missing.
    let sys = sysfs(&scenario_gpus());
    let m = once(sys.path());
    assert_eq!(m.value("nvidia_node_gpus_missing", &[]), Some(0.0));
    assert!(m.find("nvidia_node_missing_gpu_info", &[]).is_empty());

    // A GPU the nvidia driver failed to set up has no driver bound: missing, with an empty
    // driver label.
    let mut devices = scenario_gpus();
    devices.push(PciDevice {
        driver: None,
        ..h100("0000:ca:00.0")
    });
    let sys = sysfs(&devices);
    let m = once(sys.path());
    assert_eq!(m.value("nvidia_node_gpus_missing", &[]), Some(1.0));
    assert_eq!(
        m.value(
            "nvidia_node_missing_gpu_info",
            &[("pci_bus_id", "0000:ca:00.0"), ("driver", "")]
        ),
        Some(1.0)
    );
}

#[test]
fn a_bus_that_cannot_be_read_is_unknown_never_none_missing() {
    let absent = tempfile::tempdir().unwrap();
    let m = once(&absent.path().join("no-such-sys"));
    assert_eq!(m.value("nvidia_node_gpus_missing", &[]), None, "{}", m.text);
    assert!(m.value("nvidia_gpu_up", &[("gpu", "0")]) == Some(1.0));

    // A device whose attributes cannot be read as sysfs writes them: nothing is told.
    let mut devices = scenario_gpus();
    devices.push(h100("0000:ca:00.0"));
    let sys = sysfs(&devices);
    std::fs::write(
        sys.path().join("devices/pci0000:00/0000:ca:00.0/vendor"),
        "garbage\n",
    )
    .unwrap();
    let m = once(sys.path());
    assert_eq!(m.value("nvidia_node_gpus_missing", &[]), None, "{}", m.text);
    assert!(m.find("nvidia_node_missing_gpu_info", &[]).is_empty());
}

#[test]
fn the_inventory_group_off_reads_no_bus_and_serves_nothing() {
    let mut devices = scenario_gpus();
    devices.push(h100("0000:ca:00.0"));
    let sys = sysfs(&devices);
    let out = run_once(
        &[("NVML_EXPORTER_HOST_SYS", sys.path().to_str().unwrap())],
        &["--no-collector.inventory"],
    );
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(!text.contains("nvidia_node_"), "{text}");
}
