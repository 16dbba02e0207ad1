//! nvml-exporter: a Prometheus exporter for NVIDIA GPUs.
//!
//! Data flows one way: config → sampler (NVML) → [`sample::Snapshot`] → metrics (encoded once per
//! tick) → http (serves the encoded bytes).

pub mod nvml;
pub mod sample;
pub mod sampler;
