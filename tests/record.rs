//! The recorder's round trip: nvml-record reads the simulator as it would read a real node, the
//! recording is replayed by the simulator, and nvml-exporter serves the same `/metrics` on the
//! replay as on the original at the same instants.
//!
//! The recording is taken in this process through nvml-record's library, one sample per pinned
//! instant (`NVML_SIM_TIME` = 60, 61, 62, 63; the simulator reads it at each `nvmlInit`), so the
//! trace is exact. Replay instant k (t = k s) is then compared with original instant 60 + k:
//!
//! - every series the exporter serves with every collector group and `--processes`, minus the
//!   run's own (`common::strip_volatile`: process, timing, build);
//! - not instant 0: at t = 0 the simulator timestamps its per-process utilization samples 0,
//!   which the exporter reads as "nothing newer than last time" and leaves out (a real driver
//!   stamps them with the wall clock, never 0);
//! - GPM averages (SM activity, occupancy, tensor/DRAM/pipe/media activity) need two GPM samples
//!   apart in time, and XID events arrive as time passes: a pinned clock gives neither, on
//!   either side, and [`gpm_averages_and_xids_replay`] and
//!   [`gpm_averages_of_mig_instances_replay`] check them on a running clock instead.

#![allow(
    unsafe_code,
    reason = "std::env::set_var: the simulator reads its clock at nvmlInit"
)]

mod common;
#[path = "saturation/families.rs"]
mod saturation;

use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use nvml_record::{Recorder, Session};
use nvml_wrapper::Nvml;

/// The first recorded instant of the original scenario.
const T0: u32 = 60;
/// Samples recorded, one second apart.
const SAMPLES: u32 = 4;

/// The simulator loaded in this process is one library with one environment: one recording at
/// a time.
static LIBRARY: Mutex<()> = Mutex::new(());

fn set_env(vars: &[(&str, Option<&str>)]) {
    for (name, value) in vars {
        // SAFETY: LIBRARY is held, so no simulator init runs meanwhile; the other threads of this
        // binary read the environment only through std (spawning exporters), which locks it.
        unsafe {
            match value {
                Some(v) => std::env::set_var(name, v),
                None => std::env::remove_var(name),
            }
        }
    }
}

fn init() -> Nvml {
    Nvml::builder()
        .lib_path(common::sim_lib().as_os_str())
        .init()
        .expect("nvmlInit on the simulator")
}

/// Records `scenario` at the pinned instants T0, T0 + 1 s, …: NVML is initialized once per
/// sample, each time with the next instant.
fn record_stepped(scenario: &Path) -> String {
    let _turn = LIBRARY.lock().unwrap_or_else(|e| e.into_inner());
    let mut recorder: Option<Recorder> = None;
    for k in 0..SAMPLES {
        let t = (T0 + k).to_string();
        set_env(&[
            ("NVML_SIM_SCENARIO", Some(scenario.to_str().unwrap())),
            ("NVML_SIM_TIME", Some(&t)),
        ]);
        let nvml = init();
        let recorder = match &mut recorder {
            Some(r) => r,
            None => recorder.insert(Recorder::new(&nvml, Duration::from_secs(1)).unwrap()),
        };
        recorder.sample(&nvml).unwrap();
        assert!(recorder.gaps().is_empty(), "{:?}", recorder.gaps());
        // Dropping `nvml` shuts the library down: the next init reads the next instant.
    }
    recorder.unwrap().scenario()
}

fn every_group_with_processes(flags: &[String]) -> Vec<&str> {
    common::with_every_group(flags, &["--processes", "--host-proc", "/proc"])
}

/// `/metrics` of `--once` on `scenario` at pinned `t`, without the run's own series.
fn once(scenario: &Path, t: u32, args: &[&str]) -> String {
    let t = t.to_string();
    let out = common::run_once(
        &[
            ("NVML_SIM_SCENARIO", scenario.to_str().unwrap()),
            ("NVML_SIM_TIME", &t),
        ],
        args,
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    common::strip_volatile(&String::from_utf8_lossy(&out.stdout))
}

fn assert_round_trip(name: &str) {
    let original = common::scenario(name);
    let recording = record_stepped(&original);
    let dir = tempfile::tempdir().unwrap();
    let replay = common::write_atomic(dir.path(), "recorded.toml", &recording);
    let flags = common::every_group();
    let args = every_group_with_processes(&flags);
    for k in 1..SAMPLES {
        let want = once(&original, T0 + k, &args);
        let got = once(&replay, k, &args);
        let differing: Vec<String> = want
            .lines()
            .zip(got.lines())
            .filter(|(w, g)| w != g)
            .take(10)
            .map(|(w, g)| format!("- {w}\n+ {g}"))
            .collect();
        assert!(
            want == got,
            "{name}: replay at t = {k} differs from the original at t = {} ({} vs {} lines):\n{}",
            T0 + k,
            want.lines().count(),
            got.lines().count(),
            differing.join("\n")
        );
    }
    // The instants differ from each other, or the comparison proves little.
    assert_ne!(
        once(&replay, 1, &args),
        once(&replay, 2, &args),
        "{name}: the recording does not change between samples"
    );
}

#[test]
fn replay_of_the_default_scenario_serves_the_same_metrics() {
    assert_round_trip("h100x8");
}

#[test]
fn replay_of_a_pcie_board_with_encoders_serves_the_same_metrics() {
    // L4: no NVLink, no MIG, no memory temperature sensor, encoder/decoder load, steps patterns.
    assert_round_trip("l4x2");
}

#[test]
fn replay_of_a_board_with_fans_serves_the_same_metrics() {
    assert_round_trip("rtx6000ada");
}

/// Records `scenario` on a running clock from t = `start` s, 3 samples 1 s apart, through the
/// recorder's session (GPM windows and XIDs).
fn record_running(scenario: &Path, start: &str) -> String {
    let _turn = LIBRARY.lock().unwrap_or_else(|e| e.into_inner());
    set_env(&[
        ("NVML_SIM_SCENARIO", Some(scenario.to_str().unwrap())),
        ("NVML_SIM_TIME", None),
        ("NVML_SIM_START", Some(start)),
    ]);
    let nvml = init();
    let mut recorder = Recorder::new(&nvml, Duration::from_secs(1)).unwrap();
    let mut session = Session::new(&nvml);
    let began = std::time::Instant::now();
    for k in 0..3 {
        // The recorder's sampling period: GPM averages need time to pass between samples.
        let due = began + Duration::from_secs(k);
        if let Some(wait) = due.checked_duration_since(std::time::Instant::now()) {
            std::thread::sleep(wait);
        }
        recorder.sample(&nvml).unwrap();
        recorder.sample_over_time(&mut session);
    }
    drop(session);
    set_env(&[("NVML_SIM_START", None)]);
    recorder.scenario()
}

/// The GPM families that are averages over time (the ratios).
fn gpm_averages() -> Vec<&'static str> {
    saturation::gpm_families()
        .into_iter()
        .filter(|n| n.ends_with("_ratio"))
        .collect()
}

/// Serves `recording` (a running-clock recording of `original` from t = `start` s) and the
/// original from `start`, waits until both serve every GPM average and `until` holds, and checks
/// that they serve the same GPM series with the same values (to rounding), except `skip`
/// ((family, GPU) whose inputs move, so their average depends on the window). Returns both
/// expositions.
fn assert_gpm_round_trip(
    original: &Path,
    start: &str,
    recording: &str,
    skip: &[(&str, &str)],
    until: impl Fn(&common::Exposition) -> bool,
) -> (common::Exposition, common::Exposition) {
    let dir = tempfile::tempdir().unwrap();
    let replay = common::write_atomic(dir.path(), "recorded.toml", recording);
    let flags = common::every_group();
    let args = common::with_every_group(&flags, &[]);
    let averages = gpm_averages();
    let serve = |scenario: &Path, start: &str| {
        let e = common::Exporter::start(
            &[
                ("NVML_SIM_SCENARIO", scenario.to_str().unwrap()),
                ("NVML_SIM_START", start),
            ],
            &args,
        );
        e.wait_metrics(Duration::from_secs(20), "GPM averages", |m| {
            averages.iter().all(|f| !m.find(f, &[]).is_empty()) && until(m)
        })
    };
    let gpm = |m: &common::Exposition| {
        m.series
            .iter()
            .filter(|s| averages.contains(&s.name.as_str()))
            .filter(|s| {
                let gpu = s.labels.get("gpu").map(String::as_str).unwrap_or_default();
                !skip.contains(&(s.name.as_str(), gpu))
            })
            .map(|s| ((s.name.clone(), s.labels.clone()), s.value))
            .collect::<std::collections::BTreeMap<_, _>>()
    };
    let want_m = serve(original, start);
    let got_m = serve(&replay, "0");
    let (want, got) = (gpm(&want_m), gpm(&got_m));
    assert_eq!(
        want.keys().collect::<Vec<_>>(),
        got.keys().collect::<Vec<_>>(),
        "the replay serves other GPM series"
    );
    for (key, w) in &want {
        let g = got[key];
        assert!((w - g).abs() < 1e-9, "{key:?}: original {w}, replay {g}");
    }
    (want_m, got_m)
}

/// GPM averages and XIDs on a running clock, on the default scenario from t = 29 s: every GPM
/// input of it is constant except GPU 1's graphics activity (it follows the utilization sine),
/// and GPU 6 has XID 79 at t = 30 s.
#[test]
fn gpm_averages_and_xids_replay() {
    let original = common::scenario("h100x8");
    let recording = record_running(&original, "29");
    let parsed: toml::Table = toml::from_str(&recording).unwrap();
    let occupancy = parsed["gpu"][1]["load"]["sm_occupancy"].as_float();
    assert!(
        occupancy.is_some_and(|o| (o - 0.1).abs() < 1e-9),
        "GPU 1's occupancy (10 %) is recorded: {occupancy:?}"
    );
    let event = &parsed["event"][0];
    assert_eq!(
        (event["gpu"].as_integer(), event["xid"].as_integer()),
        (Some(6), Some(79)),
        "GPU 6's XID 79 is recorded: {event}"
    );
    let xid = [("xid", "79")];
    let (want, got) = assert_gpm_round_trip(
        &original,
        "29",
        &recording,
        &[("nvidia_gpu_graphics_engine_active_ratio", "1")],
        |m| {
            m.gpu_value("nvidia_gpu_xid_errors_total", 6, &xid)
                .is_some()
        },
    );
    for m in [want, got] {
        let xids = m.find("nvidia_gpu_xid_errors_total", &[]);
        assert_eq!(xids.len(), 1, "one XID series, GPU 6's: {xids:?}");
    }
}

/// GPM averages per MIG instance on a running clock: the H100 MIG scenario from t = 70 s, where
/// every instance's inputs are constant until t = 80 s (GI 10's square wave is low).
#[test]
fn gpm_averages_of_mig_instances_replay() {
    let original = common::scenario("h100-mig");
    let recording = record_running(&original, "70");
    let (want, _) = assert_gpm_round_trip(&original, "70", &recording, &[], |_| true);
    let instances = want.find_any_labels(&[("gpu_instance", "2")]);
    assert!(
        instances
            .iter()
            .any(|s| s.name == "nvidia_gpu_sm_active_ratio"),
        "GI 2's SM activity is among the compared series"
    );
}

#[test]
fn replay_of_remapped_rows_and_retired_pages_serves_the_same_metrics() {
    // A100: row remapping (correctable, uncorrectable, pending); V100: retired pages.
    assert_round_trip("a100x4");
    assert_round_trip("v100x2");
}

#[test]
fn replay_of_mig_instances_serves_the_same_metrics() {
    // H100: four GPU instances (after the reconfiguration at t = 60 s) and a second GPU with MIG
    // off but pending; A100: seven 1g.10gb instances. Per-instance memory, MIG devices, processes.
    assert_round_trip("h100-mig");
    assert_round_trip("a100-mig");
}
