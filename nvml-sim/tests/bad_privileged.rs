//! An `NVML_SIM_PRIVILEGED` that is neither 0/1 nor false/true makes nvmlInit fail, rather than
//! silently simulating one kind of caller when the test meant the other.

mod common;

use nvml_wrapper::Nvml;
use nvml_wrapper::error::NvmlError;

#[test]
fn init_fails_on_an_unknown_privilege_value() {
    common::set_env(&[
        ("NVML_SIM_SCENARIO", None),
        ("NVML_SIM_TIME", Some("1")),
        ("NVML_SIM_PRIVILEGED", Some("no")),
    ]);
    let r = Nvml::builder()
        .lib_path(common::lib_path().as_os_str())
        .init();
    assert!(matches!(r, Err(NvmlError::Unknown)), "{:?}", r.err());
}
