//! Snapshot → Prometheus text exposition, once per sampling tick.
//!
//! The [`catalog`] declares every family once, in exposition order. [`Encoder::encode`] first
//! resolves each device's view (`resolve.rs`: its reading, `gpu` label, owner, MIG instances,
//! processes), with `--max-series` counts the series each group would have (writing them to a
//! `text::Text` that keeps no bytes) to choose the groups left out, then writes the families in
//! catalog order, one writer per source (`write.rs`), every line through one function
//! (`text::line`); then the exporter's own
//! `process_*` families (`exporter_process.rs`, Linux) and, with `--dcgm-compat`, dcgm-exporter's
//! names of the same views ([`dcgm`]). The exporter's counters and gauges that other parts keep
//! (the HTTP server's connections and scrapes, the reloader's outcome) and the encoder's own
//! (tick durations, series per group) are in one `prometheus` registry, wired in `lib.rs`, and
//! written where the catalog places them.
//!
//! Rules the encoder enforces: a reading that is `None` (or an empty list) produces no series;
//! a device with `up == false` keeps only `nvidia_gpu_info`, `nvidia_gpu_up 0`, its health
//! verdict (and its `nvidia_gpu_pod_info`); every per-GPU series carries `gpu` and `uuid`; families come in
//! catalog order, series by GPU index and then in label order (processes by pid). Attribution
//! rules (pod labels, MIG instances, processes) are in `resolve.rs`.

pub mod catalog;
pub mod dcgm;
pub mod docs;
#[cfg(target_os = "linux")]
mod exporter_process;
pub(crate) mod resolve;
pub mod samples;
mod text;
pub mod workloads;
pub(crate) mod write;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use prometheus::{Histogram, HistogramOpts, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};

use crate::processes::DEFAULT_MAX_PROCESSES_PER_GPU;
use crate::sample::Snapshot;
use catalog::{EXPOSITION_BYTES, SAMPLE_DURATION_SECONDS, SERIES, SERIES_DROPPED_TOTAL};
use dcgm::{DcgmCompat, DcgmRelease};

use crate::groups::{DROP_ORDER, GROUPS, Group, Groups};
use resolve::DeviceView;

pub use catalog::{REVISION, RUSTC, VERSION};

/// Content type of the text exposition.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Bucket bounds of `nvml_exporter_sample_duration_seconds`: a healthy tick over 8 GPUs takes
/// milliseconds, a tick that waits on a hanging device takes up to its deadline (seconds).
const SAMPLE_DURATION_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Encoding choices.
#[derive(Debug, Clone, PartialEq)]
pub struct MetricsOptions {
    /// Add `namespace`, `pod`, `container` to every series of a GPU that the snapshot's kubelet
    /// state assigns to exactly one container (`--kubernetes-labels`).
    pub pod_labels: bool,
    /// At most this many process series per GPU, the largest by memory
    /// (`--max-processes-per-gpu`); per-pod sums count every process.
    pub max_processes_per_gpu: usize,
    /// The GPUs' processes are read (`--processes`): with the kubelet's assignments, each GPU
    /// serves the memory its processes hold outside them, 0 included.
    pub processes: bool,
    /// Which names the GPUs' series are served under (`--dcgm-compat`).
    pub dcgm_compat: DcgmCompat,
    /// Which release of dcgm-exporter those names are of (`--dcgm-compat-version`).
    pub dcgm_release: DcgmRelease,
    /// `Hostname` label of the dcgm-exporter series ([`dcgm::hostname`]); left out when empty.
    pub hostname: String,
    /// The collector groups whose native families are served (`--collector.NAME`); a family of
    /// another group is left out. The DCGM fields are served from whatever was sampled.
    pub groups: Groups,
    /// At most this many series of the GPU families, dcgm-exporter's names included
    /// (`--max-series`): above it whole groups are left out in [`crate::groups::DROP_ORDER`]; `None`: no
    /// limit.
    pub max_series: Option<usize>,
    /// Below this SM activity (utilization without GPM) an allocated GPU is idle
    /// (`--idle-threshold`): the node page's "allocated, idle" mark. The sampler's idle
    /// GPU-seconds take the same option.
    pub idle_threshold: f64,
}

impl Default for MetricsOptions {
    /// No pod labels; the default process series limit, processes read; every group (the configuration's
    /// defaults are narrower: `Config::groups`).
    fn default() -> Self {
        MetricsOptions {
            pod_labels: false,
            max_processes_per_gpu: DEFAULT_MAX_PROCESSES_PER_GPU,
            processes: true,
            dcgm_compat: DcgmCompat::Off,
            dcgm_release: DcgmRelease::default(),
            hostname: String::new(),
            groups: Groups::all(),
            max_series: None,
            idle_threshold: 0.05,
        }
    }
}

/// Turns snapshots into expositions; keeps the state that outlives one snapshot: the tick-duration
/// histogram and the series counts (in the exporter's `prometheus` registry, which it writes
/// whole) and the open files the `process_*` metrics are read from. Its options can be
/// [replaced](Encoder::set_options) by a configuration reload; the counters carry on.
#[derive(Debug)]
pub struct Encoder {
    opts: RwLock<Arc<MetricsOptions>>,
    registry: Registry,
    sample_duration: Histogram,
    /// Series of the GPU families served per group in the last exposition.
    series: IntGaugeVec,
    /// Series `--max-series` left out, per group.
    series_dropped: IntCounterVec,
    /// Size of the previous exposition; registered once there is one.
    exposition_bytes: IntGauge,
    /// The last exposition left groups out (so that starting and stopping are logged once).
    dropping: std::sync::atomic::AtomicBool,
    /// Length of the last exposition: the next one's buffer starts that large, since the text
    /// changes little from tick to tick.
    last_len: AtomicUsize,
    #[cfg(target_os = "linux")]
    process: exporter_process::ProcessMetrics,
}

impl Encoder {
    /// An encoder that registers its own metrics in `registry` and writes everything in it.
    pub fn new(opts: MetricsOptions, registry: Registry) -> Encoder {
        let sample_duration = Histogram::with_opts(
            HistogramOpts::new(
                SAMPLE_DURATION_SECONDS,
                catalog::help(SAMPLE_DURATION_SECONDS),
            )
            .buckets(SAMPLE_DURATION_BUCKETS.to_vec()),
        )
        .expect("static histogram options are valid");
        let series = IntGaugeVec::new(Opts::new(SERIES, catalog::help(SERIES)), &["group"])
            .expect("static gauge options are valid");
        let series_dropped = IntCounterVec::new(
            Opts::new(SERIES_DROPPED_TOTAL, catalog::help(SERIES_DROPPED_TOTAL)),
            &["group"],
        )
        .expect("static counter options are valid");
        let exposition_bytes = IntGauge::new(EXPOSITION_BYTES, catalog::help(EXPOSITION_BYTES))
            .expect("static gauge options are valid");
        let sample_duration = registered(&registry, sample_duration);
        let series = registered(&registry, series);
        let series_dropped = registered(&registry, series_dropped);
        Encoder {
            opts: RwLock::new(Arc::new(opts)),
            registry,
            sample_duration,
            series,
            series_dropped,
            exposition_bytes,
            dropping: std::sync::atomic::AtomicBool::new(false),
            last_len: AtomicUsize::new(0),
            #[cfg(target_os = "linux")]
            process: exporter_process::ProcessMetrics::new(),
        }
    }

    /// The options encodings use now.
    pub fn options(&self) -> Arc<MetricsOptions> {
        // A poisoned lock only means a writer panicked mid-swap of an Arc; the value is whole.
        self.opts.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Encodes with `opts` from the next encoding on (a configuration reload).
    pub fn set_options(&self, opts: MetricsOptions) {
        *self.opts.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(opts);
    }

    /// Counts one sampling tick of `seconds` in `nvml_exporter_sample_duration_seconds`: once per
    /// tick, before its snapshot is encoded.
    pub fn observe_tick(&self, seconds: f64) {
        if seconds.is_finite() {
            self.sample_duration.observe(seconds);
        }
    }

    /// The text exposition of `snap`, in serving order.
    pub fn encode(&self, snap: &Snapshot) -> Vec<u8> {
        self.encoding(snap).text
    }

    /// The text exposition of `snap`, with the options it was encoded with and the groups whose
    /// native families it serves: what `write_series` needs to write the same series again
    /// into another encoding.
    pub fn encoding(&self, snap: &Snapshot) -> Encoding {
        let opts = self.options();
        let devices = resolve::resolve(snap, &opts);
        let dropped = self.limit(&opts, snap, &devices);
        let served = |groups: Groups| dropped.iter().fold(groups, |s, g| s.without(*g));
        let last_len = self.last_len.load(Ordering::Relaxed);
        let mut out = text::Text::with_capacity(last_len + last_len / 8);
        self.series.reset();
        if opts.dcgm_compat != DcgmCompat::Dcgm {
            let per_group = write::gpu_families(&mut out, snap, &devices, served(opts.groups));
            for g in opts.groups.iter() {
                self.series
                    .with_label_values(&[g.name()])
                    .set(i64::try_from(per_group[g as usize]).unwrap_or(i64::MAX));
            }
        }
        // dcgm-exporter's names alone: none of the native families, the node's included.
        let own = match opts.dcgm_compat {
            DcgmCompat::Dcgm => Groups::none(),
            _ => opts.groups,
        };
        write::own_families(&mut out, snap, own, self.registry.gather());
        #[cfg(target_os = "linux")]
        self.process.write(&mut out);
        if opts.dcgm_compat != DcgmCompat::Off {
            let groups = served(Groups::all());
            dcgm::write(
                &mut out,
                snap,
                &devices,
                &opts.hostname,
                opts.dcgm_release,
                groups,
            );
        }
        let out = out.bytes;
        let groups = served(opts.groups);
        self.last_len.store(out.len(), Ordering::Relaxed);
        self.exposition_bytes
            .set(i64::try_from(out.len()).unwrap_or(i64::MAX));
        if last_len == 0 {
            // From the second exposition on: the first has no previous one to measure. A second
            // registration (an empty first exposition) is refused, which changes nothing.
            let _ = self
                .registry
                .register(Box::new(self.exposition_bytes.clone()));
        }
        Encoding {
            text: out,
            options: opts,
            groups,
        }
    }

    /// The groups `--max-series` leaves out of this exposition: none without a limit; else whole
    /// groups in [`DROP_ORDER`] until the series of the GPU families fit (`Group::Core` stays
    /// whatever its size), counted by writing them to a [`text::Text`] that keeps no bytes, so
    /// that nothing is encoded for the series left out. dcgm-exporter's names count in the group
    /// of the row they are read from. Counts what is left out and logs when that starts or stops.
    fn limit(
        &self,
        opts: &MetricsOptions,
        snap: &Snapshot,
        devices: &[DeviceView<'_>],
    ) -> Vec<Group> {
        let mut dropped = Vec::new();
        let mut total = 0;
        let mut per_group = [0usize; GROUPS.len()];
        if let Some(max) = opts.max_series {
            let mut count = text::Text::counting();
            if opts.dcgm_compat != DcgmCompat::Dcgm {
                per_group = write::gpu_families(&mut count, snap, devices, opts.groups);
            }
            if opts.dcgm_compat != DcgmCompat::Off {
                let dcgm = dcgm::write(
                    &mut count,
                    snap,
                    devices,
                    &opts.hostname,
                    opts.dcgm_release,
                    Groups::all(),
                );
                for (n, d) in per_group.iter_mut().zip(dcgm) {
                    *n += d;
                }
            }
            total = count.series;
            let mut kept = total;
            for g in DROP_ORDER {
                if kept <= max {
                    break;
                }
                if per_group[*g as usize] > 0 {
                    kept -= per_group[*g as usize];
                    dropped.push(*g);
                }
            }
        }
        for g in &dropped {
            self.series_dropped
                .with_label_values(&[g.name()])
                .inc_by(per_group[*g as usize] as u64);
        }
        let was_dropping = self.dropping.swap(!dropped.is_empty(), Ordering::Relaxed);
        if !dropped.is_empty() && !was_dropping {
            let names: Vec<&str> = dropped.iter().map(|g| g.name()).collect();
            tracing::warn!(
                max_series = opts.max_series,
                series = total,
                dropped = %names.join(","),
                "over --max-series: leaving collector groups out, the most detailed first"
            );
        } else if dropped.is_empty() && was_dropping {
            tracing::info!("under --max-series again: every collector group served");
        }
        dropped
    }
}

/// An exposition and what it was encoded with.
#[derive(Debug)]
pub struct Encoding {
    /// Text format 0.0.4.
    pub text: Vec<u8>,
    /// The options it was encoded with.
    pub options: Arc<MetricsOptions>,
    /// The collector groups whose native families it serves: the configured ones, less those
    /// `--max-series` left out of it.
    pub groups: Groups,
}

/// Writes into `sink` the native series an exposition of `snap` encoded with `opts` and serving
/// `groups` holds: the per-GPU families, then the exporter-wide ones read from the snapshot
/// (those the registry keeps, and dcgm-exporter's names, aside), each in catalog order.
pub(crate) fn write_series(
    snap: &Snapshot,
    opts: &MetricsOptions,
    groups: Groups,
    sink: &mut impl write::Sink,
) {
    let devices = resolve::resolve(snap, opts);
    write::gpu_families(sink, snap, &devices, groups);
    write::exporter_families(sink, snap);
}

/// `collector`, registered in `registry`: the exporter's one registry (made in `lib.rs`), which
/// the encoder writes whole; the part that keeps the collector updates it.
pub fn registered<C>(registry: &Registry, collector: C) -> C
where
    C: prometheus::core::Collector + Clone + 'static,
{
    // Registration only fails on a duplicate name, and each collector is registered once.
    registry
        .register(Box::new(collector.clone()))
        .expect("registered once, in the exporter's registry");
    collector
}

#[cfg(test)]
pub(crate) mod tests;
