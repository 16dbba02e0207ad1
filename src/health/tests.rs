//! The verdict of hand-built readings, tick after tick.

use super::*;
use crate::sample::{EccCounts, FabricCondition, NvLinkSample, RemappedRows, RetiredPages};

fn gpu(xids: &[(u64, u64)]) -> DeviceSample {
    DeviceSample {
        uuid: "GPU-a".into(),
        up: true,
        xid_counts: xids.iter().copied().collect(),
        ..DeviceSample::default()
    }
}

fn events(on: &[ClockEventReason]) -> Vec<(ClockEventReason, bool)> {
    ClockEventReason::ALL
        .iter()
        .map(|r| (*r, on.contains(r)))
        .collect()
}

fn reasons(h: &Health) -> Vec<(&str, &str)> {
    h.reasons
        .iter()
        .map(|r| (r.reason, r.action.label()))
        .collect()
}

const NODE: Node = Node {
    mig: false,
    fabric_late: false,
};

fn lost(kind: Lost, d: DeviceSample) -> DeviceSample {
    DeviceSample {
        up: false,
        lost: Some(kind),
        ..d
    }
}

#[test]
fn a_healthy_reading_has_no_reason_and_an_application_xid_leaves_it_healthy() {
    let mut t = Tracker::default();
    let now = Instant::now();
    assert_eq!(t.evaluate(&gpu(&[]), NODE, now), Health::default());
    // 31, 13 (applications), 43 (the catalogue's "healthy"), 63 and 92 (IGNORE).
    let xids = [(31, 5), (13, 1), (43, 2), (63, 1), (92, 4)];
    assert_eq!(t.evaluate(&gpu(&xids), NODE, now), Health::default());
}

#[test]
fn a_reset_xid_holds_until_the_gpu_is_seen_lost_and_back() {
    let mut t = Tracker::default();
    let t0 = Instant::now();
    let h = t.evaluate(&gpu(&[(79, 1)]), NODE, t0);
    assert_eq!(
        (h.state, reasons(&h)),
        (HealthState::Failed, vec![("xid_79", "reboot_node")])
    );
    // No new event for a day: still failed.
    let later = t0 + Duration::from_secs(86_400);
    assert_eq!(
        t.evaluate(&gpu(&[(79, 1)]), NODE, later).state,
        HealthState::Failed
    );
    // NVML calls it lost (its readings are gone), then it answers again: reset.
    let h = t.evaluate(&lost(Lost::OffTheBus, gpu(&[(79, 1)])), NODE, later);
    assert_eq!(
        reasons(&h),
        vec![("lost", "reboot_node"), ("xid_79", "reboot_node")]
    );
    assert_eq!(t.evaluate(&gpu(&[(79, 1)]), NODE, later), Health::default());
    // A new event of the same code fails it again.
    assert_eq!(
        t.evaluate(&gpu(&[(79, 2)]), NODE, later).state,
        HealthState::Failed
    );
}

#[test]
fn lost_asks_for_a_reboot_and_reset_required_for_a_reset() {
    let mut t = Tracker::default();
    let now = Instant::now();
    let h = t.evaluate(&lost(Lost::OffTheBus, gpu(&[])), NODE, now);
    assert_eq!(reasons(&h), vec![("lost", "reboot_node")]);
    let h = t.evaluate(&lost(Lost::ResetRequired, gpu(&[])), NODE, now);
    assert_eq!(reasons(&h), vec![("reset_required", "reset_gpu")]);
    assert_eq!(h.state, HealthState::Failed);
}

#[test]
fn the_catalogue_s_reset_xids_fail_the_gpu_and_an_unlisted_one_degrades_it() {
    let now = Instant::now();
    for code in [46, 62, 110, 136, 140, 143, 155, 156, 158] {
        let mut t = Tracker::default();
        let h = t.evaluate(&gpu(&[(code, 1)]), NODE, now);
        let reason = format!("xid_{code}");
        assert_eq!(
            (h.state, reasons(&h)),
            (HealthState::Failed, vec![(reason.as_str(), "reset_gpu")]),
            "{code}"
        );
    }
    let mut t = Tracker::default();
    let h = t.evaluate(&gpu(&[(151, 1), (999, 1)]), NODE, now);
    assert_eq!(
        (h.state, reasons(&h)),
        (HealthState::Degraded, vec![("xid_unlisted", "investigate")])
    );
    // It asks to be looked up, not for a reset: it goes with the window.
    assert_eq!(
        t.evaluate(&gpu(&[(151, 1), (999, 1)]), NODE, now + XID_WINDOW),
        Health::default()
    );
}

#[test]
fn a_workload_xid_holds_for_the_window_after_its_last_event() {
    let mut t = Tracker::default();
    let t0 = Instant::now();
    let h = t.evaluate(&gpu(&[(94, 1)]), NODE, t0);
    assert_eq!(
        (h.state, reasons(&h)),
        (HealthState::Degraded, vec![("xid_94", "restart_workload")])
    );
    let before = t0 + XID_WINDOW - Duration::from_secs(1);
    assert_eq!(
        t.evaluate(&gpu(&[(94, 1)]), NODE, before).state,
        HealthState::Degraded
    );
    assert_eq!(
        t.evaluate(&gpu(&[(94, 1)]), NODE, t0 + XID_WINDOW),
        Health::default()
    );
}

#[test]
fn the_recovery_action_drives_the_verdict_where_present() {
    let now = Instant::now();
    let with = |action: u64, xids: &[(u64, u64)]| DeviceSample {
        recovery_action: Some(action),
        ..gpu(xids)
    };
    type Case = (u64, HealthState, &'static [(&'static str, &'static str)]);
    let cases: [Case; 6] = [
        (0, HealthState::Healthy, &[]),
        (
            1,
            HealthState::Failed,
            &[("recovery_action_gpu_reset", "reset_gpu")],
        ),
        (
            2,
            HealthState::Failed,
            &[("recovery_action_node_reboot", "reboot_node")],
        ),
        (
            3,
            HealthState::Degraded,
            &[("recovery_action_drain_p2p", "drain_p2p")],
        ),
        (
            4,
            HealthState::Failed,
            &[("recovery_action_drain_and_reset", "reset_gpu")],
        ),
        (
            9,
            HealthState::Failed,
            &[("recovery_action_other", "investigate")],
        ),
    ];
    for (action, state, want) in cases {
        let h = Tracker::default().evaluate(&with(action, &[]), NODE, now);
        assert_eq!((h.state, reasons(&h)), (state, want.to_vec()), "{action}");
    }
    // A linked XID (95) changes nothing by itself where the driver gives its action; an XID the
    // catalogue does not link (140) still counts.
    let mut t = Tracker::default();
    assert_eq!(
        t.evaluate(&with(0, &[(95, 1)]), NODE, now),
        Health::default()
    );
    let h = t.evaluate(&with(1, &[(95, 1), (140, 1)]), NODE, now);
    assert_eq!(
        reasons(&h),
        vec![
            ("recovery_action_gpu_reset", "reset_gpu"),
            ("xid_140", "reset_gpu")
        ]
    );
    // Without the field (a driver before R565) the XID judges alone.
    let h = Tracker::default().evaluate(&gpu(&[(95, 1)]), NODE, now);
    assert_eq!(reasons(&h), vec![("xid_95", "reset_gpu")]);
    // The Blackwell NVLink XIDs need the driver's decode: without it they ask to be looked up.
    let h = Tracker::default().evaluate(&gpu(&[(149, 1)]), NODE, now);
    assert_eq!(reasons(&h), vec![("xid_144_150", "investigate")]);
    assert_eq!(
        Tracker::default().evaluate(&with(0, &[(149, 1)]), NODE, now),
        Health::default()
    );
}

#[test]
fn the_driver_s_reset_clears_what_the_xids_held() {
    let mut t = Tracker::default();
    let now = Instant::now();
    let reading = |action: u64| DeviceSample {
        recovery_action: Some(action),
        ..gpu(&[(140, 1)])
    };
    assert_eq!(
        t.evaluate(&reading(1), NODE, now).state,
        HealthState::Failed
    );
    // The action goes back to none: the reset was done, and XID 140 goes with it.
    assert_eq!(t.evaluate(&reading(0), NODE, now), Health::default());
    // A drain of peer-to-peer traffic that ends is no reset.
    let mut t = Tracker::default();
    t.evaluate(&reading(3), NODE, now);
    assert_eq!(
        t.evaluate(&reading(0), NODE, now).state,
        HealthState::Failed
    );
}

#[test]
fn a_driver_reload_resets_every_gpu() {
    let mut t = Tracker::default();
    let now = Instant::now();
    assert_eq!(
        t.evaluate(&gpu(&[(48, 1)]), NODE, now).state,
        HealthState::Failed
    );
    t.driver_reloaded();
    // The XID log keeps its counts across the re-initialisation: not news.
    assert_eq!(t.evaluate(&gpu(&[(48, 1)]), NODE, now), Health::default());
    assert_eq!(
        t.evaluate(&gpu(&[(48, 2)]), NODE, now).state,
        HealthState::Failed
    );
}

#[test]
fn conditions_nvml_shows_clear_with_it_and_the_worst_state_wins() {
    let mut t = Tracker::default();
    let now = Instant::now();
    let link = |link, up| NvLinkSample {
        link,
        up,
        ..NvLinkSample::default()
    };
    let mut d = gpu(&[]);
    d.nvlinks = vec![link(0, Some(true)), link(1, Some(false))];
    d.remapped_rows = Some(RemappedRows {
        pending: true,
        ..RemappedRows::default()
    });
    d.ecc_volatile = Some(EccCounts {
        corrected: 3,
        uncorrected: 1,
    });
    d.unrepairable_memory = Some(true);
    d.sram_threshold_exceeded = Some(true);
    let h = t.evaluate(&d, NODE, now);
    assert_eq!(h.state, HealthState::Failed);
    assert_eq!(
        reasons(&h),
        vec![
            ("unrepairable_memory", "drain_and_service"),
            ("sram_threshold", "drain_and_service"),
            ("ecc_uncorrectable", "reset_gpu"),
            ("row_remap_pending", "reset_gpu"),
            ("nvlink_down", "reset_gpu"),
        ]
    );
    d.nvlinks = vec![link(0, Some(true)), link(1, Some(true))];
    d.remapped_rows = Some(RemappedRows::default());
    d.ecc_volatile = Some(EccCounts {
        corrected: 3,
        uncorrected: 0,
    });
    d.unrepairable_memory = Some(false);
    d.sram_threshold_exceeded = Some(false);
    assert_eq!(t.evaluate(&d, NODE, now), Health::default());
}

#[test]
fn links_are_not_judged_in_mig_mode_nor_when_nvml_did_not_say() {
    let mut t = Tracker::default();
    let now = Instant::now();
    let mut d = gpu(&[]);
    d.nvlinks = (0..18)
        .map(|link| NvLinkSample {
            link,
            up: Some(false),
            ..NvLinkSample::default()
        })
        .collect();
    assert_eq!(
        t.evaluate(&d, Node { mig: true, ..NODE }, now),
        Health::default()
    );
    assert_eq!(t.evaluate(&d, NODE, now).state, HealthState::Failed);
    for l in &mut d.nvlinks {
        l.up = None;
    }
    assert_eq!(t.evaluate(&d, NODE, now), Health::default());
    let mig = DeviceSample {
        mig_mode: Some(true),
        ..gpu(&[])
    };
    assert!(Node::of([&gpu(&[]), &mig]).mig);
    assert!(!Node::of([&gpu(&[])]).mig);
}

#[test]
fn a_page_waiting_to_be_retired_degrades_until_it_is_and_the_limit_fails() {
    let mut t = Tracker::default();
    let now = Instant::now();
    let mut d = gpu(&[]);
    let pages = |single, pending| RetiredPages {
        single_bit_ecc: single,
        double_bit_ecc: 1,
        pending,
    };
    d.retired_pages = Some(pages(2, Some(true)));
    let h = t.evaluate(&d, NODE, now);
    assert_eq!(h.state, HealthState::Degraded);
    assert_eq!(reasons(&h), vec![("retired_pages_pending", "reset_gpu")]);
    // Pages already retired are no reason; nor is a status NVML did not give.
    for pending in [Some(false), None] {
        d.retired_pages = Some(pages(2, pending));
        assert_eq!(t.evaluate(&d, NODE, now), Health::default());
    }
    d.retired_pages = Some(pages(RETIRED_PAGES_LIMIT - 1, None));
    let h = t.evaluate(&d, NODE, now);
    assert_eq!(
        reasons(&h),
        vec![("retired_pages_limit", "drain_and_service")]
    );
}

#[test]
fn pcie_width_is_only_reported_and_slowdowns_need_their_bit() {
    let mut t = Tracker::default();
    let now = Instant::now();
    let mut d = gpu(&[]);
    d.pcie.link_generation_current = Some(1);
    d.pcie.link_generation_max = Some(5);
    d.pcie.link_width_current = Some(8);
    d.pcie.link_width_max = Some(16);
    d.clock_events = events(&[ClockEventReason::GpuIdle, ClockEventReason::SwPowerCap]);
    assert_eq!(t.evaluate(&d, NODE, now), Health::default());
    d.clock_events = events(&[
        ClockEventReason::HwThermalSlowdown,
        ClockEventReason::HwPowerBrakeSlowdown,
    ]);
    let h = t.evaluate(&d, NODE, now);
    assert_eq!(
        reasons(&h),
        vec![("thermal_slowdown", "none"), ("power_slowdown", "none")]
    );
}

#[test]
fn pcie_replays_are_judged_per_minute_against_dcgm_s_bound() {
    // Gen 5 x16: 1.92 a minute per lane, 31 for the link; gen 1 x1: 1.
    assert_eq!(replay_bound(5, 16), 31);
    assert_eq!(replay_bound(1, 1), 1);
    assert_eq!(replay_bound(9, 16), replay_bound(6, 16));
    let mut t = Tracker::default();
    let t0 = Instant::now();
    let at = |s: u64| t0 + Duration::from_secs(s);
    let mut d = gpu(&[]);
    d.pcie.link_generation_current = Some(5);
    d.pcie.link_width_current = Some(16);
    let mut tick = |count: u64, s: u64| {
        d.pcie.replay_errors = Some(1000 + count);
        t.evaluate(&d, NODE, at(s))
    };
    // 31 in a minute is within the bound; 32 is over it.
    assert_eq!(tick(0, 0), Health::default());
    assert_eq!(tick(31, 30), Health::default());
    let h = tick(32, 59);
    assert_eq!(reasons(&h), vec![("pcie_replay_rate", "drain_and_service")]);
    // The same count a minute later: the window moved past the growth.
    assert_eq!(tick(32, 120), Health::default());
}

#[test]
fn a_gpu_without_a_fresh_reading_past_the_grace_is_unreadable() {
    let mut t = Tracker::default();
    let d = DeviceSample {
        up: false,
        stale: true,
        ..gpu(&[])
    };
    let h = t.evaluate(&d, NODE, Instant::now());
    assert_eq!(
        (h.state, reasons(&h)),
        (HealthState::Failed, vec![("unreadable", "reset_gpu")])
    );
}

mod persisted {
    use super::*;
    use crate::health::store::Store;

    fn tracker(path: &std::path::Path, boot: &str) -> Tracker {
        let (store, loaded) = Store::open_for_boot(path.to_path_buf(), Some(boot.into()));
        Tracker::with_store(store, loaded)
    }

    fn with_energy(joules: f64, d: DeviceSample) -> DeviceSample {
        DeviceSample {
            energy_joules: Some(joules),
            ..d
        }
    }

    #[test]
    fn a_held_xid_survives_a_restart_until_the_gpu_is_reset() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("health.json");
        let now = Instant::now();
        let mut t = tracker(&path, "boot-1");
        let h = t.evaluate(&with_energy(5e6, gpu(&[(48, 1), (94, 1)])), NODE, now);
        assert_eq!(h.state, HealthState::Failed);
        t.persist();
        assert_eq!(t.store_errors(), Some(HealthStateErrors::default()));
        drop(t);

        // A new exporter: the XID log is empty and no event is replayed.
        let mut t = tracker(&path, "boot-1");
        let h = t.evaluate(&with_energy(5.1e6, gpu(&[])), NODE, now);
        assert_eq!(
            reasons(&h),
            vec![("xid_48", "reset_gpu")],
            "the reset XID held, the workload one (94) not kept"
        );
        t.persist();
        // Another restart, and the GPU is seen reset: gone from the file too.
        let mut t = tracker(&path, "boot-1");
        t.evaluate(&lost(Lost::ResetRequired, gpu(&[])), NODE, now);
        assert_eq!(t.evaluate(&gpu(&[]), NODE, now), Health::default());
        t.persist();
        let mut t = tracker(&path, "boot-1");
        assert_eq!(t.evaluate(&gpu(&[]), NODE, now), Health::default());
    }

    #[test]
    fn a_reboot_or_a_driver_reload_while_stopped_clears_the_holds() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("health.json");
        let now = Instant::now();
        let mut t = tracker(&path, "boot-1");
        t.evaluate(&with_energy(5e6, gpu(&[(79, 1)])), NODE, now);
        t.persist();
        assert_eq!(
            tracker(&path, "boot-2").evaluate(&gpu(&[]), NODE, now),
            Health::default(),
            "another boot"
        );
        // The energy counter restarted with the driver.
        let mut t = tracker(&path, "boot-1");
        assert_eq!(
            t.evaluate(&with_energy(10.0, gpu(&[])), NODE, now),
            Health::default()
        );
    }

    #[test]
    fn a_corrupt_or_unwritable_file_is_said_and_the_verdicts_hold_in_memory() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("health.json");
        std::fs::write(&path, "garbage").unwrap();
        let now = Instant::now();
        let mut t = tracker(&path, "boot-1");
        assert_eq!(t.store_errors().map(|e| e.read), Some(1));
        assert_eq!(
            t.evaluate(&gpu(&[(48, 1)]), NODE, now).state,
            HealthState::Failed
        );
        t.persist();
        assert_eq!(
            tracker(&path, "boot-1")
                .evaluate(&gpu(&[]), NODE, now)
                .state,
            HealthState::Failed
        );

        let unwritable = dir.path().join("no-such-dir").join("health.json");
        let mut t = tracker(&unwritable, "boot-1");
        assert_eq!(
            t.evaluate(&gpu(&[(48, 1)]), NODE, now).state,
            HealthState::Failed
        );
        t.persist();
        assert_eq!(t.store_errors().map(|e| e.write), Some(1));
        assert_eq!(
            t.evaluate(&gpu(&[(48, 1)]), NODE, now).state,
            HealthState::Failed,
            "held in memory"
        );
    }
}

fn on_fabric(state: FabricState, status: Option<&'static str>) -> DeviceSample {
    DeviceSample {
        fabric: Some(FabricSample {
            state,
            status,
            ..FabricSample::default()
        }),
        ..gpu(&[])
    }
}

#[test]
fn a_gpu_not_registered_with_the_fabric_fails_once_the_timeout_has_passed() {
    let mut t = Tracker::default();
    t.set_fabric_registration_timeout(Duration::from_secs(60));
    let t0 = Instant::now();
    let training = on_fabric(FabricState::InProgress, None);
    assert_eq!(t.evaluate(&training, NODE, t0), Health::default());
    let not_started = on_fabric(FabricState::NotStarted, None);
    assert_eq!(
        t.evaluate(&not_started, NODE, t0 + Duration::from_secs(59)),
        Health::default()
    );
    let h = t.evaluate(&training, NODE, t0 + Duration::from_secs(60));
    assert_eq!(
        (h.state, reasons(&h)),
        (
            HealthState::Failed,
            vec![("fabric_not_registered", "reset_gpu")]
        )
    );
    // Registered: healthy again; a GPU on no fabric never has a fabric reason.
    let later = t0 + Duration::from_secs(600);
    let done = on_fabric(FabricState::Completed, Some("success"));
    assert_eq!(t.evaluate(&done, NODE, later), Health::default());
    assert_eq!(t.evaluate(&gpu(&[]), NODE, later), Health::default());
}

#[test]
fn a_failed_registration_and_each_condition_of_the_mask_are_reasons() {
    let mut t = Tracker::default();
    let now = Instant::now();
    let h = t.evaluate(
        &on_fabric(FabricState::Completed, Some("timeout")),
        NODE,
        now,
    );
    assert_eq!(
        reasons(&h),
        vec![("fabric_registration_failed", "reset_gpu")]
    );
    let mut d = on_fabric(FabricState::Completed, Some("success"));
    let f = d.fabric.as_mut().unwrap();
    f.conditions = vec![
        (FabricCondition::DegradedBandwidth, true),
        (FabricCondition::RouteRecovery, false),
        (FabricCondition::RouteUnhealthy, true),
        (FabricCondition::IncorrectConfiguration, false),
    ];
    let h = t.evaluate(&d, NODE, now);
    assert_eq!(
        (h.state, reasons(&h)),
        (
            HealthState::Failed,
            vec![
                ("fabric_degraded_bandwidth", "reset_gpu"),
                ("fabric_route_unhealthy", "reset_gpu")
            ]
        )
    );
}

#[test]
fn a_missing_gpu_is_the_nodes_reason_never_a_gpus() {
    assert_eq!(node_verdict(&[]), Health::default());
    let h = node_verdict(&[PciGpu::default()]);
    assert_eq!(
        (h.state, reasons(&h)),
        (HealthState::Failed, vec![("gpus_missing", "reboot_node")])
    );
    assert!(
        RULES
            .iter()
            .filter(|r| r.signal.is_node())
            .all(|r| r.signal.reads().is_empty())
    );
}
