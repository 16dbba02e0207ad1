//! HPC jobs: one info series per job on a GPU or MIG GPU instance, and the error counter.

use super::*;
use crate::groups::Group;

#[test]
fn each_job_is_a_series_of_its_gpu_or_gpu_instance() {
    let mut snap = snapshot(vec![full_mig_device(0), full_device(1)]);
    snap.jobs = Some(jobs(&[
        (0, None, "17"),
        (0, Some(5), "18_2"),
        (1, None, "17"),
        (1, None, "19"),
        // Resolved against the devices: no GPU 4 here, nothing served for it.
        (4, None, "20"),
    ]));
    let text = encode(&snap);
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("nvidia_gpu_job_info{"))
        .collect();
    assert_eq!(
        lines,
        [
            r#"nvidia_gpu_job_info{gpu="0",uuid="GPU-0",hpc_job="17"} 1"#,
            r#"nvidia_gpu_job_info{gpu="0",uuid="GPU-0",hpc_job="18_2",gpu_instance="5",mig_profile="2g.20gb"} 1"#,
            r#"nvidia_gpu_job_info{gpu="1",uuid="GPU-1",hpc_job="17"} 1"#,
            r#"nvidia_gpu_job_info{gpu="1",uuid="GPU-1",hpc_job="19"} 1"#,
        ]
    );
    assert_eq!(
        value(
            &text,
            r#"nvml_exporter_jobs_errors_total{reason="malformed"}"#
        ),
        Some(1.0)
    );
    assert_eq!(
        value(
            &text,
            r#"nvml_exporter_jobs_errors_total{reason="unknown_gpu"}"#
        ),
        Some(0.0)
    );
}

#[test]
fn jobs_are_served_only_with_a_mapping_directory_and_their_group() {
    let mut snap = snapshot(vec![full_device(0)]);
    snap.jobs = Some(jobs(&[(0, None, "17")]));
    let off = encode_with(
        MetricsOptions {
            groups: Groups::defaults().without(Group::Jobs),
            ..MetricsOptions::default()
        },
        &snap,
    );
    assert!(!off.contains("nvidia_gpu_job_info"), "{off}");
    assert!(off.contains("nvml_exporter_jobs_errors_total"));
    snap.jobs = None;
    let text = encode(&snap);
    assert!(!text.contains("nvidia_gpu_job_info"), "{text}");
    assert!(!text.contains("nvml_exporter_jobs_errors_total"), "{text}");
}
