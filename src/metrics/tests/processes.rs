//! Per-process series and per-container sums (`--processes`).

use super::*;

#[test]
fn two_pods_sharing_a_gpu_each_get_their_own_usage() {
    let snap = shared_gpu_snapshot();
    let text = encode_with(
        MetricsOptions {
            pod_labels: true,
            ..MetricsOptions::default()
        },
        &snap,
    );
    let a = r#"namespace="ml",pod="train-a",container="main""#;
    let b = r#"namespace="web",pod="infer-b",container="server""#;
    let pod_mem = |c: &str| {
        value(
            &text,
            &format!(r#"nvidia_gpu_pod_memory_used_bytes{{gpu="0",uuid="GPU-0",{c}}}"#),
        )
    };
    assert_eq!(pod_mem(a), Some(((20480u64 + 4096) << 20) as f64));
    assert_eq!(pod_mem(b), Some((12288u64 << 20) as f64));
    let pod_sm = value(
        &text,
        &format!(r#"nvidia_gpu_pod_sm_utilization_ratio{{gpu="0",uuid="GPU-0",{a}}}"#),
    )
    .unwrap();
    assert!((pod_sm - 0.35).abs() < 1e-12, "{pod_sm}");
    // Each process names its own pod; the host process none.
    assert_eq!(
        value(
            &text,
            &format!(
                r#"nvidia_gpu_process_memory_used_bytes{{gpu="0",uuid="GPU-0",pid="400",process_name="proc400",{b}}}"#
            )
        ),
        Some((12288u64 << 20) as f64)
    );
    assert_eq!(
        value(
            &text,
            r#"nvidia_gpu_process_memory_used_bytes{gpu="0",uuid="GPU-0",pid="900",process_name="proc900"}"#
        ),
        Some((1024u64 << 20) as f64)
    );
    // The pod sums add up to the attributed processes' memory; with the host process they add up
    // to the device's used memory (exactly so in the simulator; a real GPU's used memory also
    // holds the driver's own reservations, so there the processes sum to less).
    let sum = |family: &str| -> f64 {
        series(&text)
            .into_iter()
            .filter(|l| l.starts_with(family))
            .map(|l| l.rsplit_once(' ').unwrap().1.parse::<f64>().unwrap())
            .sum()
    };
    let pods = sum("nvidia_gpu_pod_memory_used_bytes{");
    let procs = sum("nvidia_gpu_process_memory_used_bytes{");
    assert_eq!(pods + (1024u64 << 20) as f64, procs);
    assert_eq!(Some(procs), snap.devices[0].memory.map(|m| m.used_bytes));
    // The shared GPU's own series carry no pod labels, and no pod gets the GPU's memory.
    assert_eq!(
        value(
            &text,
            r#"nvidia_gpu_memory_used_bytes{gpu="0",uuid="GPU-0"}"#
        ),
        Some(procs)
    );
}

#[test]
fn memory_outside_allocations_counts_host_processes_and_ended_pods_leftovers() {
    let opts = || MetricsOptions::default();
    let outside = |text: &str| {
        value(
            text,
            r#"nvidia_gpu_memory_outside_allocation_bytes{gpu="0",uuid="GPU-0"}"#,
        )
    };
    let mut snap = shared_gpu_snapshot();
    // Both pods hold the GPU: only the host process (pid 900, 1 GiB) is outside.
    assert_eq!(
        outside(&encode_with(opts(), &snap)),
        Some((1024u64 << 20) as f64)
    );
    // infer-b's pod ended (the kubelet no longer assigns it the GPU) but pid 400 still runs.
    let k = snap.kubernetes.as_mut().unwrap();
    k.assignments = k
        .assignments
        .iter()
        .filter(|a| a.container.pod != "infer-b")
        .cloned()
        .collect();
    assert_eq!(
        outside(&encode_with(opts(), &snap)),
        Some(((1024u64 + 12288) << 20) as f64)
    );
    // Nothing outside is 0, not absent.
    Arc::make_mut(&mut snap.devices[0])
        .processes
        .retain(|p| p.pid == 300);
    let text = encode_with(opts(), &snap);
    assert_eq!(outside(&text), Some(0.0));
    assert!(
        text.contains("nvidia_gpu_memory_outside_allocation_bytes{gpu=\"0\",uuid=\"GPU-0\"} 0\n"),
        "written as 0, not -0: {text}"
    );
    // Not measured without --processes or without the kubelet.
    let no_processes = MetricsOptions {
        processes: false,
        ..opts()
    };
    assert_eq!(outside(&encode_with(no_processes, &snap)), None);
    snap.kubernetes = None;
    assert_eq!(outside(&encode_with(opts(), &snap)), None);
}

#[test]
fn process_series_are_capped_per_gpu_but_pod_sums_count_all() {
    let snap = shared_gpu_snapshot();
    let text = encode_with(
        MetricsOptions {
            max_processes_per_gpu: 2,
            ..MetricsOptions::default()
        },
        &snap,
    );
    let pids: Vec<&str> = series(&text)
        .into_iter()
        .filter(|l| l.starts_with("nvidia_gpu_process_memory_used_bytes{"))
        .map(|l| l.split("pid=\"").nth(1).unwrap().split('"').next().unwrap())
        .collect();
    assert_eq!(pids, ["300", "400"], "the two largest, in pid order");
    assert_eq!(
        value(
            &text,
            r#"nvidia_gpu_pod_memory_used_bytes{gpu="0",uuid="GPU-0",namespace="ml",pod="train-a",container="main"}"#
        ),
        Some(((20480u64 + 4096) << 20) as f64),
        "pid 301 is not served but still counts for its pod"
    );
}

#[test]
fn an_exited_process_leaves_no_series_behind() {
    let enc = Encoder::new(MetricsOptions::default(), prometheus::Registry::new());
    let mut snap = shared_gpu_snapshot();
    let text = String::from_utf8(enc.encode(&snap)).unwrap();
    assert!(text.contains(r#"pid="400""#));
    assert!(text.contains(r#"pod="infer-b""#));
    // pid 400 (infer-b's only process) exits.
    Arc::make_mut(&mut snap.devices[0])
        .processes
        .retain(|p| p.pid != 400);
    let text = String::from_utf8(enc.encode(&snap)).unwrap();
    assert!(!text.contains(r#"pid="400""#), "{text}");
    // infer-b is still assigned (pod_info) but has no usage series.
    let usage: Vec<&str> = series(&text)
        .into_iter()
        .filter(|l| l.starts_with("nvidia_gpu_pod_") && l.contains(r#"pod="infer-b""#))
        .collect();
    assert_eq!(usage.len(), 1, "{usage:?}");
    assert!(usage[0].starts_with("nvidia_gpu_pod_info{"));
    // No processes at all: the families disappear, headers included.
    Arc::make_mut(&mut snap.devices[0]).processes.clear();
    let text = String::from_utf8(enc.encode(&snap)).unwrap();
    assert!(!text.contains("nvidia_gpu_process_"));
    assert!(!text.contains("nvidia_gpu_pod_memory_used_bytes"));
}

#[test]
fn a_lost_gpu_serves_no_process_series() {
    let mut snap = shared_gpu_snapshot();
    Arc::make_mut(&mut snap.devices[0]).up = false;
    let text = encode(&snap);
    assert!(!text.contains("nvidia_gpu_process_"), "{text}");
    assert!(!text.contains("nvidia_gpu_pod_memory_used_bytes"), "{text}");
}
