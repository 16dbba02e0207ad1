//! faults.toml makes nvmlInit fail for its first 3 s: with the clock pinned at 1 s, every init
//! attempt answers NVML_ERROR_DRIVER_NOT_LOADED.

use crate::common;
use nvml_wrapper::error::NvmlError;

#[test]
fn init_fails_inside_the_init_fault_window() {
    let _turn = common::turn(&[
        ("NVML_SIM_SCENARIO", Some(&common::scenario("faults.toml"))),
        ("NVML_SIM_TIME", Some("1")),
        ("NVML_SIM_START", None),
    ]);
    for _ in 0..2 {
        let r = common::init();
        assert!(
            matches!(r, Err(NvmlError::DriverNotLoaded)),
            "{:?}",
            r.err()
        );
    }
}
