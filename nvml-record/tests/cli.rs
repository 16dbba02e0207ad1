//! The `nvml-record` binary against the simulator: what it writes is a scenario the simulator
//! replays (recording the replay gives the same file back), and bad options exit 2 naming them.

use std::path::Path;
use std::process::{Command, Output};

fn sim_lib() -> std::path::PathBuf {
    nvml_sim::built_library().expect("libnvml_sim.so built next to the test executable")
}

fn record(env: &[(&str, &str)], args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_nvml-record"));
    for (key, _) in std::env::vars() {
        if key.starts_with("NVML_SIM_") {
            cmd.env_remove(key);
        }
    }
    cmd.envs(env.iter().copied())
        .args(args)
        .output()
        .expect("run nvml-record")
}

fn record_ok(env: &[(&str, &str)], out: &Path) -> String {
    let lib = sim_lib();
    let o = record(
        env,
        &[
            "--duration",
            "2s",
            "--period",
            "1s",
            "--out",
            out.to_str().unwrap(),
            "--nvml-lib",
            lib.to_str().unwrap(),
        ],
    );
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    std::fs::read_to_string(out).unwrap()
}

#[test]
fn recording_the_replay_gives_the_recording_back() {
    let dir = tempfile::tempdir().unwrap();
    let first = dir.path().join("first.toml");
    let second = dir.path().join("second.toml");
    let scenario = Path::new(env!("CARGO_MANIFEST_DIR")).join("../nvml-sim/scenarios/h100x8.toml");
    let recorded = record_ok(
        &[
            ("NVML_SIM_SCENARIO", scenario.to_str().unwrap()),
            ("NVML_SIM_TIME", "60"),
        ],
        &first,
    );
    // What an H100 SXM answers NOT_SUPPORTED (no fan) is left out; what it has is there.
    assert!(!recorded.contains("fan_percent"), "{recorded}");
    assert!(recorded.contains("memory_temperature_c = "), "{recorded}");
    assert!(recorded.contains("name = \"tritonserver\""), "{recorded}");
    assert!(recorded.contains("[gpu.process.replay]"), "{recorded}");
    assert_eq!(recorded.matches("[[gpu]]").count(), 8);
    // The first recording is of one pinned instant, so every step of it is the same; t = 1 s
    // rather than 0, where the simulator stamps per-process utilization samples 0, which a
    // reader takes for "nothing new".
    let again = record_ok(
        &[
            ("NVML_SIM_SCENARIO", first.to_str().unwrap()),
            ("NVML_SIM_TIME", "1"),
        ],
        &second,
    );
    assert_eq!(recorded, again);
    assert!(!dir.path().join("second.toml.tmp").exists());
}

#[test]
fn bad_options_exit_2_naming_the_option() {
    let lib = sim_lib();
    let lib = lib.to_str().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.toml");
    let out = out.to_str().unwrap();
    let missing_dir = dir.path().join("missing/out.toml");
    let cases: [(&[&str], &str); 3] = [
        (
            &["--period", "0s", "--out", out, "--nvml-lib", lib],
            "--period",
        ),
        (
            &["--out", missing_dir.to_str().unwrap(), "--nvml-lib", lib],
            "--out",
        ),
        (
            &["--out", out, "--nvml-lib", "/no/such/libnvidia-ml.so.1"],
            "--nvml-lib",
        ),
    ];
    for (args, option) in cases {
        let o = record(&[], args);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(option), "{args:?}: {stderr}");
    }
    assert!(!Path::new(out).exists());
}
