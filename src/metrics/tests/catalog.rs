//! The catalog against what is served: types, order, closed label values, naming.

use super::*;
use crate::metrics::catalog::{EXPOSITION_BYTES, SERIES_DROPPED_TOTAL};

/// Families one exposition of a full snapshot does not have: the dropped-series counter (after
/// `--max-series` first drops a group) and the previous exposition's size (from the second on);
/// self_metrics.rs covers both.
const NOT_IN_ONE_EXPOSITION: &[&str] = &[SERIES_DROPPED_TOTAL, EXPOSITION_BYTES];

#[test]
fn types_match_the_catalog_and_counters_end_in_total() {
    let text = encode(&snapshot(vec![full_mig_device(0)]));
    for def in CATALOG
        .iter()
        .filter(|d| !NOT_IN_ONE_EXPOSITION.contains(&d.name))
    {
        let line = format!("# TYPE {} {}", def.name, def.kind.as_str());
        assert!(text.contains(&line), "missing {line:?}");
        assert_eq!(
            def.kind == MetricKind::Counter,
            def.name.ends_with("_total"),
            "{}",
            def.name
        );
    }
    assert!(text.contains("# TYPE nvidia_gpu_energy_joules_total counter\n"));
    assert!(text.contains("# TYPE nvidia_gpu_power_watts gauge\n"));
    assert!(text.contains("# TYPE nvml_exporter_sample_duration_seconds histogram\n"));
}

#[test]
fn families_follow_the_catalog_then_process_metrics() {
    let text = encode(&snapshot(vec![full_mig_device(0)]));
    let served = families(&text);
    let catalog: Vec<&str> = CATALOG
        .iter()
        .map(|d| d.name)
        .filter(|n| !NOT_IN_ONE_EXPOSITION.contains(n))
        .collect();
    assert_eq!(&served[..catalog.len()], &catalog[..]);
    assert!(
        served[catalog.len()..]
            .iter()
            .all(|n| n.starts_with("process_")),
        "{served:?}"
    );
}

#[test]
fn closed_labels_only_take_their_declared_values() {
    let text = encode(&snapshot(vec![full_device(0)]));
    for def in CATALOG {
        for (label, values) in def.closed_labels {
            assert!(
                def.labels.contains(label),
                "{}: {label} is not a label",
                def.name
            );
            let allowed = values();
            let prefix = format!("{}{{", def.name);
            // The label is first (after `{`) or follows another (after `,`).
            let tags = [format!("{{{label}=\""), format!(",{label}=\"")];
            let lines: Vec<&str> = series(&text)
                .into_iter()
                .filter(|l| l.starts_with(&prefix))
                .collect();
            assert!(!lines.is_empty(), "{}: no series", def.name);
            for l in lines {
                let v = tags
                    .iter()
                    .find_map(|t| l.split(t.as_str()).nth(1))
                    .and_then(|r| r.split('"').next());
                let v = v.unwrap_or_else(|| panic!("{l}: no {label}"));
                assert!(allowed.contains(&v), "{}: {label}={v}", def.name);
            }
        }
    }
}

#[test]
fn catalog_names_units_and_labels_are_well_formed() {
    let mut names: Vec<&str> = CATALOG.iter().map(|d| d.name).collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), CATALOG.len(), "duplicate names");
    let snake = |s: &str| {
        !s.is_empty()
            && s.starts_with(|c: char| c.is_ascii_lowercase())
            && s.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
    };
    for d in CATALOG {
        assert!(snake(d.name), "{}", d.name);
        assert!(!d.help.is_empty(), "{}", d.name);
        if !d.unit.is_empty() {
            let base = d.name.strip_suffix("_total").unwrap_or(d.name);
            assert!(
                base.ends_with(&format!("_{}", d.unit)),
                "{} lacks unit {}",
                d.name,
                d.unit
            );
        }
        for l in d.labels {
            assert!(snake(l) && !l.starts_with("__"), "{}: label {l}", d.name);
            assert!(!d.all_labels()[..d.all_labels().len() - d.labels.len()].contains(l));
        }
        let per_device = d.name.starts_with("nvidia_gpu_");
        assert_eq!(per_device, d.source.is_per_device(), "{}", d.name);
        // Only the registry can hold a histogram's buckets.
        if d.kind == MetricKind::Histogram {
            assert!(matches!(d.source, Source::Registry), "{}", d.name);
        }
        for f in d.dcgm {
            assert!(f.field.starts_with("DCGM_FI_"), "{}", d.name);
            if let Some(v) = f.label_value {
                let known = d
                    .closed_labels
                    .iter()
                    .any(|(_, values)| values().contains(&v));
                assert!(
                    known,
                    "{}: DCGM mapping for unknown label value {v}",
                    d.name
                );
            }
        }
    }
}

/// Help texts are written as they are (`text::header`): none may hold what the format escapes.
fn needs_no_escape(help: &str) -> bool {
    !help.contains(['\\', '\n'])
}

#[test]
fn help_texts_hold_nothing_to_escape() {
    for def in CATALOG {
        assert!(needs_no_escape(def.help), "{}", def.name);
        for d in def.dcgm {
            assert!(needs_no_escape(d.help), "{}", d.field);
        }
    }
}

#[test]
fn the_gpu_families_come_first_and_the_exporters_own_are_core() {
    // The encoder writes the two parts in turn (the GPU families, then the node's and the
    // exporter's own), and never leaves out or switches off the exporter's own; the node's
    // (nvidia_node_*) have a group of their own.
    let first_own = CATALOG
        .iter()
        .position(|d| !d.source.is_per_device())
        .unwrap();
    for d in &CATALOG[first_own..] {
        assert!(
            !d.source.is_per_device(),
            "{} after the exporter's own",
            d.name
        );
        if d.name.starts_with("nvml_exporter_") {
            assert_eq!(d.group, crate::groups::Group::Core, "{}", d.name);
        } else {
            assert!(d.name.starts_with("nvidia_node_"), "{}", d.name);
        }
    }
}
