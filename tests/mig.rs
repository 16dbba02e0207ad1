//! MIG end to end: the real exporter binary on the simulated MIG scenarios (`h100-mig`,
//! `a100-mig`), checked against the layouts their files define: per-instance memory and GPM
//! series next to the GPU's, the instance info family, a reconfiguration while running, pod
//! attribution by MIG UUID and by GKE's `nvidiaN/giM`, and dcgm-exporter's MIG labels.

mod common;
mod kubelet;

use std::time::Duration;

use common::{Exporter, Exposition, run_once, scenario};
use kubelet::{FakeKubelet, pod};

const MIB: f64 = 1_048_576.0;
const H100_GPU0: &str = "GPU-8e1c4a7f-3b2d-4c6e-9a0f-5d7b9e1c3a21";
const H100_GPU1: &str = "GPU-4f6a8c0e-2d4b-4e6a-8c0e-2a4c6e8a0c22";
/// The MIG device UUID of h100-mig's GPU0 instance number `n` (1 = GI 2 … 5 = GI 7).
fn h100_mig_uuid(n: u32) -> String {
    format!("MIG-2b5f3e61-7a0c-5d4e-9f1b-6c8a2e4d0b0{n}")
}

/// `--once` at simulated time `t` on `scenario_name`.
fn once(scenario_name: &str, t: &str, args: &[&str]) -> Exposition {
    let path = scenario(scenario_name);
    let out = run_once(
        &[
            ("NVML_SIM_SCENARIO", path.to_str().unwrap()),
            ("NVML_SIM_TIME", t),
        ],
        args,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Exposition::parse(&String::from_utf8(out.stdout).unwrap())
}

/// (GI id, profile) of every instance served for GPU `gpu` in family `name`, in serving order.
fn instances(m: &Exposition, name: &str, gpu: &str) -> Vec<(String, String)> {
    m.find(name, &[("gpu", gpu)])
        .iter()
        .filter_map(|s| {
            Some((
                s.labels.get("gpu_instance")?.clone(),
                s.labels.get("mig_profile")?.clone(),
            ))
        })
        .collect()
}

fn owned(v: &[(&str, &str)]) -> Vec<(String, String)> {
    v.iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
}

#[test]
fn h100_mig_serves_each_instance_with_its_profile_memory_and_mig_uuid() {
    let m = once("h100-mig", "10", &[]);
    let layout = owned(&[
        ("2", "3g.40gb"),
        ("3", "2g.20gb"),
        ("9", "1g.10gb"),
        ("10", "1g.10gb"),
    ]);
    assert_eq!(instances(&m, "nvidia_gpu_memory_total_bytes", "0"), layout);
    // Memory totals are the profiles' sizes (h100-80gb table).
    for (gi, mib) in [
        ("2", 40448.0),
        ("3", 20096.0),
        ("9", 9984.0),
        ("10", 9984.0),
    ] {
        assert_eq!(
            m.gpu_value("nvidia_gpu_memory_total_bytes", 0, &[("gpu_instance", gi)]),
            Some(mib * MIB),
            "GI {gi}"
        );
        let used = m
            .gpu_value("nvidia_gpu_memory_used_bytes", 0, &[("gpu_instance", gi)])
            .unwrap();
        let free = m
            .gpu_value("nvidia_gpu_memory_free_bytes", 0, &[("gpu_instance", gi)])
            .unwrap();
        assert_eq!(used + free, mib * MIB, "GI {gi}");
    }
    // The idle instance holds exactly its process's memory; the inference one at least its.
    assert_eq!(
        m.gpu_value("nvidia_gpu_memory_used_bytes", 0, &[("gpu_instance", "9")]),
        Some(2048.0 * MIB)
    );
    assert!(
        m.gpu_value("nvidia_gpu_memory_used_bytes", 0, &[("gpu_instance", "3")])
            .unwrap()
            >= 12288.0 * MIB
    );
    // The GPU's own series stay, without instance labels; its used memory is the instances' sum.
    let parent = m
        .find("nvidia_gpu_memory_used_bytes", &[("gpu", "0")])
        .into_iter()
        .find(|s| !s.labels.contains_key("gpu_instance"))
        .expect("the GPU's own memory series")
        .value;
    let sum: f64 = m
        .find("nvidia_gpu_memory_used_bytes", &[("gpu", "0")])
        .iter()
        .filter(|s| s.labels.contains_key("gpu_instance"))
        .map(|s| s.value)
        .sum();
    assert!(
        (parent - sum).abs() <= 4.0,
        "GPU {parent} vs instances {sum}"
    );

    // One info series per MIG device: MIG UUID → instance.
    for (n, gi, profile) in [
        (1, "2", "3g.40gb"),
        (2, "3", "2g.20gb"),
        (3, "9", "1g.10gb"),
        (4, "10", "1g.10gb"),
    ] {
        let uuid = h100_mig_uuid(n);
        let s = m.find(
            "nvidia_gpu_mig_instance_info",
            &[("mig_uuid", uuid.as_str())],
        );
        assert_eq!(s.len(), 1, "{uuid}");
        let l = &s[0].labels;
        assert_eq!(
            (
                l["gpu"].as_str(),
                l["uuid"].as_str(),
                l["gpu_instance"].as_str()
            ),
            ("0", H100_GPU0, gi)
        );
        assert_eq!(
            (l["mig_profile"].as_str(), l["compute_instance"].as_str()),
            (profile, "0")
        );
    }
    assert_eq!(m.find("nvidia_gpu_mig_instance_info", &[]).len(), 4);

    // MIG mode on GPU0 only; utilization is NOT_SUPPORTED in MIG mode: omitted, never 0.
    assert_eq!(m.gpu_value("nvidia_gpu_mig_mode", 0, &[]), Some(1.0));
    assert_eq!(m.gpu_value("nvidia_gpu_mig_mode", 1, &[]), Some(0.0));
    assert!(
        m.find("nvidia_gpu_utilization_ratio", &[("gpu", "0")])
            .is_empty()
    );
    assert_eq!(
        m.value(
            "nvidia_gpu_utilization_ratio",
            &[("gpu", "1"), ("uuid", H100_GPU1)]
        ),
        Some(0.6)
    );
    // The MIG-off GPU has no instance labels at all.
    assert!(
        m.series
            .iter()
            .filter(|s| s.labels.get("gpu").map(String::as_str) == Some("1"))
            .all(|s| !s.labels.contains_key("gpu_instance"))
    );
    // Enumerating MIG devices (NOT_FOUND slots included) costs no counted error.
    assert!(
        m.find("nvml_exporter_nvml_errors_total", &[]).is_empty(),
        "{:?}",
        m.find("nvml_exporter_nvml_errors_total", &[])
    );
}

#[test]
fn a100_mig_before_and_after_its_reconfiguration() {
    let seven: Vec<(String, String)> = (7..=13)
        .map(|gi| (gi.to_string(), "1g.10gb".to_owned()))
        .collect();
    let before = once("a100-mig", "30", &[]);
    assert_eq!(
        instances(&before, "nvidia_gpu_memory_total_bytes", "0"),
        seven
    );
    for (gi, _) in &seven {
        assert_eq!(
            before.gpu_value(
                "nvidia_gpu_memory_total_bytes",
                0,
                &[("gpu_instance", gi.as_str())]
            ),
            Some(9728.0 * MIB)
        );
    }
    assert_eq!(
        before.gpu_value("nvidia_gpu_memory_used_bytes", 0, &[("gpu_instance", "9")]),
        Some(0.0)
    );
    // No GPM on Ampere: no saturation series for the GPU or its instances.
    assert_eq!(
        before.gpu_value("nvidia_gpu_gpm_supported", 0, &[]),
        Some(0.0)
    );
    assert!(before.find("nvidia_gpu_sm_active_ratio", &[]).is_empty());

    let after = once("a100-mig", "61", &[]);
    let mut layout = seven[..6].to_vec();
    layout.push(("14".into(), "1g.20gb".into()));
    assert_eq!(
        instances(&after, "nvidia_gpu_memory_total_bytes", "0"),
        layout
    );
    assert_eq!(
        after.gpu_value(
            "nvidia_gpu_memory_total_bytes",
            0,
            &[("gpu_instance", "14")]
        ),
        Some(19968.0 * MIB)
    );
    assert!(
        after
            .find(
                "nvidia_gpu_mig_instance_info",
                &[("mig_uuid", "MIG-5c1e9a3d-4b7f-5a2c-8d6e-0f2a4c6e8a13")]
            )
            .is_empty()
    );
    assert_eq!(
        after
            .find(
                "nvidia_gpu_mig_instance_info",
                &[("mig_uuid", "MIG-5c1e9a3d-4b7f-5a2c-8d6e-0f2a4c6e8a14")]
            )
            .len(),
        1
    );
}

/// The saturation value of GI `gi` on GPU0, if served.
fn instance_sm_active(m: &Exposition, gi: &str) -> Option<f64> {
    m.gpu_value("nvidia_gpu_sm_active_ratio", 0, &[("gpu_instance", gi)])
}

#[test]
fn serve_picks_up_a_reconfiguration_and_keeps_gpm_per_instance() {
    // The layout changes at t = 60 s: start a few seconds before.
    let path = scenario("h100-mig");
    let exporter = Exporter::start(
        &[
            ("NVML_SIM_SCENARIO", path.to_str().unwrap()),
            ("NVML_SIM_START", "55"),
        ],
        &["--interval", "300ms", "--log-level", "info"],
    );
    let m = exporter.wait_metrics(Duration::from_secs(20), "per-instance GPM", |m| {
        instance_sm_active(m, "2").is_some() && instance_sm_active(m, "3").is_some()
    });
    // Busy vs idle instances, each from its own GPM samples.
    let busy = instance_sm_active(&m, "2").unwrap();
    assert!((busy - 0.85).abs() < 0.01, "GI 2 sm_active {busy}");
    let inference = instance_sm_active(&m, "3").unwrap();
    assert!((inference - 0.4).abs() < 0.01, "GI 3 sm_active {inference}");
    if let Some(idle) = instance_sm_active(&m, "9") {
        assert!(idle < 0.01, "GI 9 is idle: {idle}");
    }
    let tensor = m
        .gpu_value(
            "nvidia_gpu_tensor_active_ratio",
            0,
            &[("gpu_instance", "2")],
        )
        .unwrap();
    assert!((tensor - 0.6).abs() < 0.01, "GI 2 tensor {tensor}");
    // Links belong to the board: an instance has no PCIe/NVLink GPM series.
    assert!(
        m.find(
            "nvidia_gpu_pcie_gpm_transmit_bytes_per_second",
            &[("gpu_instance", "2")]
        )
        .is_empty()
    );

    // After the change: GI 3 and everything of it gone, GI 7 (1g.20gb) there, then its GPM.
    let m = exporter.wait_metrics(Duration::from_secs(30), "GI 7 with GPM", |m| {
        instance_sm_active(m, "7").is_some()
    });
    assert_eq!(
        instances(&m, "nvidia_gpu_memory_total_bytes", "0"),
        owned(&[
            ("2", "3g.40gb"),
            ("7", "1g.20gb"),
            ("9", "1g.10gb"),
            ("10", "1g.10gb")
        ])
    );
    assert!(
        m.series
            .iter()
            .all(|s| s.labels.get("gpu_instance").map(String::as_str) != Some("3")),
        "a destroyed instance's series disappear"
    );
    assert_eq!(
        m.gpu_value("nvidia_gpu_memory_total_bytes", 0, &[("gpu_instance", "7")]),
        Some(20096.0 * MIB)
    );
    let new = instance_sm_active(&m, "7").unwrap();
    assert!((new - 0.7).abs() < 0.01, "GI 7 sm_active {new}");
    let uuid = h100_mig_uuid(5);
    assert_eq!(
        m.value(
            "nvidia_gpu_mig_instance_info",
            &[("gpu_instance", "7"), ("mig_uuid", uuid.as_str())]
        ),
        Some(1.0)
    );
    // No window was ever closed across two different instances.
    assert!(
        m.find(
            "nvml_exporter_nvml_errors_total",
            &[("function", "nvmlGpmMetricsGet")]
        )
        .is_empty(),
        "{}",
        m.text
    );
}

#[test]
fn kubelet_mig_devices_attribute_their_instance() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("kubelet.sock");
    let gi2 = h100_mig_uuid(1);
    let _kubelet = FakeKubelet::start(
        &socket,
        vec![
            pod("ml", "train", "main", "nvidia.com/mig-3g.40gb", &[&gi2]),
            pod(
                "web",
                "notebook",
                "kernel",
                "nvidia.com/gpu",
                &["nvidia0/gi9"],
            ),
            pod("ml", "whole", "main", "nvidia.com/gpu", &[H100_GPU1]),
        ],
    );
    let path = scenario("h100-mig");
    let exporter = Exporter::start(
        &[
            ("NVML_SIM_SCENARIO", path.to_str().unwrap()),
            ("NVML_SIM_TIME", "10"),
        ],
        &[
            "--interval",
            "300ms",
            "--kubernetes",
            "--pod-resources-socket",
            socket.to_str().unwrap(),
        ],
    );
    let m = exporter.wait_metrics(Duration::from_secs(20), "three pod_info series", |m| {
        m.find("nvidia_gpu_pod_info", &[]).len() == 3
    });
    let info = |pod: &str| {
        let s = m.find("nvidia_gpu_pod_info", &[("pod", pod)]);
        assert_eq!(s.len(), 1, "{pod}");
        let l = &s[0].labels;
        (
            l["gpu"].clone(),
            l.get("gpu_instance").cloned(),
            l.get("mig_profile").cloned(),
        )
    };
    assert_eq!(
        info("train"),
        ("0".into(), Some("2".into()), Some("3g.40gb".into()))
    );
    assert_eq!(
        info("notebook"),
        ("0".into(), Some("9".into()), Some("1g.10gb".into()))
    );
    assert_eq!(info("whole"), ("1".into(), None, None));
    // Each instance's series carry its one container; the GPU's own series carry none.
    assert_eq!(
        m.value(
            "nvidia_gpu_memory_used_bytes",
            &[
                ("gpu", "0"),
                ("gpu_instance", "9"),
                ("namespace", "web"),
                ("pod", "notebook"),
                ("container", "kernel")
            ]
        ),
        Some(2048.0 * MIB)
    );
    assert_eq!(
        m.find(
            "nvidia_gpu_memory_total_bytes",
            &[("gpu_instance", "2"), ("pod", "train")]
        )
        .len(),
        1
    );
    assert!(
        m.find("nvidia_gpu_memory_total_bytes", &[("gpu", "0")])
            .iter()
            .filter(|s| !s.labels.contains_key("gpu_instance"))
            .all(|s| !s.labels.contains_key("pod"))
    );
    // GI 3 and GI 10 are held by nobody.
    assert!(
        !m.find("nvidia_gpu_memory_total_bytes", &[("gpu_instance", "3")])[0]
            .labels
            .contains_key("pod")
    );
}

#[test]
fn dcgm_compat_labels_instances_with_gpu_i_profile_and_gpu_i_id() {
    let m = once("a100-mig", "30", &["--dcgm-compat=dcgm"]);
    let fb = m.find("DCGM_FI_DEV_FB_TOTAL", &[("gpu", "0")]);
    // The GPU's own series without the MIG labels, then the seven instances with them.
    assert_eq!(fb.len(), 8);
    assert!(!fb[0].labels.contains_key("GPU_I_ID"));
    let gi8 = m.find("DCGM_FI_DEV_FB_TOTAL", &[("GPU_I_ID", "8")]);
    assert_eq!(gi8.len(), 1);
    assert_eq!(gi8[0].labels["GPU_I_PROFILE"], "1g.10gb");
    assert_eq!(gi8[0].value, 9728.0);
    // GI 8 runs at memory_used = 0.5 of its 9728 MiB, in whole MiB as DCGM serves it.
    assert_eq!(
        m.value("DCGM_FI_DEV_FB_USED", &[("GPU_I_ID", "8")]),
        Some(4864.0)
    );
    // dcgm-exporter's label order: GPU_I_PROFILE and GPU_I_ID right after modelName.
    let line = m
        .text
        .lines()
        .find(|l| l.starts_with("DCGM_FI_DEV_FB_TOTAL{") && l.contains("GPU_I_ID=\"8\""))
        .unwrap();
    let names: Vec<&str> = line
        .split(['{', ','])
        .skip(1)
        .map(|kv| kv.split('=').next().unwrap())
        .collect();
    assert_eq!(
        &names[..7],
        [
            "gpu",
            "UUID",
            "pci_bus_id",
            "device",
            "modelName",
            "GPU_I_PROFILE",
            "GPU_I_ID"
        ]
    );
}
