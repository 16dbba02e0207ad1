//! `--dcgm-compat`: the dcgm-exporter families of the same snapshot.

use super::*;
use crate::metrics::dcgm::{DcgmCompat, DcgmRelease};

fn encode_mode(mode: DcgmCompat, hostname: &str, snap: &Snapshot) -> String {
    encode_release(mode, DcgmRelease::default(), hostname, snap)
}

fn encode_release(
    mode: DcgmCompat,
    release: DcgmRelease,
    hostname: &str,
    snap: &Snapshot,
) -> String {
    encode_with(
        MetricsOptions {
            pod_labels: true,
            dcgm_compat: mode,
            dcgm_release: release,
            hostname: hostname.into(),
            ..MetricsOptions::default()
        },
        snap,
    )
}

/// The value of the one series of `name` for GPU `gpu` whose labels contain `with`.
fn one(text: &str, name: &str, gpu: u32, with: &str) -> f64 {
    let prefix = format!("{name}{{gpu=\"{gpu}\",");
    let found: Vec<f64> = series(text)
        .into_iter()
        .filter(|l| l.starts_with(&prefix) && l.contains(with))
        .map(|l| l.rsplit_once(' ').unwrap().1.parse().unwrap())
        .collect();
    assert_eq!(found.len(), 1, "{name} gpu {gpu} {with}: {found:?}\n{text}");
    found[0]
}

#[test]
fn the_xid_field_is_the_last_code_seen_and_0_before_the_first() {
    let mut quiet = full_device(1);
    quiet.xid_counts.clear();
    quiet.last_xid = None;
    quiet.last_xid_timestamp_seconds = None;
    let mut unwatched = quiet.clone();
    unwatched.index = 2;
    unwatched.uuid = "GPU-2".into();
    unwatched.xids_watched = false;
    let t = encode_mode(
        DcgmCompat::Dcgm,
        "node-a",
        &snapshot(vec![full_device(0), quiet, unwatched]),
    );
    // GPU 0 saw XID 79 once and XID 13 twice, 13 last: the gauge is the last code, not the
    // commonest or the largest. GPU 1, watched, saw none: 0, as dcgm-exporter serves it. GPU 2's
    // XIDs are not watched: no series, rather than a 0 that would claim none happened.
    assert_eq!(
        one(&t, "DCGM_FI_DEV_XID_ERRORS", 0, "err_code=\"13\""),
        13.0
    );
    assert_eq!(one(&t, "DCGM_FI_DEV_XID_ERRORS", 1, "err_code=\"0\""), 0.0);
    assert!(!t.contains("DCGM_FI_DEV_XID_ERRORS{gpu=\"2\""), "{t}");
    assert!(t.contains("# TYPE DCGM_FI_DEV_XID_ERRORS gauge\n"), "{t}");
    // err_code sits among the pod labels in name order, as dcgm-exporter renders its attributes.
    let mut snap = snapshot(vec![full_device(0)]);
    snap.kubernetes = Some(kubelet(&[("GPU-0", "ml", "train-0", "main")]));
    let t = encode_mode(DcgmCompat::Dcgm, "node-a", &snap);
    assert!(
        t.contains(concat!(
            r#"Hostname="node-a",DCGM_FI_DRIVER_VERSION="550.54.15",container="main","#,
            r#"err_code="13",namespace="ml",pod="train-0"} 13"#
        )),
        "{t}"
    );
}

#[test]
fn each_release_names_its_hostname_label_orders_families_and_renames_fields() {
    let snap = snapshot(vec![full_device(0)]);
    let families_of = |release| {
        let t = encode_release(DcgmCompat::Dcgm, release, "node-a", &snap);
        let dcgm: Vec<String> = families(&t)
            .into_iter()
            .filter(|f| f.starts_with("DCGM_"))
            .map(String::from)
            .collect();
        (t, dcgm)
    };
    let (t2, f2) = families_of(DcgmRelease::V4_8_2);
    let (t3, f3) = families_of(DcgmRelease::V4_8_3);
    let (t4, f4) = families_of(DcgmRelease::V4_8_4);
    assert!(t2.contains(r#"modelName="NVIDIA H100 80GB HBM3",Hostname="node-a","#));
    assert!(!t2.contains("hostname="));
    for t in [&t3, &t4] {
        assert!(t.contains(r#"modelName="NVIDIA H100 80GB HBM3",hostname="node-a","#));
        assert!(!t.contains("Hostname="));
    }
    // 4.8.2's dialect keeps the catalog's order (4.8.2 has none), 4.8.3 and 4.8.4 sort by name.
    assert_eq!(f2.first().map(String::as_str), Some("DCGM_FI_DEV_GPU_UTIL"));
    let mut sorted = f2.clone();
    sorted.sort();
    assert_ne!(f2, sorted);
    assert_eq!(f3, sorted);
    let mut sorted4 = f4.clone();
    sorted4.sort();
    assert_eq!(f4, sorted4);
    // 4.8.4 names the NVLink error counters and describes the energy its own way.
    assert!(
        f3.iter()
            .any(|f| f == "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL")
    );
    assert!(
        !f4.iter()
            .any(|f| f == "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL")
    );
    assert_eq!(
        one(&t4, "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_TOTAL", 0, ""),
        one(&t3, "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", 0, "")
    );
    assert_eq!(f3.len(), f4.len());
    assert!(t3.contains(
        "# HELP DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION Total energy consumption since boot (in mJ).\n"
    ));
    assert!(t4.contains("# HELP DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION Total energy consumption since the driver was last reloaded (in mJ).\n"));
}

#[test]
fn the_two_power_limits_are_their_own_readings() {
    // The board is held to 650 W below its 700 W management limit: each DCGM field is its own
    // NVML reading, in every release.
    for release in [DcgmRelease::V4_8_2, DcgmRelease::V4_8_4] {
        let t = encode_release(
            DcgmCompat::Both,
            release,
            "n",
            &snapshot(vec![full_device(0)]),
        );
        assert_eq!(one(&t, "DCGM_FI_DEV_POWER_MGMT_LIMIT", 0, ""), 700.0);
        assert_eq!(one(&t, "DCGM_FI_DEV_ENFORCED_POWER_LIMIT", 0, ""), 650.0);
        assert_eq!(
            one(&t, "nvidia_gpu_power_management_limit_watts", 0, ""),
            700.0
        );
        assert_eq!(one(&t, "nvidia_gpu_power_limit_watts", 0, ""), 650.0);
    }
}

#[test]
fn values_are_the_native_readings_in_dcgm_units() {
    let t = encode_mode(DcgmCompat::Both, "node-a", &snapshot(vec![full_device(0)]));
    let native = |name: &str, with: &str| one(&t, name, 0, with);
    let dcgm = |name: &str| one(&t, name, 0, "");
    // Percent from ratios.
    assert_eq!(
        dcgm("DCGM_FI_DEV_GPU_UTIL"),
        native("nvidia_gpu_utilization_ratio", "") * 100.0
    );
    assert_eq!(
        dcgm("DCGM_FI_DEV_DEC_UTIL"),
        native("nvidia_gpu_decoder_utilization_ratio", "") * 100.0
    );
    // DCGM's fan speed is the first fan's.
    assert_eq!(
        dcgm("DCGM_FI_DEV_FAN_SPEED"),
        native("nvidia_gpu_fan_speed_ratio", "fan=\"0\"") * 100.0
    );
    // MiB from bytes, whole MiB as DCGM's integer division gives.
    for (field, family) in [
        ("DCGM_FI_DEV_FB_TOTAL", "nvidia_gpu_memory_total_bytes"),
        ("DCGM_FI_DEV_FB_USED", "nvidia_gpu_memory_used_bytes"),
        ("DCGM_FI_DEV_FB_FREE", "nvidia_gpu_memory_free_bytes"),
        (
            "DCGM_FI_DEV_FB_RESERVED",
            "nvidia_gpu_memory_reserved_bytes",
        ),
    ] {
        assert_eq!(
            dcgm(field),
            (native(family, "") / 1_048_576.0).floor(),
            "{field}"
        );
    }
    assert_eq!(dcgm("DCGM_FI_DEV_FB_USED"), 1.0);
    // MHz from hertz.
    assert_eq!(
        dcgm("DCGM_FI_DEV_MEM_CLOCK"),
        native("nvidia_gpu_clock_hertz", "clock=\"memory\"") / 1e6
    );
    assert_eq!(dcgm("DCGM_FI_DEV_MEM_CLOCK"), 2619.0);
    // mJ from joules, ns from seconds.
    assert_eq!(
        dcgm("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"),
        (native("nvidia_gpu_energy_joules_total", "") * 1e3).round()
    );
    assert_eq!(dcgm("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"), 123_456_789.0);
    assert_eq!(
        dcgm("DCGM_FI_DEV_POWER_VIOLATION"),
        native("nvidia_gpu_throttle_seconds_total", "reason=\"power\"") * 1e9
    );
    // Same unit: watts, celsius, P-state, counts.
    assert_eq!(
        dcgm("DCGM_FI_DEV_POWER_USAGE"),
        native("nvidia_gpu_power_watts", "")
    );
    assert_eq!(
        dcgm("DCGM_FI_DEV_POWER_MGMT_LIMIT"),
        native("nvidia_gpu_power_management_limit_watts", "")
    );
    assert_eq!(
        dcgm("DCGM_FI_DEV_ENFORCED_POWER_LIMIT"),
        native("nvidia_gpu_power_limit_watts", "")
    );
    assert_eq!(
        dcgm("DCGM_FI_DEV_GPU_TEMP"),
        native("nvidia_gpu_temperature_celsius", "")
    );
    assert_eq!(dcgm("DCGM_FI_DEV_PSTATE"), 0.0);
    assert_eq!(
        dcgm("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL"),
        native("nvidia_gpu_ecc_lifetime_errors", "error_type=\"corrected\"")
    );
    assert_eq!(dcgm("DCGM_FI_DEV_ROW_REMAP_PENDING"), 1.0);
    // NVLink error counts are per GPU in DCGM: the total over links.
    assert_eq!(dcgm("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL"), 5.0);
    assert_eq!(dcgm("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"), 1.0);
    // Profiling fields stay ratios in 0..1.
    assert_eq!(
        dcgm("DCGM_FI_PROF_SM_ACTIVE"),
        native("nvidia_gpu_sm_active_ratio", "")
    );
    assert_eq!(
        dcgm("DCGM_FI_PROF_PIPE_FP64_ACTIVE"),
        native("nvidia_gpu_pipe_active_ratio", "pipe=\"fp64\"")
    );
    let ratios: Vec<f64> = series(&t)
        .into_iter()
        .filter(|l| l.starts_with("DCGM_FI_PROF_") && l.contains("_ACTIVE{"))
        .map(|l| l.rsplit_once(' ').unwrap().1.parse().unwrap())
        .collect();
    assert!(ratios.len() >= 6, "{ratios:?}");
    assert!(ratios.iter().all(|v| (0.0..=1.0).contains(v)), "{ratios:?}");
    // Types are dcgm-exporter's.
    assert!(t.contains("# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter\n"));
    assert!(t.contains("# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n"));
    assert!(t.contains("# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).\n"));
}

#[test]
fn labels_follow_dcgm_exporter_order_and_are_escaped() {
    let mut d = full_device(0);
    Arc::make_mut(&mut d.info).name = "Odd \"GPU\" \\ name".into();
    let mut snap = snapshot(vec![d, full_device(1)]);
    snap.kubernetes = Some(kubelet(&[("GPU-0", "ml", "train-0", "main")]));
    let t = encode_mode(DcgmCompat::Dcgm, "node-a", &snap);
    assert!(
        t.contains(concat!(
            r#"DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-0",pci_bus_id="00000000:18:00.0","#,
            r#"device="nvidia0",modelName="Odd \"GPU\" \\ name",Hostname="node-a","#,
            r#"DCGM_FI_DRIVER_VERSION="550.54.15",container="main",namespace="ml","#,
            r#"pod="train-0"} 61"#,
            "\n"
        )),
        "{t}"
    );
    // A GPU no container holds has no pod labels at all, as in dcgm-exporter.
    assert!(
        t.contains(concat!(
            r#"DCGM_FI_DEV_GPU_TEMP{gpu="1",UUID="GPU-1",pci_bus_id="00000000:19:00.0","#,
            r#"device="nvidia1",modelName="NVIDIA H100 80GB HBM3",Hostname="node-a","#,
            r#"DCGM_FI_DRIVER_VERSION="550.54.15"} 61"#,
            "\n"
        )),
        "{t}"
    );
    // No hostname known: the label is left out, not served empty.
    let t = encode_mode(DcgmCompat::Dcgm, "", &snap);
    assert!(!t.contains("Hostname="), "{t}");
    assert!(t.contains(r#"modelName="NVIDIA H100 80GB HBM3",DCGM_FI_DRIVER_VERSION="#));
}

#[test]
fn a_lost_gpu_and_unsupported_readings_have_no_dcgm_series() {
    let mut lost = full_device(1);
    lost.up = false;
    let snap = snapshot(vec![full_device(0), lost, bare_device(2)]);
    let t = encode_mode(DcgmCompat::Both, "n", &snap);
    let dcgm_lines = |gpu: u32| {
        series(&t)
            .into_iter()
            .filter(|l| l.starts_with("DCGM_") && l.contains(&format!("{{gpu=\"{gpu}\",")))
            .count()
    };
    assert!(dcgm_lines(0) > 30, "{t}");
    assert_eq!(dcgm_lines(1), 0, "a lost GPU's series are dropped");
    assert_eq!(dcgm_lines(2), 0, "nothing readable, nothing served");
    // Still visible natively.
    assert_eq!(
        value(&t, r#"nvidia_gpu_up{gpu="1",uuid="GPU-1"}"#),
        Some(0.0)
    );
    // A family no GPU has a reading for is left out, header included.
    let t = encode_mode(DcgmCompat::Dcgm, "n", &snapshot(vec![bare_device(0)]));
    assert!(!t.contains("DCGM_"), "{t}");
}

#[test]
fn modes_choose_the_names_and_native_comes_first() {
    let snap = snapshot(vec![full_device(0)]);
    let off = encode_mode(DcgmCompat::Off, "n", &snap);
    assert!(!off.contains("DCGM_"));
    // Process metrics differ between any two encodings; the rest is the same bytes.
    assert_eq!(
        without_process(&off),
        without_process(&encode_with(
            MetricsOptions {
                pod_labels: true,
                ..Default::default()
            },
            &snap
        ))
    );

    let only = encode_mode(DcgmCompat::Dcgm, "n", &snap);
    let fams = families(&only);
    assert!(
        !fams.iter().any(|f| f.starts_with("nvidia_gpu_")),
        "{fams:?}"
    );
    assert!(fams.contains(&"nvml_exporter_nvml_up"), "self-metrics stay");
    assert!(fams.contains(&"DCGM_FI_DEV_GPU_UTIL"));

    let both = encode_mode(DcgmCompat::Both, "n", &snap);
    let fams = families(&both);
    let last_native = fams.iter().rposition(|f| !f.starts_with("DCGM_")).unwrap();
    let first_dcgm = fams.iter().position(|f| f.starts_with("DCGM_")).unwrap();
    assert!(last_native < first_dcgm, "{fams:?}");
    // The native part is exactly what `off` serves.
    let native = without_process(&both[..both.find("# HELP DCGM_").unwrap()]);
    let off = without_process(&off);
    let diff: Vec<_> = native
        .lines()
        .zip(off.lines())
        .filter(|(a, b)| a != b)
        .collect();
    assert!(diff.is_empty() && native.len() == off.len(), "{diff:?}");
}
