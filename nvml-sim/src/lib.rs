//! nvml-sim: a simulated NVIDIA driver library.
//!
//! Built as `libnvml_sim.so`, it exports the NVML C ABI (plain and versioned symbol names, as the
//! real `libnvidia-ml.so.1` does) and answers from a scenario file: GPUs, load patterns over
//! time, XID events and injected faults. Any NVML client (nvml-wrapper, pynvml, gpustat) can load
//! it in place of the driver's library. See README.md for the scenario schema and environment.

pub mod activity;
pub mod api;
pub mod device;
pub mod errors;
pub mod events;
pub mod faults;
mod ffi;
pub mod gpm;
pub mod integrals;
pub mod pattern;
pub mod physics;
pub mod scenario;
pub mod state;

pub use ffi::DeviceCall;
