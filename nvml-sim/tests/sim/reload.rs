//! The simulation after a full shutdown: the first `nvmlInit` that finds no live reference reads
//! the environment and the scenario again. The same ones keep the simulation and its clocks, as a
//! real driver outlives a client that re-initialises after a driver restart; anything changed
//! starts a new simulation with its own clock, and the handles of the earlier one get a clean
//! error.

use crate::common;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper_sys::bindings::{
    self as b, NVML_GPM_METRICS_GET_VERSION, NvmlLib, nvmlDevice_t, nvmlGpmMetricsGet_t,
    nvmlGpmSample_t, nvmlReturn_t,
};
use std::os::raw::c_char;
use std::path::PathBuf;
use std::time::Duration;

const SUCCESS: nvmlReturn_t = b::nvmlReturn_enum_NVML_SUCCESS;
const INVALID_ARGUMENT: nvmlReturn_t = b::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;

/// One L4; the driver restarts from t = 0.5 s for a minute.
const RESTARTING: &str = r#"
[[gpu]]
model = "L4"
uuid = "GPU-aaaaaaaa-0000-4000-8000-000000000001"
pci_bus_id = "01:00.0"
serial = "1"

[[fault]]
kind = "driver_restart"
from = 0.5
to = 60
"#;

/// One L4; nvmlInit fails for the first 0.3 s.
const LATE_DRIVER: &str = r#"
[[gpu]]
model = "L4"
uuid = "GPU-aaaaaaaa-0000-4000-8000-000000000001"
pci_bus_id = "01:00.0"
serial = "1"

[[fault]]
kind = "init"
error = "DRIVER_NOT_LOADED"
to = 0.3
"#;

/// A scenario file of this test process, removed when dropped.
struct ScenarioFile(PathBuf);

impl ScenarioFile {
    fn new(name: &str, text: &str) -> ScenarioFile {
        let path = std::env::temp_dir().join(format!(
            "nvml-sim-reload-{name}-{}.toml",
            std::process::id()
        ));
        std::fs::write(&path, text).unwrap();
        ScenarioFile(path)
    }

    fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for ScenarioFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Waits until the running clock has reached the restart: every call answers UNINITIALIZED.
fn wait_for_the_restart(nvml: &nvml_wrapper::Nvml) {
    common::eventually("the restart", || {
        matches!(nvml.device_count(), Err(NvmlError::Uninitialized)).then_some(())
    });
}

#[test]
fn a_changed_environment_is_read_at_the_first_init_after_a_full_shutdown() {
    let l4x2 = common::scenario("l4x2.toml");
    let turn = common::turn(&[
        ("NVML_SIM_SCENARIO", Some(&l4x2)),
        ("NVML_SIM_TIME", Some("10")),
    ]);
    let first = common::init().expect("init on l4x2");
    assert_eq!(first.device_count().unwrap(), 2);
    // The default scenario now, but a reference is live: the library keeps its simulation.
    common::set_env(&turn, &[("NVML_SIM_TIME", Some("10"))]);
    let second = common::init().expect("a second reference");
    assert_eq!(second.device_count().unwrap(), 2);
    drop(first);
    drop(second);
    let third = common::init().expect("init on h100x8");
    assert_eq!(third.device_count().unwrap(), 8);
    assert_eq!(
        third.device_by_index(0).unwrap().name().unwrap(),
        "NVIDIA H100 80GB HBM3"
    );
}

#[test]
fn the_same_environment_and_scenario_keep_the_clock() {
    let file = ScenarioFile::new("restart", RESTARTING);
    let turn = common::turn(&[("NVML_SIM_SCENARIO", Some(file.path()))]);
    let nvml = common::init().expect("init before the restart");
    wait_for_the_restart(&nvml);
    // A client that drops NVML and initializes it again finds the driver still restarting: the
    // simulation went on, it did not replay from t = 0.
    drop(nvml);
    let again = common::init();
    assert!(
        matches!(again, Err(NvmlError::DriverNotLoaded)),
        "{:?}",
        again.err()
    );

    // Another scenario text: a new simulation, whose clock starts at 0, before its restart.
    std::fs::write(&file.0, format!("{RESTARTING}# changed\n")).unwrap();
    let nvml = common::init().expect("a new simulation before its restart");
    assert_eq!(nvml.device_count().unwrap(), 1);
    wait_for_the_restart(&nvml);
    drop(nvml);
    let again = common::init();
    assert!(
        matches!(again, Err(NvmlError::DriverNotLoaded)),
        "{:?}",
        again.err()
    );

    // The same text in another environment (a start given, even if 0): a new simulation too.
    common::set_env(
        &turn,
        &[
            ("NVML_SIM_SCENARIO", Some(file.path())),
            ("NVML_SIM_START", Some("0")),
        ],
    );
    let nvml = common::init().expect("a new simulation after the environment changed");
    assert_eq!(nvml.device_count().unwrap(), 1);
}

#[test]
fn the_init_fault_clock_runs_across_failed_attempts_and_shutdowns() {
    let file = ScenarioFile::new("late-driver", LATE_DRIVER);
    let _turn = common::turn(&[("NVML_SIM_SCENARIO", Some(file.path()))]);
    let first = common::init();
    assert!(
        matches!(first, Err(NvmlError::DriverNotLoaded)),
        "{:?}",
        first.err()
    );
    // Every failed attempt reads the environment again and keeps the simulation, so the fault's
    // 0.3 s run out instead of starting over at each retry.
    let nvml = common::eventually("an init after the init fault", || common::init().ok());
    drop(nvml);
    let again = common::init();
    assert!(again.is_ok(), "the same simulation: {:?}", again.err());
}

/// nvmlGpmMetricsGet asking for SM activity between two samples: the call's return code.
///
/// # Safety
/// `lib` is the initialized simulator; the samples are its handles.
unsafe fn sm_activity(lib: &NvmlLib, s1: nvmlGpmSample_t, s2: nvmlGpmSample_t) -> nvmlReturn_t {
    // SAFETY: all-zero is a valid nvmlGpmMetricsGet_t (null samples, null name pointers).
    let mut request: Box<nvmlGpmMetricsGet_t> = Box::new(unsafe { std::mem::zeroed() });
    request.version = NVML_GPM_METRICS_GET_VERSION;
    request.numMetrics = 1;
    request.sample1 = s1;
    request.sample2 = s2;
    request.metrics[0].metricId = 2;
    // SAFETY: the request is a valid struct with room for every metric NVML may touch.
    unsafe { lib.nvmlGpmMetricsGet(&mut *request) }
}

#[test]
fn handles_of_an_earlier_simulation_get_a_clean_error() {
    let turn = common::turn(&[("NVML_SIM_START", Some("100"))]);
    // SAFETY: loads the simulator and calls its exported functions with valid out-pointers and
    // the handles it gave.
    unsafe {
        let lib = NvmlLib::new(common::lib_path()).expect("load libnvml_sim.so");
        assert_eq!(lib.nvmlInit_v2(), SUCCESS);
        let mut gpu5: nvmlDevice_t = std::ptr::null_mut();
        assert_eq!(lib.nvmlDeviceGetHandleByIndex_v2(5, &mut gpu5), SUCCESS);
        let mut set = std::ptr::null_mut();
        assert_eq!(lib.nvmlEventSetCreate(&mut set), SUCCESS);
        let (mut s1, mut s2) = (std::ptr::null_mut(), std::ptr::null_mut());
        assert_eq!(lib.nvmlGpmSampleAlloc(&mut s1), SUCCESS);
        assert_eq!(lib.nvmlGpmSampleAlloc(&mut s2), SUCCESS);
        assert_eq!(lib.nvmlGpmSampleGet(gpu5, s1), SUCCESS);
        // A real wait: the GPM unit refreshes every 100 ms, and the clock is running.
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(lib.nvmlGpmSampleGet(gpu5, s2), SUCCESS);
        assert_eq!(sm_activity(&lib, s1, s2), SUCCESS);
        assert_eq!(lib.nvmlShutdown(), SUCCESS);

        // The same eight GPUs from another start: a new simulation, where the samples and the
        // event set of the earlier one are unknown.
        common::set_env(&turn, &[("NVML_SIM_START", Some("200"))]);
        assert_eq!(lib.nvmlInit_v2(), SUCCESS);
        assert_eq!(sm_activity(&lib, s1, s2), INVALID_ARGUMENT);
        let mut new_set = std::ptr::null_mut();
        assert_eq!(lib.nvmlEventSetCreate(&mut new_set), SUCCESS);
        assert_ne!(new_set, set);
        assert_eq!(lib.nvmlEventSetFree(set), INVALID_ARGUMENT);
        assert_eq!(lib.nvmlEventSetFree(new_set), SUCCESS);
        assert_eq!(lib.nvmlShutdown(), SUCCESS);

        // Two GPUs: the earlier handle of GPU 5 names none of them.
        let l4x2 = common::scenario("l4x2.toml");
        common::set_env(&turn, &[("NVML_SIM_SCENARIO", Some(&l4x2))]);
        assert_eq!(lib.nvmlInit_v2(), SUCCESS);
        let mut name = [0 as c_char; 96];
        assert_eq!(
            lib.nvmlDeviceGetName(gpu5, name.as_mut_ptr(), 96),
            INVALID_ARGUMENT
        );
        // A sample buffer is freed whatever simulation filled it.
        assert_eq!(lib.nvmlGpmSampleFree(s1), SUCCESS);
        assert_eq!(lib.nvmlGpmSampleFree(s2), SUCCESS);
        assert_eq!(lib.nvmlShutdown(), SUCCESS);
    }
}
