//! Every shipped scenario parses, and its GPUs are internally consistent.

use nvml_sim::scenario::{DEFAULT_SCENARIO, Scenario};

#[test]
fn every_shipped_scenario_parses() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/scenarios");
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            let text = std::fs::read_to_string(&path).unwrap();
            let s = Scenario::parse(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert!(!s.gpus.is_empty());
            names.push(path.file_name().unwrap().to_string_lossy().into_owned());
        }
    }
    names.sort();
    for required in [
        "a100x4.toml",
        "faults.toml",
        "h100x8.toml",
        "l4x2.toml",
        "rtx6000ada.toml",
    ] {
        assert!(names.iter().any(|n| n == required), "missing {required}");
    }
    assert_eq!(Scenario::parse(DEFAULT_SCENARIO).unwrap().gpus.len(), 8);
}
