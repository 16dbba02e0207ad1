//! The golden file: `/metrics` of the default scenario at a pinned simulator clock, minus the
//! series that depend on the run (process, timing, build). Any change to what the exporter serves
//! shows up here and must be deliberate: `UPDATE_GOLDEN=1 cargo test --test golden` rewrites it,
//! and the change is noted in CHANGELOG.md.

mod common;

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
    common::assert_golden("h100x8.prom", &actual, "golden");
}
