//! The NVLink fabric end to end: the real binary with `--once` on `nvml-sim/scenarios/fabric.toml`
//! (eight H100s on one fabric; GPU 2's registration never completes, GPU 5 reports degraded
//! bandwidth; timeline in its header), on the driver branches that have each fabric call, and on
//! a scenario with no fabric at all.

mod common;

use common::{Exposition, every_group, run_once, scenario, with_every_group};

/// `--once` on `scenario_text` (a scenario file's text) with every group and `args`.
fn once_on(scenario_text: &str, args: &[&str]) -> Exposition {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("scenario.toml");
    std::fs::write(&path, scenario_text).unwrap();
    let groups = every_group();
    let out = run_once(
        &[
            ("NVML_SIM_SCENARIO", path.to_str().unwrap()),
            ("NVML_SIM_TIME", "60"),
        ],
        &with_every_group(&groups, args),
    );
    assert!(out.status.success(), "{out:?}");
    Exposition::parse(&String::from_utf8(out.stdout).unwrap())
}

fn fabric_toml() -> String {
    std::fs::read_to_string(scenario("fabric")).unwrap()
}

/// `fabric.toml` reporting driver `version` instead of R580.
fn on_driver(version: &str) -> String {
    fabric_toml().replace(
        "version = \"580.65.06\"\nnvml_version = \"13.580.65.06\"",
        &format!("version = \"{version}\"\nnvml_version = \"12.{version}\""),
    )
}

/// Each GPU's (reason, action) pairs.
fn reasons(m: &Exposition, gpu: u32) -> Vec<(String, String)> {
    m.find("nvidia_gpu_health_reason", &[("gpu", &gpu.to_string())])
        .iter()
        .map(|s| (s.labels["reason"].clone(), s.labels["action"].clone()))
        .collect()
}

fn pair(reason: &str, action: &str) -> (String, String) {
    (reason.to_owned(), action.to_owned())
}

#[test]
fn gpu_2_unregistered_and_gpu_5_degraded_carry_fabric_reasons_and_the_others_are_healthy() {
    let m = once_on(&fabric_toml(), &["--fabric-registration-timeout", "0s"]);
    for gpu in 0..8 {
        let (want, state) = match gpu {
            2 => (vec![pair("fabric_not_registered", "reset_gpu")], 2.0),
            5 => (vec![pair("fabric_degraded_bandwidth", "reset_gpu")], 2.0),
            _ => (vec![], 0.0),
        };
        assert_eq!(reasons(&m, gpu), want, "GPU {gpu}");
        assert_eq!(
            m.gpu_value("nvidia_gpu_health_state", gpu, &[]),
            Some(state),
            "GPU {gpu}"
        );
        let registration = if gpu == 2 { 2.0 } else { 3.0 };
        assert_eq!(
            m.gpu_value("nvidia_gpu_fabric_state", gpu, &[]),
            Some(registration)
        );
    }
    assert_eq!(
        m.gpu_value(
            "nvidia_gpu_fabric_condition",
            5,
            &[("condition", "degraded_bandwidth")]
        ),
        Some(1.0)
    );
    assert_eq!(m.gpu_value("nvidia_gpu_fabric_health", 5, &[]), Some(3.0));
    assert_eq!(m.gpu_value("nvidia_gpu_fabric_health", 0, &[]), Some(1.0));
    assert_eq!(
        m.gpu_value(
            "nvidia_gpu_fabric_info",
            0,
            &[
                ("clique_id", "1"),
                ("cluster_uuid", "8b2f4c1e-6a0d-4e59-9c3b-715e2a84d016"),
                ("status", "success"),
                ("configuration", "correct"),
            ]
        ),
        Some(1.0)
    );
    // Asking a driver for what it answers is no error.
    assert!(
        !m.text.contains("function=\"nvmlDeviceGetGpuFabricInfo"),
        "{}",
        m.text
    );
}

#[test]
fn a_registration_in_progress_is_no_reason_within_the_timeout() {
    // The default timeout (5 minutes) has not passed at the first tick.
    let m = once_on(&fabric_toml(), &[]);
    assert_eq!(reasons(&m, 2), vec![]);
    assert_eq!(m.gpu_value("nvidia_gpu_fabric_state", 2, &[]), Some(2.0));
}

#[test]
fn older_drivers_answer_through_the_older_calls() {
    // R550: the versioned call with the v2 struct: the mask, no summary.
    let m = once_on(
        &on_driver("550.127.05"),
        &["--fabric-registration-timeout", "0s"],
    );
    assert_eq!(
        reasons(&m, 5),
        vec![pair("fabric_degraded_bandwidth", "reset_gpu")]
    );
    assert!(m.find("nvidia_gpu_fabric_health", &[]).is_empty());
    assert_eq!(
        m.find("nvidia_gpu_fabric_condition", &[("gpu", "0")]).len(),
        5
    );
    // R535: only nvmlDeviceGetGpuFabricInfo: the registration, no mask, so no mask reason.
    let m = once_on(
        &on_driver("535.261.03"),
        &["--fabric-registration-timeout", "0s"],
    );
    assert_eq!(reasons(&m, 5), vec![]);
    assert_eq!(
        reasons(&m, 2),
        vec![pair("fabric_not_registered", "reset_gpu")]
    );
    assert_eq!(m.gpu_value("nvidia_gpu_fabric_state", 5, &[]), Some(3.0));
    assert!(m.find("nvidia_gpu_fabric_condition", &[]).is_empty());
    assert!(m.find("nvidia_gpu_fabric_health", &[]).is_empty());
    assert!(
        !m.text.contains("function=\"nvmlDeviceGetGpuFabricInfo"),
        "{}",
        m.text
    );
}

#[test]
fn a_scenario_without_a_fabric_has_no_fabric_series_and_no_fabric_reason() {
    let h100x8 = std::fs::read_to_string(scenario("h100x8")).unwrap();
    let m = once_on(&h100x8, &["--fabric-registration-timeout", "0s"]);
    assert!(
        m.names()
            .iter()
            .all(|n| !n.starts_with("nvidia_gpu_fabric"))
    );
    assert!(
        m.find("nvidia_gpu_health_reason", &[])
            .iter()
            .all(|s| !s.labels["reason"].starts_with("fabric_")),
        "{}",
        m.text
    );
    assert_eq!(m.find("nvidia_gpu_up", &[]).len(), 8);
}
