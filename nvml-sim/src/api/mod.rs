//! The exported NVML C functions, grouped as in `nvml.h`.

mod events;
mod fields;
mod gpm;
mod identity;
mod metrics;
mod mig;
mod processes;
mod reliability;
mod system;
