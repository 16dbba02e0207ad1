//! One simulated clock for every process: with `NVML_SIM_EPOCH` set, separate processes that
//! read a GPU at the same moment read the same counters, the values a pinned clock gives at
//! t = now − epoch; `NVML_SIM_TIME` still pins t.
//!
//! The other processes are this test binary run again for the ignored `child_reads_gpu2_energy`.

use crate::common;
use std::process::{Child, Command, Stdio};
use std::time::{SystemTime, UNIX_EPOCH};

/// GPU2 of h100x8 trains at full power: any error in t shows as energy.
const GPU: u32 = 2;
/// Above any draw of the scenario's H100s (700 W limit), W.
const MAX_POWER_W: f64 = 1000.0;
/// Marks the child's answer in its output.
const MARK: &str = "nvml-sim-clock-child:";

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// Run in another process by `processes_on_one_epoch_read_the_same_energy`: initializes NVML
/// in the environment it inherited and prints the wall-clock window of one energy read.
#[test]
#[ignore = "run as a child process by processes_on_one_epoch_read_the_same_energy"]
fn child_reads_gpu2_energy() {
    let nvml = common::init().expect("nvml init in the child");
    let device = nvml.device_by_index(GPU).unwrap();
    let before = unix_now();
    let energy_mj = device.total_energy_consumption().unwrap();
    let after = unix_now();
    println!("{MARK} {before} {after} {energy_mj}");
}

fn spawn_child() -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            "clock::child_reads_gpu2_energy",
            "--nocapture",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap()
}

/// (before, after, energy mJ) printed by a child.
fn answer(child: Child) -> (f64, f64, u64) {
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "child failed: {text}");
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix(MARK))
        .unwrap_or_else(|| panic!("no answer from the child: {text}"));
    let v: Vec<&str> = line.split_whitespace().collect();
    (
        v[0].parse().unwrap(),
        v[1].parse().unwrap(),
        v[2].parse().unwrap(),
    )
}

/// GPU2's energy with t pinned, mJ.
fn pinned_energy(turn: &common::Turn, epoch: &str, t: f64) -> u64 {
    let scenario = common::scenario("h100x8.toml");
    let t = format!("{t:.3}");
    common::set_env(
        turn,
        &[
            ("NVML_SIM_SCENARIO", Some(scenario.as_str())),
            ("NVML_SIM_EPOCH", Some(epoch)),
            ("NVML_SIM_TIME", Some(t.as_str())),
        ],
    );
    let nvml = common::init().unwrap();
    nvml.device_by_index(GPU)
        .unwrap()
        .total_energy_consumption()
        .unwrap()
}

#[test]
fn processes_on_one_epoch_read_the_same_energy() {
    let scenario = common::scenario("h100x8.toml");
    // The machine's simulation started 100 s ago: a clock per process would read about 0 J.
    let epoch_s = unix_now() - 100.0;
    let epoch = format!("{epoch_s:.3}");
    let turn = common::turn(&[
        ("NVML_SIM_SCENARIO", Some(scenario.as_str())),
        ("NVML_SIM_EPOCH", Some(epoch.as_str())),
    ]);
    let children = [spawn_child(), spawn_child()];
    let answers = children.map(answer);

    // Energy grows by at most MAX_POWER_W per second: two reads agree within the time between
    // them, and each is what a pinned clock gives at its own moment (plus the 0.25 s grid).
    let bound_mj = |seconds: f64| ((seconds + 0.25) * MAX_POWER_W * 1000.0) as u64;
    let [(b0, a0, e0), (b1, a1, e1)] = answers;
    let apart = (a0.max(a1) - b0.min(b1)).max(0.0);
    assert!(
        e0.abs_diff(e1) <= bound_mj(apart),
        "{e0} mJ and {e1} mJ read within {apart:.3} s"
    );
    let epoch_s: f64 = epoch.parse().unwrap();
    for (before, after, energy) in answers {
        let mid = (before + after) / 2.0 - epoch_s;
        let expected = pinned_energy(&turn, &epoch, mid);
        assert!(
            energy.abs_diff(expected) <= bound_mj((after - before) / 2.0),
            "read {energy} mJ at t = {mid:.3} s, pinned {expected} mJ"
        );
        // Sanity: the shared clock is 100 s in, not at a process's own start.
        assert!(energy > 100 * 300 * 1000, "{energy} mJ");
    }
    drop(turn);
}

#[test]
fn a_pinned_time_wins_over_the_epoch() {
    let turn = common::turn(&[]);
    let long_ago = format!("{:.3}", unix_now() - 1000.0);
    let with_epoch = pinned_energy(&turn, &long_ago, 42.0);
    let scenario = common::scenario("h100x8.toml");
    common::set_env(
        &turn,
        &[
            ("NVML_SIM_SCENARIO", Some(scenario.as_str())),
            ("NVML_SIM_TIME", Some("42")),
        ],
    );
    let nvml = common::init().unwrap();
    let without = nvml
        .device_by_index(GPU)
        .unwrap()
        .total_energy_consumption()
        .unwrap();
    assert_eq!(with_epoch, without);
}

#[test]
fn an_epoch_in_the_future_reads_t_0_and_a_bad_one_fails_init() {
    let scenario = common::scenario("h100x8.toml");
    let future = format!("{:.3}", unix_now() + 3600.0);
    let turn = common::turn(&[
        ("NVML_SIM_SCENARIO", Some(scenario.as_str())),
        ("NVML_SIM_EPOCH", Some(future.as_str())),
    ]);
    {
        let nvml = common::init().unwrap();
        let d = nvml.device_by_index(GPU).unwrap();
        assert_eq!(d.total_energy_consumption().unwrap(), 0);
    }
    common::set_env(
        &turn,
        &[
            ("NVML_SIM_SCENARIO", Some(scenario.as_str())),
            ("NVML_SIM_EPOCH", Some("yesterday")),
        ],
    );
    assert!(matches!(
        common::init(),
        Err(nvml_wrapper::error::NvmlError::Unknown)
    ));
}
