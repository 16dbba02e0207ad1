//! A driver restart on a running clock: two GPUs, the driver reloads from t = 0.4 s to 1 s and
//! GPU 0 is gone afterwards. While it reloads every call answers UNINITIALIZED and a new init
//! DRIVER_NOT_LOADED; afterwards the device set has one GPU, renumbered, and the old handle of the
//! vanished one answers GPU_IS_LOST.

use crate::common;
use nvml_wrapper::error::NvmlError;

const SCENARIO: &str = r#"
[[gpu]]
model = "L4"
uuid = "GPU-aaaaaaaa-0000-4000-8000-000000000001"
pci_bus_id = "01:00.0"
serial = "1"

[[gpu]]
model = "L4"
uuid = "GPU-bbbbbbbb-0000-4000-8000-000000000002"
pci_bus_id = "02:00.0"
serial = "2"

[[fault]]
kind = "driver_restart"
from = 0.4
to = 1.0
drop_gpus = [0]
"#;

#[test]
fn calls_fail_during_the_restart_and_the_device_set_changes_after_it() {
    let path = std::env::temp_dir().join(format!("nvml-sim-restart-{}.toml", std::process::id()));
    std::fs::write(&path, SCENARIO).unwrap();
    let _turn = common::turn(&[("NVML_SIM_SCENARIO", Some(path.to_str().unwrap()))]);
    let nvml = common::init().expect("init before the restart");
    assert_eq!(nvml.device_count().unwrap(), 2);
    let gpu_a = nvml.device_by_index(0).unwrap();
    assert_eq!(
        gpu_a.uuid().unwrap(),
        "GPU-aaaaaaaa-0000-4000-8000-000000000001"
    );

    // The reload starts: every call, with or without a device, answers UNINITIALIZED.
    common::eventually("the restart", || {
        matches!(nvml.device_count(), Err(NvmlError::Uninitialized)).then_some(())
    });
    assert!(matches!(gpu_a.name(), Err(NvmlError::Uninitialized)));
    assert!(matches!(
        nvml.sys_driver_version(),
        Err(NvmlError::Uninitialized)
    ));
    let during = common::init();
    assert!(
        matches!(during, Err(NvmlError::DriverNotLoaded)),
        "{:?}",
        during.err()
    );

    // After it: one GPU, now at index 0; the vanished one's handle is lost, its UUID unknown.
    let count = common::eventually("the driver back", || nvml.device_count().ok());
    assert_eq!(count, 1);
    let first = nvml.device_by_index(0).unwrap();
    assert_eq!(
        first.uuid().unwrap(),
        "GPU-bbbbbbbb-0000-4000-8000-000000000002"
    );
    assert_eq!(first.index().unwrap(), 0);
    assert!(matches!(
        nvml.device_by_index(1),
        Err(NvmlError::InvalidArg)
    ));
    assert!(matches!(gpu_a.name(), Err(NvmlError::GpuLost)));
    assert!(matches!(
        nvml.device_by_uuid("GPU-aaaaaaaa-0000-4000-8000-000000000001"),
        Err(NvmlError::NotFound)
    ));
    let again = common::init().expect("init after the restart");
    assert_eq!(again.device_count().unwrap(), 1);
    let _ = std::fs::remove_file(&path);
}
