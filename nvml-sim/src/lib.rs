//! nvml-sim: a simulated NVIDIA driver library.
//!
//! Built as `libnvml_sim.so`, it exports the NVML C ABI (plain and versioned symbol names, as the
//! real `libnvidia-ml.so.1` does) and answers from a scenario file: GPUs, load patterns over
//! time, XID events and injected faults. Any NVML client (nvml-wrapper, pynvml, gpustat) can load
//! it in place of the driver's library. See README.md for the scenario schema and environment.
//!
//! The NVML entry points are C symbols, not Rust items: the only Rust API is [`built_library`],
//! which tests use to find the cdylib.

mod activity;
mod api;
mod device;
mod errors;
mod events;
mod fabric;
mod faults;
mod ffi;
mod gpm;
mod integrals;
mod load;
mod mig;
mod pattern;
mod physics;
mod replay;
mod scenario;
mod state;

/// The file name cargo gives this crate's cdylib.
const LIBRARY_FILE_NAME: &str = "libnvml_sim.so";

/// Where cargo put this library's cdylib for the running executable: in the same directory (a
/// test binary in `target/<profile>/deps/`, where a dependency's cdylib lands) or one level up
/// (`target/<profile>/`, where a built workspace member is copied). For tests of this crate and of
/// its clients, which load it by path exactly as they would load the driver.
pub fn built_library() -> Option<std::path::PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    [Some(dir), dir.parent()]
        .into_iter()
        .flatten()
        .map(|d| d.join(LIBRARY_FILE_NAME))
        .find(|p| p.exists())
}
