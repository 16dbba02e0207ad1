//! dcgm-exporter compatibility (`--dcgm-compat`): the catalog's DCGM column served with
//! dcgm-exporter's names, units, types and labels, from the same snapshot as the native families.
//!
//! The catalog stays the one source of truth: each [`Dcgm`] entry of a row says which DCGM field
//! the row (or the series with one label value of it) corresponds to and in which unit DCGM serves
//! it. [`FIELDS`] adds what the catalog does not know: dcgm-exporter's `# TYPE` and `# HELP` for
//! the field, and how several native series make the one DCGM value of a GPU (NVLink error counts
//! are per link natively, per GPU in DCGM). A unit test keeps the two lists in step.
//!
//! Labels follow dcgm-exporter's template, in its order: `gpu`, `UUID`, `pci_bus_id`, `device`
//! (`nvidia<gpu>`), `modelName`, `Hostname` (left out when empty), `DCGM_FI_DRIVER_VERSION`, then
//! with Kubernetes attribution `container`, `namespace`, `pod` (dcgm-exporter renders these from a
//! map, so alphabetically; a GPU no container holds has none of them, as in dcgm-exporter).
//!
//! MIG: dcgm-exporter puts `GPU_I_PROFILE` and `GPU_I_ID` between `modelName` and `Hostname`
//! on a GPU instance's series. Each GPU instance of a GPU in MIG mode gets its series right after
//! the GPU's, from the instance's own readings (memory, profiling fields), with the parent's
//! labels and those two inserted at [`MIG_LABELS_AT`]; the GPU's own series have neither, as in
//! dcgm-exporter. An instance assigned to one container carries that container's labels.
//!
//! Like dcgm-exporter, a GPU that is lost (`up == false`) has no series at all, and a reading the
//! GPU does not support is absent.

use std::ffi::OsString;
use std::sync::OnceLock;

use crate::sample::{ContainerRef, DeviceSample, Snapshot};

use super::catalog::{CATALOG, Dcgm, MetricDef, MetricKind, Source};
use super::samples::Samples;
use super::text;

/// How the native series a DCGM field covers make its one value per GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Combine {
    /// Exactly one native series (or the total over links for the NVLink counters).
    Sum,
    /// The first series in label order: DCGM's fan speed is the first fan's.
    First,
    /// Not from the native values but from [`DeviceSample::last_xid`]: DCGM's XID field is a gauge
    /// of the last XID code. Served once an XID was seen on the GPU: dcgm-exporter serves 0
    /// before any, but whether a GPU reports XID events at all is not known here, and a reading
    /// that may be unsupported is never served as 0. GPU instances have none of their own.
    LastXid,
}

/// One DCGM field served in compatibility mode.
#[derive(Debug, Clone, Copy)]
pub struct Field {
    /// The DCGM field name, which is the metric name.
    pub name: &'static str,
    /// The type dcgm-exporter declares for it.
    pub kind: MetricKind,
    /// `# HELP` text, in dcgm-exporter's style ("… (in MHz).").
    pub help: &'static str,
    /// How the native series are combined.
    pub combine: Combine,
}

const fn field(
    name: &'static str,
    kind: MetricKind,
    help: &'static str,
    combine: Combine,
) -> Field {
    Field {
        name,
        kind,
        help,
        combine,
    }
}

use Combine::{First, LastXid, Sum};
use MetricKind::{Counter, Gauge};

/// Every served DCGM field, in catalog order (which is the exposition order).
pub static FIELDS: &[Field] = &[
    field(
        "DCGM_FI_DEV_GPU_UTIL",
        Gauge,
        "GPU utilization (in %).",
        Sum,
    ),
    field(
        "DCGM_FI_DEV_MEM_COPY_UTIL",
        Gauge,
        "Memory utilization (in %).",
        Sum,
    ),
    field(
        "DCGM_FI_DEV_ENC_UTIL",
        Gauge,
        "Encoder utilization (in %).",
        Sum,
    ),
    field(
        "DCGM_FI_DEV_DEC_UTIL",
        Gauge,
        "Decoder utilization (in %).",
        Sum,
    ),
    field(
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        Gauge,
        "Ratio of time the graphics engine is active.",
        Sum,
    ),
    field(
        "DCGM_FI_PROF_SM_ACTIVE",
        Gauge,
        "Ratio of cycles an SM has at least one warp assigned.",
        Sum,
    ),
    field(
        "DCGM_FI_PROF_SM_OCCUPANCY",
        Gauge,
        "Ratio of warps resident on an SM to the maximum it can hold.",
        Sum,
    ),
    field(
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        Gauge,
        "Ratio of cycles any tensor pipe is active.",
        Sum,
    ),
    field(
        "DCGM_FI_PROF_DRAM_ACTIVE",
        Gauge,
        "Ratio of cycles the device memory interface is active sending or receiving data.",
        Sum,
    ),
    field(
        "DCGM_FI_PROF_PIPE_FP64_ACTIVE",
        Gauge,
        "Ratio of cycles the fp64 pipes are active.",
        Sum,
    ),
    field(
        "DCGM_FI_PROF_PIPE_FP32_ACTIVE",
        Gauge,
        "Ratio of cycles the fp32 pipes are active.",
        Sum,
    ),
    field(
        "DCGM_FI_PROF_PIPE_FP16_ACTIVE",
        Gauge,
        "Ratio of cycles the fp16 pipes are active.",
        Sum,
    ),
    field(
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        Gauge,
        "Rate of data transmitted over the PCIe bus (in bytes per second).",
        Sum,
    ),
    field(
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        Gauge,
        "Rate of data received over the PCIe bus (in bytes per second).",
        Sum,
    ),
    field(
        "DCGM_FI_PROF_NVLINK_TX_BYTES",
        Gauge,
        "Rate of data transmitted over NVLink (in bytes per second).",
        Sum,
    ),
    field(
        "DCGM_FI_PROF_NVLINK_RX_BYTES",
        Gauge,
        "Rate of data received over NVLink (in bytes per second).",
        Sum,
    ),
    field(
        "DCGM_FI_DEV_FB_TOTAL",
        Gauge,
        "Framebuffer memory total (in MiB).",
        Sum,
    ),
    field(
        "DCGM_FI_DEV_FB_USED",
        Gauge,
        "Framebuffer memory used (in MiB).",
        Sum,
    ),
    field(
        "DCGM_FI_DEV_FB_FREE",
        Gauge,
        "Framebuffer memory free (in MiB).",
        Sum,
    ),
    field(
        "DCGM_FI_DEV_FB_RESERVED",
        Gauge,
        "Framebuffer memory reserved (in MiB).",
        Sum,
    ),
    field("DCGM_FI_DEV_POWER_USAGE", Gauge, "Power draw (in W).", Sum),
    field(
        "DCGM_FI_DEV_POWER_MGMT_LIMIT",
        Gauge,
        "Power management limit (in W).",
        Sum,
    ),
    field(
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        Counter,
        "Total energy consumption since boot (in mJ).",
        Sum,
    ),
    field(
        "DCGM_FI_DEV_GPU_TEMP",
        Gauge,
        "GPU temperature (in C).",
        Sum,
    ),
    field(
        "DCGM_FI_DEV_MEMORY_TEMP",
        Gauge,
        "Memory temperature (in C).",
        Sum,
    ),
    field("DCGM_FI_DEV_FAN_SPEED", Gauge, "Fan speed (in %).", First),
    field(
        "DCGM_FI_DEV_SM_CLOCK",
        Gauge,
        "SM clock frequency (in MHz).",
        Sum,
    ),
    field(
        "DCGM_FI_DEV_MEM_CLOCK",
        Gauge,
        "Memory clock frequency (in MHz).",
        Sum,
    ),
    field(
        "DCGM_FI_DEV_PSTATE",
        Gauge,
        "Performance state (P-state) 0-15, 0 is the highest.",
        Sum,
    ),
    field(
        "DCGM_FI_DEV_POWER_VIOLATION",
        Counter,
        "Throttling duration due to power constraints (in ns).",
        Sum,
    ),
    field(
        "DCGM_FI_DEV_THERMAL_VIOLATION",
        Counter,
        "Throttling duration due to thermal constraints (in ns).",
        Sum,
    ),
    field(
        "DCGM_FI_DEV_SYNC_BOOST_VIOLATION",
        Counter,
        "Throttling duration due to sync-boost constraints (in ns).",
        Sum,
    ),
    field(
        "DCGM_FI_DEV_BOARD_LIMIT_VIOLATION",
        Counter,
        "Throttling duration due to board limit constraints (in ns).",
        Sum,
    ),
    field(
        "DCGM_FI_DEV_LOW_UTIL_VIOLATION",
        Counter,
        "Throttling duration due to low utilization (in ns).",
        Sum,
    ),
    field(
        "DCGM_FI_DEV_RELIABILITY_VIOLATION",
        Counter,
        "Throttling duration due to reliability constraints (in ns).",
        Sum,
    ),
    field(
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        Counter,
        "Total number of PCIe retries.",
        Sum,
    ),
    field(
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        Counter,
        "Total number of single-bit volatile ECC errors.",
        Sum,
    ),
    field(
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        Counter,
        "Total number of double-bit volatile ECC errors.",
        Sum,
    ),
    field(
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
        Counter,
        "Total number of single-bit persistent ECC errors.",
        Sum,
    ),
    field(
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
        Counter,
        "Total number of double-bit persistent ECC errors.",
        Sum,
    ),
    field(
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        Counter,
        "Number of remapped rows for correctable errors.",
        Sum,
    ),
    field(
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        Counter,
        "Number of remapped rows for uncorrectable errors.",
        Sum,
    ),
    field(
        "DCGM_FI_DEV_ROW_REMAP_PENDING",
        Gauge,
        "Whether remapping of rows is pending.",
        Sum,
    ),
    field(
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        Gauge,
        "Whether remapping of rows has failed.",
        Sum,
    ),
    field(
        "DCGM_FI_DEV_RETIRED_SBE",
        Counter,
        "Total number of retired pages due to single-bit errors.",
        Sum,
    ),
    field(
        "DCGM_FI_DEV_RETIRED_DBE",
        Counter,
        "Total number of retired pages due to double-bit errors.",
        Sum,
    ),
    field(
        "DCGM_FI_DEV_XID_ERRORS",
        Gauge,
        "Value of the last XID error encountered.",
        LastXid,
    ),
    field(
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
        Counter,
        "Total number of NVLink flow-control CRC errors.",
        Sum,
    ),
    field(
        "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
        Counter,
        "Total number of NVLink data CRC errors.",
        Sum,
    ),
    field(
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
        Counter,
        "Total number of NVLink retries.",
        Sum,
    ),
    field(
        "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
        Counter,
        "Total number of NVLink recovery errors.",
        Sum,
    ),
];

/// DCGM fields of the catalog's DCGM column that are not served, and why (for the docs).
pub static NOT_SERVED: &[(&str, &str)] = &[(
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
    "DCGM's raw NVLink bandwidth counter has no fixed unit (its counter units are set per \
         device); serving bytes under its name would silently change what queries compute. Use \
         nvidia_gpu_nvlink_transmit_bytes_total / _receive_bytes_total.",
)];

/// Where `GPU_I_PROFILE`, `GPU_I_ID` go in a GPU instance's labels: after `modelName`.
pub const MIG_LABELS_AT: usize = 5;

/// The value of a native reading in DCGM's unit, or `None` when the pair of units has no known
/// conversion. DCGM serves the converted fields as integers: the percentages, clocks, energy and
/// violation times NVML reports as integers come back exactly (rounded, to drop the float error
/// of the native conversion), and memory is whole MiB, truncated as DCGM's integer division of
/// NVML's bytes does.
pub fn convert(native_unit: &str, dcgm_unit: &str, value: f64) -> Option<f64> {
    Some(match (native_unit, dcgm_unit) {
        ("ratio", "%") => (value * 100.0).round(),
        ("bytes", "MiB") => (value / 1_048_576.0).floor(),
        ("hertz", "MHz") => (value / 1e6).round(),
        ("joules", "mJ") => (value * 1e3).round(),
        ("seconds", "ns") => (value * 1e9).round(),
        ("ratio", "ratio")
        | ("watts", "W")
        | ("celsius", "°C")
        | ("bytes_per_second", "B/s")
        | ("", "") => value,
        _ => return None,
    })
}

/// A catalog row behind a DCGM field, its DCGM entry, and the position among the row's extra
/// labels of the label that [`Dcgm::label_value`] selects on (the row's closed label).
type FieldSource = (&'static MetricDef, &'static Dcgm, Option<usize>);

/// The catalog rows behind each of [`FIELDS`], in the same order.
fn sources() -> &'static [Vec<FieldSource>] {
    static SOURCES: OnceLock<Vec<Vec<FieldSource>>> = OnceLock::new();
    SOURCES.get_or_init(|| {
        FIELDS
            .iter()
            .map(|f| {
                CATALOG
                    .iter()
                    .flat_map(|def| def.dcgm.iter().map(move |d| (def, d)))
                    .filter(|(_, d)| d.field == f.name)
                    .map(|(def, d)| (def, d, selector_position(def)))
                    .collect()
            })
            .collect()
    })
}

/// Position in `def.labels` of its (first) closed label, which `label_value` entries select on.
fn selector_position(def: &MetricDef) -> Option<usize> {
    let (name, _) = def.closed_labels.first()?;
    def.labels.iter().position(|l| l == name)
}

/// The `Hostname` label value: the `NODE_NAME` environment variable (a DaemonSet sets it from
/// `spec.nodeName`), else the OS hostname, as dcgm-exporter does. Read once at start-up.
pub fn hostname() -> String {
    hostname_from(std::env::var_os("NODE_NAME"), os_hostname)
}

/// [`hostname`] with its two sources passed in; an empty `NODE_NAME` counts as unset.
fn hostname_from(node_name: Option<OsString>, os: impl FnOnce() -> Option<String>) -> String {
    node_name
        .map(|n| n.to_string_lossy().into_owned())
        .filter(|n| !n.is_empty())
        .or_else(os)
        .unwrap_or_default()
}

/// `gethostname(2)`; `None` if it fails.
fn os_hostname() -> Option<String> {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its whole length; gethostname writes at most that much.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return None;
    }
    let len = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    Some(String::from_utf8_lossy(&buf[..len]).into_owned())
}

/// A GPU whose DCGM series are written, and the one container its series are labelled with.
pub(crate) struct Device<'a> {
    pub sample: &'a DeviceSample,
    /// `gpu` label value.
    pub index: &'a str,
    pub owner: Option<&'a ContainerRef>,
    /// Its MIG GPU instances, by GI id (empty unless MIG is on).
    pub instances: Vec<Instance<'a>>,
}

/// A MIG GPU instance whose DCGM series are written after its GPU's.
pub(crate) struct Instance<'a> {
    /// The instance's readings as a device sample (`super::instance_view`).
    pub view: &'a DeviceSample,
    /// `GPU_I_ID` label value.
    pub gpu_instance: &'a str,
    /// `GPU_I_PROFILE` label value.
    pub profile: &'a str,
    pub owner: Option<&'a ContainerRef>,
}

/// The labels of a whole GPU's series, in dcgm-exporter's order (see the module docs; a GPU
/// instance inserts its two labels at [`MIG_LABELS_AT`]).
fn identity_labels<'a>(
    s: &'a DeviceSample,
    index: &'a str,
    owner: Option<&'a ContainerRef>,
    device: &'a str,
    driver_version: &'a str,
    hostname: &'a str,
) -> Vec<(&'static str, &'a str)> {
    let mut labels = vec![
        ("gpu", index),
        ("UUID", s.uuid.as_str()),
        ("pci_bus_id", s.info.pci_bus_id.as_str()),
        ("device", device),
        ("modelName", s.info.name.as_str()),
    ];
    // dcgm-exporter leaves out an empty hostname and a driver version DCGM reports blank.
    if !hostname.is_empty() {
        labels.push(("Hostname", hostname));
    }
    if !driver_version.is_empty() {
        labels.push(("DCGM_FI_DRIVER_VERSION", driver_version));
    }
    if let Some(c) = owner {
        labels.push(("container", c.container.as_str()));
        labels.push(("namespace", c.namespace.as_str()));
        labels.push(("pod", c.pod.as_str()));
    }
    labels
}

/// The DCGM value of `field` (index `i` of [`FIELDS`]) on one GPU, `None` when the GPU has no
/// reading for it.
fn value_of(i: usize, snap: &Snapshot, d: &DeviceSample, samples: &mut Samples) -> Option<f64> {
    if FIELDS[i].combine == LastXid {
        return d.last_xid.map(|code| code as f64);
    }
    let mut total: Option<f64> = None;
    for &(def, dcgm, at) in &sources()[i] {
        let Source::Device(read) = def.source else {
            continue;
        };
        samples.clear();
        read(&snap.system, d, samples);
        for (mut labels, value) in samples.iter() {
            if let Some(wanted) = dcgm.label_value
                && at.and_then(|at| labels.nth(at)) != Some(wanted)
            {
                continue;
            }
            let Some(v) = convert(def.unit, dcgm.unit, value) else {
                continue;
            };
            match FIELDS[i].combine {
                Combine::First => return Some(v),
                Combine::Sum => total = Some(total.unwrap_or(0.0) + v),
                // Answered before the loop.
                Combine::LastXid => {}
            }
        }
    }
    total
}

/// Appends every DCGM family of `snap` to `out`: one series per GPU that is up and has the
/// reading. Families without a series are left out entirely, as native ones are.
pub(crate) fn write(
    out: &mut Vec<u8>,
    snap: &Snapshot,
    devices: &[Device<'_>],
    hostname: &str,
    samples: &mut Samples,
) {
    let names: Vec<String> = devices
        .iter()
        .map(|d| format!("nvidia{}", d.index))
        .collect();
    let driver = snap.system.driver_version.as_str();
    let labels: Vec<_> = devices
        .iter()
        .zip(&names)
        .map(|(d, device)| identity_labels(d.sample, d.index, d.owner, device, driver, hostname))
        .collect();
    // Per instance: the parent's labels with its owner, and GPU_I_PROFILE, GPU_I_ID inserted.
    let instance_labels: Vec<Vec<_>> = devices
        .iter()
        .zip(&names)
        .map(|(d, device)| {
            d.instances
                .iter()
                .map(|inst| {
                    let mut l =
                        identity_labels(d.sample, d.index, inst.owner, device, driver, hostname);
                    l.splice(
                        MIG_LABELS_AT..MIG_LABELS_AT,
                        [
                            ("GPU_I_PROFILE", inst.profile),
                            ("GPU_I_ID", inst.gpu_instance),
                        ],
                    );
                    l
                })
                .collect()
        })
        .collect();
    for (i, f) in FIELDS.iter().enumerate() {
        let family_start = out.len();
        text::header(out, f.name, f.help, f.kind.as_str());
        let series_start = out.len();
        for ((d, labels), instance_labels) in devices.iter().zip(&labels).zip(&instance_labels) {
            if !d.sample.up {
                continue;
            }
            if let Some(v) = value_of(i, snap, d.sample, samples) {
                text::sample(
                    out,
                    f.name,
                    labels.iter().map(|(n, _)| *n),
                    labels.iter().map(|(_, v)| *v),
                    v,
                );
            }
            // XIDs are the GPU's: its instances have no XID field of their own.
            let instances = if f.combine == LastXid {
                &[][..]
            } else {
                &d.instances[..]
            };
            for (inst, labels) in instances.iter().zip(instance_labels) {
                if let Some(v) = value_of(i, snap, inst.view, samples) {
                    text::sample(
                        out,
                        f.name,
                        labels.iter().map(|(n, _)| *n),
                        labels.iter().map(|(_, v)| *v),
                        v,
                    );
                }
            }
        }
        if out.len() == series_start {
            out.truncate(family_start);
        }
    }
}

/// How [`convert`] changes a value, in words, for the docs.
fn conversion_words(native_unit: &str, dcgm_unit: &str) -> &'static str {
    match (native_unit, dcgm_unit) {
        ("ratio", "%") => "× 100",
        ("bytes", "MiB") => "÷ 1048576, whole MiB",
        ("hertz", "MHz") => "÷ 10⁶",
        ("joules", "mJ") => "× 1000",
        ("seconds", "ns") => "× 10⁹",
        _ => "same value",
    }
}

/// The Markdown table of what each DCGM field is served from, and the fields that are not
/// served: the generated part of docs/migrating-from-dcgm-exporter.md.
pub fn mapping_markdown() -> String {
    use std::fmt::Write;
    let mut md = String::from(
        "| DCGM field | type | unit | served from | conversion |\n|---|---|---|---|---|\n",
    );
    for (f, sources) in FIELDS.iter().zip(sources()) {
        let mut from = Vec::new();
        let mut how = Vec::new();
        for (def, d, at) in sources {
            let selector = match (d.label_value, at) {
                (Some(v), Some(at)) => format!("{{{}=\"{v}\"}}", def.labels[*at]),
                _ => String::new(),
            };
            from.push(format!("`{}{selector}`", def.name));
            let mut words = conversion_words(def.unit, d.unit).to_string();
            if f.combine == LastXid {
                words = "the code of the last XID event seen; absent before the first (dcgm-exporter: 0)"
                    .to_string();
            }
            let others: Vec<&str> = def
                .labels
                .iter()
                .enumerate()
                .filter(|(i, _)| Some(*i) != *at)
                .map(|(_, l)| *l)
                .collect();
            if let Some(label) = others.first().filter(|_| f.combine != LastXid) {
                words.push_str(match f.combine {
                    Combine::First => ", the lowest ",
                    Combine::Sum => ", summed over ",
                    Combine::LastXid => "",
                });
                let _ = write!(words, "`{label}`");
            }
            if !how.contains(&words) {
                how.push(words);
            }
        }
        let unit = sources.first().map_or("", |(_, d, _)| d.unit);
        let _ = writeln!(
            md,
            "| `{}` | {} | {} | {} | {} |",
            f.name,
            f.kind.as_str(),
            match (f.combine, unit) {
                (LastXid, _) => "XID code",
                (_, "") => "count",
                (_, unit) => unit,
            },
            from.join(", "),
            how.join("; ")
        );
    }
    md.push_str("\nNot served:\n\n");
    for (name, why) in NOT_SERVED {
        let _ = writeln!(md, "- `{name}`: {why}");
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migration_doc_has_the_current_mapping() {
        const BEGIN: &str = "<!-- BEGIN mapping: generated from src/metrics/catalog.rs and src/metrics/dcgm.rs by `UPDATE_DOCS=1 cargo test --lib dcgm` -->\n";
        const END: &str = "<!-- END mapping -->";
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("docs/migrating-from-dcgm-exporter.md");
        let doc = std::fs::read_to_string(&path).expect("docs/migrating-from-dcgm-exporter.md");
        let start = doc.find(BEGIN).expect("BEGIN marker") + BEGIN.len();
        let end = doc.find(END).expect("END marker");
        let table = mapping_markdown();
        if std::env::var_os("UPDATE_DOCS").is_some() {
            let mut updated = doc.clone();
            updated.replace_range(start..end, &table);
            std::fs::write(&path, updated).unwrap();
            return;
        }
        assert!(
            doc[start..end] == table,
            "the mapping in {} is out of date: UPDATE_DOCS=1 cargo test --lib dcgm",
            path.display()
        );
    }

    #[test]
    fn every_dcgm_field_of_the_catalog_is_served_or_explained() {
        let mut catalog: Vec<&str> = Vec::new();
        for def in CATALOG {
            for d in def.dcgm {
                if !catalog.contains(&d.field) {
                    catalog.push(d.field);
                }
                assert!(
                    matches!(def.source, Source::Device(_)),
                    "{}: only per-GPU readings map to DCGM fields",
                    def.name
                );
            }
        }
        let served: Vec<&str> = FIELDS.iter().map(|f| f.name).collect();
        let explained: Vec<&str> = NOT_SERVED.iter().map(|(n, _)| *n).collect();
        let expected: Vec<&str> = catalog
            .iter()
            .copied()
            .filter(|f| !explained.contains(f))
            .collect();
        assert_eq!(
            served, expected,
            "FIELDS must list the catalog's DCGM fields in order"
        );
        for f in explained {
            assert!(catalog.contains(&f), "{f} is not in the catalog");
        }
    }

    #[test]
    fn every_served_field_has_a_unit_conversion_and_a_source_per_label_value() {
        for (f, sources) in FIELDS.iter().zip(sources()) {
            assert!(!sources.is_empty(), "{}", f.name);
            for (def, d, at) in sources {
                assert!(
                    convert(def.unit, d.unit, 1.0).is_some(),
                    "{}: no conversion from {:?} to {:?}",
                    f.name,
                    def.unit,
                    d.unit
                );
                if let Some(v) = d.label_value {
                    assert!(at.is_some(), "{}: {} has no closed label", f.name, def.name);
                    assert!(
                        def.closed_labels
                            .first()
                            .is_some_and(|(_, values)| values().contains(&v)),
                        "{}: {v} is not a value of {}'s closed label",
                        f.name,
                        def.name
                    );
                }
            }
            assert!(f.help.ends_with('.'), "{}", f.name);
        }
    }

    #[test]
    fn conversions() {
        assert_eq!(convert("ratio", "%", 0.57), Some(57.0));
        assert_eq!(convert("ratio", "ratio", 0.57), Some(0.57));
        assert_eq!(convert("bytes", "MiB", 85_899_345_920.0), Some(81_920.0));
        assert_eq!(convert("bytes", "MiB", 1_048_575.0), Some(0.0));
        assert_eq!(convert("hertz", "MHz", 1_980_000_000.0), Some(1980.0));
        assert_eq!(convert("joules", "mJ", 123_456.789), Some(123_456_789.0));
        assert_eq!(convert("seconds", "ns", 1.5), Some(1_500_000_000.0));
        assert_eq!(convert("watts", "W", 312.5), Some(312.5));
        assert_eq!(convert("watts", "mW", 1.0), None);
    }

    #[test]
    fn hostname_prefers_node_name_then_the_os() {
        let os = || Some("box".to_string());
        assert_eq!(hostname_from(Some("node-7".into()), os), "node-7");
        assert_eq!(hostname_from(Some("".into()), os), "box");
        assert_eq!(hostname_from(None, os), "box");
        assert_eq!(hostname_from(None, || None), "");
        // The real OS hostname is what the kernel says.
        if let Ok(kernel) = std::fs::read_to_string("/proc/sys/kernel/hostname") {
            assert_eq!(os_hostname().as_deref(), Some(kernel.trim_end()));
        }
    }
}
