//! The golden files: `/metrics` of the default scenario at a pinned simulator clock, minus the
//! series that depend on the run (process, timing, build), with the default collector groups
//! (`h100x8.prom`) and with every group on (`h100x8-all.prom`, which holds every family the
//! scenario has). Any change to what the exporter serves shows up here and must be deliberate:
//! `UPDATE_GOLDEN=1 cargo test --test golden` rewrites them, and the change is noted in
//! CHANGELOG.md.

mod common;

fn golden(file: &str, args: &[&str]) {
    let out = common::run_once(&[("NVML_SIM_TIME", "60")], args);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let actual = common::strip_volatile(&String::from_utf8_lossy(&out.stdout));
    common::assert_golden(file, &actual, "golden");
}

#[test]
fn default_scenario_matches_the_golden_file() {
    golden("h100x8.prom", &[]);
}

#[test]
fn default_scenario_with_every_group_matches_the_full_golden_file() {
    let every_group = common::every_group();
    golden(
        "h100x8-all.prom",
        &common::with_every_group(&every_group, &[]),
    );
}
