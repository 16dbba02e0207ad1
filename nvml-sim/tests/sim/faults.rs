//! Injected faults at a pinned t = 75 s: a lost GPU (repeating window), a hanging call, a
//! per-function error and an error window that does not cover t.

use crate::common::{self, Session};
use nvml_wrapper::enum_wrappers::device::TemperatureSensor;
use nvml_wrapper::error::NvmlError;
use std::time::{Duration, Instant};

const SCENARIO: &str = r#"
[[gpu]]
model = "L4"
uuid = "GPU-00000000-0000-4000-8000-000000000000"
pci_bus_id = "01:00.0"
serial = "0"
[[gpu]]
model = "L4"
uuid = "GPU-00000000-0000-4000-8000-000000000001"
pci_bus_id = "02:00.0"
serial = "1"
[[gpu]]
model = "L4"
uuid = "GPU-00000000-0000-4000-8000-000000000002"
pci_bus_id = "03:00.0"
serial = "2"
[[gpu]]
model = "L4"
uuid = "GPU-00000000-0000-4000-8000-000000000003"
pci_bus_id = "04:00.0"
serial = "3"

[[fault]]          # covers t = 75 through its repeat: 75 - 10 = 65 ≡ 5 (mod 60)
kind = "lost"
gpu = 1
from = 10
to = 20
repeat = 60
[[fault]]
kind = "hang"
gpu = 2
function = "nvmlDeviceGetTemperature"
seconds = 0.5
from = 70
to = 80
[[fault]]
kind = "error"
gpu = 3
function = "nvmlDeviceGetPowerUsage"
error = "UNKNOWN"
from = 70
to = 80
[[fault]]          # over before t = 75
kind = "error"
gpu = 0
error = "TIMEOUT"
from = 0
to = 74
"#;

fn session() -> Session {
    static PATH: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    let path = PATH.get_or_init(|| {
        let p = std::env::temp_dir().join(format!("nvml-sim-faults-{}.toml", std::process::id()));
        std::fs::write(&p, SCENARIO).unwrap();
        p
    });
    common::session(&[
        ("NVML_SIM_SCENARIO", Some(path.to_str().unwrap())),
        ("NVML_SIM_TIME", Some("75")),
        ("NVML_SIM_START", None),
    ])
}

#[test]
fn lost_gpu_answers_gpu_is_lost() {
    let nvml = session();
    assert!(matches!(nvml.device_by_index(1), Err(NvmlError::GpuLost)));
    assert_eq!(nvml.device_count().unwrap(), 4);
    // A handle obtained some other way fails the same on every call.
    let d = nvml
        .device_by_uuid("GPU-00000000-0000-4000-8000-000000000001")
        .unwrap();
    assert!(matches!(d.name(), Err(NvmlError::GpuLost)));
    assert!(matches!(d.power_usage(), Err(NvmlError::GpuLost)));
}

#[test]
fn hanging_call_blocks_then_answers() {
    let nvml = session();
    let d = nvml.device_by_index(2).unwrap();
    let start = Instant::now();
    assert!(d.temperature(TemperatureSensor::Gpu).is_ok());
    assert!(start.elapsed() >= Duration::from_millis(500));
    let start = Instant::now();
    d.power_usage().unwrap();
    assert!(
        start.elapsed() < Duration::from_millis(400),
        "only the named function hangs"
    );
}

#[test]
fn error_hits_only_the_named_function_and_device() {
    let nvml = session();
    let d3 = nvml.device_by_index(3).unwrap();
    assert!(matches!(d3.power_usage(), Err(NvmlError::Unknown)));
    assert!(d3.name().is_ok());
    // GPU0's TIMEOUT window ended at 74 s.
    assert!(nvml.device_by_index(0).unwrap().power_usage().is_ok());
}
