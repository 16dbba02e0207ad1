//! Shared test setup: load the built `libnvml_sim.so` through nvml-wrapper, exactly as the
//! exporter does, with the environment each test file needs.
//!
//! The environment is read by the library at its first init, so every test file (its own
//! process) sets it once, before that init, under a `OnceLock`.

#![allow(dead_code)]

use nvml_wrapper::Nvml;
use std::path::PathBuf;
use std::sync::OnceLock;

/// The cdylib cargo built next to this test binary.
pub fn lib_path() -> PathBuf {
    nvml_sim::built_library().expect("libnvml_sim.so built next to the test executable")
}

/// Path of a shipped scenario.
pub fn scenario(name: &str) -> String {
    format!("{}/scenarios/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// Sets `vars` (None: removed) and initializes NVML once for this test process.
pub fn nvml(vars: &[(&str, Option<&str>)]) -> &'static Nvml {
    static NVML: OnceLock<Nvml> = OnceLock::new();
    NVML.get_or_init(|| {
        set_env(vars);
        Nvml::builder()
            .lib_path(lib_path().as_os_str())
            .init()
            .expect("nvml init against the simulator")
    })
}

/// Sets or removes environment variables.
pub fn set_env(vars: &[(&str, Option<&str>)]) {
    for (k, v) in vars {
        // SAFETY: called once per process before the library reads the environment, while the
        // other tests of the file wait on the same OnceLock.
        unsafe {
            match v {
                Some(v) => std::env::set_var(k, v),
                None => std::env::remove_var(k),
            }
        }
    }
}
