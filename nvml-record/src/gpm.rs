//! What only time passing shows, kept per NVML session: GPM averages over the windows between
//! samples (the GPU's and each MIG instance's) and XID events.

use std::collections::BTreeMap;

use nvml_wrapper::Nvml;
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enums::gpm::GpmMetricId;
use nvml_wrapper::event::EventSet;
use nvml_wrapper::gpm::{GpmSample, gpm_metrics_get};
use toml::{Table, Value};

use crate::MIB;
use crate::trace::{float, table};

/// The GPM metrics recorded: each becomes the `load` key nvml-sim derives it from, divided by
/// `divisor` (percent → ratio; MiB/s → MB/s for PCIe and GB/s for NVLink, over all links).
const GPM_METRICS: [(GpmMetricId, &str, f64); 19] = [
    (GpmMetricId::GraphicsUtil, "graphics_active", 100.0),
    (GpmMetricId::SmUtil, "sm_active", 100.0),
    (GpmMetricId::SmOccupancy, "sm_occupancy", 100.0),
    (GpmMetricId::IntegerUtil, "integer_active", 100.0),
    (GpmMetricId::AnyTensorUtil, "tensor_active", 100.0),
    (GpmMetricId::DfmaTensorUtil, "dfma_tensor_active", 100.0),
    (GpmMetricId::HmmaTensorUtil, "hmma_tensor_active", 100.0),
    (GpmMetricId::ImmaTensorUtil, "imma_tensor_active", 100.0),
    (GpmMetricId::DramBwUtil, "dram_active", 100.0),
    (GpmMetricId::Fp64Util, "fp64_active", 100.0),
    (GpmMetricId::Fp32Util, "fp32_active", 100.0),
    (GpmMetricId::Fp16Util, "fp16_active", 100.0),
    (GpmMetricId::PcieTxPerSec, "pcie_tx_mb_s", 1e6 / MIB as f64),
    (GpmMetricId::PcieRxPerSec, "pcie_rx_mb_s", 1e6 / MIB as f64),
    (GpmMetricId::Nvdec0Util, "decoder", 100.0),
    (GpmMetricId::Nvjpg0Util, "nvjpg", 100.0),
    (GpmMetricId::Nvofa0Util, "nvofa", 100.0),
    (
        GpmMetricId::NvlinkTotalTxPerSec,
        "nvlink_tx_gb_s",
        1e9 / MIB as f64,
    ),
    (
        GpmMetricId::NvlinkTotalRxPerSec,
        "nvlink_rx_gb_s",
        1e9 / MIB as f64,
    ),
];

/// What a recording keeps from one NVML session between two
/// [`crate::Recorder::sample_over_time`] calls: each GPU's (and MIG instance's) previous GPM
/// sample and the XID event set, all of which belong to the session that made them.
pub struct Session<'nvml> {
    pub(crate) nvml: &'nvml Nvml,
    pub(crate) gpm: Vec<Option<GpmSample<'nvml>>>,
    /// By (GPU position, GPU instance id).
    pub(crate) instance_gpm: BTreeMap<(usize, u32), GpmSample<'nvml>>,
    pub(crate) xids: Option<EventSet<'nvml>>,
}

impl<'nvml> Session<'nvml> {
    /// Registers for the XID events of every GPU that reports them.
    pub fn new(nvml: &'nvml Nvml) -> Session<'nvml> {
        let mut xids = nvml.create_event_set().ok();
        let count = nvml.device_count().unwrap_or(0);
        for index in 0..count {
            let Ok(device) = nvml.device_by_index(index) else {
                continue;
            };
            let reports = device
                .supported_event_types()
                .is_ok_and(|t| t.contains(EventTypes::CRITICAL_XID_ERROR));
            if let (true, Some(set)) = (reports, xids.take()) {
                // A failed registration frees the set: the rest of the recording has no XIDs.
                xids = device
                    .register_events(EventTypes::CRITICAL_XID_ERROR, set)
                    .ok();
            }
        }
        Session {
            nvml,
            gpm: Vec::new(),
            instance_gpm: BTreeMap::new(),
            xids,
        }
    }
}

/// Appends each GPM metric's average between `before` and `now` to its `load` key's list.
pub(crate) fn gpm_window<'nvml>(
    nvml: &'nvml Nvml,
    before: &GpmSample<'nvml>,
    now: &GpmSample<'nvml>,
    into: &mut BTreeMap<&'static str, Vec<f64>>,
) {
    let ids: Vec<GpmMetricId> = GPM_METRICS.iter().map(|(id, _, _)| *id).collect();
    if let Ok(results) = gpm_metrics_get(nvml, before, now, &ids) {
        for ((_, key, divisor), result) in GPM_METRICS.iter().zip(results) {
            if let Ok(r) = result {
                into.entry(key).or_default().push(r.value / divisor);
            }
        }
    }
}

/// GPM averages as `load` patterns: window k (between samples k and k + 1) is step k, the last
/// step repeats the last window. Keys with a window missing are left out (the simulator's
/// defaults stand in).
pub(crate) fn gpm_load(gpm: &BTreeMap<&'static str, Vec<f64>>, step: f64, samples: usize) -> Table {
    gpm.iter()
        .filter(|(_, windows)| windows.len() + 1 == samples)
        .map(|(key, windows)| {
            let mut values = windows.clone();
            values.push(*windows.last().expect("at least one window"));
            let pattern = if values.iter().all(|v| *v == values[0]) {
                float(values[0])
            } else {
                table([
                    ("shape", Value::String("steps".into())),
                    ("step", float(step)),
                    (
                        "values",
                        Value::Array(values.into_iter().map(float).collect()),
                    ),
                ])
            };
            (key.to_string(), pattern)
        })
        .collect()
}
