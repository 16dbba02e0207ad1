//! GPM saturation series: served per GPU from the second tick on, absent where unsupported.

use super::*;

#[test]
fn gpm_averages_are_served_per_gpu_with_pipe_and_engine_labels() {
    let text = encode(&snapshot(vec![full_device(1)]));
    let id = r#"gpu="1",uuid="GPU-1""#;
    let v = |s: String| value(&text, &s);
    assert_eq!(v(format!("nvidia_gpu_gpm_supported{{{id}}}")), Some(1.0));
    // The canonical trap: busy (utilization, engine active) but not saturated (SM activity).
    assert_eq!(
        v(format!("nvidia_gpu_utilization_ratio{{{id}}}")),
        Some(0.75)
    );
    assert_eq!(
        v(format!("nvidia_gpu_graphics_engine_active_ratio{{{id}}}")),
        Some(0.99)
    );
    assert_eq!(v(format!("nvidia_gpu_sm_active_ratio{{{id}}}")), Some(0.15));
    assert_eq!(
        v(format!("nvidia_gpu_sm_occupancy_ratio{{{id}}}")),
        Some(0.08)
    );
    assert_eq!(
        v(format!("nvidia_gpu_tensor_active_ratio{{{id}}}")),
        Some(0.05)
    );
    assert_eq!(
        v(format!("nvidia_gpu_dram_active_ratio{{{id}}}")),
        Some(0.2)
    );
    assert_eq!(
        v(format!(
            "nvidia_gpu_pcie_gpm_transmit_bytes_per_second{{{id}}}"
        )),
        Some(3_145_728.0)
    );
    assert_eq!(
        v(format!(
            "nvidia_gpu_nvlink_gpm_receive_bytes_per_second{{{id}}}"
        )),
        Some(524_288.0)
    );
    let pipes: Vec<&str> = series(&text)
        .into_iter()
        .filter(|l| l.starts_with("nvidia_gpu_pipe_active_ratio{"))
        .collect();
    assert_eq!(
        pipes,
        [
            r#"nvidia_gpu_pipe_active_ratio{gpu="1",uuid="GPU-1",pipe="fp64"} 0"#,
            r#"nvidia_gpu_pipe_active_ratio{gpu="1",uuid="GPU-1",pipe="fp32"} 0.1"#,
            r#"nvidia_gpu_pipe_active_ratio{gpu="1",uuid="GPU-1",pipe="hmma_tensor"} 0.05"#,
        ]
    );
    let engines: Vec<&str> = series(&text)
        .into_iter()
        .filter(|l| l.starts_with("nvidia_gpu_media_engine_active_ratio{"))
        .collect();
    assert_eq!(
        engines,
        [
            r#"nvidia_gpu_media_engine_active_ratio{gpu="1",uuid="GPU-1",engine="nvdec1"} 0.5"#,
            r#"nvidia_gpu_media_engine_active_ratio{gpu="1",uuid="GPU-1",engine="nvofa0"} 0"#,
        ]
    );
}

#[test]
fn a_gpu_without_gpm_says_so_and_serves_no_gpm_series() {
    let mut a100 = full_device(0);
    Arc::make_mut(&mut a100.info).architecture = "ampere".into();
    a100.gpm_supported = Some(false);
    a100.gpm = None;
    let text = encode(&snapshot(vec![a100, full_device(1)]));
    assert_eq!(
        value(&text, r#"nvidia_gpu_gpm_supported{gpu="0",uuid="GPU-0"}"#),
        Some(0.0)
    );
    let served = families_of_gpu(&text, 0);
    for f in gpm_families() {
        assert!(!served.contains(&f), "{f} served for a GPU without GPM");
    }
    // The other GPU is unaffected.
    assert!(families_of_gpu(&text, 1).contains(&"nvidia_gpu_sm_active_ratio"));
}

#[test]
fn the_first_tick_serves_the_gpm_flag_but_no_averages() {
    let mut first = full_device(0);
    first.gpm = None;
    let text = encode(&snapshot(vec![first]));
    assert_eq!(
        value(&text, r#"nvidia_gpu_gpm_supported{gpu="0",uuid="GPU-0"}"#),
        Some(1.0)
    );
    let served = families_of_gpu(&text, 0);
    for f in gpm_families() {
        assert!(
            !served.contains(&f),
            "{f} served before a GPM window closed"
        );
    }
}

#[test]
fn gpm_metrics_the_driver_refused_are_absent_not_zero() {
    let mut d = bare_device(0);
    d.gpm_supported = Some(true);
    d.gpm = Some(GpmMetrics {
        sm_active: Some(0.9),
        sm_occupancy: Some(0.55),
        ..GpmMetrics::default()
    });
    let opts = MetricsOptions {
        processes: false,
        ..MetricsOptions::default()
    };
    let text = encode_with(opts, &snapshot(vec![d]));
    assert_eq!(
        families_of_gpu(&text, 0),
        [
            "nvidia_gpu_info",
            "nvidia_gpu_up",
            "nvidia_gpu_gpm_supported",
            "nvidia_gpu_sm_active_ratio",
            "nvidia_gpu_sm_occupancy_ratio",
        ]
    );
}

#[test]
fn gpm_support_unknown_serves_no_flag() {
    let mut d = bare_device(0);
    d.gpm_supported = None;
    let text = encode(&snapshot(vec![d]));
    assert!(!text.contains("nvidia_gpu_gpm_supported{"), "{text}");
}

#[test]
fn a_lost_gpu_serves_neither_the_gpm_flag_nor_averages() {
    let mut lost = full_device(0);
    lost.up = false;
    let text = encode(&snapshot(vec![lost]));
    assert!(!text.contains("nvidia_gpu_gpm_supported{"), "{text}");
    assert!(!text.contains("nvidia_gpu_sm_active_ratio{"), "{text}");
}
