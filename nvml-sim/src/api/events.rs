//! Event sets: create, register a device, wait (blocking up to the timeout), free.

use crate::events::{RECOVERY_EVENT, XID_EVENT};
use crate::ffi::{self, INVALID_ARGUMENT, NOT_SUPPORTED, device_fns, plain_fns, write};
use crate::state::{self, Sim};
use nvml_wrapper_sys::bindings::{self as b, nvmlDevice_t, nvmlEventData_t, nvmlEventSet_t};
use std::os::raw::{c_uint, c_ulonglong};
use std::time::{Duration, Instant};

/// The event types a device accepts: XID, P-state and clock changes, plus ECC with ECC on, plus
/// the recovery action from R565 on (nvml.h).
fn supported_types(c: &crate::ffi::DeviceCall) -> u64 {
    let mut types = XID_EVENT | b::nvmlEventTypePState as u64 | b::nvmlEventTypeClock as u64;
    if c.gpu.ecc.enabled {
        types |= (b::nvmlEventTypeSingleBitEccError | b::nvmlEventTypeDoubleBitEccError) as u64;
    }
    if c.sim.scenario.driver.branch() >= 565 {
        types |= RECOVERY_EVENT;
    }
    types
}

/// The event data of `nvmlEventSetWait` (before GPU/compute instance ids were added).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct EventDataV1 {
    /// Device the event happened on.
    pub device: nvmlDevice_t,
    /// Event type.
    pub event_type: c_ulonglong,
    /// XID number for XID events.
    pub event_data: c_ulonglong,
}

/// Blocks until an event is due or `timeout_ms` elapses.
fn wait(sim: &Sim, set: nvmlEventSet_t, timeout_ms: c_uint) -> Result<nvmlEventData_t, u32> {
    let id = set as usize;
    let deadline = Instant::now() + Duration::from_millis(timeout_ms as u64);
    loop {
        let now = sim.now();
        let next = match sim.events.poll(id, &sim.scenario.events, now) {
            None => return Err(INVALID_ARGUMENT),
            Some(Ok(ev)) => {
                return Ok(nvmlEventData_t {
                    device: ffi::handle_of(ev.gpu),
                    eventType: if ev.recovery {
                        RECOVERY_EVENT
                    } else {
                        XID_EVENT
                    },
                    eventData: ev.xid,
                    gpuInstanceId: u32::MAX,
                    computeInstanceId: u32::MAX,
                });
            }
            Some(Err(next)) => next,
        };
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(b::nvmlReturn_enum_NVML_ERROR_TIMEOUT);
        }
        // Sleep until the next event is due (it can only become due on a running clock) or the
        // deadline, whichever is first; then look again.
        let until_event = match (next, sim.clock.pinned) {
            (Some(due), None) => Duration::from_secs_f64((due - now).max(0.0)),
            _ => left,
        };
        std::thread::sleep(left.min(until_event).max(Duration::from_millis(1)));
    }
}

plain_fns! {
    /// Creates an event set.
    fn nvmlEventSetCreate(set: *mut nvmlEventSet_t) {
        let sim = state::sim()?;
        if set.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        write(set, sim.events.create() as nvmlEventSet_t)
    }
    /// Frees an event set.
    fn nvmlEventSetFree(set: nvmlEventSet_t) {
        let sim = state::sim()?;
        if sim.events.free(set as usize) { Ok(()) } else { Err(INVALID_ARGUMENT) }
    }
    /// Waits for the next event (v2 data: with instance ids).
    fn nvmlEventSetWait_v2(set: nvmlEventSet_t, data: *mut nvmlEventData_t, timeout_ms: c_uint) {
        let sim = state::sim()?;
        if data.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        write(data, wait(&sim, set, timeout_ms)?)
    }
    /// Waits for the next event (v1 data).
    fn nvmlEventSetWait(set: nvmlEventSet_t, data: *mut EventDataV1, timeout_ms: c_uint) {
        let sim = state::sim()?;
        if data.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        let ev = wait(&sim, set, timeout_ms)?;
        write(data, EventDataV1 { device: ev.device, event_type: ev.eventType, event_data: ev.eventData })
    }
}

device_fns! {
    /// Event types the device can report.
    fn nvmlDeviceGetSupportedEventTypes(event_types: *mut c_ulonglong) |c| {
        write(event_types, supported_types(c))
    }
    /// Registers the device in an event set for `event_types`.
    fn nvmlDeviceRegisterEvents(event_types: c_ulonglong, set: nvmlEventSet_t) |c| {
        if event_types & !supported_types(c) != 0 {
            return Err(NOT_SUPPORTED);
        }
        if c.sim.events.register(set as usize, c.index, event_types, c.t) {
            Ok(())
        } else {
            Err(INVALID_ARGUMENT)
        }
    }
}
