//! One NVML session: the devices found at one initialisation, their reader threads and XID
//! thread, one tick at a time, and the [`Snapshot`] of each tick.
//!
//! Each device has a [`Slot`]: its reading state while it is idle, its last reading and whether
//! that is fresh. A device that misses a tick's deadline, or whose read was
//! [unanswered](Verdict::Unanswered) (calls failed and none answered, whatever the error), is
//! served from its last reading marked `stale`, and with `up = false` once that reading is older
//! than the grace period; a device never read at all is served by its index (and identity, when
//! known) only, down. A late reading is taken whenever it arrives and served (stale) at the next
//! snapshot.
//!
//! Each slot also integrates its device's busy time over the readings it takes (see
//! [`super::busy`]), so the counters live as long as the session and flow out with the readings.
//!
//! A tick is *complete* when at least one device answered within its deadline (or there are no
//! devices): only then does `last_tick_timestamp_seconds` advance, so `/readyz` turns 503 when
//! every device hangs or fails every call.

use std::path::{Path, PathBuf};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;
use nvml_wrapper::Nvml;

use super::busy::{Busy, BusyClock};
use super::readers::{Answer, Readers};
use super::threads::ThreadGroup;
use super::{SamplerOptions, Stopped};
use crate::groups::{Group, Groups};
use crate::health::rules::{self, Reading};
use crate::health::{self, Node, Tracker};
use crate::nvml::device::{DeviceReader, ReadOutcome};
use crate::nvml::discovery;
use crate::nvml::error::{ErrorClass, ErrorCounter, NvmlUnavailable, classify};
use crate::nvml::events::{XidLog, watch_xids};
use crate::nvml::ledger::Verdict;
use crate::pci;
use crate::sample::unix_now;
use crate::sample::{DeviceSample, PciGpu, Snapshot, SystemInfo};

/// How long stopping a session's readers (and its XID thread) may take before the threads still
/// inside a hung NVML call are left behind.
const READER_STOP_BOUND: Duration = Duration::from_secs(2);

/// The devices and threads of one NVML initialisation.
pub(super) struct Session {
    system: SystemInfo,
    /// One per device, by NVML index.
    slots: Vec<Slot>,
    readers: Readers,
    /// The readers and the XID thread.
    threads: ThreadGroup,
    /// Dropping it tells the XID thread to stop.
    xid_stop: Option<mpsc::Sender<()>>,
    /// Ticks started in this session; the number of the next one.
    ticks: u64,
    /// End of the last complete tick (Unix seconds), if any in this session.
    last_complete: Option<f64>,
    /// Where devices look their processes up, when they read them (see [`Session::configure`]).
    processes: Option<PathBuf>,
    /// The collector groups whose calls devices make (see [`Session::configure`]).
    groups: Groups,
    /// The longest time between two readings of a device that busy time is integrated over: an
    /// interval and a device deadline (see [`super::busy`]).
    max_busy_gap: Duration,
    /// Below this activity a reading counts as idle (`--idle-threshold`).
    idle_threshold: f64,
    /// What the XID thread needs, to start it when the `xid` group is turned on.
    nvml: Arc<Nvml>,
    errors: Arc<ErrorCounter>,
    xid_log: Option<Arc<XidLog>>,
    /// The host's sysfs, when the `inventory` group is on (see [`Session::configure`]).
    host_sys: Option<PathBuf>,
    /// The last scan of its PCI bus.
    bus: Option<BusScan>,
}

/// How often the PCI bus is read again: its devices change only when one is hot-plugged, removed
/// or bound to another driver, and a scan costs some microseconds per PCI function (hundreds on a
/// GPU server), so it is not worth every tick. Each session reads it at its first tick.
const BUS_SCAN_PERIOD: Duration = Duration::from_secs(30);

/// A scan of the PCI bus: when, below which sysfs, and the GPUs NVML should enumerate (`None`:
/// the bus could not be read).
struct BusScan {
    at: Instant,
    sys: PathBuf,
    gpus: Option<Vec<PciGpu>>,
}

impl Session {
    /// Reads system info and the device count, then prepares each device's reader (reading
    /// processes too when `opts` say so) and, when `xids` is given, starts the XID thread.
    pub(super) fn start(
        nvml: Arc<Nvml>,
        opts: &SamplerOptions,
        errors: &Arc<ErrorCounter>,
        xids: Option<&Arc<XidLog>>,
    ) -> Result<Session, NvmlUnavailable> {
        let system = discovery::system_info(&nvml, errors);
        let count = nvml.device_count().map_err(|source| {
            if classify(&source) != ErrorClass::DriverGone {
                errors.record(None, "nvmlDeviceGetCount_v2", &source);
            }
            NvmlUnavailable::DeviceCount { source }
        })?;
        let slots = (0..count)
            .map(|index| {
                Slot::new(DeviceReader::new(
                    Arc::clone(&nvml),
                    index,
                    Arc::clone(errors),
                ))
            })
            .collect();
        let mut session = Session {
            system,
            slots,
            readers: Readers::new(opts.device_timeout),
            threads: ThreadGroup::new(),
            xid_stop: None,
            ticks: 0,
            last_complete: None,
            processes: None,
            groups: Groups::none(),
            max_busy_gap: opts.interval + opts.device_timeout,
            idle_threshold: opts.idle_threshold,
            nvml,
            errors: Arc::clone(errors),
            xid_log: xids.cloned(),
            host_sys: None,
            bus: None,
        };
        session.configure(opts);
        Ok(session)
    }

    /// Takes the options that may change between ticks (a configuration reload): each device
    /// follows them from its next read (see [`Session::tick`]). An option that changes what a
    /// device reads belongs here, not only in [`Session::start`].
    pub(super) fn configure(&mut self, opts: &SamplerOptions) {
        self.groups = opts.groups;
        self.max_busy_gap = opts.interval + opts.device_timeout;
        self.idle_threshold = opts.idle_threshold;
        self.processes = opts
            .processes
            .clone()
            .filter(|_| opts.groups.contains(Group::Processes));
        self.host_sys = opts
            .groups
            .contains(Group::Inventory)
            .then(|| opts.host_sys.clone());
        // Without the xid and health groups no event set is registered; with either, one thread
        // watches.
        let health = opts.groups.contains(Group::Health) && rules::needs(Reading::XidEvents);
        if !opts.groups.contains(Group::Xid) && !health {
            self.xid_stop = None;
        } else if self.xid_stop.is_none()
            && let Some(log) = &self.xid_log
        {
            let (stop_tx, stop_rx) = mpsc::channel();
            let (nvml, log, errors) = (
                Arc::clone(&self.nvml),
                Arc::clone(log),
                Arc::clone(&self.errors),
            );
            match self.threads.spawn("nvml-xid".into(), move || {
                watch_xids(&nvml, &log, &errors, &stop_rx)
            }) {
                Ok(()) => self.xid_stop = Some(stop_tx),
                Err(e) => tracing::error!("cannot start the XID event thread: {e}"),
            }
        }
    }

    /// System-wide versions, read at the start of the session.
    pub(super) fn system(&self) -> &SystemInfo {
        &self.system
    }

    /// How many devices the session has.
    pub(super) fn device_count(&self) -> usize {
        self.slots.len()
    }

    /// Runs one tick: queues every idle device (a device still inside an earlier call is not
    /// asked again) and waits until each has answered or `deadline` passes. `start` is when the
    /// tick was due. `Err` when `stop` disconnects.
    pub(super) fn tick(
        &mut self,
        start: Instant,
        deadline: Instant,
        stop: &Receiver<()>,
    ) -> Result<(), Stopped> {
        let tick = self.ticks;
        self.ticks += 1;
        // Late answers of earlier ticks first, so that their devices are asked again.
        self.wait_until(start, stop)?;
        let mut missing = 0;
        for slot in &mut self.slots {
            slot.fresh = false;
            if let Some(mut device) = slot.device.take() {
                device.set_groups(self.groups);
                device.set_processes(self.processes.as_deref());
                self.readers.queue(tick, device, &mut self.threads);
                missing += 1;
            }
        }
        let stall = self.readers.stall_limit();
        let mut next_stall = Instant::now() + stall;
        while missing > 0 {
            match self.readers.next_answer(stop, next_stall.min(deadline))? {
                Some(answer) => {
                    if answer.tick == tick {
                        missing -= 1;
                    }
                    self.take(answer, Some(tick));
                }
                None if Instant::now() >= deadline => break,
                None => {
                    self.readers.relieve_stall(&mut self.threads);
                    // From now: a coordinator that ran late starts one reader, not one per
                    // stall limit it missed.
                    next_stall = Instant::now() + stall;
                }
            }
        }
        for device in self.readers.take_back() {
            if let Some(slot) = self.slots.get_mut(device.index() as usize) {
                slot.device = Some(device);
            }
        }
        let reading = self.slots.iter().filter(|s| s.device.is_none()).count();
        self.readers.retire_surplus(reading, Instant::now());
        Ok(())
    }

    /// Waits until `until`, taking the late answers that arrive meanwhile. `Err` when `stop`
    /// disconnects.
    pub(super) fn wait_until(
        &mut self,
        until: Instant,
        stop: &Receiver<()>,
    ) -> Result<(), Stopped> {
        while let Some(answer) = self.readers.next_answer(stop, until)? {
            self.take(answer, None);
        }
        Ok(())
    }

    /// Takes a reading: its device is idle again, and fresh when it answers `tick`.
    fn take(&mut self, answer: Answer, tick: Option<u64>) {
        let Some(slot) = self.slots.get_mut(answer.device.index() as usize) else {
            return;
        };
        slot.take(
            answer.outcome,
            answer.at,
            tick == Some(answer.tick),
            Busy {
                max_gap: self.max_busy_gap,
                idle_threshold: self.idle_threshold,
            },
        );
        slot.device = Some(answer.device);
    }

    /// True when every device that answered this tick says the driver is gone.
    pub(super) fn driver_gone(&self) -> bool {
        let mut fresh = self.slots.iter().filter(|s| s.fresh).peekable();
        fresh.peek().is_some() && fresh.all(|s| s.driver_gone)
    }

    /// True when a device answered this tick that its index no longer exists (e.g. after a
    /// driver restart that every device answered GPU_IS_LOST, a GPU is missing).
    pub(super) fn device_set_changed(&self) -> bool {
        self.slots.iter().any(|s| s.fresh && s.vanished)
    }

    /// The snapshot of the tick that started at `started`; marks the tick complete when a device
    /// answered in it (see the module doc). With `xids`, each device carries its XID counts;
    /// `health` gives each its verdict when the health group is on.
    pub(super) fn snapshot(
        &mut self,
        started: Instant,
        grace: Duration,
        errors: &ErrorCounter,
        xids: Option<&XidLog>,
        health: &mut Tracker,
    ) -> Snapshot {
        let now = Instant::now();
        if self.slots.is_empty() || self.slots.iter().any(|s| s.fresh) {
            self.last_complete = Some(unix_now());
        }
        let mut devices: Vec<DeviceSample> =
            self.slots.iter_mut().map(|s| s.view(now, grace)).collect();
        if let Some(xids) = xids {
            xids.fill(&mut devices);
        }
        if self.groups.contains(Group::Health) {
            let node = Node::of(&devices);
            for d in &mut devices {
                d.health = Some(health.evaluate(d, node, now));
            }
            health.persist();
        }
        let missing_gpus = match self.host_sys.clone() {
            Some(sys) => self.bus_gpus(&sys, now).and_then(|bus| {
                pci::missing(bus, devices.iter().map(|d| d.info.pci_bus_id.as_str()))
            }),
            None => None,
        };
        let node_health = missing_gpus
            .as_deref()
            .filter(|_| self.groups.contains(Group::Health))
            .map(health::node_verdict);
        Snapshot {
            nvml_up: true,
            nvml_error: None,
            system: self.system.clone(),
            devices: self
                .slots
                .iter_mut()
                .zip(devices)
                .map(|(slot, device)| slot.publish(device))
                .collect(),
            nvml_errors: errors.snapshot(),
            tick_duration_seconds: Some(now.duration_since(started).as_secs_f64()),
            last_tick_timestamp_seconds: self.last_complete,
            // Attached when the snapshot is published: the sampler only reads NVML.
            kubernetes: None,
            jobs: None,
            workloads: None,
            health_state: health.store_errors(),
            missing_gpus,
            node_health,
        }
    }

    /// The GPUs NVML should enumerate, from the PCI bus below `sys` as it was read at most
    /// [`BUS_SCAN_PERIOD`] ago; `None` when it cannot be read (logged when that starts).
    fn bus_gpus(&mut self, sys: &Path, now: Instant) -> Option<&[PciGpu]> {
        let due = self
            .bus
            .as_ref()
            .is_none_or(|b| b.sys != sys || now.saturating_duration_since(b.at) >= BUS_SCAN_PERIOD);
        if due {
            let read_before = self.bus.as_ref().is_none_or(|b| b.gpus.is_some());
            let gpus = match pci::expected_gpus(sys) {
                Ok(gpus) => Some(gpus),
                Err(e) => {
                    if read_before {
                        tracing::warn!(
                            path = %sys.display(),
                            error = %e,
                            "cannot read the PCI bus: a GPU NVML does not enumerate goes unseen (nvidia_node_gpus_missing is absent)"
                        );
                    }
                    None
                }
            };
            self.bus = Some(BusScan {
                at: now,
                sys: sys.to_owned(),
                gpus,
            });
        }
        self.bus.as_ref()?.gpus.as_deref()
    }

    /// Stops the readers and the XID thread; those that do not return within the bound (stuck in
    /// NVML) are left detached and exit by themselves when their call returns.
    pub(super) fn stop(self) {
        self.readers.stop();
        drop(self.xid_stop);
        if !self.threads.join_within(READER_STOP_BOUND) {
            tracing::warn!(
                "a device reader is stuck in an NVML call; left detached after {READER_STOP_BOUND:?}"
            );
        }
    }
}

/// One device as the session sees it.
struct Slot {
    index: u32,
    /// The device's reading state while it is idle; `None` while it is queued or being read.
    device: Option<Box<DeviceReader>>,
    /// It was asked this tick and answered this tick.
    fresh: bool,
    /// The last reading, until a snapshot takes it.
    unpublished: Option<DeviceSample>,
    /// What the last snapshot served for the device: served again, stale, until a new reading.
    published: Option<Arc<DeviceSample>>,
    /// What the last reading said of the driver and of the device's index.
    driver_gone: bool,
    vanished: bool,
    last_at: Option<Instant>,
    /// The device's busy time, added to by each reading it takes.
    busy: BusyClock,
}

impl Slot {
    fn new(device: DeviceReader) -> Slot {
        Slot {
            index: device.index(),
            device: Some(Box::new(device)),
            fresh: false,
            unpublished: None,
            published: None,
            driver_gone: false,
            vanished: false,
            last_at: None,
            busy: BusyClock::default(),
        }
    }

    /// Takes a read made at `at`, of the current tick when `this_tick`. An unanswered read is no
    /// reading: the last one stays, ageing towards the grace, and the device is not fresh. A
    /// reading of a device that is up adds to its busy time (as `busy` says); any other read is
    /// a gap in it.
    fn take(&mut self, mut reading: ReadOutcome, at: Instant, this_tick: bool, busy: Busy) {
        self.driver_gone = reading.verdict == Verdict::DriverGone;
        self.vanished = reading.vanished;
        if reading.verdict == Verdict::Up {
            self.busy.add(&mut reading.sample, at, busy);
        } else {
            self.busy.gap();
        }
        if reading.verdict == Verdict::Unanswered {
            self.fresh = false;
            if self.unpublished.is_none() && self.published.is_none() {
                // Never read: served down, by its identity if that is known.
                let s = reading.sample;
                self.unpublished = Some(DeviceSample {
                    index: s.index,
                    uuid: s.uuid,
                    info: s.info,
                    ..DeviceSample::default()
                });
            }
            return;
        }
        self.fresh = this_tick;
        self.unpublished = Some(reading.sample);
        self.last_at = Some(at);
    }

    /// What the device looks like in this tick's snapshot: its last reading, moved out when no
    /// snapshot has served it yet, else a copy of what the last snapshot served; marked stale
    /// unless it is this tick's, and down once older than `grace`.
    fn view(&mut self, now: Instant, grace: Duration) -> DeviceSample {
        let mut s = match (self.unpublished.take(), &self.published) {
            (Some(sample), _) => sample,
            // Already marked stale, with `up` cut by its age then: the rule below gives the same
            // again, as the age only grows.
            (None, Some(served)) => DeviceSample::clone(served),
            // Never answered yet: known only by its index.
            (None, None) => {
                return DeviceSample {
                    index: self.index,
                    stale: true,
                    ..DeviceSample::default()
                };
            }
        };
        if !self.fresh {
            s.stale = true;
            let age = self
                .last_at
                .map_or(Duration::MAX, |at| now.duration_since(at));
            s.up = s.up && age <= grace;
        }
        s
    }

    /// Shares `device` with the snapshot, keeping it to serve again if the next tick misses.
    fn publish(&mut self, device: DeviceSample) -> Arc<DeviceSample> {
        let device = Arc::new(device);
        self.published = Some(Arc::clone(&device));
        device
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How [`Slot::take`] integrates busy time.
    const GAP: Busy = Busy {
        max_gap: Duration::from_secs(2),
        idle_threshold: 0.05,
    };

    fn outcome(up: bool, power: f64) -> ReadOutcome {
        ReadOutcome {
            sample: DeviceSample {
                index: 2,
                uuid: "GPU-x".into(),
                up,
                power_watts: Some(power),
                ..Default::default()
            },
            verdict: if up { Verdict::Up } else { Verdict::Lost },
            vanished: false,
        }
    }

    /// A read in which every call failed: the device reader's sample holds the identity only.
    fn unanswered() -> ReadOutcome {
        ReadOutcome {
            sample: DeviceSample {
                index: 2,
                uuid: "GPU-x".into(),
                ..Default::default()
            },
            verdict: Verdict::Unanswered,
            vanished: false,
        }
    }

    /// A slot for device 2, with no reading state (not read by these tests).
    fn slot() -> Slot {
        Slot {
            index: 2,
            device: None,
            fresh: false,
            unpublished: None,
            published: None,
            driver_gone: false,
            vanished: false,
            last_at: None,
            busy: BusyClock::default(),
        }
    }

    /// The slot's view, published as a snapshot would.
    fn served(slot: &mut Slot, now: Instant, grace: Duration) -> Arc<DeviceSample> {
        let view = slot.view(now, grace);
        slot.publish(view)
    }

    #[test]
    fn a_late_device_is_stale_then_down_after_the_grace() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let grace = Duration::from_secs(5);
        let mut slot = slot();
        slot.take(outcome(true, 100.0), t0, true, GAP);
        let fresh = served(&mut slot, t0, grace);
        assert!(fresh.up && !fresh.stale);

        // The next ticks miss the deadline: served from the last reading.
        slot.fresh = false;
        let stale = served(&mut slot, at(2), grace);
        assert!(stale.up && stale.stale);
        assert_eq!(
            stale.power_watts,
            Some(100.0),
            "served from the last reading"
        );
        let down = served(&mut slot, at(6), grace);
        assert!(!down.up && down.stale);
        assert_eq!(down.power_watts, Some(100.0));

        // A late answer arrives between ticks: the next snapshot serves it (stale, but within
        // the grace again) rather than the older reading the last snapshot had.
        slot.take(outcome(true, 200.0), at(7), false, GAP);
        let late = served(&mut slot, at(8), grace);
        assert!(late.up && late.stale);
        assert_eq!(late.power_watts, Some(200.0));
    }

    #[test]
    fn a_fresh_reading_is_shared_with_the_snapshot_not_copied() {
        let t0 = Instant::now();
        let mut slot = slot();
        slot.take(outcome(true, 100.0), t0, true, GAP);
        let fresh = served(&mut slot, t0, Duration::from_secs(5));
        assert!(Arc::ptr_eq(&fresh, slot.published.as_ref().unwrap()));
    }

    #[test]
    fn a_device_never_read_is_down() {
        let now = Instant::now();
        let grace = Duration::from_secs(5);
        let mut slot = slot();
        let d = served(&mut slot, now, grace);
        assert_eq!((d.index, d.up, d.stale), (2, false, true));
        // And stays so, tick after tick, until it answers.
        let d = served(&mut slot, now + grace * 2, grace);
        assert_eq!(
            (d.index, d.up, d.stale, d.power_watts),
            (2, false, true, None)
        );
    }

    #[test]
    fn a_device_that_fails_every_call_is_stale_then_down_and_comes_back() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let grace = Duration::from_secs(5);
        let mut slot = slot();
        slot.take(outcome(true, 100.0), t0, true, GAP);
        assert!(served(&mut slot, t0, grace).up);

        // Every tick from 1 s on is answered in time, but every call of it failed: not fresh,
        // served from the last good reading until the grace is over, then down.
        for s in 1..=5 {
            slot.fresh = false;
            slot.take(unanswered(), at(s), true, GAP);
            let d = served(&mut slot, at(s), grace);
            assert!(d.up && d.stale, "{s} s: {d:?}");
            assert_eq!(d.power_watts, Some(100.0), "{s} s: the last good reading");
        }
        slot.fresh = false;
        slot.take(unanswered(), at(6), true, GAP);
        let down = served(&mut slot, at(6), grace);
        assert!(!down.up && down.stale, "{down:?}");
        assert_eq!(down.uuid, "GPU-x");

        // It answers again: fresh and up at once.
        slot.fresh = false;
        slot.take(outcome(true, 300.0), at(7), true, GAP);
        let back = served(&mut slot, at(7), grace);
        assert!(back.up && !back.stale, "{back:?}");
        assert_eq!(back.power_watts, Some(300.0));
    }

    #[test]
    fn a_device_that_never_answered_is_down_with_its_identity() {
        let now = Instant::now();
        let grace = Duration::from_secs(5);
        let mut slot = slot();
        slot.take(unanswered(), now, true, GAP);
        assert!(!slot.fresh);
        let d = served(&mut slot, now, grace);
        assert_eq!((d.up, d.stale, d.uuid.as_str()), (false, true, "GPU-x"));
        slot.take(unanswered(), now + grace, true, GAP);
        let d = served(&mut slot, now + grace * 2, grace);
        assert_eq!((d.up, d.power_watts), (false, None));
    }
}
