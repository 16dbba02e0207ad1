//! The exported NVML C functions, grouped as in `nvml.h`.

pub mod events;
pub mod fields;
pub mod gpm;
pub mod identity;
pub mod metrics;
pub mod mig;
pub mod processes;
pub mod reliability;
pub mod system;
