//! A scenario that does not parse makes nvmlInit fail (the reason goes to stderr).

use crate::common;
use nvml_wrapper::error::NvmlError;

#[test]
fn init_fails_on_a_bad_scenario() {
    let path = std::env::temp_dir().join(format!("nvml-sim-bad-{}.toml", std::process::id()));
    std::fs::write(
        &path,
        "[[gpu]]\nmodel = \"H100-SXM5-80GB\"\nuuid = \"GPU-1\"\n",
    )
    .unwrap();
    let _turn = common::turn(&[("NVML_SIM_SCENARIO", Some(path.to_str().unwrap()))]);
    let r = common::init();
    std::fs::remove_file(&path).ok();
    assert!(matches!(r, Err(NvmlError::Unknown)), "{:?}", r.err());
}
