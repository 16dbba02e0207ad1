//! The golden file: `/metrics` of the default scenario at a pinned simulator clock, minus the
//! series that depend on the run (process, timing, build). Any change to what the exporter serves
//! shows up here and must be deliberate: `UPDATE_GOLDEN=1 cargo test --test golden` rewrites it,
//! and the change is noted in CHANGELOG.md.

mod common;

use std::path::Path;

#[test]
fn default_scenario_matches_the_golden_file() {
    let out = common::run_once(&[("NVML_SIM_TIME", "60")], &[]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let actual = common::strip_volatile(&String::from_utf8_lossy(&out.stdout));
    let golden = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/h100x8.prom");

    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&golden, &actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&golden).unwrap_or_default();
    if expected != actual {
        let diff: Vec<String> = expected
            .lines()
            .zip(actual.lines())
            .filter(|(e, a)| e != a)
            .take(15)
            .map(|(e, a)| format!("- {e}\n+ {a}"))
            .collect();
        panic!(
            "/metrics differs from {} ({} vs {} lines); first differences:\n{}\n\
             If the change is intended: UPDATE_GOLDEN=1 cargo test --test golden, and note it in CHANGELOG.md",
            golden.display(),
            expected.lines().count(),
            actual.lines().count(),
            diff.join("\n")
        );
    }
}
