//! Busy-time counters end to end: each `_seconds_total` grows by the reading times the time it
//! held, nothing is added while a GPU cannot be read, and MIG instances count their own GPM
//! readings. (That `rate()` of a counter is a square wave's true mean is checked against a live
//! Prometheus by `scripts/check-busy.py`, over minutes: the simulator's readings are point
//! samples and 0.1 s GPM refreshes, so a window of seconds depends on where the ticks fall.)
//!
//! Elapsed time is the exporter's own: `nvml_exporter_last_sample_timestamp_seconds` of two
//! expositions (each tick's snapshot carries its end).

mod common;

use std::time::Duration;

use common::{Exporter, Exposition, scenario};

const TIMESTAMP: &str = "nvml_exporter_last_sample_timestamp_seconds";
const UTILIZATION: &str = "nvidia_gpu_utilization_seconds_total";
const SM_ACTIVE: &str = "nvidia_gpu_sm_active_seconds_total";
const TENSOR_ACTIVE: &str = "nvidia_gpu_tensor_active_seconds_total";

fn timestamp(m: &Exposition) -> f64 {
    m.value(TIMESTAMP, &[]).expect("a complete tick")
}

/// The first exposition at least `seconds` of ticks after `from`.
fn after(e: &Exporter, from: &Exposition, seconds: f64) -> Exposition {
    let t0 = timestamp(from);
    e.wait_metrics(
        Duration::from_secs_f64(seconds + 10.0),
        &format!("ticks {seconds} s on"),
        |m| m.value(TIMESTAMP, &[]).is_some_and(|t| t >= t0 + seconds),
    )
}

/// Asserts `got` ≈ `want` seconds, within 1 % of the `window` and 20 ms: a tick's end and its
/// reading differ by the reading's share of the tick.
fn assert_seconds(got: f64, want: f64, window: f64, what: &str) {
    let tolerance = 0.01 * window + 0.02;
    assert!(
        (got - want).abs() <= tolerance,
        "{what}: {got:.4} s, want {want:.4} ± {tolerance:.3}"
    );
}

#[test]
fn each_counter_grows_by_its_reading_times_the_time_between_ticks() {
    // A frozen clock: every reading is the same, so the counter's increase is reading × time.
    let e = Exporter::start(&[("NVML_SIM_TIME", "60")], &["--interval", "250ms"]);
    let first = e.wait_metrics(Duration::from_secs(20), "the counters", |m| {
        (0..8).all(|g| m.gpu_value(UTILIZATION, g, &[]).is_some())
    });
    let second = after(&e, &first, 2.0);
    let window = timestamp(&second) - timestamp(&first);
    for g in 0..8 {
        let reading = second
            .gpu_value("nvidia_gpu_utilization_ratio", g, &[])
            .unwrap();
        let grew = second.gpu_value(UTILIZATION, g, &[]).unwrap()
            - first.gpu_value(UTILIZATION, g, &[]).unwrap();
        assert_seconds(grew, reading * window, window, &format!("GPU {g}"));
    }
    // GPU1 runs kernels all the time (0.99) and GPU0 none: the counter tells them apart.
    assert!(second.gpu_value(UTILIZATION, 1, &[]).unwrap() > 1.0);
    assert_eq!(second.gpu_value(UTILIZATION, 0, &[]), Some(0.0));
    // The SM-active counter is in the pipes group, off by default.
    assert!(second.find(SM_ACTIVE, &[]).is_empty());
}

#[test]
fn no_busy_time_is_counted_while_a_gpu_cannot_be_read() {
    // faults.toml from t = 36 s: from 38 to 42 s every call on GPU0 (utilization 0.5) fails,
    // while GPU2 (utilization 0.3) answers throughout; the driver restarts at 45 s.
    let path = scenario("faults");
    let e = Exporter::start(
        &[
            ("NVML_SIM_SCENARIO", path.to_str().unwrap()),
            ("NVML_SIM_START", "36"),
        ],
        &["--interval", "250ms"],
    );
    let m = e.wait_metrics(
        Duration::from_secs(20),
        "GPU2 read for 7.5 s (t = 43.5 s)",
        |m| {
            m.gpu_value(UTILIZATION, 2, &[])
                .is_some_and(|s| s / 0.3 >= 7.5)
        },
    );
    // Seconds each was read: the counter over its constant utilization.
    let gpu0 = m.gpu_value(UTILIZATION, 0, &[]).unwrap() / 0.5;
    let gpu2 = m.gpu_value(UTILIZATION, 2, &[]).unwrap() / 0.3;
    let missed = gpu2 - gpu0;
    // 4 s unread, and the first reading after it starts a new stretch (one tick).
    assert!(
        (3.75..=4.75).contains(&missed),
        "GPU0 counted {gpu0:.3} s of GPU2's {gpu2:.3} s: {missed:.3} s missing, want 4 to 4.5\n{}",
        m.text
    );
    // It stayed up (the gap is shorter than the stale grace), so the counter never vanished.
    assert_eq!(m.gpu_value("nvidia_gpu_up", 0, &[]), Some(1.0));
}

#[test]
fn each_mig_instance_counts_its_own_busy_time() {
    // h100-mig.toml before t = 60 s: GI 2 (3g.40gb) SM activity 0.85 and tensor 0.6, GI 3
    // (2g.20gb) 0.4 and 0.25, GI 9 (1g.10gb) idle. GPU0 itself has no utilization in MIG mode.
    let path = scenario("h100-mig");
    let e = Exporter::start(
        &[("NVML_SIM_SCENARIO", path.to_str().unwrap())],
        &["--interval", "250ms", "--collector.pipes"],
    );
    let instance = |gi: &'static str| [("gpu", "0"), ("gpu_instance", gi)];
    let value = |m: &Exposition, name: &str, gi: &'static str| {
        m.find(name, &instance(gi)).first().map(|s| s.value)
    };
    let first = e.wait_metrics(Duration::from_secs(20), "each instance's counters", |m| {
        ["2", "3", "9"]
            .iter()
            .all(|gi| value(m, SM_ACTIVE, gi).is_some())
    });
    let second = after(&e, &first, 2.0);
    let window = timestamp(&second) - timestamp(&first);
    for (gi, sm, tensor) in [("2", 0.85, 0.6), ("3", 0.4, 0.25), ("9", 0.0, 0.0)] {
        let grew =
            |name: &str| value(&second, name, gi).unwrap() - value(&first, name, gi).unwrap();
        assert_seconds(grew(SM_ACTIVE), sm * window, window, &format!("GI {gi}"));
        assert_seconds(
            grew(TENSOR_ACTIVE),
            tensor * window,
            window,
            &format!("GI {gi} tensor"),
        );
    }
    assert_eq!(
        second.find(UTILIZATION, &[("gpu", "0")]).len(),
        0,
        "no utilization in MIG mode, so no utilization counter"
    );
}
