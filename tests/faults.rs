//! Faults injected through the simulated driver while the real binary runs: a GPU falling off the
//! bus, a call hanging 30 s (and a shutdown meanwhile), failing calls, GPUs whose every call
//! fails, NVML init failing at start, and XID events. Each test
//! starts the simulator's clock just before its fault (`NVML_SIM_START`); the timeline is in the
//! header of `nvml-sim/scenarios/faults.toml`. Driver restarts, bursts and readiness under a
//! stall are in `reliability.rs`.

mod common;

use common::{Exporter, Exposition, eventually};
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(30);

/// What a GPU that is down still serves (default groups): its identity, `up 0`, and the health
/// verdict that says why it is down.
const DOWN_FAMILIES: [&str; 4] = [
    "nvidia_gpu_info",
    "nvidia_gpu_up",
    "nvidia_gpu_health_state",
    "nvidia_gpu_health_reason",
];

fn faults_env(start: &str) -> Vec<(&'static str, String)> {
    vec![
        (
            "NVML_SIM_SCENARIO",
            common::scenario("faults").to_str().unwrap().to_string(),
        ),
        ("NVML_SIM_START", start.to_string()),
    ]
}

fn start(env: &[(&'static str, String)], args: &[&str]) -> Exporter {
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    Exporter::start(&env, args)
}

fn up(m: &Exposition, gpu: u32) -> Option<f64> {
    m.gpu_value("nvidia_gpu_up", gpu, &[])
}

fn timestamp(m: &Exposition) -> f64 {
    m.value("nvml_exporter_last_sample_timestamp_seconds", &[])
        .unwrap_or(0.0)
}

#[test]
fn a_lost_gpu_goes_down_alone_and_comes_back() {
    // faults.toml: GPU 1 is lost from t = 4 s to t = 8 s.
    let mut e = start(
        &faults_env("3"),
        &["--interval", "250ms", "--stale-grace", "1s"],
    );
    e.wait_metrics(WAIT, "all four GPUs up", |m| {
        (0..4).all(|g| up(m, g) == Some(1.0))
    });

    let lost = e.wait_metrics(WAIT, "GPU 1 down", |m| up(m, 1) == Some(0.0));
    let g1 = [("gpu", "1")];
    assert_eq!(lost.find("nvidia_gpu_info", &g1).len(), 1, "identity stays");
    let g1_series: Vec<&str> = lost
        .find_any_labels(&g1)
        .into_iter()
        .map(|s| s.name.as_str())
        .collect();
    assert_eq!(
        g1_series, DOWN_FAMILIES,
        "a lost GPU keeps only info, up and its health verdict"
    );
    for g in [0, 2, 3] {
        assert_eq!(up(&lost, g), Some(1.0), "GPU {g} unaffected");
        assert!(lost.gpu_value("nvidia_gpu_power_watts", g, &[]).is_some());
    }
    // The others stay fresh while GPU 1 is lost.
    let t = timestamp(&lost);
    let later = e.wait_metrics(WAIT, "a newer tick during the loss", |m| {
        timestamp(m) > t + 0.5
    });
    assert_eq!(up(&later, 0), Some(1.0));

    let back = e.wait_metrics(WAIT, "GPU 1 back", |m| up(m, 1) == Some(1.0));
    assert!(
        back.gpu_value("nvidia_gpu_power_watts", 1, &[]).is_some(),
        "its series return"
    );
    assert!(e.alive());
}

#[test]
fn a_gpu_hanging_30_s_does_not_hold_up_the_others() {
    // faults.toml: on GPU 2, an nvmlDeviceGetTemperature call made at t = 9–10 s blocks 30 s.
    let mut e = start(
        &faults_env("7"),
        &["--interval", "250ms", "--stale-grace", "2s"],
    );
    e.wait_metrics(WAIT, "all four GPUs up", |m| {
        (0..4).all(|g| up(m, g) == Some(1.0))
    });
    let hung = e.wait_metrics(WAIT, "GPU 2 down after the grace period", |m| {
        up(m, 2) == Some(0.0)
    });
    // One reader is held by the hung call and one reads the others; a tick slowed by a loaded
    // machine may have started a spare (it ends after 10 s idle). None accumulate per tick.
    let bounded = |when: &str| {
        let n = readers(&e);
        assert!((2..=3).contains(&n), "{n} reader threads {when}");
    };
    bounded("once GPU 2 went down");
    let went_down = Instant::now();
    let g2 = [("gpu", "2")];
    assert_eq!(
        hung.find_any_labels(&g2)
            .into_iter()
            .map(|s| s.name.as_str())
            .collect::<Vec<_>>(),
        DOWN_FAMILIES,
        "a hung GPU past the grace serves no stale numbers"
    );
    // While GPU 2 hangs, ticks keep their cadence for the others, and scrapes stay fast.
    let t = timestamp(&hung);
    let next = e.wait_metrics(WAIT, "ticks continue", |m| timestamp(m) >= t + 1.0);
    assert!(
        went_down.elapsed() < Duration::from_secs(4),
        "ticks stalled: {:?}",
        went_down.elapsed()
    );
    for g in [0, 1, 3] {
        assert_eq!(up(&next, g), Some(1.0), "GPU {g} stays up");
    }
    bounded("four ticks later");
    let slowest = (0..20)
        .map(|_| {
            let served = Instant::now();
            assert_eq!(e.get("/metrics").status, 200);
            served.elapsed()
        })
        .max()
        .unwrap();
    assert!(
        slowest < Duration::from_secs(1),
        "a scrape took {slowest:?}"
    );

    e.wait_metrics(
        Duration::from_secs(45),
        "GPU 2 back after its 30 s call returned",
        |m| up(m, 2) == Some(1.0),
    );
    // Down from about 2 s (the grace) into the hang until the call returned at about 30 s.
    assert!(
        went_down.elapsed() > Duration::from_secs(20),
        "GPU 2 reported up while its call still hung: back after {:?}",
        went_down.elapsed()
    );
    assert!(e.alive());
}

#[test]
fn shutdown_ends_within_the_grace_while_a_gpu_hangs() {
    // faults.toml: on GPU 2, an nvmlDeviceGetTemperature call made at t = 9–10 s blocks 30 s.
    let mut e = start(
        &faults_env("8"),
        &["--interval", "250ms", "--stale-grace", "1s"],
    );
    e.wait_metrics(WAIT, "GPU 2 down, its reader inside the hung call", |m| {
        up(m, 2) == Some(0.0) && up(m, 0) == Some(1.0)
    });
    let asked = Instant::now();
    let status = e
        .terminate(nvml_exporter::SHUTDOWN_GRACE)
        .unwrap_or_else(|| {
            panic!(
                "still running {:?} after SIGTERM\n{}",
                nvml_exporter::SHUTDOWN_GRACE,
                e.logs()
            )
        });
    eprintln!("exited {:?} after SIGTERM", asked.elapsed());
    assert!(status.success(), "{status:?}\n{}", e.logs());
}

#[test]
fn gpus_whose_every_call_fails_go_down_after_the_grace_and_come_back() {
    // faults.toml, t = 38–42 s: every call fails on GPU 0 with UNKNOWN, on GPU 1 with TIMEOUT
    // (its handle still resolves) and on GPU 3 with IRQ_ISSUE; GPU 2 answers.
    let e = start(
        &faults_env("37"),
        &["--interval", "250ms", "--stale-grace", "2s"],
    );
    let broken = [(0, "unknown"), (1, "timeout"), (3, "irq_issue")];
    e.wait_metrics(WAIT, "all four GPUs up", |m| {
        (0..4).all(|g| up(m, g) == Some(1.0))
    });
    let failures = |m: &Exposition, error: &str| -> f64 {
        m.find("nvml_exporter_nvml_errors_total", &[("error", error)])
            .iter()
            .map(|s| s.value)
            .sum()
    };
    // The first failures, within the grace (2 s, against ticks of 250 ms): still up, served from
    // the last good reading.
    let failing = e.wait_metrics(WAIT, "the first failures counted", |m| {
        broken.iter().any(|(_, error)| failures(m, error) > 0.0)
    });
    for (g, error) in broken {
        if failures(&failing, error) > 0.0 {
            assert_eq!(
                up(&failing, g),
                Some(1.0),
                "GPU {g} down at its first failure"
            );
            assert!(
                failing
                    .gpu_value("nvidia_gpu_power_watts", g, &[])
                    .is_some(),
                "GPU {g} ({error}) is up without readings"
            );
        }
    }

    let down = e.wait_metrics(WAIT, "the three failing GPUs down", |m| {
        broken.iter().all(|(g, _)| up(m, *g) == Some(0.0))
    });
    for (g, error) in broken {
        let gpu = g.to_string();
        let series: Vec<&str> = down
            .find_any_labels(&[("gpu", gpu.as_str())])
            .into_iter()
            .map(|s| s.name.as_str())
            .collect();
        assert_eq!(
            series, DOWN_FAMILIES,
            "GPU {g} ({error}) keeps only info, up and its health verdict"
        );
    }
    assert_eq!(up(&down, 2), Some(1.0), "GPU 2 unaffected");
    assert!(down.gpu_value("nvidia_gpu_power_watts", 2, &[]).is_some());
    assert!(
        e.get("/readyz").status == 200,
        "one GPU answering keeps the exporter ready"
    );

    let back = e.wait_metrics(WAIT, "every GPU up again after the window", |m| {
        (0..4).all(|g| up(m, g) == Some(1.0))
    });
    for (g, error) in broken {
        assert!(
            back.gpu_value("nvidia_gpu_power_watts", g, &[]).is_some(),
            "GPU {g} ({error}): its readings return"
        );
    }
}

/// How many device reader threads the exporter has.
fn readers(e: &Exporter) -> usize {
    common::reader_threads(e)
}

#[test]
fn failing_calls_are_counted_and_only_their_series_go() {
    // faults.toml: GPU 0's nvmlDeviceGetPowerUsage fails with UNKNOWN from t = 12 s to 17 s.
    let e = start(&faults_env("11"), &["--interval", "250ms"]);
    let labels = [
        ("function", "nvmlDeviceGetPowerUsage"),
        ("error", "unknown"),
    ];
    let m = e.wait_metrics(WAIT, "the error counted", |m| {
        m.value("nvml_exporter_nvml_errors_total", &labels)
            .unwrap_or(0.0)
            > 0.0
    });
    let m = if m.gpu_value("nvidia_gpu_power_watts", 0, &[]).is_none() {
        m
    } else {
        e.wait_metrics(WAIT, "GPU 0 power absent while failing", |m| {
            m.gpu_value("nvidia_gpu_power_watts", 0, &[]).is_none()
        })
    };
    assert_eq!(
        up(&m, 0),
        Some(1.0),
        "one failing call does not take the GPU down"
    );
    assert!(
        m.gpu_value("nvidia_gpu_temperature_celsius", 0, &[])
            .is_some()
    );
    assert!(m.gpu_value("nvidia_gpu_power_watts", 3, &[]).is_some());
    e.wait_metrics(WAIT, "GPU 0 power back", |m| {
        m.gpu_value("nvidia_gpu_power_watts", 0, &[]).is_some()
    });
}

#[test]
fn nvml_init_failing_at_start_is_retried_without_a_restart() {
    // faults.toml: nvmlInit answers DRIVER_NOT_LOADED for the first 3 s.
    let e = start(&faults_env("0"), &["--interval", "250ms"]);
    // Before NVML answers, /readyz says why (after a first attempt; "no sample yet" before it).
    eventually(
        Duration::from_secs(3),
        "/readyz to give the reason (driver not loaded)",
        || {
            let r = e.get("/readyz");
            assert_eq!(r.status, 503, "not ready while init fails: {}", r.text());
            let reason = r.text().to_lowercase();
            reason.contains("driver not loaded").then_some(())
        },
    );
    assert_eq!(e.metrics().value("nvml_exporter_nvml_up", &[]), Some(0.0));
    e.wait_metrics(WAIT, "NVML up after retries", |m| {
        m.value("nvml_exporter_nvml_up", &[]) == Some(1.0)
    });
    let m = e.wait_metrics(WAIT, "4 GPUs", |m| {
        m.find("nvidia_gpu_up", &[])
            .iter()
            .filter(|s| s.value == 1.0)
            .count()
            == 4
    });
    assert_eq!(m.value("nvml_exporter_gpus", &[]), Some(4.0));
    e.wait_ready(WAIT);
}

#[test]
fn xid_events_are_counted_per_gpu_and_code() {
    // h100x8.toml: XID 79 on GPU 6 at t = 30 s.
    let scenario = common::scenario("h100x8");
    let e = Exporter::start(
        &[
            ("NVML_SIM_SCENARIO", scenario.to_str().unwrap()),
            ("NVML_SIM_START", "27"),
        ],
        // Both namings: dcgm-exporter's XID field is checked against the same events.
        &["--interval", "250ms", "--dcgm-compat=both"],
    );
    let m = e.wait_metrics(WAIT, "XID 79 on GPU 6", |m| {
        m.gpu_value("nvidia_gpu_xid_errors_total", 6, &[("xid", "79")])
            .is_some()
    });
    assert_eq!(
        m.gpu_value("nvidia_gpu_xid_errors_total", 6, &[("xid", "79")]),
        Some(1.0)
    );
    let when = m
        .gpu_value("nvidia_gpu_last_xid_timestamp_seconds", 6, &[])
        .expect("time of the last XID");
    assert!(when > 1.7e9);
    // --dcgm-compat: the code of the last XID on that GPU, 0 on the others (none yet).
    let dcgm = m.find("DCGM_FI_DEV_XID_ERRORS", &[]);
    assert_eq!(dcgm.len(), 8, "{dcgm:?}");
    for s in dcgm {
        let want = if s.labels["gpu"] == "6" { 79.0 } else { 0.0 };
        assert_eq!(s.value, want, "{s:?}");
    }
    assert!(
        m.find("nvidia_gpu_xid_errors_total", &[])
            .iter()
            .all(|s| s.labels["gpu"] == "6"),
        "only GPU 6 had one"
    );
    assert_eq!(
        m.types
            .get("nvidia_gpu_xid_errors_total")
            .map(String::as_str),
        Some("counter")
    );
}
