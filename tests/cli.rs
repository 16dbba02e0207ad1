//! The command-line contract, run through the real binary: `--help`, exit status 2 with a message
//! naming the option for every kind of bad input, and `--once`'s status when NVML is unavailable.

mod common;

use common::{exporter_command, run_once};
use std::io::Write;

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn help_documents_every_option() {
    let out = exporter_command(&[], &["--help"]).output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for option in [
        "--config",
        "--listen",
        "--interval",
        "--device-timeout",
        "--stale-grace",
        "--nvml-lib",
        "--demo",
        "--once",
        "--log-format",
        "--log-level",
        "--web-config",
        "check-config",
        "NVML_EXPORTER_LISTEN",
        "9400",
    ] {
        assert!(
            help.contains(option),
            "--help does not mention {option}:\n{help}"
        );
    }
}

#[test]
fn unknown_flag_exits_2() {
    let out = exporter_command(&[], &["--listne", ":9400"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("--listne"), "{}", stderr(&out));
}

#[test]
fn bad_flag_value_exits_2_naming_the_option() {
    let out = exporter_command(&[], &["--interval", "often"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("--interval"), "{}", stderr(&out));
}

#[test]
fn bad_environment_value_exits_2_naming_the_option() {
    let out = exporter_command(&[("NVML_EXPORTER_LISTEN", "not-an-address")], &["--once"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("--listen"), "{}", stderr(&out));

    let out = exporter_command(&[("NVML_EXPORTER_INTERVAL", "1ms")], &["--once"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(
        err.contains("--interval") && err.contains("NVML_EXPORTER_INTERVAL"),
        "{err}"
    );
}

#[test]
fn bad_config_file_exits_2_naming_option_and_line() {
    let mut file = tempfile::NamedTempFile::new().unwrap();
    writeln!(file, "listen = \":9400\"\n\nlog_format = \"xml\"").unwrap();
    let out = exporter_command(&[], &["--config", file.path().to_str().unwrap(), "--once"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(
        err.contains("line 3") && err.contains("log_format"),
        "{err}"
    );
}

#[test]
fn environment_overrides_file_and_flag_overrides_environment() {
    // interval 5ms is invalid: whichever layer wins decides whether the exporter accepts it.
    let mut file = tempfile::NamedTempFile::new().unwrap();
    writeln!(file, "interval = \"5ms\"").unwrap();
    let path = file.path().to_str().unwrap();
    let sim = common::sim_lib();
    let sim = sim.to_str().unwrap();
    let scenario = common::scenario("h100x8");
    let env_ok = [
        ("NVML_EXPORTER_INTERVAL", "2s"),
        ("NVML_SIM_SCENARIO", scenario.to_str().unwrap()),
    ];

    let file_only = exporter_command(&[], &["--config", path, "--once", "--nvml-lib", sim])
        .output()
        .unwrap();
    assert_eq!(
        file_only.status.code(),
        Some(2),
        "the file's bad interval is used"
    );

    let env_wins = exporter_command(
        &env_ok,
        &[
            "--config",
            path,
            "--once",
            "--nvml-lib",
            sim,
            "--stale-grace",
            "5s",
        ],
    )
    .output()
    .unwrap();
    assert_eq!(
        env_wins.status.code(),
        Some(0),
        "env beats file: {}",
        stderr(&env_wins)
    );

    let flag_wins = exporter_command(&env_ok, &["--config", path, "--once", "--interval", "5ms"])
        .output()
        .unwrap();
    assert_eq!(flag_wins.status.code(), Some(2), "flag beats env");
    assert!(
        stderr(&flag_wins).contains("command line"),
        "{}",
        stderr(&flag_wins)
    );
}

#[test]
fn once_without_a_library_exits_1_and_says_why() {
    let out = exporter_command(
        &[],
        &["--once", "--nvml-lib", "/nonexistent/libnvidia-ml.so.1"],
    )
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("nvml_exporter_nvml_up 0"), "{text}");
    assert!(
        stderr(&out).contains("/nonexistent/libnvidia-ml.so.1"),
        "{}",
        stderr(&out)
    );
}

/// Debian's real `libnvidia-ml.so.1` on a machine without an NVIDIA driver: NVML answers
/// DRIVER_NOT_LOADED. `scripts/test.sh` fetches it and sets the variable.
#[test]
fn real_driver_library_without_a_driver_reports_driver_not_loaded() {
    let Ok(real) = std::env::var("NVML_EXPORTER_TEST_REAL_NVML") else {
        eprintln!(
            "NVML_EXPORTER_TEST_REAL_NVML not set (scripts/test.sh sets it); nothing to check here"
        );
        return;
    };
    let out = exporter_command(&[], &["--once", "--nvml-lib", &real])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stdout).contains("nvml_exporter_nvml_up 0"));
    let err = stderr(&out).to_lowercase();
    assert!(
        err.contains("driver") && err.contains("not loaded"),
        "{err}"
    );
}

#[test]
fn demo_loads_the_simulator_next_to_the_executable() {
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("nvml-exporter");
    std::fs::copy(common::exporter_bin(), &bin).unwrap();
    std::fs::copy(common::sim_lib(), dir.path().join("libnvml_sim.so")).unwrap();
    let out = std::process::Command::new(&bin)
        .args(["--demo", "--once", "--log-level", "warn"])
        .env("NVML_SIM_TIME", "60")
        .env_remove("NVML_SIM_SCENARIO")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("nvml_exporter_gpus 8"), "{text}");

    std::fs::remove_file(dir.path().join("libnvml_sim.so")).unwrap();
    let out = std::process::Command::new(&bin)
        .args(["--demo", "--once"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "no simulator next to the binary"
    );
    assert!(stderr(&out).contains("libnvml_sim.so"), "{}", stderr(&out));
}

#[test]
fn once_output_is_deterministic_with_a_pinned_clock() {
    let env = [("NVML_SIM_TIME", "60")];
    let a = run_once(&env, &[]);
    let b = run_once(&env, &[]);
    assert_eq!(a.status.code(), Some(0), "{}", stderr(&a));
    let strip =
        |o: &std::process::Output| common::strip_volatile(&String::from_utf8_lossy(&o.stdout));
    assert_eq!(strip(&a), strip(&b));
}

#[test]
fn check_config_validates_without_starting() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.toml");
    std::fs::write(&good, "interval = \"2s\"\nstale_grace = \"10s\"\n").unwrap();
    let web = dir.path().join("web.yml");
    let hash = bcrypt::hash("pw", 4).unwrap();
    std::fs::write(&web, format!("basic_auth_users:\n  prometheus: '{hash}'\n")).unwrap();

    // The file as argument, the web-config by flag after the subcommand; no NVML is loaded.
    let out = exporter_command(
        &[],
        &[
            "check-config",
            good.to_str().unwrap(),
            "--web-config",
            web.to_str().unwrap(),
        ],
    )
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ok\n");

    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "interval = \"2s\"\nintervall = \"3s\"\n").unwrap();
    let out = exporter_command(&[], &["check-config", bad.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(err.contains("line 2") && err.contains("intervall"), "{err}");
    assert!(out.stdout.is_empty());

    let bad_web = dir.path().join("bad.yml");
    std::fs::write(&bad_web, "basic_auth_user:\n  a: b\n").unwrap();
    let out = exporter_command(
        &[("NVML_EXPORTER_WEB_CONFIG", bad_web.to_str().unwrap())],
        &["check-config", good.to_str().unwrap()],
    )
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(
        err.contains("bad.yml") && err.contains("line 1") && err.contains("basic_auth_user"),
        "{err}"
    );
}

/// Runs the exporter with `args` and returns (status, stderr), killing it if it has not exited
/// within 10 s (a FIFO read without bounds never returns).
fn exits_within_10s(env: &[(&str, &str)], args: &[&str]) -> (Option<i32>, String) {
    let mut child = exporter_command(env, args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let status = common::poll_until(std::time::Duration::from_secs(10), || {
        child.try_wait().unwrap()
    });
    if status.is_none() {
        let _ = child.kill();
    }
    let out = child.wait_with_output().unwrap();
    let status = status.unwrap_or_else(|| panic!("{args:?} still running after 10 s"));
    (status.code(), stderr(&out))
}

#[test]
fn config_files_that_are_not_small_regular_files_exit_2_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("config.fifo");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    let big = dir.path().join("big.toml");
    std::fs::write(&big, "# padding\n".repeat(200 * 1024)).unwrap(); // 2 MiB of comments
    let fifo = fifo.to_str().unwrap();
    let big = big.to_str().unwrap();
    let cases: &[(&[&str], &str)] = &[
        (&["--config", fifo], "a FIFO, not a regular file"),
        (&["--config", big], "larger than 1024 KiB"),
        (
            &["--config", "/dev/zero"],
            "a character device, not a regular file",
        ),
        (&["check-config", big], "larger than 1024 KiB"),
        (&["--web-config", fifo], "a FIFO, not a regular file"),
        (&["--web-config", "/dev/zero"], "a character device"),
    ];
    for (args, expected) in cases {
        let (status, err) = exits_within_10s(&[], args);
        assert_eq!(status, Some(2), "{args:?}: {err}");
        assert!(
            err.contains(args[1]) && err.contains(expected),
            "{args:?}: {err}"
        );
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: one line: {err}");
    }
}

#[test]
fn check_config_prints_what_is_valid_but_probably_not_meant() {
    let dir = tempfile::tempdir().unwrap();
    let web = dir.path().join("web.yml");
    std::fs::write(&web, "# tls_server_config and basic_auth_users to come\n").unwrap();
    let out = exporter_command(
        &[("NVML_EXPORTER_INTERVALL", "2s")],
        &["check-config", "--web-config", web.to_str().unwrap()],
    )
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ok\n");
    let err = stderr(&out);
    assert!(
        err.contains("warning: environment variable NVML_EXPORTER_INTERVALL is not an option")
            && err.contains("warning: ")
            && err.contains("enables neither TLS nor basic auth"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 2, "{err}");
}

#[test]
fn an_unknown_nvml_exporter_variable_is_warned_about() {
    let out = run_once(
        &[
            ("NVML_EXPORTER_INTERVALL", "2s"),
            ("NVML_EXPORTER_LOG_FORMAT", "text"),
        ],
        &[],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("WARN")
            && err.contains(
                "environment variable NVML_EXPORTER_INTERVALL is not an option and is ignored; \
                 did you mean NVML_EXPORTER_INTERVAL?"
            ),
        "{err}"
    );
    assert!(!err.contains("NVML_EXPORTER_LOG_FORMAT"), "{err}");
}
