//! dcgm-exporter compatibility (`--dcgm-compat`): the catalog's DCGM column served with
//! dcgm-exporter's names, units, types and labels, from the same views as the native families.
//!
//! The catalog is the one table: each [`Dcgm`] entry of a row says which DCGM field the row (or
//! the series with one label value of it) corresponds to, the unit DCGM serves it in, its
//! `# TYPE` and `# HELP`, and how several native series make the one DCGM value of a GPU (NVLink
//! error counts are per link natively, per GPU in DCGM). Fields are served in catalog order, or
//! by name where the release's renderer sorts them.
//!
//! Which release of dcgm-exporter is spoken (`--dcgm-compat-version`) is one row of
//! [`DIALECTS`], taken from that release's own files (the facts the tests check the served fields
//! against, its fields, types and help texts and its dashboard's queries, are extracted into
//! tests/fixtures/dcgm-exporter/). The catalog's entries are 4.8.2's; a dialect lists the fields
//! its release names or describes differently, and whether it renders the families in name
//! order (4.8.3 and later) or in the catalog's.
//!
//! Labels follow dcgm-exporter's template, in its order: `gpu`, `UUID`, `pci_bus_id`, `device`
//! (`nvidia<gpu>`), `modelName`, `Hostname` (left out when empty), `DCGM_FI_DRIVER_VERSION` (the
//! release's names for these two), then
//! with Kubernetes attribution `container`, `namespace`, `pod` (dcgm-exporter renders these from a
//! map, so alphabetically; a GPU no container holds has none of them, as in dcgm-exporter). The
//! XID field adds `err_code` (the code) among those, in their order.
//!
//! MIG: dcgm-exporter puts `GPU_I_PROFILE` and `GPU_I_ID` between `modelName` and `Hostname`
//! on a GPU instance's series. Each GPU instance of a GPU in MIG mode gets its series right after
//! the GPU's, from the instance's own readings (memory, profiling fields), with the parent's
//! labels and those two inserted at [`MIG_LABELS_AT`]; the GPU's own series have neither, as in
//! dcgm-exporter. An instance assigned to one container carries that container's labels.
//!
//! Like dcgm-exporter, a GPU that is lost (`up == false`) has no series at all, and a reading the
//! GPU does not support is absent.

use clap::ValueEnum;
use serde::Deserialize;

use crate::sample::{ContainerRef, DeviceSample, Snapshot};

use super::catalog::{CATALOG, Combine, Dcgm, MetricDef, Source};
use super::resolve::DeviceView;
use super::samples::Samples;
use super::text::{self, Text};
use super::write::PerGroup;
use crate::groups::{GROUPS, Groups};

/// `--dcgm-compat`: serve dcgm-exporter's metric names, units and labels (see
/// docs/migrating-from-dcgm-exporter.md).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DcgmCompat {
    /// Native names only.
    #[default]
    Off,
    /// dcgm-exporter's names only (the exporter's own self-metrics stay).
    Dcgm,
    /// Native names first, then dcgm-exporter's.
    Both,
}

/// `--dcgm-compat-version`: the release of dcgm-exporter whose names, units and labels
/// `--dcgm-compat` serves; each has its row in [`DIALECTS`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum, Deserialize)]
pub enum DcgmRelease {
    /// dcgm-exporter 4.8.2 (release tag 4.5.3-4.8.2): the `Hostname` label.
    #[default]
    #[value(name = "4.8.2")]
    #[serde(rename = "4.8.2")]
    V4_8_2,
    /// dcgm-exporter 4.8.3 (release tag 4.6.0-4.8.3): the `hostname` label, families in name
    /// order.
    #[value(name = "4.8.3")]
    #[serde(rename = "4.8.3")]
    V4_8_3,
    /// dcgm-exporter 4.8.4 (release tag 4.6.1-4.8.4): as 4.8.3, with its names of the NVLink
    /// error counters and its help texts.
    #[value(name = "4.8.4")]
    #[serde(rename = "4.8.4")]
    V4_8_4,
}

/// What a release of dcgm-exporter names its own way.
#[derive(Debug)]
pub struct Dialect {
    /// The release.
    pub release: DcgmRelease,
    /// The label holding `NODE_NAME` or the OS hostname ([`hostname()`]).
    pub hostname_label: &'static str,
    /// The label holding the driver version: the `label` field of the release's counter file.
    pub driver_label: &'static str,
    /// The families are rendered in name order (the renderer of 4.8.3 and later sorts them),
    /// else in catalog order (4.8.2 renders them in no fixed order: its template ranges over a
    /// map keyed by counter).
    pub name_order: bool,
    /// The fields whose name or `# HELP` the release's counter file gives differently from the
    /// catalog's entry.
    pub renamed: &'static [Renamed],
}

/// A field a release names or describes differently from the catalog's entry.
#[derive(Debug)]
pub struct Renamed {
    /// The catalog's name of the field.
    pub field: &'static str,
    /// The release's name of it.
    pub name: &'static str,
    /// The release's `# HELP` text of it.
    pub help: &'static str,
}

/// Every release served, one row each, from the release's label and rendering code
/// (`internal/pkg/rendermetrics/render_metrics.go`) and counter file (`etc/default-counters.csv`).
pub const DIALECTS: &[Dialect] = &[
    Dialect {
        release: DcgmRelease::V4_8_2,
        hostname_label: "Hostname",
        driver_label: "DCGM_FI_DRIVER_VERSION",
        name_order: false,
        renamed: &[],
    },
    Dialect {
        release: DcgmRelease::V4_8_3,
        hostname_label: "hostname",
        driver_label: "DCGM_FI_DRIVER_VERSION",
        name_order: true,
        renamed: &[],
    },
    Dialect {
        release: DcgmRelease::V4_8_4,
        hostname_label: "hostname",
        driver_label: "DCGM_FI_DRIVER_VERSION",
        name_order: true,
        renamed: &[
            Renamed {
                field: "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
                name: "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
                help: "Total energy consumption since the driver was last reloaded (in mJ).",
            },
            Renamed {
                field: "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
                name: "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_TOTAL",
                help: "Total number of NVLink flow-control CRC errors across all lanes.",
            },
            Renamed {
                field: "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
                name: "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_TOTAL",
                help: "Total number of NVLink data CRC errors across all lanes.",
            },
            Renamed {
                field: "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
                name: "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_TOTAL",
                help: "Total number of NVLink replay errors across all lanes.",
            },
            Renamed {
                field: "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
                name: "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_TOTAL",
                help: "Total number of NVLink recovery errors across all lanes.",
            },
        ],
    },
];

impl DcgmRelease {
    /// This release's row of [`DIALECTS`].
    pub fn dialect(self) -> &'static Dialect {
        DIALECTS
            .iter()
            .find(|d| d.release == self)
            .expect("every release has its row in DIALECTS")
    }
}

impl Dialect {
    /// The name and `# HELP` text this release serves the catalog's field `d` under.
    pub fn name_and_help(&self, d: &Dcgm) -> (&'static str, &'static str) {
        self.renamed
            .iter()
            .find(|r| r.field == d.field)
            .map_or((d.field, d.help), |r| (r.name, r.help))
    }
}

/// Where `GPU_I_PROFILE`, `GPU_I_ID` go in a GPU instance's labels: after `modelName`.
pub const MIG_LABELS_AT: usize = 5;

/// The served DCGM fields, in exposition order, each with the catalog row it is read from.
pub fn served() -> impl Iterator<Item = (&'static MetricDef, &'static Dcgm)> {
    all().filter(|(_, d)| !matches!(d.combine, Combine::NotServed(_)))
}

/// The groups of the served DCGM fields: what `--dcgm-compat` samples, so that it serves
/// dcgm-exporter's fields whatever the default groups.
pub fn groups() -> Groups {
    served().fold(Groups::none(), |s, (def, _)| s.with(def.group))
}

/// Every DCGM entry of the catalog with its row, in catalog order.
fn all() -> impl Iterator<Item = (&'static MetricDef, &'static Dcgm)> {
    CATALOG
        .iter()
        .flat_map(|def| def.dcgm.iter().map(move |d| (def, d)))
}

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

/// Position in `def.labels` of its (first) closed label, which `label_value` entries select on.
fn selector_position(def: &MetricDef) -> Option<usize> {
    let (name, _) = def.closed_labels.first()?;
    def.labels.iter().position(|l| l == name)
}

/// The `Hostname` label value: the `NODE_NAME` environment variable (a DaemonSet sets it from
/// `spec.nodeName`), else the OS hostname, as dcgm-exporter does. Read once at start-up.
pub fn hostname() -> String {
    hostname_from(std::env::var_os("NODE_NAME"), || {
        hostname::get()
            .ok()
            .map(|h| h.to_string_lossy().into_owned())
    })
}

/// [`hostname()`] with its two sources passed in; an empty `NODE_NAME` counts as unset.
fn hostname_from(
    node_name: Option<std::ffi::OsString>,
    os: impl FnOnce() -> Option<String>,
) -> String {
    node_name
        .map(|n| n.to_string_lossy().into_owned())
        .filter(|n| !n.is_empty())
        .or_else(os)
        .unwrap_or_default()
}

/// The labels of a whole GPU's series, in dcgm-exporter's order (see the module docs; a GPU
/// instance inserts its two labels at [`MIG_LABELS_AT`]).
fn identity_labels<'a>(
    s: &'a DeviceSample,
    gpu: &'a str,
    owner: Option<&'a ContainerRef>,
    device: &'a str,
    driver_version: &'a str,
    hostname: &'a str,
    dialect: &Dialect,
) -> Vec<(&'static str, &'a str)> {
    let mut labels = vec![
        ("gpu", gpu),
        ("UUID", s.uuid.as_str()),
        ("pci_bus_id", s.info.pci_bus_id.as_str()),
        ("device", device),
        ("modelName", s.info.name.as_str()),
    ];
    // dcgm-exporter leaves out an empty hostname and a driver version DCGM reports blank.
    if !hostname.is_empty() {
        labels.push((dialect.hostname_label, hostname));
    }
    if !driver_version.is_empty() {
        labels.push((dialect.driver_label, driver_version));
    }
    if let Some(c) = owner {
        labels.push(("container", c.container.as_str()));
        labels.push(("namespace", c.namespace.as_str()));
        labels.push(("pod", c.pod.as_str()));
    }
    labels
}

/// The value of DCGM field `dcgm` (of catalog row `def`) on one reading, `None` when it has no
/// reading for it.
fn value_of(
    def: &MetricDef,
    dcgm: &Dcgm,
    snap: &Snapshot,
    d: &DeviceSample,
    samples: &mut Samples,
) -> Option<f64> {
    let read = match (dcgm.combine, def.source) {
        (Combine::LastXid, _) => {
            return d
                .last_xid
                .or(d.xids_watched.then_some(0))
                .map(|code| code as f64);
        }
        (Combine::NotServed(_), _) => return None,
        (_, Source::Device(read)) => read,
        _ => return None,
    };
    samples.clear();
    read(&snap.system, d, samples);
    let at = selector_position(def);
    let mut total: Option<f64> = None;
    for (mut labels, value) in samples.iter() {
        if let Some(wanted) = dcgm.label_value
            && at.and_then(|at| labels.nth(at)) != Some(wanted)
        {
            continue;
        }
        let Some(v) = convert(def.unit, dcgm.unit, value) else {
            continue;
        };
        if dcgm.combine == Combine::First {
            return Some(v);
        }
        total = Some(total.unwrap_or(0.0) + v);
    }
    total
}

/// Appends the DCGM families of `snap` read from a catalog row of one of `groups` to `out`: one
/// series per GPU that is up and has the reading (and per MIG instance that has it), in the
/// dialect of `release`, and returns their series per group of their rows. Families without a
/// series are left out entirely, as native ones are.
pub(crate) fn write(
    out: &mut Text,
    snap: &Snapshot,
    devices: &[DeviceView<'_>],
    hostname: &str,
    release: DcgmRelease,
    groups: Groups,
) -> PerGroup {
    let dialect = release.dialect();
    let driver = snap.system.driver_version.as_str();
    let names: Vec<String> = devices.iter().map(|d| format!("nvidia{}", d.gpu)).collect();
    let labels: Vec<_> = devices
        .iter()
        .zip(&names)
        .map(|(d, device)| {
            identity_labels(d.sample, &d.gpu, d.owner, device, driver, hostname, dialect)
        })
        .collect();
    // Per instance: the parent's labels with the instance's owner, GPU_I_PROFILE and GPU_I_ID.
    let instance_labels: Vec<Vec<_>> = devices
        .iter()
        .zip(&names)
        .map(|(d, device)| {
            d.instances
                .iter()
                .map(|instance| {
                    let mut l = identity_labels(
                        d.sample,
                        &d.gpu,
                        instance.owner,
                        device,
                        driver,
                        hostname,
                        dialect,
                    );
                    l.splice(
                        MIG_LABELS_AT..MIG_LABELS_AT,
                        [
                            ("GPU_I_PROFILE", instance.profile),
                            ("GPU_I_ID", instance.gpu_instance.as_str()),
                        ],
                    );
                    l
                })
                .collect()
        })
        .collect();
    let mut fields: Vec<_> = served()
        .filter(|(def, _)| groups.contains(def.group))
        .map(|(def, d)| {
            let (name, help) = dialect.name_and_help(d);
            (def, d, name, help)
        })
        .collect();
    if dialect.name_order {
        fields.sort_by_key(|&(_, _, name, _)| name);
    }
    let mut samples = Samples::default();
    let mut per_group = [0; GROUPS.len()];
    for (def, dcgm, name, help) in fields {
        let family_start = out.bytes.len();
        let series_start = out.series;
        text::header(out, name, help, dcgm.kind.as_str());
        for ((d, labels), instance_labels) in devices.iter().zip(&labels).zip(&instance_labels) {
            if !d.sample.up {
                continue;
            }
            let value = value_of(def, dcgm, snap, d.sample, &mut samples);
            // XIDs are the GPU's: its instances have no XID field of their own.
            if dcgm.combine == Combine::LastXid {
                if let Some(v) = value {
                    let code = format!("{v}");
                    text::line(out, name, "", with_err_code(labels, &code), v);
                }
                continue;
            }
            if let Some(v) = value {
                text::line(out, name, "", labels.iter().copied(), v);
            }
            for (instance, labels) in d.instances.iter().zip(instance_labels) {
                if let Some(v) = value_of(def, dcgm, snap, &instance.sample, &mut samples) {
                    text::line(out, name, "", labels.iter().copied(), v);
                }
            }
        }
        if out.series == series_start {
            out.bytes.truncate(family_start);
        }
        per_group[def.group as usize] += out.series - series_start;
    }
    per_group
}

/// `labels` with the XID field's `err_code` among the attributes dcgm-exporter renders after the
/// driver label in name order: after `container`, before `namespace` and `pod`.
fn with_err_code<'a>(
    labels: &[(&'static str, &'a str)],
    code: &'a str,
) -> impl Iterator<Item = (&'static str, &'a str)> {
    let at = labels
        .iter()
        .position(|(name, _)| *name == "namespace")
        .unwrap_or(labels.len());
    labels[..at]
        .iter()
        .copied()
        .chain(std::iter::once(("err_code", code)))
        .chain(labels[at..].iter().copied())
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
    for (def, d) in served() {
        let at = selector_position(def);
        let selector = match (d.label_value, at) {
            (Some(v), Some(at)) => format!("{{{}=\"{v}\"}}", def.labels[at]),
            _ => String::new(),
        };
        let mut how = conversion_words(def.unit, d.unit).to_string();
        let other_label = def
            .labels
            .iter()
            .enumerate()
            .find(|(i, _)| Some(*i) != at)
            .map(|(_, l)| *l);
        match (d.combine, other_label) {
            (Combine::LastXid, _) => {
                how = "the code of the last XID event seen, 0 before the first (absent on a \
                       GPU whose XID events cannot be watched); label `err_code`, the code"
                    .to_string();
            }
            (Combine::First, Some(label)) => {
                let _ = write!(how, ", the lowest `{label}`");
            }
            (Combine::Sum, Some(label)) => {
                let _ = write!(how, ", summed over `{label}`");
            }
            _ => {}
        }
        let unit = match (d.combine, d.unit) {
            (Combine::LastXid, _) => "XID code",
            (_, "") => "count",
            (_, unit) => unit,
        };
        let _ = writeln!(
            md,
            "| `{}` | {} | {unit} | `{}{selector}` | {how} |",
            d.field,
            d.kind.as_str(),
            def.name,
        );
    }
    md.push_str("\nNot served:\n\n");
    let mut listed = Vec::new();
    for (_, d) in all() {
        if let Combine::NotServed(why) = d.combine
            && !listed.contains(&d.field)
        {
            listed.push(d.field);
            let _ = writeln!(md, "- `{}`: {why}", d.field);
        }
    }
    md.push_str("\nNamed or described differently by a release (`--dcgm-compat-version`):\n\n");
    for dialect in DIALECTS {
        let release = dialect
            .release
            .to_possible_value()
            .expect("a named release");
        for r in dialect.renamed {
            let said = if r.name == r.field {
                format!("`{}`'s help is", r.field)
            } else {
                format!("`{}` is `{}`, help", r.field, r.name)
            };
            let _ = writeln!(md, "- {}: {said} \"{}\"", release.get_name(), r.help);
        }
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
    fn dcgm_fields_map_per_gpu_readings_and_are_named_once() {
        let mut names = Vec::new();
        for (def, d) in all() {
            assert!(
                matches!(def.source, Source::Device(_)),
                "{}: only per-GPU readings map to DCGM fields",
                def.name
            );
            if let Combine::NotServed(why) = d.combine {
                assert!(!why.is_empty(), "{}: say why it is not served", d.field);
            } else {
                assert!(
                    !names.contains(&d.field),
                    "{} is served from two rows",
                    d.field
                );
                names.push(d.field);
            }
        }
        assert!(names.len() > 40, "{names:?}");
    }

    #[test]
    fn every_served_field_has_a_unit_conversion_and_a_source_per_label_value() {
        for (def, d) in served() {
            assert!(
                convert(def.unit, d.unit, 1.0).is_some(),
                "{}: no conversion from {:?} to {:?}",
                d.field,
                def.unit,
                d.unit
            );
            if let Some(v) = d.label_value {
                assert!(
                    selector_position(def).is_some(),
                    "{}: {} has no closed label",
                    d.field,
                    def.name
                );
                assert!(
                    def.closed_labels
                        .first()
                        .is_some_and(|(_, values)| values().contains(&v)),
                    "{}: {v} is not a value of {}'s closed label",
                    d.field,
                    def.name
                );
            }
            assert!(!d.help.is_empty(), "{}", d.field);
        }
    }

    /// The rows of a release's `fields.txt` (`FIELD TYPE HELP`) or `optional.txt` (`FIELD TYPE`)
    /// in tests/fixtures/dcgm-exporter/: field, type, help ("" in `optional.txt`).
    fn release_rows(release: DcgmRelease, file: &str) -> Vec<(String, String, String)> {
        let name = release.to_possible_value().unwrap();
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/dcgm-exporter")
            .join(name.get_name())
            .join(file);
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e}: the release's files are kept", path.display()));
        text.lines()
            .map(|l| {
                let mut parts = l.splitn(3, ' ');
                let mut next = || parts.next().unwrap_or_default().to_string();
                (next(), next(), next())
            })
            .collect()
    }

    #[test]
    fn every_release_has_one_row_and_its_files() {
        for release in DcgmRelease::value_variants() {
            assert_eq!(release.dialect().release, *release);
            assert!(!release_rows(*release, "fields.txt").is_empty());
            assert!(!release_rows(*release, "optional.txt").is_empty());
        }
        assert_eq!(DIALECTS.len(), DcgmRelease::value_variants().len());
    }

    #[test]
    fn each_release_serves_its_fields_under_its_names_types_and_help() {
        for dialect in DIALECTS {
            let rows = release_rows(dialect.release, "fields.txt");
            let optional = release_rows(dialect.release, "optional.txt");
            let named = |field: &str| rows.iter().chain(&optional).find(|r| r.0 == field);
            for (_, d) in served() {
                let (name, help) = dialect.name_and_help(d);
                // A field of the release's counter file has its type there, and a default one
                // its help text.
                if let Some((_, kind, file_help)) = named(name) {
                    assert_eq!(kind, d.kind.as_str(), "{:?} {name}", dialect.release);
                    if !file_help.is_empty() {
                        assert_eq!(help, file_help, "{:?} {name}", dialect.release);
                    }
                }
            }
            for r in dialect.renamed {
                assert!(
                    served().any(|(_, d)| d.field == r.field),
                    "{:?}: {} is no served field",
                    dialect.release,
                    r.field
                );
                assert!(named(r.name).is_some(), "{:?}: {}", dialect.release, r.name);
                if r.name != r.field {
                    assert!(
                        named(r.field).is_none(),
                        "{:?}: {}",
                        dialect.release,
                        r.field
                    );
                }
            }
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
        // Without NODE_NAME, the OS hostname is what the kernel says.
        if let (Ok(kernel), None) = (
            std::fs::read_to_string("/proc/sys/kernel/hostname"),
            std::env::var_os("NODE_NAME"),
        ) {
            assert_eq!(hostname(), kernel.trim_end());
        }
    }
}
