//! Which catalog families come from NVML GPM, shared by the tests that treat them apart: derived
//! from the catalog itself, so a new GPM family is picked up without a list to edit.

#![allow(dead_code)] // each test binary uses a different subset

use std::collections::BTreeSet;
use std::sync::Arc;

use nvml_exporter::metrics::catalog::CATALOG;
use nvml_exporter::metrics::{Encoder, MetricsOptions};
use nvml_exporter::sample::{
    BusySeconds, DeviceSample, GpmMetrics, GpmPipe, MediaEngine, Snapshot,
};

/// The GPM families, in catalog order: those a GPU holding nothing but GPM readings (the support
/// flag, the averages and their time integrals) serves beyond what a GPU with no readings serves.
pub fn gpm_families() -> Vec<&'static str> {
    let bare = DeviceSample {
        uuid: "GPU-0".into(),
        up: true,
        ..Default::default()
    };
    // Every field spelled out: a new GPM reading does not compile until it is given a value here.
    let gpm = GpmMetrics {
        graphics_engine_active: Some(0.5),
        sm_active: Some(0.5),
        sm_occupancy: Some(0.5),
        tensor_active: Some(0.5),
        dram_active: Some(0.5),
        pipes: GpmPipe::ALL.iter().map(|p| (*p, 0.5)).collect(),
        pcie_transmit_bytes_per_second: Some(1.0),
        pcie_receive_bytes_per_second: Some(1.0),
        nvlink_transmit_bytes_per_second: Some(1.0),
        nvlink_receive_bytes_per_second: Some(1.0),
        media_engines: MediaEngine::ALL.iter().map(|e| (*e, 0.5)).collect(),
    };
    let gpm_only = DeviceSample {
        gpm_supported: Some(true),
        gpm: Some(gpm),
        busy: BusySeconds {
            sm_active: Some(1.0),
            sm_occupancy: Some(1.0),
            tensor_active: Some(1.0),
            dram_active: Some(1.0),
            ..Default::default()
        },
        ..bare.clone()
    };
    let (with, without) = (served(gpm_only), served(bare));
    CATALOG
        .iter()
        .map(|d| d.name)
        .filter(|n| with.contains(*n) && !without.contains(*n))
        .collect()
}

/// The families served for the one GPU `device`, every group on.
fn served(device: DeviceSample) -> BTreeSet<String> {
    let snapshot = Snapshot {
        nvml_up: true,
        devices: vec![Arc::new(device)],
        ..Default::default()
    };
    let encoder = Encoder::new(MetricsOptions::default(), prometheus::Registry::new());
    String::from_utf8(encoder.encode(&snapshot))
        .expect("utf-8 exposition")
        .lines()
        .filter(|l| !l.starts_with('#') && l.contains("gpu=\"0\""))
        .map(|l| l.split('{').next().unwrap_or_default().to_owned())
        .collect()
}
