//! The mapping tables of `docs/otlp.md`, rendered from the [mapping](super::mapping) and the
//! catalog: a unit test compares the checked-in file's generated part with [`render_mapping`];
//! `UPDATE_DOCS=1 cargo test --lib otlp::docs` rewrites it.

use std::fmt::Write;

use super::mapping::{
    Attribute, HEALTH_STATES, Kind, MAPPING, MIG_ATTRIBUTES, Metric, POD_ATTRIBUTES, Push, Row,
};
use crate::groups::Group;
use crate::metrics::catalog::{self, MetricDef};

/// Where the generated part of docs/otlp.md starts.
pub const BEGIN: &str = "<!-- BEGIN mapping: generated from src/otlp/mapping.rs by `UPDATE_DOCS=1 cargo test --lib otlp::docs` -->\n";

/// Where it ends.
pub const END: &str = "<!-- END mapping -->";

/// The generated part: the attributes every point has, then the families pushed under the
/// semantic conventions' names, under the exporter's own (the saturation signals first), and
/// those not pushed.
pub fn render_mapping() -> String {
    let mut md = String::new();
    md.push_str(
        "Every point of a GPU carries `hw.id` (the GPU's UUID), `hw.type` `gpu`, `hw.name` \
         (`GPU 0`, by NVML index), `hw.vendor` `NVIDIA` and `hw.model` (`NVIDIA H100 80GB HBM3`). \
         A MIG GPU instance's points (the memory and GPM families of a GPU in MIG mode, and the \
         processes, pods and jobs in an instance) have `hw.id` its first MIG device's UUID (what \
         `nvidia-smi -L` and `CUDA_VISIBLE_DEVICES` name), `hw.name` `GPU 0 GI 3`, `hw.parent` the \
         GPU's UUID and ",
    );
    md.push_str(&attribute_list(&MIG_ATTRIBUTES));
    md.push_str(
        ". A series of a GPU or instance held by one container (with `--kubernetes`), and the \
         per-pod families, carry ",
    );
    md.push_str(&attribute_list(&POD_ATTRIBUTES));
    md.push_str(
        ". Labels a family adds that the table does not list (the `claim`, `controller_*`, \
         `label_*` and `annotation_*` of `nvidia_gpu_pod_info`) keep their Prometheus names. \
         The exporter's own families (`nvml_exporter.*`) carry no hardware attributes.\n\n",
    );
    let rows = |semconv: bool| {
        MAPPING.iter().filter_map(move |r| match r.push {
            Push::Metric(m) if m.semconv == semconv => Some((r, m)),
            _ => None,
        })
    };
    md.push_str("### Semantic conventions\n\n");
    md.push_str(
        "Names, units, instruments and attributes of OpenTelemetry's hardware semantic \
         conventions (status: development).\n\n",
    );
    table(&mut md, rows(true));
    md.push_str("\n### The exporter's own names\n\n");
    md.push_str("The saturation signals (NVML GPM) first, then the others in catalog order.\n\n");
    let saturation = |r: &Row| {
        catalog::find(r.family)
            .is_some_and(|d| matches!(d.group, Group::Saturation | Group::Pipes | Group::Bandwidth))
    };
    table(
        &mut md,
        rows(false)
            .filter(|(r, _)| saturation(r))
            .chain(rows(false).filter(|(r, _)| !saturation(r))),
    );
    md.push_str("\n### Not pushed\n\n| family | why |\n|---|---|\n");
    for r in MAPPING {
        if let Push::Not(why) = r.push {
            let _ = writeln!(md, "| `{}` | {why} |", r.family);
        }
    }
    md
}

fn table<'a>(md: &mut String, rows: impl Iterator<Item = (&'a Row, Metric)>) {
    md.push_str(
        "| family | OTLP metric | instrument | unit | attributes |\n|---|---|---|---|---|\n",
    );
    for (r, m) in rows {
        let def: Option<&MetricDef> = catalog::find(r.family);
        let mut attributes: Vec<String> = m
            .fixed
            .iter()
            .map(|(k, v)| format!("`{k}`=`{v}`"))
            .collect();
        attributes.extend(m.attributes.iter().map(|a| {
            format!(
                "`{}` ← `{}`{}",
                a.key,
                a.label,
                if a.kind == Kind::Int { " (int)" } else { "" }
            )
        }));
        if m.states {
            let states: Vec<String> = HEALTH_STATES
                .iter()
                .map(|(v, s)| format!("`{s}` ({v})"))
                .collect();
            attributes.push(format!(
                "`hw.state`: one point per state, 1 for the verdict's: {}",
                states.join(", ")
            ));
        }
        let kind = def.map_or("", |d| d.kind.as_str());
        let _ = writeln!(
            md,
            "| `{}` ({kind}) | `{}` | {} | `{}` | {} |",
            r.family,
            m.name,
            m.instrument.as_str(),
            m.unit,
            attributes.join(", ")
        );
    }
}

fn attribute_list(attributes: &[Attribute]) -> String {
    let list: Vec<String> = attributes
        .iter()
        .map(|a| format!("`{}` (from `{}`)", a.key, a.label))
        .collect();
    list.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn otlp_doc_has_the_current_mapping() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/otlp.md");
        let doc = std::fs::read_to_string(&path).expect("docs/otlp.md");
        let start = doc.find(BEGIN).expect("BEGIN marker") + BEGIN.len();
        let end = doc.find(END).expect("END marker");
        let mapping = render_mapping();
        if std::env::var_os("UPDATE_DOCS").is_some() {
            let mut updated = doc.clone();
            updated.replace_range(start..end, &mapping);
            std::fs::write(&path, updated).unwrap();
            return;
        }
        assert!(
            doc[start..end] == mapping,
            "the mapping in docs/otlp.md is out of date: UPDATE_DOCS=1 cargo test --lib otlp::docs"
        );
    }
}
