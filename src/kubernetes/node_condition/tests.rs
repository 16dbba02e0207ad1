use super::*;

fn gpu(index: u32, state: HealthState, reasons: &[(&'static str, HealthAction)]) -> GpuVerdict {
    GpuVerdict {
        index,
        uuid: format!("GPU-{index}"),
        state,
        reasons: reasons.to_vec(),
    }
}

fn node(gpus: &[GpuVerdict]) -> BTreeMap<String, GpuVerdict> {
    gpus.iter().map(|g| (g.uuid.clone(), g.clone())).collect()
}

#[test]
fn the_condition_is_true_when_every_gpu_is_healthy_and_false_naming_the_others() {
    let healthy = node(&[
        gpu(0, HealthState::Healthy, &[]),
        gpu(1, HealthState::Healthy, &[]),
    ]);
    let c = Condition::of(Some(&healthy));
    assert_eq!((c.status, c.reason), ("True", "GpusHealthy"));
    assert_eq!(c.message, "all 2 GPUs healthy");

    let sick = node(&[
        gpu(0, HealthState::Healthy, &[]),
        gpu(
            4,
            HealthState::Degraded,
            &[("nvlink_down", HealthAction::ResetGpu)],
        ),
        gpu(
            2,
            HealthState::Failed,
            &[
                ("xid_79", HealthAction::RebootNode),
                ("pcie_width", HealthAction::DrainAndService),
            ],
        ),
    ]);
    let c = Condition::of(Some(&sick));
    assert_eq!((c.status, c.reason), ("False", "GpuFailed"));
    assert_eq!(
        c.message,
        "GPU 2 (GPU-2) failed: xid_79 (reboot_node), pcie_width (drain_and_service); \
         GPU 4 (GPU-4) degraded: nvlink_down (reset_gpu)"
    );
    let degraded = node(&[gpu(
        1,
        HealthState::Degraded,
        &[("thermal_slowdown", HealthAction::None)],
    )]);
    assert_eq!(Condition::of(Some(&degraded)).reason, "GpuDegraded");

    let c = Condition::of(None);
    assert_eq!((c.status, c.reason), ("Unknown", "NvmlUnavailable"));
}

#[test]
fn events_are_made_of_state_changes_and_at_the_start_of_gpus_not_healthy() {
    let failed = gpu(
        2,
        HealthState::Failed,
        &[("xid_48", HealthAction::ResetGpu)],
    );
    let start = node(&[gpu(0, HealthState::Healthy, &[]), failed.clone()]);
    let first = changes(None, &start);
    assert_eq!(first, [(None, failed.clone())], "a healthy GPU is no news");
    assert!(changes(Some(&start), &start).is_empty());

    // Another reason with the same state is no news; a new state is.
    let other = gpu(
        2,
        HealthState::Failed,
        &[("xid_79", HealthAction::RebootNode)],
    );
    assert!(
        changes(
            Some(&start),
            &node(&[gpu(0, HealthState::Healthy, &[]), other])
        )
        .is_empty()
    );
    let reset = node(&[
        gpu(
            0,
            HealthState::Degraded,
            &[("pcie_width", HealthAction::DrainAndService)],
        ),
        gpu(2, HealthState::Healthy, &[]),
    ]);
    let next = changes(Some(&start), &reset);
    assert_eq!(
        next.iter()
            .map(|(was, v)| (v.index, *was, v.state))
            .collect::<Vec<_>>(),
        [
            (0, Some(HealthState::Healthy), HealthState::Degraded),
            (2, Some(HealthState::Failed), HealthState::Healthy),
        ]
    );
}

#[test]
fn an_event_is_one_the_api_server_accepts_about_the_node() {
    let at = SystemTime::UNIX_EPOCH + Duration::from_micros(1_795_000_000_123_456);
    let failed = gpu(
        3,
        HealthState::Failed,
        &[
            ("xid_48", HealthAction::ResetGpu),
            ("ecc_uncorrectable", HealthAction::ResetGpu),
        ],
    );
    let e = event("gpu-node-7", Some(HealthState::Healthy), &failed, at);
    assert_eq!(
        e,
        json!({
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": {"generateName": "gpu-node-7.nvidia-gpu-", "namespace": "default"},
            "eventTime": "2026-11-18T11:06:40.123456Z",
            "reportingController": "nvml-exporter",
            "reportingInstance": "nvml-exporter-gpu-node-7",
            "action": "reset_gpu",
            "reason": "GpuFailed",
            "type": "Warning",
            "regarding": {"apiVersion": "v1", "kind": "Node", "name": "gpu-node-7", "uid": "gpu-node-7"},
            "note": "GPU 3 (GPU-3) failed: xid_48 (reset_gpu), ecc_uncorrectable (reset_gpu) (was healthy)",
        })
    );
    let back = event(
        "n",
        Some(HealthState::Failed),
        &gpu(3, HealthState::Healthy, &[]),
        at,
    );
    assert_eq!(
        (&back["type"], &back["reason"], &back["action"]),
        (&json!("Normal"), &json!("GpuHealthy"), &json!("none"))
    );
    // The API server's limits: 128 characters of reportingInstance, 1 KiB of note.
    let long = "n".repeat(300);
    let many: Vec<(&'static str, HealthAction)> = vec![("xid_79", HealthAction::RebootNode); 200];
    let e = event(&long, None, &gpu(1, HealthState::Failed, &many), at);
    assert_eq!(e["reportingInstance"].as_str().unwrap().len(), 128);
    let note = e["note"].as_str().unwrap();
    assert!(
        note.len() <= MAX_NOTE_BYTES && note.ends_with('…'),
        "{}",
        note.len()
    );
    assert!(e["metadata"]["generateName"].as_str().unwrap().len() < 253);
    // A name that is no DNS name (the API server refuses it) is cut at a character, not a byte.
    let name = format!("a{}", "ñ".repeat(150));
    let e = event(&name, None, &gpu(1, HealthState::Failed, &many), at);
    assert!(
        e["metadata"]["generateName"]
            .as_str()
            .unwrap()
            .starts_with("añ")
    );
}

#[test]
fn truncation_keeps_whole_characters() {
    assert_eq!(truncate("short".into()), "short");
    let text = "é".repeat(MAX_NOTE_BYTES);
    let cut = truncate(text);
    assert!(cut.len() <= MAX_NOTE_BYTES);
    assert!(cut.ends_with('…'));
    assert!(cut.trim_end_matches('…').chars().all(|c| c == 'é'));
}

#[test]
fn the_kubernetes_docs_say_what_the_writer_does() {
    let docs = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/kubernetes.md"),
    )
    .unwrap();
    let section = docs
        .split("### GPU health on the node")
        .nth(1)
        .and_then(|s| s.split("\n### ").next())
        .expect("docs/kubernetes.md has a section on the node condition");
    let minutes = |d: Duration| format!("{} minutes", d.as_secs() / 60);
    for said in [
        format!("`{CONDITION_TYPE}`"),
        format!("every {}", minutes(HEARTBEAT)),
        format!(
            "from {} s to {}",
            FIRST_BACKOFF.as_secs(),
            minutes(MAX_BACKOFF)
        ),
        format!("at most {MAX_PENDING_EVENTS}"),
        format!("`{}`", REASONS[0].label()),
    ] {
        assert!(section.contains(&said), "the section does not say {said:?}");
    }
    for reason in &REASONS[1..] {
        let suffix = reason.label().trim_start_matches("node_condition");
        assert!(section.contains(&format!("`{suffix}`")), "{suffix}");
    }
}
