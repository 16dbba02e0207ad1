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

#[test]
fn a_healthy_reading_has_no_reason_and_an_application_xid_leaves_it_healthy() {
    let mut t = Tracker::default();
    let now = Instant::now();
    assert_eq!(t.evaluate(&gpu(&[]), now), Health::default());
    assert_eq!(
        t.evaluate(&gpu(&[(31, 5), (13, 1)]), now),
        Health::default()
    );
}

#[test]
fn a_reset_xid_holds_until_the_gpu_is_seen_lost_and_back() {
    let mut t = Tracker::default();
    let t0 = Instant::now();
    let h = t.evaluate(&gpu(&[(79, 1)]), t0);
    assert_eq!(
        (h.state, reasons(&h)),
        (HealthState::Failed, vec![("xid_79", "reboot_node")])
    );
    // No new event for a day: still failed.
    let later = t0 + Duration::from_secs(86_400);
    assert_eq!(
        t.evaluate(&gpu(&[(79, 1)]), later).state,
        HealthState::Failed
    );
    // NVML calls it lost (its readings are gone), then it answers again: reset.
    let lost = DeviceSample {
        up: false,
        ..gpu(&[(79, 1)])
    };
    let h = t.evaluate(&lost, later);
    assert_eq!(
        reasons(&h),
        vec![("lost", "reset_gpu"), ("xid_79", "reboot_node")]
    );
    assert_eq!(t.evaluate(&gpu(&[(79, 1)]), later), Health::default());
    // A new event of the same code fails it again.
    assert_eq!(
        t.evaluate(&gpu(&[(79, 2)]), later).state,
        HealthState::Failed
    );
}

#[test]
fn a_workload_xid_holds_for_the_window_after_its_last_event() {
    let mut t = Tracker::default();
    let t0 = Instant::now();
    let h = t.evaluate(&gpu(&[(94, 1)]), t0);
    assert_eq!(
        (h.state, reasons(&h)),
        (HealthState::Degraded, vec![("xid_94", "restart_workload")])
    );
    let before = t0 + XID_WINDOW - Duration::from_secs(1);
    assert_eq!(
        t.evaluate(&gpu(&[(94, 1)]), before).state,
        HealthState::Degraded
    );
    assert_eq!(
        t.evaluate(&gpu(&[(94, 1)]), t0 + XID_WINDOW),
        Health::default()
    );
}

#[test]
fn xids_counted_before_the_session_are_not_news() {
    let baseline = HashMap::from([("GPU-a".to_string(), BTreeMap::from([(48, 2)]))]);
    let mut t = Tracker::new(baseline);
    let now = Instant::now();
    assert_eq!(t.evaluate(&gpu(&[(48, 2)]), now), Health::default());
    assert_eq!(t.evaluate(&gpu(&[(48, 3)]), now).state, HealthState::Failed);
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
    d.nvlinks = vec![link(0, true), link(1, false)];
    d.remapped_rows = Some(RemappedRows {
        failed: true,
        ..RemappedRows::default()
    });
    d.ecc_volatile = Some(EccCounts {
        corrected: 3,
        uncorrected: 1,
    });
    let h = t.evaluate(&d, now);
    assert_eq!(h.state, HealthState::Failed);
    assert_eq!(
        reasons(&h),
        vec![
            ("row_remap_failure", "drain_and_service"),
            ("ecc_uncorrectable", "reset_gpu"),
            ("nvlink_down", "reset_gpu"),
        ]
    );
    d.nvlinks = vec![link(0, true), link(1, true)];
    d.remapped_rows = Some(RemappedRows::default());
    d.ecc_volatile = Some(EccCounts {
        corrected: 3,
        uncorrected: 0,
    });
    assert_eq!(t.evaluate(&d, now), Health::default());
}

#[test]
fn a_page_waiting_to_be_retired_degrades_until_it_is() {
    let mut t = Tracker::default();
    let now = Instant::now();
    let mut d = gpu(&[]);
    let pages = |pending| RetiredPages {
        single_bit_ecc: 2,
        double_bit_ecc: 1,
        pending,
    };
    d.retired_pages = Some(pages(Some(true)));
    let h = t.evaluate(&d, now);
    assert_eq!(h.state, HealthState::Degraded);
    assert_eq!(reasons(&h), vec![("retired_pages_pending", "reset_gpu")]);
    // Pages already retired are no reason; nor is a status NVML did not give.
    for pending in [Some(false), None] {
        d.retired_pages = Some(pages(pending));
        assert_eq!(t.evaluate(&d, now), Health::default());
    }
}

#[test]
fn pcie_width_counts_but_a_lower_generation_alone_does_not_and_slowdowns_need_their_bit() {
    let mut t = Tracker::default();
    let now = Instant::now();
    let mut d = gpu(&[]);
    d.pcie.link_generation_current = Some(1);
    d.pcie.link_generation_max = Some(5);
    d.pcie.link_width_current = Some(16);
    d.pcie.link_width_max = Some(16);
    d.clock_events = events(&[ClockEventReason::GpuIdle, ClockEventReason::SwPowerCap]);
    assert_eq!(t.evaluate(&d, now), Health::default());
    d.pcie.link_width_current = Some(8);
    d.clock_events = events(&[
        ClockEventReason::HwThermalSlowdown,
        ClockEventReason::HwPowerBrakeSlowdown,
    ]);
    let h = t.evaluate(&d, now);
    assert_eq!(
        reasons(&h),
        vec![
            ("pcie_width", "drain_and_service"),
            ("thermal_slowdown", "none"),
            ("power_slowdown", "none")
        ]
    );
}

#[test]
fn a_gpu_without_a_fresh_reading_past_the_grace_is_unreadable() {
    let mut t = Tracker::default();
    let d = DeviceSample {
        up: false,
        stale: true,
        ..gpu(&[])
    };
    let h = t.evaluate(&d, Instant::now());
    assert_eq!(
        (h.state, reasons(&h)),
        (HealthState::Failed, vec![("unreadable", "reset_gpu")])
    );
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
    assert_eq!(t.evaluate(&training, t0), Health::default());
    let not_started = on_fabric(FabricState::NotStarted, None);
    assert_eq!(
        t.evaluate(&not_started, t0 + Duration::from_secs(59)),
        Health::default()
    );
    let h = t.evaluate(&training, t0 + Duration::from_secs(60));
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
    assert_eq!(t.evaluate(&done, later), Health::default());
    assert_eq!(t.evaluate(&gpu(&[]), later), Health::default());
}

#[test]
fn a_failed_registration_and_each_condition_of_the_mask_are_reasons() {
    let mut t = Tracker::default();
    let now = Instant::now();
    let h = t.evaluate(&on_fabric(FabricState::Completed, Some("timeout")), now);
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
    let h = t.evaluate(&d, now);
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
            .all(|r| r.signal.reads().is_none())
    );
}
