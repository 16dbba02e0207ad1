//! XID (critical error) events: an NVML event set registered on every device that supports
//! them, waited on in a loop with a short timeout so that shutdown is prompt. Counts are kept
//! per device uuid (so they survive a re-initialisation that renumbers devices) and merged into
//! every snapshot.
//!
//! Where the driver reports it (R565 and newer), the GPU recovery action event is registered
//! beside XIDs: its data is empty (nvml.h), so a change is logged as it happens and the verdict
//! reads the action itself every tick (`NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Mutex;
use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::time::{Duration, Instant};

use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{EventSet, Nvml};

use super::error::{ErrorCounter, LogLimiter};
use super::raw;
use crate::sample::DeviceSample;
use crate::sample::unix_now;

/// Distinct XID codes remembered per device; a device spraying random codes cannot grow the
/// series count without bound. Codes beyond it are dropped (and logged).
pub const MAX_XID_CODES_PER_DEVICE: usize = 64;

/// How long one `nvmlEventSetWait_v2` may block: the bound on how late shutdown is noticed.
const WAIT_MS: u32 = 1000;

/// The code NVML reports for an XID it could not identify (nvml-wrapper's `XidError::Unknown`).
const UNKNOWN_XID: u64 = 999;

/// `nvmlEventTypeGpuRecoveryAction` of nvml.h (R565), which nvml-wrapper's `EventTypes` lacks.
const GPU_RECOVERY_ACTION_EVENT: u64 =
    nvml_wrapper_sys::bindings::nvmlEventTypeGpuRecoveryAction as u64;

#[derive(Debug, Default, Clone, PartialEq)]
struct DeviceXids {
    counts: BTreeMap<u64, u64>,
    last_seconds: Option<f64>,
    /// The last code seen, dropped from `counts` or not.
    last_code: Option<u64>,
    /// Registered with the event thread that is running now.
    watched: bool,
}

/// Cumulative XID counts by device uuid, shared between the event thread and the sampler.
#[derive(Debug, Default)]
pub struct XidLog {
    devices: Mutex<HashMap<String, DeviceXids>>,
}

impl XidLog {
    /// Counts one XID `code` on the device `uuid`, seen at `at_seconds` (Unix time). Returns the
    /// code's new total, or None when the code was dropped (too many distinct codes).
    pub fn record(&self, uuid: &str, code: u64, at_seconds: f64) -> Option<u64> {
        let mut devices = self.devices.lock().unwrap_or_else(|p| p.into_inner());
        let d = devices.entry(uuid.to_string()).or_default();
        d.last_seconds = Some(at_seconds);
        d.last_code = Some(code);
        let full = d.counts.len() >= MAX_XID_CODES_PER_DEVICE;
        match d.counts.get_mut(&code) {
            Some(n) => {
                *n += 1;
                Some(*n)
            }
            None if full => None,
            None => {
                d.counts.insert(code, 1);
                Some(1)
            }
        }
    }

    /// Marks the devices `uuids` as watched (their XID events registered) or no longer.
    fn set_watched<'u>(&self, uuids: impl Iterator<Item = &'u String>, watched: bool) {
        let mut devices = self.devices.lock().unwrap_or_else(|p| p.into_inner());
        for uuid in uuids {
            devices.entry(uuid.clone()).or_default().watched = watched;
        }
    }

    /// Copies the counts, last event and whether it is watched into the matching devices of a
    /// snapshot.
    pub fn fill(&self, devices: &mut [DeviceSample]) {
        let log = self.devices.lock().unwrap_or_else(|p| p.into_inner());
        for d in devices {
            if let Some(x) = log.get(&d.uuid) {
                d.xid_counts = x.counts.clone();
                d.last_xid_timestamp_seconds = x.last_seconds;
                d.last_xid = x.last_code;
                d.xids_watched = x.watched;
            }
        }
    }

    /// Forgets devices that are no longer present (after a rediscovery), so their series go.
    pub fn retain(&self, uuids: &HashSet<String>) {
        self.devices
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|u, _| uuids.contains(u));
    }
}

/// The event loop, run on its own thread until `stop` receives or disconnects. Registers
/// XidCriticalError on every device that supports it; returns at once when none does. The
/// devices registered are marked watched in `log` while it runs.
pub fn watch_xids(nvml: &Nvml, log: &XidLog, errors: &ErrorCounter, stop: &Receiver<()>) {
    let Some((set, devices)) = register(nvml, errors) else {
        return;
    };
    log.set_watched(devices.iter().map(|(_, uuid)| uuid), true);
    wait_for_xids(&set, &devices, log, errors, stop);
    log.set_watched(devices.iter().map(|(_, uuid)| uuid), false);
}

/// Records the XIDs of `devices` (raw handle, uuid) that `set` delivers until `stop`.
fn wait_for_xids(
    set: &EventSet<'_>,
    devices: &[(usize, String)],
    log: &XidLog,
    errors: &ErrorCounter,
    stop: &Receiver<()>,
) {
    let mut limiter = LogLimiter::default();
    loop {
        match stop.try_recv() {
            Err(TryRecvError::Empty) => {}
            _ => return,
        }
        match set.wait(WAIT_MS) {
            Ok(event) => {
                let handle = raw::device_key(&event.device);
                let Some((_, uuid)) = devices.iter().find(|(h, _)| *h == handle) else {
                    continue;
                };
                // Only XIDs and recovery actions are registered, and nvml-wrapper drops the bit
                // of the latter: an event that is no XID is a recovery action change.
                let Some(xid) = event.event_data else {
                    if limiter.allow(&format!("{uuid}/recovery"), Instant::now()) {
                        tracing::warn!(
                            uuid,
                            "GPU recovery action changed (the verdict reads it at the next tick)"
                        );
                    }
                    continue;
                };
                let code = match xid {
                    XidError::Value(v) => v,
                    XidError::Unknown => UNKNOWN_XID,
                };
                let total = log.record(uuid, code, unix_now());
                // An XID storm delivers thousands a second: log each (GPU, code) at most
                // once a minute, with its running total; the counter has every one. The
                // keys are bounded: at most MAX_XID_CODES_PER_DEVICE + 1 per device.
                let key = match total {
                    Some(_) => format!("{uuid}/{code}"),
                    None => format!("{uuid}/dropped"),
                };
                if limiter.allow(&key, Instant::now()) {
                    match total {
                        Some(total) => tracing::warn!(uuid, xid = code, total, "XID event"),
                        None => tracing::warn!(
                            uuid,
                            xid = code,
                            "XID code dropped: too many distinct codes"
                        ),
                    }
                }
            }
            Err(NvmlError::Timeout) => {}
            Err(e) => {
                errors.record(None, "nvmlEventSetWait_v2", &e);
                // Don't spin on a persistent failure: pause, still listening for shutdown.
                match stop.recv_timeout(Duration::from_millis(u64::from(WAIT_MS))) {
                    Err(RecvTimeoutError::Timeout) => {}
                    _ => return,
                }
            }
        }
    }
}

/// Creates the event set and registers every device that supports XID events; the devices are
/// returned as (raw handle, uuid) so events can be attributed without further NVML calls.
fn register<'n>(
    nvml: &'n Nvml,
    errors: &ErrorCounter,
) -> Option<(EventSet<'n>, Vec<(usize, String)>)> {
    let count = match nvml.device_count() {
        Ok(n) => n,
        Err(e) => {
            errors.record(None, "nvmlDeviceGetCount_v2", &e);
            return None;
        }
    };
    let mut set = create_set(nvml, errors)?;
    let mut registered: Vec<(usize, String)> = Vec::new();
    // The types registered on each device, for registering them again in a new set.
    let mut masks: Vec<EventTypes> = Vec::new();
    for index in 0..count {
        let Ok(device) = nvml.device_by_index(index) else {
            continue;
        };
        let mask = match raw::supported_event_types(&device) {
            Ok(t) if t & EventTypes::CRITICAL_XID_ERROR.bits() != 0 => {
                EventTypes::from_bits_retain(
                    (t & GPU_RECOVERY_ACTION_EVENT) | EventTypes::CRITICAL_XID_ERROR.bits(),
                )
            }
            Ok(_) | Err(NvmlError::NotSupported) => continue,
            Err(e) => {
                errors.record(Some(index), "nvmlDeviceGetSupportedEventTypes", &e);
                continue;
            }
        };
        let Ok(uuid) = device.uuid() else { continue };
        match device.register_events(mask, set) {
            Ok(s) => {
                set = s;
                registered.push((raw::device_key(&device), uuid));
                masks.push(mask);
            }
            Err(e) => {
                errors.record(Some(index), "nvmlDeviceRegisterEvents", &e.error);
                // nvml-wrapper frees the set on failure: start a new one and re-register the
                // devices that were already in it.
                set = create_set(nvml, errors)?;
                let mut kept = Vec::new();
                let mut kept_masks = Vec::new();
                for ((handle, uuid), mask) in registered.into_iter().zip(masks) {
                    let Ok(d) = nvml.device_by_uuid(uuid.as_str()) else {
                        continue;
                    };
                    match d.register_events(mask, set) {
                        Ok(s) => {
                            set = s;
                            kept.push((handle, uuid));
                            kept_masks.push(mask);
                        }
                        Err(e) => {
                            errors.record(None, "nvmlDeviceRegisterEvents", &e.error);
                            return None;
                        }
                    }
                }
                registered = kept;
                masks = kept_masks;
            }
        }
    }
    if registered.is_empty() {
        None
    } else {
        Some((set, registered))
    }
}

fn create_set<'n>(nvml: &'n Nvml, errors: &ErrorCounter) -> Option<EventSet<'n>> {
    match nvml.create_event_set() {
        Ok(s) => Some(s),
        Err(NvmlError::NotSupported) => None,
        Err(e) => {
            errors.record(None, "nvmlEventSetCreate", &e);
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_accumulate_per_device_and_code() {
        let log = XidLog::default();
        log.record("GPU-a", 79, 10.0);
        log.record("GPU-a", 79, 11.0);
        log.record("GPU-a", 48, 12.0);
        let mut devices = vec![
            DeviceSample {
                uuid: "GPU-a".into(),
                ..Default::default()
            },
            DeviceSample {
                uuid: "GPU-b".into(),
                ..Default::default()
            },
        ];
        log.fill(&mut devices);
        assert_eq!(devices[0].xid_counts, BTreeMap::from([(48, 1), (79, 2)]));
        assert_eq!(devices[0].last_xid_timestamp_seconds, Some(12.0));
        assert_eq!(
            devices[0].last_xid,
            Some(48),
            "the last code, not the largest or commonest"
        );
        assert!(devices[1].xid_counts.is_empty());
        assert_eq!(devices[1].last_xid_timestamp_seconds, None);
        assert_eq!(devices[1].last_xid, None);
    }

    #[test]
    fn watched_devices_are_marked_until_their_thread_ends() {
        let log = XidLog::default();
        let watched = ["GPU-a".to_string()];
        log.set_watched(watched.iter(), true);
        let mut d = vec![
            DeviceSample {
                uuid: "GPU-a".into(),
                ..Default::default()
            },
            DeviceSample {
                uuid: "GPU-b".into(),
                ..Default::default()
            },
        ];
        log.fill(&mut d);
        assert!(d[0].xids_watched && d[0].last_xid.is_none());
        assert!(!d[1].xids_watched, "never registered");
        log.record("GPU-a", 31, 1.0);
        log.set_watched(watched.iter(), false);
        log.fill(&mut d);
        assert!(!d[0].xids_watched);
        assert_eq!(d[0].last_xid, Some(31), "what was seen stays");
    }

    #[test]
    fn distinct_codes_are_bounded_per_device() {
        let log = XidLog::default();
        for code in 0..MAX_XID_CODES_PER_DEVICE as u64 {
            assert_eq!(log.record("GPU-a", code, 1.0), Some(1));
        }
        for code in 0..10 {
            assert_eq!(log.record("GPU-a", 1000 + code, 1.0), None, "dropped");
        }
        assert_eq!(
            log.record("GPU-a", 0, 2.0),
            Some(2),
            "a known code still counts"
        );
        let mut d = vec![DeviceSample {
            uuid: "GPU-a".into(),
            ..Default::default()
        }];
        log.fill(&mut d);
        assert_eq!(d[0].xid_counts.len(), MAX_XID_CODES_PER_DEVICE);
        assert_eq!(d[0].xid_counts[&0], 2);
    }

    #[test]
    fn retain_forgets_departed_devices() {
        let log = XidLog::default();
        log.record("GPU-a", 79, 1.0);
        log.record("GPU-b", 79, 1.0);
        log.retain(&HashSet::from(["GPU-b".to_string()]));
        let mut d = vec![
            DeviceSample {
                uuid: "GPU-a".into(),
                ..Default::default()
            },
            DeviceSample {
                uuid: "GPU-b".into(),
                ..Default::default()
            },
        ];
        log.fill(&mut d);
        assert!(d[0].xid_counts.is_empty());
        assert_eq!(d[1].xid_counts.len(), 1);
    }
}
