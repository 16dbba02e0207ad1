//! Everything that talks to NVML (through nvml-wrapper): loading the library, discovering
//! devices, reading a device for one tick (GPM saturation included), XID events. The rest of the exporter sees only the
//! plain data of [`crate::sample`].

pub mod device;
pub mod discovery;
pub mod error;
pub mod events;
pub mod fabric;
pub mod gpm;
pub mod ledger;
pub mod mig;
pub mod processes;
pub mod raw;
pub mod units;
