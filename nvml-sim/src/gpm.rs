//! GPU Performance Monitoring (GPM): which boards support it, what a sample records, and how each
//! `NVML_GPM_METRIC_*` is computed from two samples.
//!
//! A sample is a snapshot of cumulative counters (the integrals of the activity gauges and the
//! NVLink byte counters). A metric is the counter difference divided by the time between the
//! snapshots, i.e. the average of the scenario's pattern over that window, in the unit `nvml.h`
//! gives: percent 0..100 for `*_UTIL`/occupancy, MiB/s for the PCIe and NVLink `*_PER_SEC`.

use crate::activity::{Activity, COUNT};
use crate::scenario::{GpuSpec, MediaSpec};
use crate::state::Sim;
use nvml_wrapper_sys::bindings as b;
use std::ffi::{CStr, CString};
use std::sync::OnceLock;

/// The GPM unit refreshes its counter snapshot this often (s). `nvml.h` asks for samples at
/// least 100 ms apart; two samples within one refresh see the same snapshot.
pub const REFRESH_S: f64 = 0.1;

/// Most NVLink links a GPM metric id can name (`NVLINK_L0` … `NVLINK_L17`).
const GPM_NVLINK_LINKS: u32 = 18;
/// Most instances per media engine kind a metric id can name (NVDEC/NVJPG 0..7, NVOFA 0..1).
const NVDEC_IDS: u32 = 8;
const NVJPG_IDS: u32 = 8;
const NVOFA_IDS: u32 = 2;

const MIB: f64 = 1024.0 * 1024.0;

/// GPM exists on Hopper and newer only (`nvml.h`: "For Hopper or newer fully supported devices").
pub fn supported(gpu: &GpuSpec) -> bool {
    let arch = gpu.arch();
    arch >= b::NVML_DEVICE_ARCH_HOPPER && arch != b::NVML_DEVICE_ARCH_UNKNOWN
}

/// What `nvmlGpmSampleGet` records: the device and its cumulative counters at a refresh point.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    /// The simulation it was taken in ([`Sim::id`]).
    pub sim: u64,
    /// The GPU's index.
    pub index: usize,
    /// For a MIG sample: the GPU instance's position in the scenario's instance list.
    pub instance: Option<usize>,
    /// Simulated time of the snapshot, s (a multiple of [`REFRESH_S`]).
    pub t: f64,
    /// ∫ of each activity gauge, indexed by [`Activity`].
    pub activity: [f64; COUNT],
    /// NVLink bytes sent, all links (the same counter the NVLink field values read).
    pub nvlink_tx_bytes: f64,
    /// NVLink bytes received, all links.
    pub nvlink_rx_bytes: f64,
}

impl Snapshot {
    /// The counters of GPU `index` at the last refresh at or before `t`.
    pub fn take(sim: &Sim, index: usize, t: f64) -> Snapshot {
        let t = (t / REFRESH_S).floor() * REFRESH_S;
        let gpu = &sim.scenario.gpus[index];
        let integrals = &sim.integrals[index];
        let totals = integrals.at(gpu, t);
        Snapshot {
            sim: sim.id,
            index,
            instance: None,
            t,
            activity: integrals.activity_at(gpu, t),
            nvlink_tx_bytes: totals.nvlink_tx_bytes,
            nvlink_rx_bytes: totals.nvlink_rx_bytes,
        }
    }

    /// The counters of MIG GPU instance `gi_index` of GPU `index` at the last refresh at or
    /// before `t`. Link counters belong to the whole board: a MIG sample has none.
    pub fn take_instance(sim: &Sim, index: usize, gi_index: usize, t: f64) -> Snapshot {
        let t = (t / REFRESH_S).floor() * REFRESH_S;
        let gpu = &sim.scenario.gpus[index];
        Snapshot {
            sim: sim.id,
            index,
            instance: Some(gi_index),
            t,
            activity: sim.integrals[index].instance_activity_at(gpu, gi_index, t),
            nvlink_tx_bytes: 0.0,
            nvlink_rx_bytes: 0.0,
        }
    }
}

/// Where a metric's value comes from.
#[derive(Debug, Clone, Copy)]
enum Source {
    /// An activity ratio, reported in percent.
    Percent(Activity),
    /// Instance `n` of a media engine (the activity names the kind), percent.
    Engine(Activity, u32),
    /// A PCIe rate, MiB/s.
    Pcie(Activity),
    /// NVLink total over all links, MiB/s.
    NvlinkTotal { tx: bool },
    /// One NVLink link (the total split evenly over the active links), MiB/s.
    NvlinkLink { link: u32, tx: bool },
}

/// A metric id, its source and the names `metricInfo` reports.
struct Entry {
    id: u32,
    source: Source,
    short_name: CString,
    long_name: CString,
    unit: &'static CStr,
}

/// Names and units a metric reports in `nvmlGpmMetric_t.metricInfo`; the strings are static.
#[derive(Debug, Clone, Copy)]
pub struct Info {
    /// Short name, e.g. "SM_UTIL".
    pub short_name: &'static CStr,
    /// Descriptive name.
    pub long_name: &'static CStr,
    /// "%" or "MiB/s".
    pub unit: &'static CStr,
}

fn entry(id: u32, source: Source, short: &str, long: &str, unit: &'static CStr) -> Entry {
    Entry {
        id,
        source,
        // The names are built from literals and numbers: never an interior NUL.
        short_name: CString::new(short).unwrap_or_default(),
        long_name: CString::new(long).unwrap_or_default(),
        unit,
    }
}

/// Every metric id the simulator computes (others answer NOT_SUPPORTED).
fn catalog() -> &'static [Entry] {
    static CATALOG: OnceLock<Vec<Entry>> = OnceLock::new();
    CATALOG.get_or_init(|| {
        use Activity as A;
        let pct = c"%";
        let mibs = c"MiB/s";
        let mut v = vec![
            entry(
                1,
                Source::Percent(A::Graphics),
                "GRAPHICS_UTIL",
                "Graphics engine activity",
                pct,
            ),
            entry(2, Source::Percent(A::Sm), "SM_UTIL", "SM activity", pct),
            entry(
                3,
                Source::Percent(A::SmOccupancy),
                "SM_OCCUPANCY",
                "SM occupancy",
                pct,
            ),
            entry(
                4,
                Source::Percent(A::Integer),
                "INTEGER_UTIL",
                "Integer pipe activity",
                pct,
            ),
            entry(
                5,
                Source::Percent(A::Tensor),
                "ANY_TENSOR_UTIL",
                "Tensor pipe activity (any)",
                pct,
            ),
            entry(
                6,
                Source::Percent(A::DfmaTensor),
                "DFMA_TENSOR_UTIL",
                "DFMA tensor pipe activity",
                pct,
            ),
            entry(
                7,
                Source::Percent(A::HmmaTensor),
                "HMMA_TENSOR_UTIL",
                "HMMA tensor pipe activity",
                pct,
            ),
            entry(
                9,
                Source::Percent(A::ImmaTensor),
                "IMMA_TENSOR_UTIL",
                "IMMA tensor pipe activity",
                pct,
            ),
            entry(
                10,
                Source::Percent(A::Dram),
                "DRAM_BW_UTIL",
                "DRAM bandwidth utilization",
                pct,
            ),
            entry(
                11,
                Source::Percent(A::Fp64),
                "FP64_UTIL",
                "FP64 pipe activity",
                pct,
            ),
            entry(
                12,
                Source::Percent(A::Fp32),
                "FP32_UTIL",
                "FP32 pipe activity",
                pct,
            ),
            entry(
                13,
                Source::Percent(A::Fp16),
                "FP16_UTIL",
                "FP16 pipe activity",
                pct,
            ),
            entry(
                20,
                Source::Pcie(A::PcieTx),
                "PCIE_TX_PER_SEC",
                "PCIe transmit bandwidth",
                mibs,
            ),
            entry(
                21,
                Source::Pcie(A::PcieRx),
                "PCIE_RX_PER_SEC",
                "PCIe receive bandwidth",
                mibs,
            ),
            entry(
                60,
                Source::NvlinkTotal { tx: false },
                "NVLINK_TOTAL_RX_PER_SEC",
                "NVLink receive bandwidth, all links",
                mibs,
            ),
            entry(
                61,
                Source::NvlinkTotal { tx: true },
                "NVLINK_TOTAL_TX_PER_SEC",
                "NVLink transmit bandwidth, all links",
                mibs,
            ),
        ];
        for (base, kind, count, name) in [
            (30, A::Nvdec, NVDEC_IDS, "NVDEC"),
            (40, A::Nvjpg, NVJPG_IDS, "NVJPG"),
            (50, A::Nvofa, NVOFA_IDS, "NVOFA"),
        ] {
            for n in 0..count {
                let short = format!("{name}_{n}_UTIL");
                let long = format!("{name} {n} utilization");
                v.push(entry(base + n, Source::Engine(kind, n), &short, &long, pct));
            }
        }
        for link in 0..GPM_NVLINK_LINKS {
            for (offset, tx, dir) in [(0, false, "RX"), (1, true, "TX")] {
                let short = format!("NVLINK_L{link}_{dir}_PER_SEC");
                let long = format!("NVLink link {link} {dir} bandwidth");
                let id = 62 + 2 * link + offset;
                v.push(entry(
                    id,
                    Source::NvlinkLink { link, tx },
                    &short,
                    &long,
                    mibs,
                ));
            }
        }
        v
    })
}

/// The value of metric `id` over the window from `s1` to `s2` (same GPU, `s2.t > s1.t`), with
/// its names; `Err(NOT_SUPPORTED)` for ids this GPU (or the simulator) does not provide.
///
/// For samples of a MIG GPU instance the activity is the instance's own, the media engines are
/// the instance's (its profile's counts), and PCIe/NVLink (board-wide links) are NOT_SUPPORTED.
pub fn metric(gpu: &GpuSpec, id: u32, s1: &Snapshot, s2: &Snapshot) -> Result<(f64, Info), u32> {
    let not_supported = b::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED;
    let e = catalog().iter().find(|e| e.id == id).ok_or(not_supported)?;
    let instance = s1.instance.map(|i| gpu.mig.instances[i].profile());
    let media = match instance {
        Some(p) => MediaSpec {
            nvdec: p.decoders,
            nvjpg: p.jpegs,
            nvofa: p.ofas,
        },
        None => gpu.media,
    };
    if instance.is_some()
        && matches!(
            e.source,
            Source::Pcie(_) | Source::NvlinkTotal { .. } | Source::NvlinkLink { .. }
        )
    {
        return Err(not_supported);
    }
    let dt = s2.t - s1.t;
    let mean = |a: Activity| (s2.activity[a as usize] - s1.activity[a as usize]) / dt;
    let nvlink = |tx: bool| {
        let bytes = if tx {
            s2.nvlink_tx_bytes - s1.nvlink_tx_bytes
        } else {
            s2.nvlink_rx_bytes - s1.nvlink_rx_bytes
        };
        bytes / dt / MIB
    };
    let percent = |x: f64| (x * 100.0).clamp(0.0, 100.0);
    let value = match e.source {
        Source::Percent(a) => percent(mean(a)),
        Source::Engine(kind, n) => {
            let count = match kind {
                Activity::Nvdec => media.nvdec,
                Activity::Nvjpg => media.nvjpg,
                _ => media.nvofa,
            };
            if n >= count {
                return Err(not_supported);
            }
            percent(mean(kind))
        }
        Source::Pcie(a) => mean(a).max(0.0) / MIB,
        Source::NvlinkTotal { tx } => {
            if !gpu.has_nvlink() {
                return Err(not_supported);
            }
            nvlink(tx).max(0.0)
        }
        Source::NvlinkLink { link, tx } => {
            if link >= gpu.nvlink.links {
                return Err(not_supported);
            }
            if gpu.link_down(link, s2.t) {
                0.0
            } else {
                nvlink(tx).max(0.0) / f64::from(gpu.active_links(s2.t).max(1))
            }
        }
    };
    let info = Info {
        short_name: e.short_name.as_c_str(),
        long_name: e.long_name.as_c_str(),
        unit: e.unit,
    };
    Ok((value, info))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::Scenario;

    fn snap(index: usize, t: f64, activity: [f64; COUNT], nvlink: f64) -> Snapshot {
        Snapshot {
            sim: 1,
            index,
            instance: None,
            t,
            activity,
            nvlink_tx_bytes: nvlink,
            nvlink_rx_bytes: nvlink / 2.0,
        }
    }

    #[test]
    fn metrics_are_window_averages_in_nvml_units() {
        let s = Scenario::parse(crate::scenario::DEFAULT_SCENARIO).unwrap();
        let gpu = &s.gpus[2];
        let mut a1 = [0.0; COUNT];
        let mut a2 = [0.0; COUNT];
        a1[Activity::Sm as usize] = 10.0;
        a2[Activity::Sm as usize] = 10.9; // 0.9 ratio·s over 1 s
        a2[Activity::PcieTx as usize] = 2.0 * MIB; // 2 MiB over 1 s
        let (s1, s2) = (snap(2, 5.0, a1, 0.0), snap(2, 6.0, a2, 18.0 * MIB));
        let (sm, info) = metric(gpu, 2, &s1, &s2).unwrap();
        assert!((sm - 90.0).abs() < 1e-9, "{sm}");
        assert_eq!(info.short_name, c"SM_UTIL");
        assert_eq!(info.unit, c"%");
        assert!((metric(gpu, 20, &s1, &s2).unwrap().0 - 2.0).abs() < 1e-9);
        assert!((metric(gpu, 61, &s1, &s2).unwrap().0 - 18.0).abs() < 1e-9);
        assert!((metric(gpu, 60, &s1, &s2).unwrap().0 - 9.0).abs() < 1e-9);
        // 18 links up: link 0 carries 1/18 of the total.
        assert!((metric(gpu, 63, &s1, &s2).unwrap().0 - 1.0).abs() < 1e-9);
        let unsupported = b::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED;
        // H100 has 7 NVDEC (ids 30..=36), 1 NVOFA (50); C2C and DMMA are not simulated.
        assert!(metric(gpu, 36, &s1, &s2).is_ok());
        assert_eq!(metric(gpu, 37, &s1, &s2).unwrap_err(), unsupported);
        assert!(metric(gpu, 50, &s1, &s2).is_ok());
        assert_eq!(metric(gpu, 51, &s1, &s2).unwrap_err(), unsupported);
        assert_eq!(metric(gpu, 100, &s1, &s2).unwrap_err(), unsupported);
        assert_eq!(metric(gpu, 8, &s1, &s2).unwrap_err(), unsupported);
    }

    #[test]
    fn only_hopper_and_newer_support_gpm() {
        let text = |model: &str| {
            format!(
                "[[gpu]]\nmodel = \"{model}\"\nuuid = \"GPU-1\"\npci_bus_id = \"01:00.0\"\nserial = \"1\"\n"
            )
        };
        let support = |model: &str| supported(&Scenario::parse(&text(model)).unwrap().gpus[0]);
        assert!(support("H100-SXM5-80GB"));
        for model in ["A100-SXM4-80GB", "L4", "RTX6000-Ada", "V100-SXM2-32GB"] {
            assert!(!support(model), "{model}");
        }
    }
}
