//! Saturation metrics from NVML GPM (GPU Performance Monitoring, Hopper and newer).
//!
//! GPM values are not read directly: NVML takes a sample of the device's performance counters
//! (`nvmlGpmSampleGet`) and `nvmlGpmMetricsGet` turns two samples into averages over the time
//! between them. So each device keeps its previous sample in a [`GpmState`] (a [`GpmSample`]
//! owns its handle and keeps the library loaded), and every tick yields the averages over the
//! last interval. The first tick after a (re)start, after the device missed a tick and after it
//! was lost yields none: there is no previous sample, or the one there is does not close a
//! window of one tick.
//!
//! Units: NVML reports the `*_UTIL` metrics in percent (0–100) and the PCIe/NVLink rates in
//! MiB/s (nvml.h); [`GpmMetrics`] holds ratios 0..1 and bytes per second.
//!
//! MIG: GPM also samples a single GPU instance (`nvmlGpmMigSampleGet`). [`GpmState`] keeps one
//! [`Window`] per GPU instance next to the GPU's, keyed by the instance's identity (not only its
//! id: a destroyed and re-created instance is another one and must not close a window with the
//! old one's sample); `read_instance_gpm` feeds it, [`super::mig`] says which instances exist.

use std::collections::HashMap;
use std::sync::Arc;

use nvml_wrapper::enums::gpm::GpmMetricId;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};

use super::ledger::CallLedger;
use super::raw::{GpmRequest, GpmSample};
use super::units::{mib_to_bytes_f64, percent_to_ratio_f64};
use crate::groups::{Group, Groups};
use crate::sample::{GpmMetrics, GpmPipe, MediaEngine};

/// Where one GPM metric goes in [`GpmMetrics`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// `graphics_engine_active`.
    GraphicsEngine,
    /// `sm_active`.
    SmActive,
    /// `sm_occupancy`.
    SmOccupancy,
    /// `tensor_active`.
    Tensor,
    /// `dram_active`.
    Dram,
    /// One entry of `pipes`.
    Pipe(GpmPipe),
    /// `pcie_transmit_bytes_per_second`.
    PcieTransmit,
    /// `pcie_receive_bytes_per_second`.
    PcieReceive,
    /// `nvlink_transmit_bytes_per_second`.
    NvLinkTransmit,
    /// `nvlink_receive_bytes_per_second`.
    NvLinkReceive,
    /// One entry of `media_engines`.
    Media(MediaEngine),
}

impl Target {
    /// The collector groups of the families the metric is served in: asked for when one is on.
    fn groups(self) -> &'static [Group] {
        match self {
            Target::GraphicsEngine | Target::Pipe(_) => &[Group::Pipes],
            // SM activity's time integral is in the saturation group, the others' in pipes.
            Target::SmActive | Target::SmOccupancy | Target::Tensor | Target::Dram => {
                &[Group::Saturation, Group::Pipes]
            }
            Target::PcieTransmit
            | Target::PcieReceive
            | Target::NvLinkTransmit
            | Target::NvLinkReceive => &[Group::Bandwidth],
            Target::Media(_) => &[Group::Media],
        }
    }

    /// Percent metrics become ratios; the transfer rates are MiB/s and become bytes/s.
    fn convert(self, raw: f64) -> f64 {
        match self {
            Target::PcieTransmit
            | Target::PcieReceive
            | Target::NvLinkTransmit
            | Target::NvLinkReceive => mib_to_bytes_f64(raw),
            _ => percent_to_ratio_f64(raw),
        }
    }
}

/// Every GPM metric the exporter asks for (METRICS.md, "Saturation metrics"), in one request.
pub const METRICS: &[(GpmMetricId, Target)] = &[
    (GpmMetricId::GraphicsUtil, Target::GraphicsEngine),
    (GpmMetricId::SmUtil, Target::SmActive),
    (GpmMetricId::SmOccupancy, Target::SmOccupancy),
    (GpmMetricId::AnyTensorUtil, Target::Tensor),
    (GpmMetricId::DramBwUtil, Target::Dram),
    (GpmMetricId::Fp64Util, Target::Pipe(GpmPipe::Fp64)),
    (GpmMetricId::Fp32Util, Target::Pipe(GpmPipe::Fp32)),
    (GpmMetricId::Fp16Util, Target::Pipe(GpmPipe::Fp16)),
    (GpmMetricId::IntegerUtil, Target::Pipe(GpmPipe::Integer)),
    (
        GpmMetricId::DfmaTensorUtil,
        Target::Pipe(GpmPipe::DfmaTensor),
    ),
    (
        GpmMetricId::HmmaTensorUtil,
        Target::Pipe(GpmPipe::HmmaTensor),
    ),
    (
        GpmMetricId::ImmaTensorUtil,
        Target::Pipe(GpmPipe::ImmaTensor),
    ),
    (GpmMetricId::PcieTxPerSec, Target::PcieTransmit),
    (GpmMetricId::PcieRxPerSec, Target::PcieReceive),
    (GpmMetricId::NvlinkTotalTxPerSec, Target::NvLinkTransmit),
    (GpmMetricId::NvlinkTotalRxPerSec, Target::NvLinkReceive),
    (GpmMetricId::Nvdec0Util, Target::Media(MediaEngine::Nvdec0)),
    (GpmMetricId::Nvdec1Util, Target::Media(MediaEngine::Nvdec1)),
    (GpmMetricId::Nvdec2Util, Target::Media(MediaEngine::Nvdec2)),
    (GpmMetricId::Nvdec3Util, Target::Media(MediaEngine::Nvdec3)),
    (GpmMetricId::Nvdec4Util, Target::Media(MediaEngine::Nvdec4)),
    (GpmMetricId::Nvdec5Util, Target::Media(MediaEngine::Nvdec5)),
    (GpmMetricId::Nvdec6Util, Target::Media(MediaEngine::Nvdec6)),
    (GpmMetricId::Nvdec7Util, Target::Media(MediaEngine::Nvdec7)),
    (GpmMetricId::Nvjpg0Util, Target::Media(MediaEngine::Nvjpg0)),
    (GpmMetricId::Nvjpg1Util, Target::Media(MediaEngine::Nvjpg1)),
    (GpmMetricId::Nvjpg2Util, Target::Media(MediaEngine::Nvjpg2)),
    (GpmMetricId::Nvjpg3Util, Target::Media(MediaEngine::Nvjpg3)),
    (GpmMetricId::Nvjpg4Util, Target::Media(MediaEngine::Nvjpg4)),
    (GpmMetricId::Nvjpg5Util, Target::Media(MediaEngine::Nvjpg5)),
    (GpmMetricId::Nvjpg6Util, Target::Media(MediaEngine::Nvjpg6)),
    (GpmMetricId::Nvjpg7Util, Target::Media(MediaEngine::Nvjpg7)),
    (GpmMetricId::Nvofa0Util, Target::Media(MediaEngine::Nvofa0)),
];

/// The C function name per-metric failures are counted under.
const METRICS_GET: &str = "nvmlGpmMetricsGet";

/// The previous sample of a stream of samples taken one tick apart, so that each new sample
/// closes a window of exactly one tick. Generic over the sample so that the bookkeeping does
/// not need a driver (and so a MIG instance's samples can use it too).
#[derive(Debug)]
pub struct Window<S> {
    prev: Option<S>,
    last_tick: Option<u64>,
}

impl<S> Default for Window<S> {
    fn default() -> Self {
        Window {
            prev: None,
            last_tick: None,
        }
    }
}

impl<S> Window<S> {
    /// Starts tick number `tick`: the previous sample is forgotten unless it was taken in tick
    /// `tick - 1`, so that a device that missed a tick (its read was stuck in a call) starts
    /// over rather than averaging over a hang.
    pub fn begin_tick(&mut self, tick: u64) {
        if self.last_tick.and_then(|t| t.checked_add(1)) != Some(tick) {
            self.prev = None;
        }
        self.last_tick = Some(tick);
    }

    /// Forgets the previous sample (the device was lost, or this tick's sample failed).
    pub fn forget(&mut self) {
        self.prev = None;
    }

    /// Whether a previous sample is held.
    pub fn has_previous(&self) -> bool {
        self.prev.is_some()
    }

    /// Takes `current` as the end of the window: `between(previous, current)` when there is a
    /// previous sample, and `current` becomes the previous sample of the next tick.
    pub fn advance<R>(&mut self, current: S, between: impl FnOnce(&S, &S) -> R) -> Option<R> {
        let result = self.prev.as_ref().map(|prev| between(prev, &current));
        self.prev = Some(current);
        result
    }
}

/// One device's GPM state, kept with its reader for one NVML session: whether the device
/// supports GPM (asked once per session) and the previous sample.
#[derive(Debug, Default)]
pub struct GpmState {
    supported: Option<bool>,
    window: Window<GpmSample>,
    /// The tick being read, so that a window first seen mid-tick starts at it.
    tick: Option<u64>,
    /// One window per MIG GPU instance seen on the last tick.
    instances: HashMap<InstanceKey, Window<GpmSample>>,
    /// What every `nvmlGpmMetricsGet` of this device reuses.
    buffers: Buffers,
}

/// The request and result lists of `nvmlGpmMetricsGet`, kept across ticks so that a steady
/// tick allocates nothing for GPM.
#[derive(Debug, Default)]
struct Buffers {
    /// Made on the first window that closes (GPUs without GPM never need its 8 KiB).
    request: Option<GpmRequest>,
    /// The metrics asked for: [`METRICS`] less those known unsupported.
    requested: Vec<(GpmMetricId, Target)>,
    /// Their answers, in that order.
    results: Vec<Result<f64, NvmlError>>,
    /// The collector groups whose metrics are asked for; `None`: all of them.
    groups: Option<Groups>,
}

impl Buffers {
    /// The averages between `prev` and `cur` of every metric not known unsupported under
    /// `arg_base`, in one `nvmlGpmMetricsGet`; `None` when the call failed.
    fn metrics(
        &mut self,
        t: &mut CallLedger,
        nvml: &Nvml,
        prev: &GpmSample,
        cur: &GpmSample,
        arg_base: u32,
    ) -> Option<GpmMetrics> {
        let Buffers {
            request,
            requested,
            results,
            groups,
        } = self;
        requested.clear();
        requested.extend(METRICS.iter().copied().filter(|(id, target)| {
            groups.is_none_or(|g| g.any(target.groups()))
                && !t.is_unsupported(METRICS_GET, arg_base | id.as_c())
        }));
        let request = request.get_or_insert_with(GpmRequest::default);
        let ids = requested.iter().map(|(id, _)| id.as_c());
        t.batch(METRICS_GET, arg_base, || {
            request.get(nvml, prev, cur, ids, results)
        })?;
        Some(decode_with(t, requested, results.drain(..), arg_base))
    }
}

/// What makes a MIG GPU instance the same one from tick to tick: its id alone is reused when an
/// instance is destroyed and another created.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct InstanceKey {
    /// GPU instance id.
    pub gpu_instance: u32,
    /// GPU-instance profile id (`nvmlGpuInstanceInfo_t.profileId`).
    pub profile_id: u32,
    /// Placement start (memory slice).
    pub placement_start: u32,
    /// UUID of its first compute instance: NVML gives a re-created instance a new one.
    pub uuid: String,
}

impl GpmState {
    /// No support answer yet, no previous sample.
    pub fn new() -> Self {
        GpmState::default()
    }

    /// See [`Window::begin_tick`]; applies to the MIG instances' windows too.
    pub fn begin_tick(&mut self, tick: u64) {
        self.window.begin_tick(tick);
        self.tick = Some(tick);
        for w in self.instances.values_mut() {
            w.begin_tick(tick);
        }
    }

    /// Forgets the previous sample (the device was lost), the MIG instances' included.
    pub fn forget(&mut self) {
        self.window.forget();
        self.instances.clear();
    }

    /// Keeps the windows of the MIG instances in `alive` only: an instance gone for a tick
    /// (destroyed, MIG off) starts over if it comes back.
    pub(super) fn retain_instances(&mut self, alive: &[InstanceKey]) {
        self.instances.retain(|k, _| alive.contains(k));
    }

    /// Asks only for the metrics of `groups`' families.
    pub(super) fn set_groups(&mut self, groups: Groups) {
        self.buffers.groups = Some(groups);
    }

    /// Whether the device supports GPM, as far as this session knows.
    pub(super) fn supported(&self) -> bool {
        self.supported == Some(true)
    }
}

/// Offset added to a metric id in the "not supported" memory for a MIG instance's metrics: an
/// instance does not support PCIe/NVLink metrics that the whole GPU does, and the two must not
/// switch each other off.
const INSTANCE_METRIC_ARG: u32 = 1 << 20;

/// Reads one MIG GPU instance's GPM for this tick (the GPU must support GPM): its sample closes
/// the instance's window when the previous tick sampled the same instance.
pub(super) fn read_instance_gpm(
    t: &mut CallLedger,
    nvml: &Arc<Nvml>,
    device: &Device,
    key: &InstanceKey,
    state: &mut GpmState,
) -> Option<GpmMetrics> {
    if nvml.lib().nvmlGpmMigSampleGet.is_err() {
        return None;
    }
    let gi = key.gpu_instance;
    let tick = state.tick;
    let window = state.instances.entry(key.clone()).or_insert_with(|| {
        let mut w = Window::default();
        if let Some(tick) = tick {
            w.begin_tick(tick);
        }
        w
    });
    let Some(current) = t.call("nvmlGpmMigSampleGet", gi, || {
        GpmSample::of_instance(nvml, device, gi)
    }) else {
        window.forget();
        return None;
    };
    let buffers = &mut state.buffers;
    window
        .advance(current, |prev, cur| {
            buffers.metrics(t, nvml, prev, cur, INSTANCE_METRIC_ARG)
        })
        .flatten()
}

/// Whether the loaded library has every GPM entry point: no sample is taken unless the whole set
/// is there (drivers before R520 have none of it), so that one taken can always be compared and
/// freed.
pub fn library_has_gpm(nvml: &Nvml) -> bool {
    let lib = nvml.lib();
    lib.nvmlGpmQueryDeviceSupport.is_ok()
        && lib.nvmlGpmSampleAlloc.is_ok()
        && lib.nvmlGpmSampleFree.is_ok()
        && lib.nvmlGpmSampleGet.is_ok()
        && lib.nvmlGpmMetricsGet.is_ok()
}

/// Reads GPM for one tick: fills `gpm_supported` and, when a window closes, `gpm`.
pub(super) fn read_gpm(
    t: &mut CallLedger,
    nvml: &Arc<Nvml>,
    device: &Device,
    state: &mut GpmState,
) -> (Option<bool>, Option<GpmMetrics>) {
    if state.supported.is_none() {
        state.supported = query_support(t, nvml, device);
    }
    if state.supported != Some(true) {
        state.forget();
        return (state.supported, None);
    }
    let Some(current) = t.call("nvmlGpmSampleGet", 0, || GpmSample::of_device(nvml, device)) else {
        // Without this tick's sample the next one would close a two-tick window.
        state.forget();
        return (state.supported, None);
    };
    let buffers = &mut state.buffers;
    let metrics = state
        .window
        .advance(current, |prev, cur| buffers.metrics(t, nvml, prev, cur, 0))
        .flatten();
    (state.supported, metrics)
}

/// Asks once whether the device supports GPM. `Some(false)` also when the library has no GPM
/// at all (or answers NOT_SUPPORTED): there is nothing to sample either way. `None` when the
/// query failed for another reason: it is asked again next tick.
fn query_support(t: &mut CallLedger, nvml: &Nvml, device: &Device) -> Option<bool> {
    const QUERY: &str = "nvmlGpmQueryDeviceSupport";
    if !library_has_gpm(nvml) {
        return Some(false);
    }
    match t.call(QUERY, 0, || device.gpm_support()) {
        Some(supported) => Some(supported),
        None if t.is_unsupported(QUERY, 0) => Some(false),
        None => None,
    }
}

/// [`decode_with`] for the GPU's own metrics.
#[cfg(test)]
fn decode(
    t: &mut CallLedger,
    requested: &[(GpmMetricId, Target)],
    results: Vec<Result<f64, NvmlError>>,
) -> GpmMetrics {
    decode_with(t, requested, results, 0)
}

/// Sorts the per-metric answers of one `nvmlGpmMetricsGet` into [`GpmMetrics`]. A metric that
/// failed is left out; NOT_SUPPORTED is remembered under `arg_base | metric id` (not asked again
/// this session) and never counted, any other error is counted under `nvmlGpmMetricsGet`.
fn decode_with(
    t: &mut CallLedger,
    requested: &[(GpmMetricId, Target)],
    results: impl IntoIterator<Item = Result<f64, NvmlError>>,
    arg_base: u32,
) -> GpmMetrics {
    let mut m = GpmMetrics::default();
    for ((id, target), result) in requested.iter().zip(results) {
        let Some(value) = t.field(METRICS_GET, arg_base | id.as_c(), result) else {
            continue;
        };
        // A NaN/inf would be a broken reading; the encoder drops those too, but keep the
        // sample honest.
        if !value.is_finite() {
            continue;
        }
        let v = target.convert(value);
        match *target {
            Target::GraphicsEngine => m.graphics_engine_active = Some(v),
            Target::SmActive => m.sm_active = Some(v),
            Target::SmOccupancy => m.sm_occupancy = Some(v),
            Target::Tensor => m.tensor_active = Some(v),
            Target::Dram => m.dram_active = Some(v),
            Target::Pipe(p) => m.pipes.push((p, v)),
            Target::PcieTransmit => m.pcie_transmit_bytes_per_second = Some(v),
            Target::PcieReceive => m.pcie_receive_bytes_per_second = Some(v),
            Target::NvLinkTransmit => m.nvlink_transmit_bytes_per_second = Some(v),
            Target::NvLinkReceive => m.nvlink_receive_bytes_per_second = Some(v),
            Target::Media(e) => m.media_engines.push((e, v)),
        }
    }
    m
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use crate::nvml::ledger::Unsupported;

    use super::*;
    use crate::nvml::error::ErrorCounter;

    #[test]
    fn every_saturation_row_is_requested_once() {
        let ids: HashSet<u32> = METRICS.iter().map(|(id, _)| id.as_c()).collect();
        assert_eq!(ids.len(), METRICS.len(), "a metric id is requested twice");
        for p in GpmPipe::ALL {
            assert!(METRICS.iter().any(|(_, t)| *t == Target::Pipe(*p)), "{p:?}");
        }
        for e in MediaEngine::ALL {
            assert!(
                METRICS.iter().any(|(_, t)| *t == Target::Media(*e)),
                "{e:?}"
            );
        }
        // nvmlGpmMetricsGet_t holds at most NVML_GPM_METRIC_MAX (98) metrics per call.
        assert!(METRICS.len() <= 98);
    }

    #[test]
    fn the_window_closes_only_over_consecutive_ticks() {
        let mut w: Window<u32> = Window::default();
        w.begin_tick(1);
        assert_eq!(
            w.advance(10, |a, b| (*a, *b)),
            None,
            "first tick: no window"
        );
        w.begin_tick(2);
        assert_eq!(w.advance(20, |a, b| (*a, *b)), Some((10, 20)));
        // Tick 3 missed (the read was stuck): tick 4 starts over.
        w.begin_tick(4);
        assert!(!w.has_previous());
        assert_eq!(w.advance(40, |a, b| (*a, *b)), None);
        w.begin_tick(5);
        assert_eq!(w.advance(50, |a, b| (*a, *b)), Some((40, 50)));
        // A lost device forgets its sample.
        w.forget();
        w.begin_tick(6);
        assert_eq!(w.advance(60, |a, b| (*a, *b)), None);
        // The same tick number twice is not a window of one tick either.
        w.begin_tick(6);
        assert!(!w.has_previous());
    }

    fn ok(_id: GpmMetricId, value: f64) -> Result<f64, NvmlError> {
        Ok(value)
    }

    #[test]
    fn percentages_become_ratios_and_mib_per_second_bytes_per_second() {
        let errors = ErrorCounter::default();
        let mut unsupported = Unsupported::default();
        let mut t = CallLedger::new(0, &errors, &mut unsupported);
        let requested = [
            (GpmMetricId::SmUtil, Target::SmActive),
            (GpmMetricId::SmOccupancy, Target::SmOccupancy),
            (
                GpmMetricId::HmmaTensorUtil,
                Target::Pipe(GpmPipe::HmmaTensor),
            ),
            (GpmMetricId::PcieTxPerSec, Target::PcieTransmit),
            (GpmMetricId::NvlinkTotalRxPerSec, Target::NvLinkReceive),
            (GpmMetricId::Nvjpg3Util, Target::Media(MediaEngine::Nvjpg3)),
        ];
        let results = vec![
            ok(GpmMetricId::SmUtil, 15.0),
            ok(GpmMetricId::SmOccupancy, 8.5),
            ok(GpmMetricId::HmmaTensorUtil, 62.0),
            ok(GpmMetricId::PcieTxPerSec, 2.0),
            ok(GpmMetricId::NvlinkTotalRxPerSec, 1024.0),
            ok(GpmMetricId::Nvjpg3Util, 100.0),
        ];
        let m = decode(&mut t, &requested, results);
        assert_eq!(m.sm_active, Some(0.15));
        assert_eq!(m.sm_occupancy, Some(0.085));
        assert_eq!(m.pipes, vec![(GpmPipe::HmmaTensor, 0.62)]);
        assert_eq!(m.pcie_transmit_bytes_per_second, Some(2.0 * 1_048_576.0));
        assert_eq!(m.nvlink_receive_bytes_per_second, Some(1_073_741_824.0));
        assert_eq!(m.media_engines, vec![(MediaEngine::Nvjpg3, 1.0)]);
        assert_eq!(m.tensor_active, None, "not requested, not invented");
        assert!(errors.snapshot().is_empty());
    }

    #[test]
    fn a_failed_metric_is_absent_and_only_real_errors_count() {
        let errors = ErrorCounter::default();
        let mut unsupported = Unsupported::default();
        let mut t = CallLedger::new(0, &errors, &mut unsupported);
        let requested = [
            (GpmMetricId::SmUtil, Target::SmActive),
            (GpmMetricId::Nvofa0Util, Target::Media(MediaEngine::Nvofa0)),
            (GpmMetricId::DramBwUtil, Target::Dram),
        ];
        let results = vec![
            ok(GpmMetricId::SmUtil, 90.0),
            Err(NvmlError::NotSupported),
            Err(NvmlError::Unknown),
        ];
        let m = decode(&mut t, &requested, results);
        assert_eq!(m.sm_active, Some(0.9));
        assert!(m.media_engines.is_empty());
        assert_eq!(m.dram_active, None);
        // NOT_SUPPORTED is remembered per metric, so the next request leaves it out.
        assert!(t.is_unsupported(METRICS_GET, GpmMetricId::Nvofa0Util.as_c()));
        assert!(!t.is_unsupported(METRICS_GET, GpmMetricId::DramBwUtil.as_c()));
        let counted = errors.snapshot();
        assert_eq!(counted.len(), 1, "{counted:?}");
        assert_eq!(
            counted[&(METRICS_GET.to_string(), "unknown".to_string())],
            1
        );
    }
}
