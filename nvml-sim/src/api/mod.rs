//! The exported NVML C functions, grouped as in `nvml.h`.

#![allow(
    unsafe_code,
    reason = "the exported NVML C functions read and write through the pointers their callers pass"
)]

mod events;
mod fabric;
mod fields;
mod gpm;
mod identity;
mod metrics;
mod mig;
mod processes;
mod reliability;
mod system;
