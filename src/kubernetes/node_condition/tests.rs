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
    let c = Condition::of(Some(&healthy), None);
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
    let c = Condition::of(Some(&sick), None);
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
    assert_eq!(Condition::of(Some(&degraded), None).reason, "GpuDegraded");

    let c = Condition::of(None, None);
    assert_eq!((c.status, c.reason), ("Unknown", "NvmlUnavailable"));
}

#[test]
fn a_gpu_nvml_lost_makes_the_condition_false_though_every_gpu_it_lists_is_healthy() {
    let healthy = node(&[gpu(0, HealthState::Healthy, &[])]);
    let lost = NodeVerdict {
        state: HealthState::Failed,
        reasons: vec![("gpus_missing", HealthAction::RebootNode)],
        missing: vec!["0000:ca:00.0".into()],
    };
    let c = Condition::of(Some(&healthy), Some(&lost));
    assert_eq!((c.status, c.reason), ("False", "GpuFailed"));
    assert_eq!(
        c.message,
        "node failed: gpus_missing (reboot_node): 0000:ca:00.0 on the PCI bus, not in NVML"
    );
    let degraded = node(&[gpu(
        1,
        HealthState::Degraded,
        &[("thermal_slowdown", HealthAction::None)],
    )]);
    let c = Condition::of(Some(&degraded), Some(&lost));
    assert_eq!(c.reason, "GpuFailed");
    assert!(c.message.starts_with("node failed: gpus_missing") && c.message.ends_with("(none)"));
    // NVML down: unknown, whatever the bus said.
    assert_eq!(Condition::of(None, Some(&lost)).status, "Unknown");
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
    let e = event("gpu-node-7", Some(HealthState::Healthy), &failed, 1, at);
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
        1,
        at,
    );
    assert_eq!(
        (&back["type"], &back["reason"], &back["action"]),
        (&json!("Normal"), &json!("GpuHealthy"), &json!("none"))
    );
    // The API server's limits: 128 characters of reportingInstance, 1 KiB of note.
    let long = "n".repeat(300);
    let many: Vec<(&'static str, HealthAction)> = vec![("xid_79", HealthAction::RebootNode); 200];
    let e = event(&long, None, &gpu(1, HealthState::Failed, &many), 1, at);
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
    let e = event(&name, None, &gpu(1, HealthState::Failed, &many), 1, at);
    assert!(
        e["metadata"]["generateName"]
            .as_str()
            .unwrap()
            .starts_with("añ")
    );
}

#[test]
fn a_budget_gives_its_burst_then_one_per_refill() {
    let mut b = Budget::new(3, Duration::from_secs(30));
    let t0 = Instant::now();
    let taken = |b: &mut Budget, at: Instant, n: usize| (0..n).filter(|_| b.take(at)).count();
    assert_eq!(taken(&mut b, t0, 10), 3, "the burst");
    assert_eq!(taken(&mut b, t0 + Duration::from_secs(29), 10), 0);
    assert_eq!(taken(&mut b, t0 + Duration::from_secs(30), 10), 1);
    assert_eq!(
        taken(&mut b, t0 + Duration::from_secs(75), 10),
        1,
        "one per 30 s"
    );
    assert_eq!(taken(&mut b, t0 + Duration::from_secs(90), 10), 1);
    // A long quiet refills the burst, no more.
    assert_eq!(taken(&mut b, t0 + Duration::from_secs(3600), 10), 3);
}

#[test]
fn a_flapping_gpu_sends_its_burst_then_a_summary_per_refill() {
    let state = StateHandle::new(&KubernetesOptions::default());
    let api = ApiServer {
        node_name: "n".into(),
        url: "https://10.0.0.1:6443".parse().unwrap(),
        ca_file: Default::default(),
    };
    let mut r = Reporter::new(&api, &KubernetesOptions::default(), state);
    let t0 = Instant::now();
    let healthy = node(&[
        gpu(0, HealthState::Healthy, &[]),
        gpu(2, HealthState::Healthy, &[]),
    ]);
    let flapped = node(&[
        gpu(0, HealthState::Healthy, &[]),
        gpu(
            2,
            HealthState::Failed,
            &[("xid_48", HealthAction::ResetGpu)],
        ),
    ]);
    // A flip every second for two minutes.
    let mut now = healthy.clone();
    r.tell(&now, t0, SystemTime::now());
    r.answered = Some(now.clone());
    for second in 1..=120 {
        now = if second % 2 == 1 {
            flapped.clone()
        } else {
            healthy.clone()
        };
        r.tell(&now, t0 + Duration::from_secs(second), SystemTime::now());
        r.answered = Some(now.clone());
    }
    let notes: Vec<&str> = r
        .pending
        .iter()
        .map(|e| e["note"].as_str().unwrap())
        .collect();
    // Three at once (1, 2 and 3 s), then one 30 s after the first (31, 61, 91 s), each telling
    // what it held back: six in two minutes, not 120.
    assert_eq!(notes.len(), 6, "{notes:#?}");
    assert_eq!(
        notes[0],
        "GPU 2 (GPU-2) failed: xid_48 (reset_gpu) (was healthy)"
    );
    assert_eq!(notes[1], "GPU 2 (GPU-2) healthy (was failed)");
    assert_eq!(
        notes[3],
        "GPU 2 (GPU-2) failed: xid_48 (reset_gpu) (was failed; 28 changes since the last Event)"
    );
    assert!(
        notes.iter().all(|n| n.starts_with("GPU 2 ")),
        "GPU 0 never changed"
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
        format!(
            "written at once {} times,\n  then at most once per {} s",
            CONDITION_BUDGET.burst,
            CONDITION_BUDGET.refill.as_secs()
        ),
        format!(
            "each GPU sends {} Events at once, then at most one\n  per {} s",
            EVENT_BUDGET.burst,
            EVENT_BUDGET.refill.as_secs()
        ),
        format!("`{}`", REASONS[0].label()),
    ] {
        assert!(section.contains(&said), "the section does not say {said:?}");
    }
    for reason in &REASONS[1..] {
        let suffix = reason.label().trim_start_matches("node_condition");
        assert!(section.contains(&format!("`{suffix}`")), "{suffix}");
    }
}
