//! Snapshot → Prometheus text exposition, encoded once per sampling tick.
//!
//! The [`catalog`] declares every family once; [`Encoder::encode`] walks it in order and writes
//! the text format 0.0.4 of a [`Snapshot`] straight into a buffer it keeps across ticks
//! (`text`), appending the text of its own registry's families (tick-duration histogram,
//! scrape counter) where they belong and the `process_*` families last (module `exporter_process`).
//! Series lines that repeat from the last tick are copied from its text (module `lines`). That
//! buffer is published as it is (and comes back through [`Encoder::recycle`]); a scrape only
//! serves those bytes; the gzip form is made on demand, at most once per exposition
//! ([`Exposition::gzip`]).
//!
//! Rules the encoder enforces: a reading that is `None` (or an empty list) produces no series;
//! a device with `up == false` keeps only `nvidia_gpu_info`, `nvidia_gpu_up 0` (and its
//! `nvidia_gpu_pod_info`); every per-GPU series carries `gpu` and `uuid`. With Kubernetes
//! attribution the snapshot's kubelet assignments are resolved against its devices here
//! ([`crate::kubernetes::mapping`]); with [`MetricsOptions::pod_labels`] a GPU assigned to exactly
//! one container adds `namespace`, `pod`, `container` to all its series. A GPU shared by several
//! containers (time-slicing, MPS) gets none: its power or memory is not any single one's, and
//! `nvidia_gpu_pod_info` lists all of them to join on. With `--processes`, per-process series
//! name each process's own container instead, and per-pod series sum each container's processes
//! on a GPU ([`crate::processes::attribution`]). Families come in catalog order, series by GPU
//! index and then in label order (processes by pid), and the `process_*` families last.
//!
//! MIG: a GPU in MIG mode also serves one series per GPU instance in every device family whose
//! reading the instance has (memory, GPM saturation), right after the GPU's own, with the extra
//! labels [`catalog::MIG_LABELS`]; the family's reader is applied to a view of the
//! instance (`instance_view`), so the values go through the very code of the GPU's. An instance
//! the kubelet assigned to exactly one container carries that container's labels, and
//! `nvidia_gpu_pod_info` lists instance assignments with `gpu_instance` and `mig_profile`.
//! Process series and per-pod sums add the labels of the instance the process runs in.
//!
//! With [`MetricsOptions::dcgm_compat`] the dcgm-exporter names of the same snapshot follow
//! ([`dcgm`]), written by the same text writer in the same pass; in `dcgm` mode the native per-GPU
//! families are left out (the exporter's self-metrics stay).

pub mod catalog;
pub mod dcgm;
pub mod docs;
#[cfg(target_os = "linux")]
mod exporter_process;
mod lines;
pub mod samples;
mod text;

use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};

use axum::body::Bytes;
use flate2::Compression;
use flate2::write::GzEncoder;
use prometheus::proto::MetricFamily;
use prometheus::{Histogram, HistogramOpts, IntCounter, IntCounterVec, Opts, Registry};

use crate::config::DcgmCompat;
use crate::kubernetes::mapping;
use crate::processes::DEFAULT_MAX_PROCESSES_PER_GPU;
use crate::processes::attribution::{GpuProcesses, Owners, summarize};
use crate::sample::{ContainerRef, DeviceSample, MigInstanceSample, PodIdentity, Snapshot};
use catalog::{
    CATALOG, IDENTITY_LABELS, MIG_LABELS, POD_LABELS, PROCESS_LABELS, SAMPLE_DURATION_SECONDS,
    SCRAPES_TOTAL, Source,
};
use lines::Lines;
use samples::Samples;

pub use catalog::{REVISION, RUSTC, VERSION};

/// Content type of [`Exposition::text`] (and of the decompressed [`Exposition::gzip`]).
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Bucket bounds of `nvml_exporter_sample_duration_seconds`: a healthy tick over 8 GPUs takes
/// milliseconds, a tick that waits on a hanging device takes up to its deadline (seconds).
const SAMPLE_DURATION_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// gzip level of [`Exposition::gzip`]. Level 1 against the default 6 (miniz_oxide, measured on
/// this exporter's bodies): 8 GPUs, 178 kB → 12.2 kB in 0.20 ms vs 9.3 kB in 1.71 ms; 64 GPUs,
/// 1.37 MB → 74 kB in 1.6 ms vs 51 kB in 12.7 ms. A third more bytes on loopback or LAN costs far
/// less than 8× the CPU, and the first gzip scrape of a tick waits for this compression.
const GZIP_LEVEL: Compression = Compression::fast();

/// Encoding choices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricsOptions {
    /// Add `namespace`, `pod`, `container` to every series of a GPU that the snapshot's kubelet
    /// state assigns to exactly one container (`--kubernetes-labels`).
    pub pod_labels: bool,
    /// At most this many process series per GPU, the largest by memory
    /// (`--max-processes-per-gpu`); per-pod sums count every process.
    pub max_processes_per_gpu: usize,
    /// Which names the GPUs' series are served under (`--dcgm-compat`).
    pub dcgm_compat: DcgmCompat,
    /// `Hostname` label of the dcgm-exporter series ([`dcgm::hostname`]); left out when empty.
    pub hostname: String,
}

impl Default for MetricsOptions {
    /// No pod labels; the default process series limit.
    fn default() -> Self {
        MetricsOptions {
            pod_labels: false,
            max_processes_per_gpu: DEFAULT_MAX_PROCESSES_PER_GPU,
            dcgm_compat: DcgmCompat::Off,
            hostname: String::new(),
        }
    }
}

/// One encoded exposition. Cloning shares the buffers, the lazily made gzip form included.
#[derive(Debug, Clone)]
pub struct Exposition {
    /// Text format 0.0.4.
    pub text: Bytes,
    /// `text` gzip-compressed, made by the first [`gzip`](Self::gzip) call.
    gzip: Arc<OnceLock<Bytes>>,
}

impl Exposition {
    fn new(text: Bytes) -> Exposition {
        Exposition {
            text,
            gzip: Arc::default(),
        }
    }

    /// `text`, gzip-compressed. Compresses on the first call only: Prometheus scrapes with gzip
    /// every 15–60 s while ticks come every second, so compressing every tick eagerly would be
    /// wasted on most of them, and concurrent scrapers of one tick share one compression (the
    /// others wait for it). Takes milliseconds on large bodies: call it off async workers.
    pub fn gzip(&self) -> Bytes {
        self.gzip
            .get_or_init(|| Bytes::from(gzip(&self.text)))
            .clone()
    }

    /// The gzip form if some earlier [`gzip`](Self::gzip) call already made it.
    pub fn gzip_if_ready(&self) -> Option<Bytes> {
        self.gzip.get().cloned()
    }
}

/// Counts `/metrics` responses by status code; the counts appear in `nvml_exporter_scrapes_total`
/// from the next [`Encoder::encode`] on (one tick of lag: a scrape never encodes).
#[derive(Debug, Clone)]
pub struct ScrapeCounter {
    by_code: IntCounterVec,
    /// The `code="200"` child, looked up once: nearly every response is counted here, without
    /// formatting the code or hashing a label value.
    ok: IntCounter,
}

impl ScrapeCounter {
    fn new(by_code: IntCounterVec) -> ScrapeCounter {
        let ok = by_code.with_label_values(&["200"]);
        ScrapeCounter { by_code, ok }
    }

    /// Counts one response with this HTTP status code.
    pub fn inc(&self, code: u16) {
        if code == 200 {
            self.ok.inc();
        } else {
            self.by_code.with_label_values(&[code.to_string()]).inc();
        }
    }
}

/// Buffers one encoding works in, kept across ticks so that a steady tick allocates (almost)
/// nothing. The text buffer is published itself and comes back through [`Encoder::recycle`].
#[derive(Debug, Default)]
struct Scratch {
    text: Vec<u8>,
    /// Line prefixes of the previous exposition, copied when the same series comes again.
    lines: Lines,
    samples: Samples,
    /// `gpu` label value of each device, in serving order.
    indices: Vec<String>,
    /// Each device's shared label pairs, in serving order.
    frames: Frames,
    /// Length of the last text written, to size a fresh buffer.
    last_len: usize,
    /// The `process_*` metrics, made on the first encoding.
    #[cfg(target_os = "linux")]
    process: Option<exporter_process::ProcessMetrics>,
}

/// The label pairs every series of a device starts with (`gpu="…",uuid="…"`) and, with pod
/// labels, ends with (`namespace="…",pod="…",container="…"`), escaped once per encoding and
/// written raw into each of the device's lines ([`text::sample_framed`]). The previous
/// encoding's are kept to tell whether a device's pairs changed ([`Frames::same`]).
#[derive(Debug, Default)]
struct Frames {
    text: Vec<u8>,
    /// Per device: where its head starts, where it ends (and its tail starts), where its tail ends.
    bounds: Vec<[usize; 3]>,
    prev_text: Vec<u8>,
    prev_bounds: Vec<[usize; 3]>,
    /// Per device: its pairs are byte for byte those of the device at the same position in the
    /// previous encoding.
    same: Vec<bool>,
}

impl Frames {
    /// Starts an encoding; the frames pushed so far become the previous ones.
    fn clear(&mut self) {
        std::mem::swap(&mut self.text, &mut self.prev_text);
        std::mem::swap(&mut self.bounds, &mut self.prev_bounds);
        self.text.clear();
        self.bounds.clear();
        self.same.clear();
    }

    /// Whether the `i`-th device's pairs are those of the `i`-th device of the previous
    /// encoding.
    fn same(&self, i: usize) -> bool {
        self.same.get(i).copied().unwrap_or(false)
    }

    /// Renders the next device's head and tail; `owner` adds the tail.
    fn push(&mut self, index: &str, uuid: &str, owner: Option<&ContainerRef>) {
        let start = self.text.len();
        text::label_pairs(
            &mut self.text,
            IDENTITY_LABELS.iter().copied(),
            [index, uuid].into_iter(),
        );
        let middle = self.text.len();
        if let Some(c) = owner {
            text::label_pairs(
                &mut self.text,
                POD_LABELS.iter().copied(),
                container_labels(c).into_iter(),
            );
        }
        let end = self.text.len();
        let i = self.bounds.len();
        let same = self
            .prev_bounds
            .get(i)
            .is_some_and(|&[p_start, p_middle, p_end]| {
                p_middle - p_start == middle - start
                    && self.prev_text[p_start..p_end] == self.text[start..end]
            });
        self.bounds.push([start, middle, end]);
        self.same.push(same);
    }

    /// Head and tail of the `i`-th device pushed.
    fn get(&self, i: usize) -> (&[u8], &[u8]) {
        let [start, middle, end] = self.bounds[i];
        (&self.text[start..middle], &self.text[middle..end])
    }
}

/// Turns snapshots into expositions; keeps the state that outlives one snapshot.
#[derive(Debug)]
pub struct Encoder {
    opts: MetricsOptions,
    registry: Registry,
    sample_duration: Histogram,
    scrapes: ScrapeCounter,
    /// Only the sampler thread encodes; the lock just makes `encode(&self)` sound.
    scratch: Mutex<Scratch>,
}
impl Encoder {
    /// An encoder with its own registry: tick-duration histogram and scrape counter.
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
        // The common case shows at 0 from the start (ScrapeCounter::new makes its child), so
        // rate() has a first point before the first scrape is counted.
        // Registration only fails on a duplicate name, and this registry is fresh.
        registry
            .register(Box::new(sample_duration.clone()))
            .expect("fresh registry");
        registry
            .register(Box::new(scrapes.clone()))
            .expect("fresh registry");
        Encoder {
            opts,
            registry,
            sample_duration,
            scrapes: ScrapeCounter::new(scrapes),
            scratch: Mutex::default(),
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

    /// Encodes `snap` as text (gzip on demand). Observes `snap.tick_duration_seconds` once, so
    /// call this once per tick.
    pub fn encode(&self, snap: &Snapshot) -> Exposition {
        if let Some(d) = snap.tick_duration_seconds.filter(|d| d.is_finite()) {
            self.sample_duration.observe(d);
        }
        // A poisoned lock only means an earlier encode panicked; every buffer is cleared first.
        let mut scratch = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        if scratch.text.capacity() == 0 {
            // No buffer came back (first tick, or the last one was still being served): size it
            // like the last exposition so it does not grow by doubling and copying.
            let size = scratch.last_len + scratch.last_len / 8;
            scratch.text.reserve(size);
        }
        scratch.lines.begin();
        self.write_text(snap, &mut scratch);
        scratch.last_len = scratch.text.len();
        // The buffer itself is published, not a copy; [`recycle`](Self::recycle) brings it back.
        let text = Bytes::from(std::mem::take(&mut scratch.text));
        // The next encoding copies line prefixes from it (a shared handle, not a copy).
        scratch.lines.end(text.clone());
        Exposition::new(text)
    }

    /// Takes back an exposition that is no longer served, so that the next [`encode`] writes
    /// into its buffer instead of a new one: with the published one, two buffers at any time
    /// instead of three (scratch, published copy, previous exposition). If a response still holds
    /// the text, nothing is taken back and the next encode allocates.
    ///
    /// [`encode`]: Self::encode
    pub fn recycle(&self, old: Exposition) {
        let Exposition { text, gzip } = old;
        // A scraper may still hold the gzip form; it owns no part of the text buffer.
        drop(gzip);
        let Ok(buffer) = text.try_into_mut() else {
            return;
        };
        let mut buffer = Vec::from(buffer);
        buffer.clear();
        let mut scratch = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        if buffer.capacity() > scratch.text.capacity() {
            scratch.text = buffer;
        }
    }

    /// Writes the whole exposition of `snap` into `scratch.text`, in serving order.
    fn write_text(&self, snap: &Snapshot, scratch: &mut Scratch) {
        let Scratch {
            text: out,
            lines,
            samples,
            indices,
            frames,
            last_len: _,
            #[cfg(target_os = "linux")]
            process,
        } = scratch;
        out.clear();
        let mut gathered = self.registry.gather();
        let mut devices: Vec<&DeviceSample> = snap.devices.iter().map(Arc::as_ref).collect();
        devices.sort_by_key(|d| d.index);
        indices.clear();
        indices.extend(devices.iter().map(|d| d.index.to_string()));
        // Containers per device (same order); empty without Kubernetes attribution.
        let assigned: Vec<Vec<&ContainerRef>> = snap
            .kubernetes
            .as_ref()
            .map(|k| mapping::attribute(&k.assignments, &devices))
            .unwrap_or_default();
        // Process and pod-usage series per device (same order); worked out only when a device
        // has processes, so the default output costs nothing here.
        // The one container pod-resources assigns device `i` to, if exactly one.
        let only_container = |i: usize| -> Option<&ContainerRef> {
            match assigned.get(i).map(Vec::as_slice) {
                Some([only]) => Some(*only),
                _ => None,
            }
        };
        // Containers per MIG instance of each device (same order); resolved once per tick for
        // both the instance series and the processes' owners, and only when there is MIG.
        let has_mig = devices.iter().any(|d| !d.mig_instances.is_empty());
        let instance_assigned: Vec<Vec<Vec<&ContainerRef>>> = snap
            .kubernetes
            .as_ref()
            .filter(|_| has_mig)
            .map(|k| mapping::attribute_instances(&k.assignments, &devices))
            .unwrap_or_default();
        let gpu_processes: Vec<GpuProcesses> = if devices.iter().any(|d| !d.processes.is_empty()) {
            let pods: &[PodIdentity] = snap.kubernetes.as_ref().map_or(&[], |k| &k.pods);
            devices
                .iter()
                .enumerate()
                .map(|(i, d)| {
                    // pod-resources' single owner (of the GPU, or of a process's MIG instance)
                    // stands in when the pod list cannot name a process's container, whatever
                    // `pod_labels` says.
                    let owners = Owners {
                        gpu: only_container(i),
                        mig_instances: &d.mig_instances,
                        instance_containers: instance_assigned.get(i).map_or(&[], Vec::as_slice),
                    };
                    summarize(&d.processes, pods, owners, self.opts.max_processes_per_gpu)
                })
                .collect()
        } else {
            Vec::new()
        };
        // The one container whose labels a device's series carry, if any.
        let owner = |i: usize| only_container(i).filter(|_| self.opts.pod_labels);
        // MIG: each device's GPU instances as the family readers see them, with their containers
        // and label values; all empty (and nothing allocated) on GPUs without MIG instances.
        let instances: Vec<Vec<Instance>> = if has_mig {
            devices
                .iter()
                .enumerate()
                .map(|(i, d)| {
                    d.mig_instances
                        .iter()
                        .enumerate()
                        .map(|(j, m)| Instance {
                            view: instance_view(d, m),
                            gpu_instance: m.gpu_instance.to_string(),
                            profile: &m.profile,
                            containers: instance_assigned
                                .get(i)
                                .and_then(|g| g.get(j))
                                .cloned()
                                .unwrap_or_default(),
                        })
                        .collect()
                })
                .collect()
        } else {
            Vec::new()
        };
        let instances_of = |i: usize| instances.get(i).map_or(&[][..], Vec::as_slice);
        frames.clear();
        for (i, (d, index)) in devices.iter().zip(indices.iter()).enumerate() {
            frames.push(index, &d.uuid, owner(i));
        }

        // In `dcgm` mode the GPUs are served under dcgm-exporter's names only.
        let native_devices = self.opts.dcgm_compat != DcgmCompat::Dcgm;
        let headers = catalog_headers();
        for (family, (def, header)) in (0u32..).zip(CATALOG.iter().zip(headers)) {
            if !native_devices && def.source.is_per_device() {
                continue;
            }
            // The header goes first and is taken back if the family turns out to have no series.
            let family_start = out.len();
            out.extend_from_slice(header);
            let series_start = out.len();
            match def.source {
                Source::Device(read) | Source::DeviceIdentity(read) => {
                    let always = matches!(def.source, Source::DeviceIdentity(_));
                    for (i, d) in devices.iter().enumerate() {
                        if !(d.up || always) {
                            continue;
                        }
                        samples.clear();
                        read(&snap.system, d, samples);
                        let (head, tail) = frames.get(i);
                        let (device, frame_same) = (i as u32, frames.same(i));
                        for (labels, value) in samples.iter() {
                            let render = |out: &mut Vec<u8>| {
                                let names = def.labels.iter().copied();
                                let values = labels.clone();
                                text::prefix_framed(out, def.name, head, names, values, tail);
                            };
                            let key = labels.clone();
                            lines.line(out, family, device, frame_same, key, render, value);
                        }
                        if always || !d.up {
                            continue;
                        }
                        for inst in instances_of(i) {
                            samples.clear();
                            read(&snap.system, &inst.view, samples);
                            let owner = inst.owner(self.opts.pod_labels);
                            let pod_names: &[&str] = if owner.is_some() { POD_LABELS } else { &[] };
                            for (labels, value) in samples.iter() {
                                let names = def
                                    .labels
                                    .iter()
                                    .chain(MIG_LABELS)
                                    .chain(pod_names)
                                    .copied();
                                let values = labels
                                    .chain([inst.gpu_instance.as_str(), inst.profile])
                                    .chain(owner.into_iter().flat_map(container_labels));
                                text::sample_framed(out, def.name, head, names, values, b"", value);
                            }
                        }
                    }
                }
                Source::PodAssignments => {
                    for (i, containers) in assigned.iter().enumerate() {
                        let (head, _) = frames.get(i);
                        for c in containers {
                            let names = POD_LABELS.iter().copied();
                            let values = container_labels(c).into_iter();
                            text::sample_framed(out, def.name, head, names, values, b"", 1.0);
                        }
                    }
                    for i in 0..devices.len() {
                        let (head, _) = frames.get(i);
                        for inst in instances_of(i) {
                            for c in &inst.containers {
                                let names = MIG_LABELS.iter().chain(POD_LABELS).copied();
                                let values = [inst.gpu_instance.as_str(), inst.profile]
                                    .into_iter()
                                    .chain(container_labels(c));
                                text::sample_framed(out, def.name, head, names, values, b"", 1.0);
                            }
                        }
                    }
                }
                Source::Processes(field) => {
                    let per_gpu = devices.iter().zip(&gpu_processes).enumerate();
                    for (i, (d, g)) in per_gpu.filter(|(_, (d, _))| d.up) {
                        let (head, _) = frames.get(i);
                        for p in &g.processes {
                            let Some(value) = field.of_process(p.process).filter(|v| v.is_finite())
                            else {
                                continue;
                            };
                            let pid = p.process.pid.to_string();
                            let pod_names: &[&str] = if p.container.is_some() {
                                POD_LABELS
                            } else {
                                &[]
                            };
                            let mig = MigLabels::of(d, p.process.gpu_instance);
                            let names = PROCESS_LABELS
                                .iter()
                                .chain(mig.names())
                                .chain(pod_names)
                                .copied();
                            let values = [pid.as_str(), &p.process.name]
                                .into_iter()
                                .chain(mig.values())
                                .chain(p.container.iter().flat_map(container_labels));
                            text::sample_framed(out, def.name, head, names, values, b"", value);
                        }
                    }
                }
                Source::PodProcesses(field) => {
                    let per_gpu = devices.iter().zip(&gpu_processes).enumerate();
                    for (i, (d, g)) in per_gpu.filter(|(_, (d, _))| d.up) {
                        let (head, _) = frames.get(i);
                        for u in &g.pods {
                            let Some(value) = field.of_pod(u).filter(|v| v.is_finite()) else {
                                continue;
                            };
                            let mig = MigLabels::of(d, u.gpu_instance);
                            let names = mig.names().iter().chain(POD_LABELS).copied();
                            let values = mig.values().chain(container_labels(&u.container));
                            text::sample_framed(out, def.name, head, names, values, b"", value);
                        }
                    }
                }
                Source::Exporter(read) => {
                    samples.clear();
                    read(snap, samples);
                    for (labels, value) in samples.iter() {
                        text::sample(out, def.name, def.labels.iter().copied(), labels, value);
                    }
                }
                Source::Registry => {
                    // The registry's own help and type lines come with its text.
                    out.truncate(family_start);
                    if let Some(pos) = gathered.iter().position(|f| f.name() == def.name) {
                        append_family(out, &gathered.remove(pos));
                    }
                    continue;
                }
            }
            if out.len() == series_start {
                out.truncate(family_start);
            }
        }
        // Registry families the catalog does not place (none today) go last, then the process's.
        for family in &gathered {
            append_family(out, family);
        }
        #[cfg(target_os = "linux")]
        process
            .get_or_insert_with(exporter_process::ProcessMetrics::new)
            .write(out);
        if self.opts.dcgm_compat != DcgmCompat::Off {
            let compat: Vec<dcgm::Device<'_>> = devices
                .iter()
                .zip(indices.iter())
                .enumerate()
                .map(|(i, (d, index))| dcgm::Device {
                    sample: d,
                    index,
                    owner: owner(i),
                    instances: instances_of(i)
                        .iter()
                        .map(|inst| dcgm::Instance {
                            view: &inst.view,
                            gpu_instance: &inst.gpu_instance,
                            profile: inst.profile,
                            owner: inst.owner(self.opts.pod_labels),
                        })
                        .collect(),
                })
                .collect();
            dcgm::write(out, snap, &compat, &self.opts.hostname, samples);
        }
    }
}

/// A MIG GPU instance as the encoder serves it.
struct Instance<'a> {
    /// What the family readers read for it ([`instance_view`]).
    view: DeviceSample,
    /// `gpu_instance` label value.
    gpu_instance: String,
    /// `mig_profile` label value.
    profile: &'a str,
    /// Containers the kubelet assigned it to, sorted and distinct.
    containers: Vec<&'a ContainerRef>,
}

impl<'a> Instance<'a> {
    /// The one container whose labels the instance's series carry (with `pod_labels`), if any.
    fn owner(&self, pod_labels: bool) -> Option<&'a ContainerRef> {
        match self.containers.as_slice() {
            [only] if pod_labels => Some(*only),
            _ => None,
        }
    }
}

/// A GPU instance of `parent` as a device sample that holds only the instance's own readings
/// (memory, GPM): a family reader then yields the instance's series for exactly the families
/// that have a per-instance reading, and nothing for the others (a unit test keeps every device
/// family silent on an empty sample).
pub(crate) fn instance_view(parent: &DeviceSample, instance: &MigInstanceSample) -> DeviceSample {
    DeviceSample {
        index: parent.index,
        uuid: parent.uuid.clone(),
        up: true,
        memory: instance.memory,
        gpm: instance.gpm.clone(),
        ..DeviceSample::default()
    }
}

/// The [`MIG_LABELS`] of a process or per-pod sum in a MIG GPU instance; none outside one.
struct MigLabels<'a> {
    /// (`gpu_instance`, `mig_profile`) values.
    values: Option<(String, &'a str)>,
}

impl<'a> MigLabels<'a> {
    /// The labels of GPU instance `gpu_instance` of `d`; its profile is "" when the snapshot has
    /// no such instance (NVML listed the process before the instance was read).
    fn of(d: &'a DeviceSample, gpu_instance: Option<u32>) -> MigLabels<'a> {
        MigLabels {
            values: gpu_instance.map(|gi| {
                let profile = d
                    .mig_instances
                    .iter()
                    .find(|m| m.gpu_instance == gi)
                    .map_or("", |m| m.profile.as_str());
                (gi.to_string(), profile)
            }),
        }
    }

    fn names(&self) -> &'static [&'static str] {
        if self.values.is_some() {
            MIG_LABELS
        } else {
            &[]
        }
    }

    fn values(&self) -> impl Iterator<Item = &str> {
        self.values
            .iter()
            .flat_map(|(gi, profile)| [gi.as_str(), *profile])
    }
}

/// The [`POD_LABELS`] values of a container, in that order.
fn container_labels(c: &ContainerRef) -> [&str; 3] {
    [&c.namespace, &c.pod, &c.container]
}

/// Appends the text of a family kept by the `prometheus` registry (histogram, scrape counter,
/// process metrics): few series, so its own encoder is cheap enough and exactly right.
fn append_family(out: &mut Vec<u8>, family: &MetricFamily) {
    // The text encoder only rejects empty or unnamed families, which a registry never gathers;
    // log rather than panic on the sampler thread if that ever changes.
    use prometheus::Encoder as _;
    if let Err(e) = prometheus::TextEncoder::new().encode(std::slice::from_ref(family), out) {
        tracing::error!(error = %e, family = family.name(), "encoding a registry family failed");
    }
}

/// The `# HELP` and `# TYPE` lines of every catalog row, in catalog order, escaped once for the
/// process instead of once per family per tick (the help texts are long and every byte is
/// scanned for escapes).
fn catalog_headers() -> &'static [Vec<u8>] {
    static HEADERS: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    HEADERS.get_or_init(|| {
        CATALOG
            .iter()
            .map(|def| {
                let mut h = Vec::new();
                text::header(&mut h, def.name, def.help, def.kind.as_str());
                h
            })
            .collect()
    })
}

/// Help text of a catalog row, so registry-kept metrics share the catalog's wording.
fn help_of(name: &str) -> &'static str {
    catalog::find(name).map_or("", |d| d.help)
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut enc = GzEncoder::new(Vec::with_capacity(data.len() / 4), GZIP_LEVEL);
    // Writing to a Vec cannot fail.
    if let Err(e) = enc.write_all(data) {
        tracing::error!(error = %e, "gzip of the exposition failed");
    }
    enc.finish().unwrap_or_default()
}

#[cfg(test)]
mod tests;
