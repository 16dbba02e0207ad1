//! XID delivery on a running clock: the default scenario has XID 79 on GPU6 at t = 30 s; the
//! clock starts at 29.5 s, so a set registered now sees it about half a second later, once.
//!
//! Both steps read the same running clock, so they run in order in one test; no other test uses
//! this environment, so the session starts a new simulation and its clock at 29.5 s.

use crate::common::{self, Session};
use nvml_wrapper::Nvml;
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::error::NvmlError;
use std::time::{Duration, Instant};

fn session() -> Session {
    common::session(&[
        ("NVML_SIM_SCENARIO", None),
        ("NVML_SIM_TIME", None),
        ("NVML_SIM_START", Some("29.5")),
    ])
}

#[test]
fn xid_79_arrives_once_and_only_to_sets_registered_before() {
    let nvml = session();
    xid_79_arrives_once_on_gpu6_only(&nvml);
    a_set_registered_after_the_event_never_sees_it(&nvml);
}

fn xid_79_arrives_once_on_gpu6_only(nvml: &Nvml) {
    let gpu6 = nvml.device_by_index(6).unwrap();
    assert!(
        gpu6.supported_event_types()
            .unwrap()
            .contains(EventTypes::CRITICAL_XID_ERROR)
    );
    let set = nvml.create_event_set().unwrap();
    let set = gpu6
        .register_events(EventTypes::CRITICAL_XID_ERROR, set)
        .unwrap();
    let set = nvml
        .device_by_index(0)
        .unwrap()
        .register_events(EventTypes::CRITICAL_XID_ERROR, set)
        .unwrap();

    let start = Instant::now();
    let ev = set.wait(5000).unwrap();
    assert!(start.elapsed() < Duration::from_secs(3));
    assert_eq!(ev.device.index().unwrap(), 6);
    assert!(ev.event_type.contains(EventTypes::CRITICAL_XID_ERROR));
    assert_eq!(format!("{:?}", ev.event_data), "Some(Value(79))");

    // Delivered once: the next wait times out.
    assert!(matches!(set.wait(200), Err(NvmlError::Timeout)));
}

/// Runs after [`xid_79_arrives_once_on_gpu6_only`], which saw the event: t is past 30 s.
fn a_set_registered_after_the_event_never_sees_it(nvml: &Nvml) {
    let set = nvml.create_event_set().unwrap();
    let d = nvml.device_by_index(6).unwrap();
    let set = d
        .register_events(EventTypes::CRITICAL_XID_ERROR, set)
        .unwrap();
    assert!(matches!(set.wait(200), Err(NvmlError::Timeout)));
}
