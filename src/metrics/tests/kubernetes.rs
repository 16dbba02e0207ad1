//! Kubernetes attribution: pod info and the single owner's labels on a GPU's series.

use super::*;

#[test]
fn a_gpu_held_by_one_container_carries_its_labels_on_every_series() {
    let mut snap = snapshot(vec![full_device(0), full_device(1), full_device(3)]);
    snap.kubernetes = Some(kubelet(&[
        ("GPU-0", "ml", "train-a", "main"),
        ("nvidia3", "web", "infer-b", "server"),
    ]));
    let text = encode_with(
        MetricsOptions {
            pod_labels: true,
            ..MetricsOptions::default()
        },
        &snap,
    );
    let pod_a = r#"namespace="ml",pod="train-a",container="main""#;
    let pod_b = r#"namespace="web",pod="infer-b",container="server""#;
    assert_eq!(
        value(
            &text,
            &format!(r#"nvidia_gpu_pod_info{{gpu="0",uuid="GPU-0",{pod_a}}}"#)
        ),
        Some(1.0)
    );
    assert_eq!(
        value(
            &text,
            &format!(r#"nvidia_gpu_pod_info{{gpu="3",uuid="GPU-3",{pod_b}}}"#)
        ),
        Some(1.0)
    );
    assert_eq!(
        series(&text)
            .iter()
            .filter(|l| l.starts_with("nvidia_gpu_pod_info"))
            .count(),
        2
    );
    for l in series(&text)
        .into_iter()
        .filter(|l| l.starts_with("nvidia_gpu_"))
    {
        let expected = match l.split("gpu=\"").nth(1).and_then(|r| r.split('"').next()) {
            Some("0") => Some(pod_a),
            Some("3") => Some(pod_b),
            _ => None,
        };
        match expected {
            Some(pod) => assert!(l.contains(pod), "{l}"),
            None => assert!(!l.contains("namespace="), "{l}"),
        }
    }
    assert_eq!(
        value(
            &text,
            &format!(r#"nvidia_gpu_power_watts{{gpu="0",uuid="GPU-0",{pod_a}}}"#)
        ),
        Some(312.5)
    );
    // Labels only in the info family when the per-series labels are off. (Process and pod-usage
    // series name their own container whatever that option says: it is what they are about.)
    let text = encode_with(
        MetricsOptions {
            pod_labels: false,
            ..MetricsOptions::default()
        },
        &snap,
    );
    let labelled: Vec<&str> = series(&text)
        .into_iter()
        .filter(|l| l.contains("namespace="))
        .filter(|l| {
            !(l.starts_with("nvidia_gpu_process_")
                || l.starts_with("nvidia_gpu_pod_memory_")
                || l.starts_with("nvidia_gpu_pod_sm_"))
        })
        .collect();
    assert_eq!(labelled.len(), 2, "{labelled:?}");
    assert!(
        labelled
            .iter()
            .all(|l| l.starts_with("nvidia_gpu_pod_info{"))
    );
}

#[test]
fn a_shared_gpu_lists_every_container_but_labels_no_series() {
    let mut snap = snapshot(vec![full_device(0)]);
    snap.kubernetes = Some(kubelet(&[
        ("GPU-0::0", "ml", "a", "main"),
        ("GPU-0::1", "ml", "b", "main"),
    ]));
    let text = encode_with(
        MetricsOptions {
            pod_labels: true,
            ..MetricsOptions::default()
        },
        &snap,
    );
    let infos: Vec<&str> = series(&text)
        .into_iter()
        .filter(|l| l.starts_with("nvidia_gpu_pod_info"))
        .collect();
    assert_eq!(
        infos,
        [
            r#"nvidia_gpu_pod_info{gpu="0",uuid="GPU-0",namespace="ml",pod="a",container="main"} 1"#,
            r#"nvidia_gpu_pod_info{gpu="0",uuid="GPU-0",namespace="ml",pod="b",container="main"} 1"#,
        ]
    );
    assert!(value(&text, r#"nvidia_gpu_power_watts{gpu="0",uuid="GPU-0"}"#).is_some());
}

#[test]
fn kubelet_state_is_served_only_with_attribution_on() {
    let mut snap = snapshot(vec![full_device(0)]);
    let text = encode(&snap);
    assert_eq!(value(&text, "nvml_exporter_kubernetes_up"), Some(1.0));
    assert_eq!(
        value(
            &text,
            r#"nvml_exporter_kubernetes_errors_total{reason="timeout"}"#
        ),
        Some(1.0)
    );
    assert_eq!(
        value(
            &text,
            r#"nvml_exporter_kubernetes_errors_total{reason="unavailable"}"#
        ),
        Some(0.0)
    );
    snap.kubernetes = None;
    let text = encode(&snap);
    assert!(!text.contains("kubernetes"), "{text}");
    assert!(!text.contains("nvidia_gpu_pod_info"));
}

#[test]
fn a_lost_gpu_keeps_its_assignment_but_no_readings() {
    let mut lost = full_device(0);
    lost.up = false;
    let text = encode_with(
        MetricsOptions {
            pod_labels: true,
            ..MetricsOptions::default()
        },
        &snapshot(vec![lost]),
    );
    let pod = r#"namespace="ml",pod="train-0",container="main""#;
    assert_eq!(
        value(
            &text,
            &format!(r#"nvidia_gpu_pod_info{{gpu="0",uuid="GPU-0",{pod}}}"#)
        ),
        Some(1.0)
    );
    assert_eq!(
        value(
            &text,
            &format!(r#"nvidia_gpu_up{{gpu="0",uuid="GPU-0",{pod}}}"#)
        ),
        Some(0.0)
    );
}
