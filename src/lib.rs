//! nvml-exporter: a Prometheus exporter for NVIDIA GPUs.
//!
//! Data flows one way: config → sampler (NVML) → [`sample::Snapshot`] → metrics (encoded once per
//! tick) → http (serves the encoded bytes).

pub mod config;
pub mod http;
pub mod metrics;
pub mod sample;
