//! Snapshot → Prometheus text exposition, encoded once per sampling tick.
//!
//! The [`catalog`] declares every family once; [`Encoder::encode`] walks it in order to turn a
//! [`Snapshot`] into `MetricFamily`s, adds the encoder's own registry (tick-duration histogram,
//! scrape counter, process collector) and serialises the lot as text format 0.0.4, plain and
//! gzip. A scrape then only copies those bytes.
//!
//! Rules the encoder enforces: a reading that is `None` (or an empty list) produces no series;
//! a device with `up == false` keeps only `nvidia_gpu_info` and `nvidia_gpu_up 0`; every per-GPU
//! series carries `gpu` and `uuid`. Families come in catalog order, series by GPU index and then
//! in label order, and the `process_*` families last.

pub mod catalog;
pub mod docs;
pub mod samples;

use std::io::Write;

use axum::body::Bytes;
use flate2::Compression;
use flate2::write::GzEncoder;
use prometheus::proto::{Counter, Gauge, LabelPair, Metric, MetricFamily, MetricType};
use prometheus::{Histogram, HistogramOpts, IntCounterVec, Opts, Registry};

use crate::sample::Snapshot;
use catalog::{CATALOG, MetricDef, MetricKind, SAMPLE_DURATION_SECONDS, SCRAPES_TOTAL, Source};
use samples::Samples;

pub use catalog::{REVISION, RUSTC, VERSION};

/// Content type of [`Exposition::text`] (and of the decompressed [`Exposition::gzip`]).
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Bucket bounds of `nvml_exporter_sample_duration_seconds`: a healthy tick over 8 GPUs takes
/// milliseconds, a tick that waits on a hanging device takes up to its deadline (seconds).
const SAMPLE_DURATION_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Encoding choices. Empty for now; DCGM-compatible names and Kubernetes labels come later.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MetricsOptions {}

/// One encoded exposition. Cloning shares the buffers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exposition {
    /// Text format 0.0.4.
    pub text: Bytes,
    /// `text`, gzip-compressed.
    pub gzip: Bytes,
}

/// Counts `/metrics` responses by status code; the counts appear in `nvml_exporter_scrapes_total`
/// from the next [`Encoder::encode`] on (one tick of lag: a scrape never encodes).
#[derive(Debug, Clone)]
pub struct ScrapeCounter(IntCounterVec);

impl ScrapeCounter {
    /// Counts one response with this HTTP status code.
    pub fn inc(&self, code: u16) {
        self.0.with_label_values(&[code.to_string()]).inc();
    }
}

/// Turns snapshots into expositions; keeps the state that outlives one snapshot.
#[derive(Debug)]
pub struct Encoder {
    opts: MetricsOptions,
    registry: Registry,
    sample_duration: Histogram,
    scrapes: ScrapeCounter,
}

impl Encoder {
    /// An encoder with its own registry: tick-duration histogram, scrape counter and (on Linux)
    /// the process collector.
    pub fn new(opts: MetricsOptions) -> Encoder {
        let registry = Registry::new();
        let sample_duration = Histogram::with_opts(
            HistogramOpts::new(SAMPLE_DURATION_SECONDS, help_of(SAMPLE_DURATION_SECONDS))
                .buckets(SAMPLE_DURATION_BUCKETS.to_vec()),
        )
        .expect("static histogram options are valid");
        let scrapes =
            IntCounterVec::new(Opts::new(SCRAPES_TOTAL, help_of(SCRAPES_TOTAL)), &["code"])
                .expect("static counter options are valid");
        // Show the common case at 0 from the start, so rate() has a first point before the first
        // scrape is counted.
        scrapes.with_label_values(&["200"]);
        // Registration only fails on a duplicate name, and this registry is fresh.
        registry
            .register(Box::new(sample_duration.clone()))
            .expect("fresh registry");
        registry
            .register(Box::new(scrapes.clone()))
            .expect("fresh registry");
        #[cfg(target_os = "linux")]
        registry
            .register(Box::new(
                prometheus::process_collector::ProcessCollector::for_self(),
            ))
            .expect("fresh registry");
        Encoder {
            opts,
            registry,
            sample_duration,
            scrapes: ScrapeCounter(scrapes),
        }
    }

    /// The options this encoder was built with.
    pub fn options(&self) -> &MetricsOptions {
        &self.opts
    }

    /// A handle for the HTTP layer to count scrapes with.
    pub fn scrape_counter(&self) -> ScrapeCounter {
        self.scrapes.clone()
    }

    /// Encodes `snap` (text and gzip). Observes `snap.tick_duration_seconds` once, so call this
    /// once per tick.
    pub fn encode(&self, snap: &Snapshot) -> Exposition {
        if let Some(d) = snap.tick_duration_seconds.filter(|d| d.is_finite()) {
            self.sample_duration.observe(d);
        }
        let families = self.families(snap);
        let mut text = String::with_capacity(64 * 1024);
        // The text encoder only rejects empty or unnamed families, which `families` never
        // produces; log rather than panic on the sampler thread if that ever changes.
        if let Err(e) = prometheus::TextEncoder::new().encode_utf8(&families, &mut text) {
            tracing::error!(error = %e, "encoding the exposition failed");
        }
        let gzip = gzip(text.as_bytes());
        Exposition {
            text: Bytes::from(text),
            gzip: Bytes::from(gzip),
        }
    }

    /// The families of one exposition, in serving order.
    fn families(&self, snap: &Snapshot) -> Vec<MetricFamily> {
        let mut gathered = self.registry.gather();
        let mut devices: Vec<_> = snap.devices.iter().collect();
        devices.sort_by_key(|d| d.index);

        let mut out = Vec::with_capacity(CATALOG.len() + 8);
        let mut samples = Samples::default();
        for def in CATALOG {
            let metrics = match def.source {
                Source::Device(read) | Source::DeviceIdentity(read) => {
                    let mut metrics = Vec::new();
                    let always = matches!(def.source, Source::DeviceIdentity(_));
                    for d in devices.iter().filter(|d| d.up || always) {
                        read(&snap.system, d, &mut samples);
                        let identity = [d.index.to_string(), d.uuid.clone()];
                        for (labels, value) in samples.take() {
                            let all = identity.iter().cloned().chain(labels);
                            metrics.push(metric(def, all, value));
                        }
                    }
                    metrics
                }
                Source::Exporter(read) => {
                    read(snap, &mut samples);
                    samples
                        .take()
                        .into_iter()
                        .map(|(labels, value)| metric(def, labels.into_iter(), value))
                        .collect()
                }
                Source::Registry => {
                    if let Some(pos) = gathered.iter().position(|f| f.name() == def.name) {
                        out.push(gathered.remove(pos));
                    }
                    continue;
                }
            };
            if !metrics.is_empty() {
                out.push(family(def, metrics));
            }
        }
        // What is left is the process collector's, in the registry's (name) order.
        out.extend(gathered);
        out
    }
}

/// Help text of a catalog row, so registry-kept metrics share the catalog's wording.
fn help_of(name: &str) -> &'static str {
    catalog::find(name).map_or("", |d| d.help)
}

fn family(def: &MetricDef, metrics: Vec<Metric>) -> MetricFamily {
    let mut f = MetricFamily::default();
    f.set_name(def.name.to_owned());
    f.set_help(def.help.to_owned());
    f.set_field_type(match def.kind {
        MetricKind::Gauge => MetricType::GAUGE,
        MetricKind::Counter => MetricType::COUNTER,
        MetricKind::Histogram => MetricType::HISTOGRAM,
    });
    f.set_metric(metrics);
    f
}

/// One series of `def` with all its label values (identity labels first) and its value.
fn metric(def: &MetricDef, label_values: impl Iterator<Item = String>, value: f64) -> Metric {
    let names = def.all_labels();
    let labels: Vec<LabelPair> = names
        .iter()
        .zip(label_values)
        .map(|(name, value)| {
            let mut pair = LabelPair::default();
            pair.set_name((*name).to_owned());
            pair.set_value(value);
            pair
        })
        .collect();
    debug_assert_eq!(labels.len(), names.len(), "{}: label count", def.name);
    let mut m = Metric::default();
    m.set_label(labels);
    match def.kind {
        MetricKind::Counter => {
            let mut c = Counter::default();
            c.set_value(value);
            m.set_counter(c);
        }
        // Histograms come from the registry, never through here.
        MetricKind::Gauge | MetricKind::Histogram => {
            let mut g = Gauge::default();
            g.set_value(value);
            m.set_gauge(g);
        }
    }
    m
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut enc = GzEncoder::new(Vec::with_capacity(data.len() / 4), Compression::default());
    // Writing to a Vec cannot fail.
    if let Err(e) = enc.write_all(data) {
        tracing::error!(error = %e, "gzip of the exposition failed");
    }
    enc.finish().unwrap_or_default()
}

#[cfg(test)]
mod tests;
