//! Event sets: XID events from the scenario, and the changes of a GPU's recovery action, delivered
//! to the sets registered for them before they happen.
//!
//! An event occurrence is ordered by (time, index in the scenario). A registration remembers the
//! last occurrence it delivered (initially: its registration time), so each occurrence in
//! (registered, now] is delivered once, in order.

use crate::scenario::EventSpec;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

/// `nvmlEventTypeXidCriticalError`.
pub const XID_EVENT: u64 = nvml_wrapper_sys::bindings::nvmlEventTypeXidCriticalError as u64;

/// `nvmlEventTypeGpuRecoveryAction` (nvml.h, R565): the recovery action changed; its event data
/// is 0.
pub const RECOVERY_EVENT: u64 = nvml_wrapper_sys::bindings::nvmlEventTypeGpuRecoveryAction as u64;

/// An occurrence key: (time, scenario event index).
type Key = (f64, usize);

#[derive(Debug, Clone)]
struct Registration {
    gpu: usize,
    mask: u64,
    delivered: Key,
}

/// The event sets of a simulation, by id (the id is the handle the caller sees).
#[derive(Debug, Default)]
pub struct EventSets {
    sets: Mutex<HashMap<usize, Vec<Registration>>>,
}

/// The next set id. Ids are unique across the simulations of the process, so the handle of a set
/// of an earlier simulation is unknown to a later one.
static NEXT_ID: AtomicUsize = AtomicUsize::new(1);

/// An event handed to the caller.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Delivered {
    /// GPU index.
    pub gpu: usize,
    /// XID number (0 for a recovery action change).
    pub xid: u64,
    /// When it happened.
    pub t: f64,
    /// A recovery action change rather than an XID.
    pub recovery: bool,
}

/// The first occurrence of event `i` strictly after `after`. A storm (`rate`) is a burst of
/// occurrences `1 / rate` apart, repeating like a single event.
fn next_occurrence(e: &EventSpec, i: usize, after: Key) -> Option<Key> {
    let gt = |a: Key| a.0 > after.0 || (a.0 == after.0 && a.1 > after.1);
    let (count, step) = e.burst();
    // The cycle (repeat period) `after` falls in; the next occurrence is in it or the next one.
    // Starting one cycle early absorbs rounding in the division.
    let cycles = match e.repeat {
        Some(period) => {
            let c = ((after.0 - e.t) / period).floor().max(0.0);
            let first = (c - 1.0).max(0.0);
            (first as u64..=c as u64 + 1)
                .map(|c| e.t + c as f64 * period)
                .collect()
        }
        None => vec![e.t],
    };
    for base in cycles {
        // The first burst index past `after`, found by division and nudged over rounding.
        let mut k = if step > 0.0 {
            (((after.0 - base) / step).floor().max(0.0) as u64).saturating_sub(1)
        } else {
            0
        };
        while k < count && !gt((base + k as f64 * step, i)) {
            k += 1;
        }
        if k < count {
            return Some((base + k as f64 * step, i));
        }
    }
    None
}

impl EventSets {
    fn lock(&self) -> MutexGuard<'_, HashMap<usize, Vec<Registration>>> {
        self.sets.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Creates an empty set and returns its id (never 0, so the handle is never null).
    pub fn create(&self) -> usize {
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        self.lock().insert(id, Vec::new());
        id
    }

    /// Frees a set; false if unknown.
    pub fn free(&self, id: usize) -> bool {
        self.lock().remove(&id).is_some()
    }

    /// Registers `gpu` for the event types in `mask` at time `t`; false if the set is unknown.
    pub fn register(&self, id: usize, gpu: usize, mask: u64, t: f64) -> bool {
        let mut sets = self.lock();
        let Some(regs) = sets.get_mut(&id) else {
            return false;
        };
        match regs.iter_mut().find(|r| r.gpu == gpu) {
            Some(r) => r.mask |= mask,
            None => regs.push(Registration {
                gpu,
                mask,
                delivered: (t, usize::MAX),
            }),
        }
        true
    }

    /// Takes the next event due by `now`, or tells when the next one is due.
    /// `None`: unknown set. `Some(Err(due))`: nothing yet; the next occurrence is at `due`.
    pub fn poll(
        &self,
        id: usize,
        events: &[EventSpec],
        now: f64,
    ) -> Option<Result<Delivered, Option<f64>>> {
        let mut sets = self.lock();
        let regs = sets.get_mut(&id)?;
        let mut best: Option<(Key, usize)> = None;
        for (r, reg) in regs.iter().enumerate() {
            let wanted = |e: &EventSpec| {
                let kind = if e.recovery {
                    RECOVERY_EVENT
                } else {
                    XID_EVENT
                };
                e.gpu == reg.gpu && reg.mask & kind != 0
            };
            for (i, e) in events.iter().enumerate().filter(|(_, e)| wanted(e)) {
                let Some(k) = next_occurrence(e, i, reg.delivered) else {
                    continue;
                };
                if best.is_none_or(|(b, _)| k < b) {
                    best = Some((k, r));
                }
            }
        }
        match best {
            Some((key, r)) if key.0 <= now => {
                regs[r].delivered = key;
                Some(Ok(Delivered {
                    gpu: regs[r].gpu,
                    xid: events[key.1].xid,
                    t: key.0,
                    recovery: events[key.1].recovery,
                }))
            }
            other => Some(Err(other.map(|(k, _)| k.0))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(t: f64, gpu: usize, xid: u64, repeat: Option<f64>) -> EventSpec {
        EventSpec {
            t,
            gpu,
            xid,
            repeat,
            rate: None,
            seconds: None,
            recovery: false,
        }
    }

    #[test]
    fn a_storm_delivers_rate_times_seconds_events_per_burst() {
        let storm = EventSpec {
            rate: Some(1000.0),
            seconds: Some(2.0),
            ..ev(10.0, 0, 31, Some(60.0))
        };
        let events = [storm, ev(11.0, 0, 79, None)];
        let sets = EventSets::default();
        let id = sets.create();
        assert!(sets.register(id, 0, XID_EVENT, 0.0));
        let got: Vec<_> = std::iter::from_fn(|| sets.poll(id, &events, 20.0)?.ok()).collect();
        assert_eq!(got.len(), 2001, "2000 storm events and the single one");
        assert_eq!(got.iter().filter(|d| d.xid == 79).count(), 1);
        assert!(got.windows(2).all(|w| w[0].t <= w[1].t), "in time order");
        assert_eq!(got.first().unwrap().t, 10.0);
        assert!((got.last().unwrap().t - 11.999).abs() < 1e-9);
        // The next burst starts a period later.
        assert_eq!(sets.poll(id, &events, 20.0).unwrap(), Err(Some(70.0)));
        // Registered in the middle of a burst: only the rest of it.
        let id2 = sets.create();
        assert!(sets.register(id2, 0, XID_EVENT, 71.5));
        let rest = std::iter::from_fn(|| sets.poll(id2, &events, 80.0)?.ok()).count();
        assert_eq!(rest, 499);
    }

    #[test]
    fn delivers_each_occurrence_once_in_order_after_registration() {
        let events = [
            ev(30.0, 1, 79, None),
            ev(10.0, 0, 48, Some(20.0)),
            ev(5.0, 1, 13, None),
        ];
        let sets = EventSets::default();
        let id = sets.create();
        assert!(sets.register(id, 1, XID_EVENT, 6.0));
        assert!(sets.register(id, 0, XID_EVENT, 6.0));
        // t=5 on gpu1 happened before registration: never delivered.
        let got: Vec<_> = std::iter::from_fn(|| sets.poll(id, &events, 50.0)?.ok())
            .map(|d| (d.t, d.gpu, d.xid))
            .collect();
        assert_eq!(
            got,
            vec![(10.0, 0, 48), (30.0, 1, 79), (30.0, 0, 48), (50.0, 0, 48)]
        );
        assert_eq!(sets.poll(id, &events, 50.0).unwrap(), Err(Some(70.0)));
        assert!(sets.free(id));
        assert!(sets.poll(id, &events, 50.0).is_none());
    }

    #[test]
    fn recovery_action_changes_go_to_the_sets_registered_for_them() {
        let change = EventSpec {
            recovery: true,
            ..ev(5.0, 0, 0, None)
        };
        let events = [ev(1.0, 0, 79, None), change];
        let sets = EventSets::default();
        let xids_only = sets.create();
        sets.register(xids_only, 0, XID_EVENT, 0.0);
        let both = sets.create();
        sets.register(both, 0, XID_EVENT | RECOVERY_EVENT, 0.0);
        let kinds = |id| {
            std::iter::from_fn(|| sets.poll(id, &events, 10.0)?.ok())
                .map(|d| (d.xid, d.recovery))
                .collect::<Vec<_>>()
        };
        assert_eq!(kinds(xids_only), vec![(79, false)]);
        assert_eq!(kinds(both), vec![(79, false), (0, true)]);
    }

    #[test]
    fn unregistered_types_get_nothing() {
        let events = [ev(1.0, 0, 79, None)];
        let sets = EventSets::default();
        let id = sets.create();
        sets.register(id, 0, 0x4, 0.0);
        assert_eq!(sets.poll(id, &events, 10.0).unwrap(), Err(None));
    }
}
