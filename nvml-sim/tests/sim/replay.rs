//! `[gpu.replay]`: recorded readings answer as recorded, step by step; counters keep growing when
//! the trace starts over; a reading the recording lacks answers NOT_SUPPORTED.

use crate::common;
use nvml_wrapper::enum_wrappers::device::{
    Clock, EccCounter, MemoryError, PerformancePolicy, TemperatureSensor,
};
use nvml_wrapper::error::NvmlError;

const SCENARIO: &str = r#"
[[gpu]]
model = "H100-SXM5-80GB"
uuid = "GPU-replay-0"
pci_bus_id = "01:00.0"
serial = "1"
nvlink = { links = 2 }
[gpu.replay]
step = 2
utilization = [10, 20, 30]
memory_utilization = 5
power_mw = [100123, 200456, 300789]
energy_mj = [1000, 1500, 2500]
sm_mhz = 1410
violation_ns = { power = [0, 7, 9] }
ecc_corrected = [3, 3, 4]
nvlink_replay = [[1, 2, 3], 0]
[[gpu.process]]
pid = 7
name = "recorded"
used_memory_mib = 1024
replay = { step = 2, sm = [11, 37, 5], memory = 4, encoder = 0, decoder = 0 }
[[gpu.process]]
pid = 8
name = "split"
used_memory_mib = 1024
"#;

#[test]
fn replayed_readings_step_cycle_and_keep_counting() {
    let path = std::env::temp_dir().join(format!("nvml-sim-replay-{}.toml", std::process::id()));
    std::fs::write(&path, SCENARIO).unwrap();
    // t = 8 s: step 4, so gauges are in their second pass at value 1 and counters add one pass.
    let nvml = common::session(&[
        ("NVML_SIM_SCENARIO", Some(path.to_str().unwrap())),
        ("NVML_SIM_TIME", Some("8")),
    ]);
    std::fs::remove_file(&path).ok();
    let d = nvml.device_by_index(0).unwrap();
    let u = d.utilization_rates().unwrap();
    assert_eq!((u.gpu, u.memory), (20, 5));
    assert_eq!(d.power_usage().unwrap(), 200456);
    assert_eq!(d.clock_info(Clock::SM).unwrap(), 1410);
    // Counters: value 1 of the second pass plus one pass's growth (last − first).
    assert_eq!(d.total_energy_consumption().unwrap(), 1500 + 1500);
    let power = d.violation_status(PerformancePolicy::Power).unwrap();
    assert_eq!(power.violation_time, 7 + 9);
    let ecc = d.total_ecc_errors(MemoryError::Corrected, EccCounter::Volatile);
    assert_eq!(ecc.unwrap(), 3 + 1);
    let link0 = d.link_wrapper_for(0);
    assert_eq!(
        link0
            .error_counter(nvml_wrapper::enum_wrappers::nv_link::ErrorCounter::DlReplay)
            .unwrap(),
        2 + 2
    );
    // A process with its own recording answers it; one without splits the GPU's utilization
    // (20 %) by memory share.
    let mut stats = d.process_utilization_stats(0).unwrap();
    stats.sort_by_key(|s| s.pid);
    let by_pid: Vec<_> = stats
        .iter()
        .map(|s| (s.pid, s.sm_util, s.mem_util))
        .collect();
    assert_eq!(by_pid, [(7, 37, 4), (8, 10, 3)]);
    // Left out of the recording: NOT_SUPPORTED, not a simulated value.
    assert!(matches!(
        d.temperature(TemperatureSensor::Gpu),
        Err(NvmlError::NotSupported)
    ));
    assert!(matches!(
        d.clock_info(Clock::Memory),
        Err(NvmlError::NotSupported)
    ));
    assert!(matches!(
        d.violation_status(PerformancePolicy::Thermal),
        Err(NvmlError::NotSupported)
    ));
    assert!(matches!(
        d.link_wrapper_for(1)
            .error_counter(nvml_wrapper::enum_wrappers::nv_link::ErrorCounter::DlRecovery),
        Err(NvmlError::NotSupported)
    ));
}

#[test]
fn a_replay_with_a_list_per_link_of_the_wrong_length_is_refused() {
    let bad = SCENARIO.replace("nvlink_replay = [[1, 2, 3], 0]", "nvlink_replay = [0]");
    let path =
        std::env::temp_dir().join(format!("nvml-sim-replay-bad-{}.toml", std::process::id()));
    std::fs::write(&path, bad).unwrap();
    let _turn = common::turn(&[("NVML_SIM_SCENARIO", Some(path.to_str().unwrap()))]);
    let r = common::init();
    std::fs::remove_file(&path).ok();
    assert!(matches!(r, Err(NvmlError::Unknown)), "{:?}", r.err());
}
