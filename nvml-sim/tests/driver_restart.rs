//! A driver restart on a running clock: two GPUs, the driver reloads from t = 0.4 s to 1 s and
//! GPU 0 is gone afterwards. While it reloads every call answers UNINITIALIZED and a new init
//! DRIVER_NOT_LOADED; afterwards the device set has one GPU, renumbered, and the old handle of the
//! vanished one answers GPU_IS_LOST.

mod common;

use nvml_wrapper::Nvml;
use nvml_wrapper::error::NvmlError;
use std::time::{Duration, Instant};

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

fn init() -> Result<Nvml, NvmlError> {
    Nvml::builder()
        .lib_path(common::lib_path().as_os_str())
        .init()
}

/// Polls `f` until it returns Some, for at most 5 s.
fn eventually<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn calls_fail_during_the_restart_and_the_device_set_changes_after_it() {
    let path = std::env::temp_dir().join(format!("nvml-sim-restart-{}.toml", std::process::id()));
    std::fs::write(&path, SCENARIO).unwrap();
    common::set_env(&[
        ("NVML_SIM_SCENARIO", Some(path.to_str().unwrap())),
        ("NVML_SIM_TIME", None),
        ("NVML_SIM_START", None),
    ]);
    let nvml = init().expect("init before the restart");
    assert_eq!(nvml.device_count().unwrap(), 2);
    let gpu_a = nvml.device_by_index(0).unwrap();
    assert_eq!(
        gpu_a.uuid().unwrap(),
        "GPU-aaaaaaaa-0000-4000-8000-000000000001"
    );

    // The reload starts: every call, with or without a device, answers UNINITIALIZED.
    eventually("the restart", || {
        matches!(nvml.device_count(), Err(NvmlError::Uninitialized)).then_some(())
    });
    assert!(matches!(gpu_a.name(), Err(NvmlError::Uninitialized)));
    assert!(matches!(
        nvml.sys_driver_version(),
        Err(NvmlError::Uninitialized)
    ));
    let during = init();
    assert!(
        matches!(during, Err(NvmlError::DriverNotLoaded)),
        "{:?}",
        during.err()
    );

    // After it: one GPU, now at index 0; the vanished one's handle is lost, its UUID unknown.
    let count = eventually("the driver back", || nvml.device_count().ok());
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
    let again = init().expect("init after the restart");
    assert_eq!(again.device_count().unwrap(), 1);
    let _ = std::fs::remove_file(&path);
}
