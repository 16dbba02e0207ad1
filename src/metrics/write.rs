//! The writers: the native families of one snapshot, in catalog order, one writer per
//! [`Source`], each series through one [`Sink`]: the text exposition ([`Text`], each line through
//! [`text::line`]), or the OTLP push's encoding of the same series (`crate::otlp`).
//!
//! A family is its `# HELP` and `# TYPE` lines and then its series, device by device in `gpu`
//! order; a family without a series is left out. Per-GPU series start with the identity labels
//! `gpu` and `uuid`, then the row's own labels, then (for a GPU or MIG instance with a single
//! owner) `namespace`, `pod`, `container`. A MIG instance's series follow its GPU's with
//! `gpu_instance` and `mig_profile` after the row's labels. A device that is not up keeps only
//! the families that are always served (identity, `up`, pod assignments, health).

use prometheus::proto::MetricFamily;

use std::collections::BTreeMap;

use crate::kubernetes::mapping;
use crate::sample::{ContainerRef, DeviceSample, PodMeta, Snapshot};

use super::catalog::{
    CATALOG, DeviceSeries, ExporterSeries, MIG_LABELS, MetricDef, POD_LABELS, PROCESS_LABELS,
    Source, WorkloadSeries,
};
use super::resolve::{DeviceView, container_labels};
use super::samples::Samples;
use super::text::{self, Text};
use crate::groups::{GROUPS, Groups};
use crate::processes::ProcessField;

/// Series per collector group, indexed by `Group as usize`.
pub(super) type PerGroup = [usize; GROUPS.len()];

/// Where the writers put the series they walk. Every series of a native family goes through
/// [`Sink::series`], so that each encoding holds exactly the same series and values.
pub(crate) trait Sink {
    /// The family `def` starts (its series follow); returns the mark [`Sink::end`] takes.
    fn begin(&mut self, def: &'static MetricDef) -> usize;
    /// The family begun at `mark` ends; `empty` when it had no series.
    fn end(&mut self, mark: usize, empty: bool);
    /// One series of `def`: of `device` (`None` for an exporter-wide family), its label pairs
    /// after the identity labels (the row's own, then MIG and pod labels), and its value.
    fn series<'n, 'v>(
        &mut self,
        def: &'static MetricDef,
        device: Option<&DeviceView<'_>>,
        labels: impl IntoIterator<Item = (&'n str, &'v str)>,
        value: f64,
    );
    /// Series so far.
    fn count(&self) -> usize;
}

/// The text exposition: a family's header, then a line per series; a family without a series
/// is taken out again.
impl Sink for Text {
    fn begin(&mut self, def: &'static MetricDef) -> usize {
        let mark = self.bytes.len();
        text::header(self, def.name, def.help, def.kind.as_str());
        mark
    }

    fn end(&mut self, mark: usize, empty: bool) {
        if empty {
            self.bytes.truncate(mark);
        }
    }

    fn series<'n, 'v>(
        &mut self,
        def: &'static MetricDef,
        device: Option<&DeviceView<'_>>,
        labels: impl IntoIterator<Item = (&'n str, &'v str)>,
        value: f64,
    ) {
        let head = device.map_or("", |d| d.identity.as_str());
        text::line(self, def.name, head, labels, value);
    }

    fn count(&self) -> usize {
        self.series
    }
}

/// Appends the per-GPU families of `snap` whose group is in `groups` to `out`, in catalog order,
/// and returns their series per group. `devices` are its resolved views.
pub(super) fn gpu_families(
    out: &mut impl Sink,
    snap: &Snapshot,
    devices: &[DeviceView<'_>],
    groups: Groups,
) -> PerGroup {
    let mut samples = Samples::default();
    let mut per_group = [0; GROUPS.len()];
    for def in CATALOG
        .iter()
        .filter(|def| def.source.is_per_device() && groups.contains(def.group))
    {
        let series_start = out.count();
        let family = out.begin(def);
        match def.source {
            Source::Device(read) => {
                device_series(out, def, read, false, snap, devices, &mut samples)
            }
            Source::DeviceIdentity(read) => {
                device_series(out, def, read, true, snap, devices, &mut samples)
            }
            Source::PodAssignments => pod_assignments(out, def, snap, devices),
            Source::Processes(field) => processes(out, def, field, devices),
            Source::PodProcesses(field) => pod_processes(out, def, field, devices),
            Source::OutsideAllocation => outside_allocation(out, def, devices),
            Source::Jobs => jobs(out, def, devices),
            Source::Workloads(read) => workloads(out, def, read, devices),
            Source::Exporter(_) | Source::Registry => {}
        }
        out.end(family, out.count() == series_start);
        per_group[def.group as usize] += out.count() - series_start;
    }
    per_group
}

/// Appends the node's and the exporter's own families in catalog order (they follow the GPU
/// families there): those read from `snap` whose group is in `groups`, and the families the
/// encoder's registry keeps (`gathered`) where the catalog places them, any others after.
pub(super) fn own_families(
    out: &mut Text,
    snap: &Snapshot,
    groups: Groups,
    mut gathered: Vec<MetricFamily>,
) {
    let mut samples = Samples::default();
    for def in CATALOG
        .iter()
        .filter(|def| !def.source.is_per_device() && groups.contains(def.group))
    {
        match def.source {
            Source::Registry => {
                if let Some(at) = gathered.iter().position(|f| f.name() == def.name) {
                    append_registry_family(out, &gathered.remove(at));
                }
            }
            Source::Exporter(read) => exporter_family(out, def, read, snap, &mut samples),
            _ => {}
        }
    }
    for family in &gathered {
        append_registry_family(out, family);
    }
}

/// Appends the exporter-wide families read from `snap` (those of the registry aside), in
/// catalog order.
pub(super) fn exporter_families(out: &mut impl Sink, snap: &Snapshot) {
    let mut samples = Samples::default();
    for def in CATALOG {
        if let Source::Exporter(read) = def.source {
            exporter_family(out, def, read, snap, &mut samples);
        }
    }
}

/// The `namespace`, `pod`, `container` pairs of a container, if any.
fn pod_pairs(
    owner: Option<&crate::sample::ContainerRef>,
) -> impl Iterator<Item = (&'static str, &str)> {
    owner
        .into_iter()
        .flat_map(|c| POD_LABELS.iter().copied().zip(container_labels(c)))
}

/// A per-GPU family read from each device's reading (and each MIG instance's); `always`: also
/// for a device that is not up, and never for instances.
fn device_series(
    out: &mut impl Sink,
    def: &'static MetricDef,
    read: DeviceSeries,
    always: bool,
    snap: &Snapshot,
    devices: &[DeviceView<'_>],
    samples: &mut Samples,
) {
    for d in devices.iter().filter(|d| always || d.sample.up) {
        samples.clear();
        read(&snap.system, d.sample, samples);
        for (values, value) in samples.iter() {
            let own = def.labels.iter().copied().zip(values);
            let labels = own.chain(pod_pairs(d.owner));
            out.series(def, Some(d), labels, value);
        }
        if always {
            continue;
        }
        for instance in &d.instances {
            samples.clear();
            read(&snap.system, &instance.sample, samples);
            let mig = MIG_LABELS
                .iter()
                .copied()
                .zip([instance.gpu_instance.as_str(), instance.profile]);
            for (values, value) in samples.iter() {
                let own = def.labels.iter().copied().zip(values);
                let labels = own.chain(mig.clone()).chain(pod_pairs(instance.owner));
                out.series(def, Some(d), labels, value);
            }
        }
    }
}

/// `nvidia_gpu_pod_info`: one series per (GPU, container), then per (MIG instance, container);
/// `claim` after the container's labels where the container holds it through DRA claims.
fn pod_assignments(
    out: &mut impl Sink,
    def: &'static MetricDef,
    snap: &Snapshot,
    devices: &[DeviceView<'_>],
) {
    let metas = snap.kubernetes.as_ref().map(|k| &*k.pod_meta);
    let assignments = snap
        .kubernetes
        .as_ref()
        .map_or(&[][..], |k| &k.assignments[..]);
    for d in devices {
        for c in &d.containers {
            let claims = mapping::claims_of(assignments, d.sample, None, c);
            let labels = pod_pairs(Some(c))
                .map(|(n, v)| (n as &str, v))
                .chain(claim_pair(&claims))
                .chain(meta_pairs(metas, c));
            out.series(def, Some(d), labels, 1.0);
        }
    }
    for d in devices {
        for instance in &d.instances {
            let mig = MIG_LABELS
                .iter()
                .copied()
                .zip([instance.gpu_instance.as_str(), instance.profile]);
            for c in &instance.containers {
                let claims = mapping::claims_of(assignments, d.sample, Some(instance.id), c);
                let labels = mig
                    .clone()
                    .chain(pod_pairs(Some(c)))
                    .map(|(n, v)| (n as &str, v))
                    .chain(claim_pair(&claims))
                    .chain(meta_pairs(metas, c));
                out.series(def, Some(d), labels, 1.0);
            }
        }
    }
}

/// The `claim` pair, absent (Prometheus's empty value) for a device plugin's assignment.
fn claim_pair(claims: &str) -> Option<(&'static str, &str)> {
    (!claims.is_empty()).then_some(("claim", claims))
}

/// One series per HPC job of each GPU, then of each MIG GPU instance.
fn jobs(out: &mut impl Sink, def: &'static MetricDef, devices: &[DeviceView<'_>]) {
    for d in devices {
        for job in &d.jobs {
            let labels = def.labels.iter().copied().zip([*job]);
            out.series(def, Some(d), labels, 1.0);
        }
        for instance in &d.instances {
            let mig = MIG_LABELS
                .iter()
                .copied()
                .zip([instance.gpu_instance.as_str(), instance.profile]);
            for job in &instance.jobs {
                let labels = def.labels.iter().copied().zip([*job]).chain(mig.clone());
                out.series(def, Some(d), labels, 1.0);
            }
        }
    }
}

/// One series per container holding each GPU, then each MIG GPU instance, with its GPU-seconds.
fn workloads(
    out: &mut impl Sink,
    def: &'static MetricDef,
    read: WorkloadSeries,
    devices: &[DeviceView<'_>],
) {
    for d in devices {
        for w in &d.workloads {
            if let Some(value) = read(w) {
                out.series(def, Some(d), pod_pairs(Some(&w.container)), value);
            }
        }
        for instance in &d.instances {
            let mig = MIG_LABELS
                .iter()
                .copied()
                .zip([instance.gpu_instance.as_str(), instance.profile]);
            for w in &instance.workloads {
                if let Some(value) = read(w) {
                    let labels = mig.clone().chain(pod_pairs(Some(&w.container)));
                    out.series(def, Some(d), labels, value);
                }
            }
        }
    }
}

/// The controller and copied label pairs of a container's pod, from the kubelet's pod list
/// (none without it), served after the container's labels.
fn meta_pairs<'a>(
    metas: Option<&'a BTreeMap<(String, String), PodMeta>>,
    c: &ContainerRef,
) -> Vec<(&'a str, &'a str)> {
    let Some(meta) = metas.and_then(|m| m.get(&(c.namespace.clone(), c.pod.clone()))) else {
        return Vec::new();
    };
    let controller = meta.controller.iter().flat_map(|(kind, name)| {
        [
            ("controller_kind", kind.as_str()),
            ("controller_name", name.as_str()),
        ]
    });
    let copied = meta.labels.iter().map(|(n, v)| (n.as_str(), v.as_str()));
    controller.chain(copied).collect()
}

/// The `gpu_instance` and `mig_profile` pairs of a process or per-container sum in MIG GPU
/// instance `gpu_instance` of `d` (none with MIG off). The profile is empty when the reading has
/// no such instance (NVML listed the process before the instance was read).
fn mig_pairs<'a>(
    d: &'a DeviceSample,
    gpu_instance: Option<u32>,
) -> impl Iterator<Item = (&'static str, String)> + 'a {
    gpu_instance.into_iter().flat_map(move |gi| {
        let profile = d
            .mig_instances
            .iter()
            .find(|m| m.gpu_instance == gi)
            .map_or("", |m| m.profile.as_str());
        MIG_LABELS
            .iter()
            .copied()
            .zip([gi.to_string(), profile.to_owned()])
    })
}

/// Per-process series (`--processes`) of every device that is up.
fn processes(
    out: &mut impl Sink,
    def: &'static MetricDef,
    field: ProcessField,
    devices: &[DeviceView<'_>],
) {
    for d in devices.iter().filter(|d| d.sample.up) {
        for p in &d.processes.processes {
            let Some(value) = field.of_process(p.process).filter(|v| v.is_finite()) else {
                continue;
            };
            let pid = p.process.pid.to_string();
            let own = PROCESS_LABELS
                .iter()
                .copied()
                .zip([pid.as_str(), p.process.name.as_str()]);
            let mig: Vec<_> = mig_pairs(d.sample, p.process.gpu_instance).collect();
            let labels = own
                .chain(mig.iter().map(|(n, v)| (*n, v.as_str())))
                .chain(pod_pairs(p.container.as_ref()));
            out.series(def, Some(d), labels, value);
        }
    }
}

/// Per-container sums of the processes on each device that is up.
fn pod_processes(
    out: &mut impl Sink,
    def: &'static MetricDef,
    field: ProcessField,
    devices: &[DeviceView<'_>],
) {
    for d in devices.iter().filter(|d| d.sample.up) {
        for usage in &d.processes.pods {
            let Some(value) = field.of_pod(usage).filter(|v| v.is_finite()) else {
                continue;
            };
            let mig: Vec<_> = mig_pairs(d.sample, usage.gpu_instance).collect();
            let labels = mig
                .iter()
                .map(|(n, v)| (*n, v.as_str()))
                .chain(pod_pairs(Some(&usage.container)));
            out.series(def, Some(d), labels, value);
        }
    }
}

/// The memory held outside the kubelet's assignments on each device that is up, where measured.
fn outside_allocation(out: &mut impl Sink, def: &'static MetricDef, devices: &[DeviceView<'_>]) {
    for d in devices.iter().filter(|d| d.sample.up) {
        if let Some(bytes) = d.processes.outside_allocation_bytes {
            out.series(def, Some(d), pod_pairs(d.owner), bytes);
        }
    }
}

/// An exporter-wide family, left out when it has no series.
fn exporter_family(
    out: &mut impl Sink,
    def: &'static MetricDef,
    read: ExporterSeries,
    snap: &Snapshot,
    samples: &mut Samples,
) {
    let series_start = out.count();
    let family = out.begin(def);
    samples.clear();
    read(snap, samples);
    for (values, value) in samples.iter() {
        out.series(def, None, def.labels.iter().copied().zip(values), value);
    }
    out.end(family, out.count() == series_start);
}

/// Appends a family kept by the `prometheus` registry (histogram, scrape counter) in that
/// crate's own text format.
fn append_registry_family(out: &mut Text, family: &MetricFamily) {
    use prometheus::Encoder as _;
    let out = &mut out.bytes;
    // The text encoder only rejects empty or unnamed families, which a registry never gathers;
    // log rather than panic on the sampler thread if that ever changes.
    if let Err(e) = prometheus::TextEncoder::new().encode(std::slice::from_ref(family), out) {
        tracing::error!(error = %e, family = family.name(), "encoding a registry family failed");
    }
}
