//! An `NVML_SIM_PRIVILEGED` that is neither 0/1 nor false/true makes nvmlInit fail, rather than
//! silently simulating one kind of caller when the test meant the other.

use crate::common;
use nvml_wrapper::error::NvmlError;

#[test]
fn init_fails_on_an_unknown_privilege_value() {
    let _turn = common::turn(&[
        ("NVML_SIM_SCENARIO", None),
        ("NVML_SIM_TIME", Some("1")),
        ("NVML_SIM_PRIVILEGED", Some("no")),
    ]);
    let r = common::init();
    assert!(matches!(r, Err(NvmlError::Unknown)), "{:?}", r.err());
}
