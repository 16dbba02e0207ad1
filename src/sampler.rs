//! The sampling loop: NVML initialisation with backoff, a coordinator that has every idle device
//! read each tick (by the reader threads of `readers.rs`) and waits until the per-device
//! deadline, and the XID event thread. Every tick ends in a complete [`Snapshot`] handed to
//! `publish`.
//!
//! Isolation: NVML calls block, and a failing GPU can hang one for seconds. A device that misses
//! the deadline is served from its last reading marked `stale` (and `up = false` once that is
//! older than the grace period); a device whose read is still inside a call is not asked again,
//! and its late result is taken at the next tick. A hung call holds one reader thread; the other
//! devices are read by another (see `readers.rs`). No thread here runs on an async runtime.
//!
//! A session is one NVML initialisation with its threads. It ends when every device answers
//! UNINITIALIZED / DRIVER_NOT_LOADED (a driver restart: initialise again with backoff) or when a
//! device index no longer exists (the device set changed: initialise again after the tick). Its
//! threads are joined, or left detached if stuck in a hung call, and the next session discovers
//! the devices anew, so neither threads nor series of vanished GPUs accumulate.
//!
//! A tick is *complete* when at least one device answered within its deadline (or there are no
//! devices): only then does `last_tick_timestamp_seconds` advance. When every device hangs, ticks
//! still publish (the devices stale, then down) but that timestamp stays put, so `/readyz` turns
//! 503 once it is older than the readiness limit: nothing fresh is being served.
//!
//! GPM saturation metrics are averages between a device's samples of two consecutive ticks, so
//! each read carries the tick number and each device keeps its previous GPM sample; a device
//! that missed a tick starts a new window.

use std::collections::HashSet;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use nvml_wrapper::Nvml;

use crate::nvml::device::{DeviceReader, ReadOutcome};
use crate::nvml::discovery;
use crate::nvml::error::{ErrorClass, ErrorCounter, LogLimiter, classify, error_name};
use crate::nvml::events::{XidLog, unix_now, watch_xids};
use crate::sample::{DeviceSample, Snapshot, SystemInfo};

mod readers;

use readers::{DeviceWork, Inbox, Readers, Reading};

/// First wait after a failed NVML initialisation; doubled after each failure.
const INIT_BACKOFF_START: Duration = Duration::from_secs(1);
/// Longest wait between two initialisation attempts.
const INIT_BACKOFF_MAX: Duration = Duration::from_secs(30);
/// How long stopping a generation of readers (and the XID thread) may take before the threads
/// still inside a hung NVML call are left behind.
const READER_STOP_BOUND: Duration = Duration::from_secs(2);
/// How long `Sampler::shutdown` waits for the coordinator (which itself waits up to
/// `READER_STOP_BOUND` for its readers).
const SHUTDOWN_BOUND: Duration = Duration::from_secs(4);

/// How the sampler runs.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplerOptions {
    /// The NVML library to load (passed to `Nvml::builder().lib_path()`), e.g.
    /// "libnvidia-ml.so.1" or the path of `libnvml_sim.so`.
    pub nvml_lib: PathBuf,
    /// Tick period.
    pub interval: Duration,
    /// Per-device deadline within a tick.
    pub device_timeout: Duration,
    /// A device not read fresh for this long is served with `up = false`.
    pub stale_grace: Duration,
    /// Read each device's processes, looking them up in this procfs (the host's `/proc`):
    /// `--processes` and `--host-proc`. `None`: processes are not read.
    pub processes: Option<PathBuf>,
}

impl Default for SamplerOptions {
    /// The driver's library by soname, 1 s ticks, a 1 s deadline, 5 s grace.
    fn default() -> Self {
        SamplerOptions {
            nvml_lib: PathBuf::from("libnvidia-ml.so.1"),
            interval: Duration::from_secs(1),
            device_timeout: Duration::from_secs(1),
            stale_grace: Duration::from_secs(5),
            processes: None,
        }
    }
}

/// The running sampler: a coordinator thread and, while NVML is up, the device readers and
/// the XID thread. Stops on [`Sampler::shutdown`] or when dropped.
pub struct Sampler {
    inbox: Arc<Inbox>,
    threads: Option<ThreadGroup>,
}

impl Sampler {
    /// Starts sampling on dedicated threads. `publish` is called after every tick with a complete
    /// Snapshot — also while NVML is not (yet) initialised: then nvml_up=false and nvml_error says
    /// why, once per retry. Never blocks the caller.
    ///
    /// `publish` returns the snapshot as it published it, shared: the sampler keeps it to serve a
    /// device that misses the next deadline from, so that a tick moves each reading into its
    /// snapshot instead of copying it.
    pub fn start(
        opts: SamplerOptions,
        publish: impl Fn(Snapshot) -> Arc<Snapshot> + Send + 'static,
    ) -> io::Result<Sampler> {
        let inbox = Arc::new(Inbox::default());
        let mut threads = ThreadGroup::new();
        let coordinator = Coordinator {
            opts,
            publish,
            inbox: Arc::clone(&inbox),
            errors: Arc::new(ErrorCounter::default()),
            xids: Arc::new(XidLog::default()),
            generation: 0,
            log: LogLimiter::default(),
        };
        threads.spawn("nvml-sampler".into(), move || coordinator.run())?;
        Ok(Sampler {
            inbox,
            threads: Some(threads),
        })
    }

    /// Signals every thread and joins those that return within a short bound; a reader stuck
    /// inside a hung NVML call is left detached (it holds its own reference to the library and
    /// exits by itself if the call ever returns). Idempotent / also on Drop.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        let Some(threads) = self.threads.take() else {
            return;
        };
        // The coordinator may already be gone (e.g. `publish` panicked): then nobody reads this.
        self.inbox.shut_down();
        if !threads.join_within(SHUTDOWN_BOUND) {
            tracing::warn!("sampler did not stop within {SHUTDOWN_BOUND:?}; left detached");
        }
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `--once`: init NVML (no retry), discover, run one tick within the deadlines, return. On init
/// failure returns a Snapshot with nvml_up=false and nvml_error set.
///
/// XID events are not watched here: an event set only reports events that arrive after it was
/// created, so a single tick would always see none.
pub fn sample_once(opts: &SamplerOptions) -> Snapshot {
    let errors = Arc::new(ErrorCounter::default());
    let nvml = match discovery::init(&opts.nvml_lib) {
        Ok(n) => Arc::new(n),
        Err(reason) => return down_snapshot(reason, &errors),
    };
    let inbox = Arc::new(Inbox::default());
    let mut session = match Session::start(nvml, 1, &inbox, opts, &errors, None) {
        Ok(s) => s,
        Err(reason) => return down_snapshot(reason, &errors),
    };
    let started = Instant::now();
    let deadline = started + opts.device_timeout;
    let end = match session.ask(&inbox, started) {
        Some(asked) => session.finish(&inbox, asked, deadline),
        None => TickEnd::Shutdown,
    };
    let snapshot = match end {
        TickEnd::Done => session.snapshot(started, opts.stale_grace, &errors, None),
        // Nobody else holds `inbox`, so no shutdown can arrive; keep the types honest anyway.
        TickEnd::Shutdown => down_snapshot("shut down".into(), &errors),
    };
    session.stop();
    snapshot
}

/// A snapshot for "NVML is not answering", with the reason.
fn down_snapshot(reason: String, errors: &ErrorCounter) -> Snapshot {
    Snapshot {
        nvml_up: false,
        nvml_error: Some(reason),
        nvml_errors: errors.snapshot(),
        ..Snapshot::default()
    }
}

/// Exponential backoff for NVML initialisation.
#[derive(Debug)]
struct Backoff {
    next: Duration,
}

impl Backoff {
    fn new() -> Self {
        Backoff {
            next: INIT_BACKOFF_START,
        }
    }

    /// The wait before the next attempt; doubles up to the maximum.
    fn next_delay(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(INIT_BACKOFF_MAX);
        d
    }
}

/// How an NVML session ended.
enum SessionEnd {
    Shutdown,
    /// NVML stopped answering (driver unloaded, restarted…) or could not list devices: go back
    /// to initialisation, with the reason.
    Reinit(String),
    /// NVML answers but a device index no longer exists: initialise and discover again at once.
    Rediscover,
}

struct Coordinator<P> {
    opts: SamplerOptions,
    publish: P,
    /// Shared with every reader and with the [`Sampler`] (for shutdown).
    inbox: Arc<Inbox>,
    /// Cumulative over the whole life of the sampler, across re-initialisations.
    errors: Arc<ErrorCounter>,
    xids: Arc<XidLog>,
    generation: u64,
    /// Rate-limits the coordinator's repeating warnings (init failures, rediscoveries).
    log: LogLimiter,
}

impl<P: Fn(Snapshot) -> Arc<Snapshot>> Coordinator<P> {
    fn run(mut self) {
        let mut backoff = Backoff::new();
        loop {
            let reason = match discovery::init(&self.opts.nvml_lib) {
                Ok(nvml) => {
                    backoff = Backoff::new();
                    tracing::info!(lib = %self.opts.nvml_lib.display(), "NVML initialised");
                    match self.run_session(Arc::new(nvml)) {
                        SessionEnd::Shutdown => return,
                        SessionEnd::Reinit(reason) => reason,
                        // The session already waited out its tick, so this cannot spin.
                        SessionEnd::Rediscover => continue,
                    }
                }
                Err(reason) => reason,
            };
            let delay = backoff.next_delay();
            if self.log.allow(&reason, Instant::now()) {
                tracing::warn!(retry_in = ?delay, "NVML not available: {reason}");
            }
            (self.publish)(down_snapshot(reason, &self.errors));
            if self.inbox.wait(Instant::now() + delay).shutdown {
                return;
            }
        }
    }

    /// One NVML session: discovery, then ticks until shutdown or until NVML stops answering.
    fn run_session(&mut self, nvml: Arc<Nvml>) -> SessionEnd {
        self.generation += 1;
        let mut session = match Session::start(
            nvml,
            self.generation,
            &self.inbox,
            &self.opts,
            &self.errors,
            Some(&self.xids),
        ) {
            Ok(s) => s,
            Err(reason) => return SessionEnd::Reinit(reason),
        };
        tracing::info!(
            gpus = session.devices.len(),
            driver = %session.system.driver_version,
            "devices discovered"
        );
        let mut xids_pruned = false;
        // The last snapshot this session published: stale devices are served from it.
        let mut published: Option<Arc<Snapshot>> = None;
        let Some(mut asked) = session.ask(&self.inbox, Instant::now()) else {
            session.stop();
            return SessionEnd::Shutdown;
        };
        loop {
            let started = asked.start;
            let deadline = started + self.opts.device_timeout;
            if let TickEnd::Shutdown = session.finish(&self.inbox, asked, deadline) {
                session.stop();
                return SessionEnd::Shutdown;
            }
            let previous = published.as_deref();
            let grace = self.opts.stale_grace;
            let mut snapshot = session.snapshot(started, grace, &self.errors, previous);
            self.xids.fill(&mut snapshot.devices);
            // Once every device is identified, drop XID counts of devices that went away.
            if !xids_pruned && snapshot.devices.iter().all(|d| !d.uuid.is_empty()) {
                let uuids: HashSet<String> =
                    snapshot.devices.iter().map(|d| d.uuid.clone()).collect();
                self.xids.retain(&uuids);
                xids_pruned = true;
            }
            let driver_gone = session.driver_gone();
            if driver_gone {
                // Served like every other moment NVML is down: no GPU series at all. The devices
                // of this tick only hold what NVML refused, and the re-initialisation decides
                // which GPUs there are.
                snapshot.nvml_up = false;
                snapshot.nvml_error =
                    Some("NVML stopped answering (driver unloaded?); re-initialising".into());
                snapshot.devices.clear();
            }
            published = Some((self.publish)(snapshot));
            if driver_gone {
                session.stop();
                return SessionEnd::Reinit(
                    "NVML answered UNINITIALIZED / DRIVER_NOT_LOADED on every call".into(),
                );
            }
            // The next tick starts an interval after this one did, or now if this one overran.
            let next = (started + self.opts.interval).max(Instant::now());
            if session.device_set_changed() {
                let message = "a device index no longer exists; rediscovering the devices";
                if self.log.allow(message, Instant::now()) {
                    tracing::warn!("{message}");
                }
                // Once the interval is over, so that rediscovering cannot spin.
                let shutdown = self.inbox.wait(next).shutdown;
                session.stop();
                return if shutdown {
                    SessionEnd::Shutdown
                } else {
                    SessionEnd::Rediscover
                };
            }
            // Queued now, read from `next` on: see `readers.rs`.
            let Some(next_asked) = session.ask(&self.inbox, next) else {
                session.stop();
                return SessionEnd::Shutdown;
            };
            asked = next_asked;
        }
    }
}

/// A tick queued to the readers.
struct Asked {
    tick: u64,
    start: Instant,
    /// How many devices it asked.
    queued: usize,
}

/// How a tick ended.
enum TickEnd {
    Done,
    Shutdown,
}

/// One device as seen by the coordinator.
struct Slot {
    index: u32,
    /// Queued or being read (a reader is inside NVML for it).
    busy: bool,
    /// It was asked this tick and answered this tick.
    fresh: bool,
    /// The last reading, until a snapshot takes it; from then on the last published snapshot
    /// holds it.
    unpublished: Option<DeviceSample>,
    /// What the last reading said of the driver and of the device's index.
    driver_gone: bool,
    vanished: bool,
    last_at: Option<Instant>,
}

impl Slot {
    fn new(index: u32) -> Slot {
        Slot {
            index,
            busy: false,
            fresh: false,
            unpublished: None,
            driver_gone: false,
            vanished: false,
            last_at: None,
        }
    }

    fn take(&mut self, reading: ReadOutcome, at: Instant) {
        self.unpublished = Some(reading.sample);
        self.driver_gone = reading.driver_gone;
        self.vanished = reading.vanished;
        self.last_at = Some(at);
    }

    /// What the device looks like in this tick's snapshot: its last reading, moved in when no
    /// snapshot has it yet, else copied from `previous` (its place in the last published
    /// snapshot); marked stale unless it is this tick's.
    fn view(
        &mut self,
        previous: Option<&DeviceSample>,
        now: Instant,
        grace: Duration,
    ) -> DeviceSample {
        let mut s = match self.unpublished.take() {
            Some(sample) => sample,
            None => match previous.filter(|p| p.index == self.index) {
                // Already marked stale, with `up` cut by its age then: the rule below gives the
                // same again, as the age only grows.
                Some(p) => p.clone(),
                // Never answered yet: known only by its index.
                None => {
                    return DeviceSample {
                        index: self.index,
                        stale: true,
                        ..DeviceSample::default()
                    };
                }
            },
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
}

/// The threads and state of one NVML initialisation.
struct Session {
    generation: u64,
    system: SystemInfo,
    devices: Vec<Slot>,
    readers: Readers,
    /// Ticks started in this session; the number of the next one.
    ticks: u64,
    /// End of the last complete tick (Unix seconds), if any in this session.
    last_complete: Option<f64>,
    threads: ThreadGroup,
    /// Dropping it tells the XID thread to stop.
    xid_stop: Option<Sender<()>>,
    /// Readings taken from the inbox, kept for its capacity.
    readings: Vec<Reading>,
}

impl Session {
    /// Reads system info and the device count, then prepares each device's reader (reading
    /// processes too when `opts` say so) and, when `xids` is given, starts the XID thread.
    fn start(
        nvml: Arc<Nvml>,
        generation: u64,
        inbox: &Arc<Inbox>,
        opts: &SamplerOptions,
        errors: &Arc<ErrorCounter>,
        xids: Option<&Arc<XidLog>>,
    ) -> Result<Session, String> {
        let system = discovery::system_info(&nvml, errors);
        let count = nvml.device_count().map_err(|e| {
            if classify(&e) != ErrorClass::DriverGone {
                errors.record(None, "nvmlDeviceGetCount_v2", &e);
            }
            format!("nvmlDeviceGetCount failed: {} ({e})", error_name(&e))
        })?;
        let mut threads = ThreadGroup::new();
        let mut slots = Vec::new();
        let mut devices = Vec::new();
        for index in 0..count {
            let mut reader = DeviceReader::new(index, Arc::clone(errors));
            if let Some(root) = opts.processes.as_deref() {
                reader = reader.with_processes(root);
            }
            devices.push(DeviceWork::new(reader, Arc::clone(&nvml)));
            slots.push(Slot::new(index));
        }
        let inbox = Arc::clone(inbox);
        let readers = Readers::new(
            generation,
            devices,
            inbox,
            opts.interval,
            opts.device_timeout,
        );
        let xid_stop = match xids {
            Some(log) => {
                let (stop_tx, stop_rx) = mpsc::channel();
                let (nvml, log, errors) = (Arc::clone(&nvml), Arc::clone(log), Arc::clone(errors));
                match threads.spawn("nvml-xid".into(), move || {
                    watch_xids(&nvml, &log, &errors, &stop_rx)
                }) {
                    Ok(()) => Some(stop_tx),
                    Err(e) => {
                        tracing::error!("cannot start the XID event thread: {e}");
                        None
                    }
                }
            }
            None => None,
        };
        Ok(Session {
            generation,
            system,
            devices: slots,
            readers,
            ticks: 0,
            last_complete: None,
            threads,
            xid_stop,
            readings: Vec::new(),
        })
    }

    /// Queues every idle device to be read by the tick that starts at `start`. `None` on
    /// shutdown.
    fn ask(&mut self, inbox: &Inbox, start: Instant) -> Option<Asked> {
        let tick = self.ticks;
        self.ticks += 1;
        // Late answers of earlier ticks first, so their devices are idle again.
        if inbox.collect(&mut self.readings) {
            return None;
        }
        self.take_readings(None);
        // A busy device is stuck in an earlier call: asking again would only queue up. Its late
        // answer is taken at a later tick, and does not count as that tick's reading.
        for w in &mut self.devices {
            w.fresh = false;
        }
        // Marked busy as the readers' queue takes them.
        let asked = self.devices.iter_mut().filter(|w| !w.busy).map(|w| {
            w.busy = true;
            w.index
        });
        let queued = self.readers.ask(tick, asked, start, &mut self.threads);
        Some(Asked {
            tick,
            start,
            queued,
        })
    }

    /// Waits for the answers to the tick `asked` until `deadline`, and takes them.
    fn finish(&mut self, inbox: &Inbox, asked: Asked, deadline: Instant) -> TickEnd {
        let Asked {
            tick,
            start,
            queued,
        } = asked;
        let threads = &mut self.threads;
        let (unstarted, shutdown) = self.readers.wait(queued, start, deadline, threads);
        for index in unstarted {
            if let Some(w) = self.devices.get_mut(index as usize) {
                w.busy = false;
            }
        }
        let shutdown = inbox.collect(&mut self.readings) || shutdown;
        self.take_readings(Some(tick));
        if shutdown {
            TickEnd::Shutdown
        } else {
            TickEnd::Done
        }
    }

    /// Takes the collected readings of this session; those answering `tick` make their device
    /// fresh.
    fn take_readings(&mut self, tick: Option<u64>) {
        for r in self.readings.drain(..) {
            if r.generation != self.generation {
                continue;
            }
            let Some(w) = self.devices.get_mut(r.index as usize) else {
                continue;
            };
            w.busy = false;
            w.fresh = tick == Some(r.tick);
            w.take(r.outcome, r.at);
        }
    }

    /// True when every device that answered this tick says the driver is gone.
    fn driver_gone(&self) -> bool {
        let mut fresh = self.devices.iter().filter(|w| w.fresh).peekable();
        fresh.peek().is_some() && fresh.all(|w| w.driver_gone)
    }

    /// True when a device answered this tick that its index no longer exists (e.g. after a
    /// driver restart that every device answered GPU_IS_LOST, a GPU is missing).
    fn device_set_changed(&self) -> bool {
        self.devices.iter().any(|w| w.fresh && w.vanished)
    }

    /// The snapshot of the tick that started at `started`; marks the tick complete when a device
    /// answered in it (see the module doc). `previous` is the last snapshot published in this
    /// session, which holds the readings earlier snapshots took.
    fn snapshot(
        &mut self,
        started: Instant,
        grace: Duration,
        errors: &ErrorCounter,
        previous: Option<&Snapshot>,
    ) -> Snapshot {
        let now = Instant::now();
        if self.devices.is_empty() || self.devices.iter().any(|w| w.fresh) {
            self.last_complete = Some(unix_now());
        }
        Snapshot {
            nvml_up: true,
            nvml_error: None,
            system: self.system.clone(),
            devices: self
                .devices
                .iter_mut()
                .enumerate()
                .map(|(i, w)| w.view(previous.and_then(|p| p.devices.get(i)), now, grace))
                .collect(),
            nvml_errors: errors.snapshot(),
            tick_duration_seconds: Some(now.duration_since(started).as_secs_f64()),
            last_tick_timestamp_seconds: self.last_complete,
            // Attached when the snapshot is published: the sampler only reads NVML.
            kubernetes: None,
        }
    }

    /// Stops the readers and the XID thread; those that do not return within the bound (stuck in
    /// NVML) are left detached and exit by themselves when their call returns.
    fn stop(self) {
        self.readers.stop();
        drop(self.xid_stop);
        if !self.threads.join_within(READER_STOP_BOUND) {
            tracing::warn!(
                "a device reader is stuck in an NVML call; left detached after {READER_STOP_BOUND:?}"
            );
        }
    }
}

/// Threads whose end can be awaited with a time bound. Each thread holds a clone of a sender
/// that is dropped when it ends (also by panic); the receiver sees "disconnected" once all are.
struct ThreadGroup {
    done_tx: Sender<()>,
    done_rx: Receiver<()>,
    handles: Vec<JoinHandle<()>>,
}

impl ThreadGroup {
    fn new() -> Self {
        let (done_tx, done_rx) = mpsc::channel();
        ThreadGroup {
            done_tx,
            done_rx,
            handles: Vec::new(),
        }
    }

    fn spawn(&mut self, name: String, f: impl FnOnce() + Send + 'static) -> io::Result<()> {
        let token = self.done_tx.clone();
        let handle = thread::Builder::new().name(name).spawn(move || {
            let _token = token;
            f();
        })?;
        self.handles.push(handle);
        Ok(())
    }

    /// Joins every thread if all end within `bound`; otherwise leaves them detached. True when
    /// all ended.
    fn join_within(self, bound: Duration) -> bool {
        let ThreadGroup {
            done_tx,
            done_rx,
            handles,
        } = self;
        drop(done_tx);
        let deadline = Instant::now() + bound;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match done_rx.recv_timeout(left) {
                Ok(()) => continue,
                Err(RecvTimeoutError::Disconnected) => break,
                Err(RecvTimeoutError::Timeout) => return false,
            }
        }
        for h in handles {
            // Every thread has dropped its token, so each join returns at once.
            let _ = h.join();
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sample::ClockEventReason;
    use std::sync::Mutex;

    #[test]
    fn the_sampler_can_be_moved_to_another_thread() {
        fn assert_send<T: Send>() {}
        assert_send::<Sampler>();
    }

    #[test]
    fn backoff_doubles_up_to_thirty_seconds() {
        let mut b = Backoff::new();
        let delays: Vec<u64> = (0..8).map(|_| b.next_delay().as_secs()).collect();
        assert_eq!(delays, vec![1, 2, 4, 8, 16, 30, 30, 30]);
    }

    fn outcome(up: bool, power: f64) -> ReadOutcome {
        ReadOutcome {
            sample: DeviceSample {
                index: 2,
                uuid: "GPU-x".into(),
                up,
                power_watts: Some(power),
                ..Default::default()
            },
            lost: !up,
            driver_gone: false,
            vanished: false,
        }
    }

    #[test]
    fn a_late_device_is_stale_then_down_after_the_grace() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let grace = Duration::from_secs(5);
        let mut slot = Slot::new(2);
        slot.take(outcome(true, 100.0), t0);
        slot.fresh = true;
        let fresh = slot.view(None, t0, grace);
        assert!(fresh.up && !fresh.stale);

        // The next ticks miss the deadline: served from the last published snapshot.
        slot.fresh = false;
        let stale = slot.view(Some(&fresh), at(2), grace);
        assert!(stale.up && stale.stale);
        assert_eq!(
            stale.power_watts,
            Some(100.0),
            "served from the last reading"
        );
        let down = slot.view(Some(&stale), at(6), grace);
        assert!(!down.up && down.stale);
        assert_eq!(down.power_watts, Some(100.0));

        // A late answer arrives between ticks: the next snapshot serves it (stale, but within
        // the grace again) rather than the older reading the last snapshot had.
        slot.take(outcome(true, 200.0), at(7));
        let late = slot.view(Some(&down), at(8), grace);
        assert!(late.up && late.stale);
        assert_eq!(late.power_watts, Some(200.0));
    }

    #[test]
    fn a_device_never_read_is_down() {
        let now = Instant::now();
        let grace = Duration::from_secs(5);
        let d = Slot::new(4).view(None, now, grace);
        assert_eq!((d.index, d.up, d.stale), (4, false, true));
        // Nor is another device's last reading served for it.
        let other = outcome(true, 100.0).sample;
        let d = Slot::new(4).view(Some(&other), now, grace);
        assert_eq!((d.index, d.up, d.power_watts), (4, false, None));
    }

    #[test]
    fn thread_group_joins_finished_threads_and_detaches_stuck_ones() {
        let mut g = ThreadGroup::new();
        g.spawn("quick".into(), || {}).unwrap();
        assert!(g.join_within(Duration::from_secs(5)));

        let (release_tx, release_rx) = mpsc::channel::<()>();
        let mut g = ThreadGroup::new();
        g.spawn("stuck".into(), move || {
            let _ = release_rx.recv();
        })
        .unwrap();
        assert!(!g.join_within(Duration::from_millis(50)));
        drop(release_tx); // let the detached thread end
    }

    #[test]
    fn a_missing_library_gives_a_down_snapshot_once() {
        let opts = SamplerOptions {
            nvml_lib: "/nonexistent/libnvidia-ml.so.1".into(),
            ..SamplerOptions::default()
        };
        let s = sample_once(&opts);
        assert!(!s.nvml_up);
        let reason = s.nvml_error.unwrap();
        assert!(reason.contains("library not found"), "{reason}");
        assert!(s.devices.is_empty());
    }

    /// Starts a sampler whose every published snapshot arrives on the returned channel.
    fn start_collecting(opts: SamplerOptions) -> (Sampler, mpsc::Receiver<Snapshot>) {
        let (tx, rx) = mpsc::channel();
        let tx = Mutex::new(tx);
        let sampler = Sampler::start(opts, move |s| {
            let s = Arc::new(s);
            let _ = tx.lock().unwrap().send(Snapshot::clone(&s));
            s
        })
        .unwrap();
        (sampler, rx)
    }

    #[test]
    fn the_sampler_publishes_while_nvml_is_down_and_stops_promptly() {
        let opts = SamplerOptions {
            nvml_lib: "/nonexistent/libnvidia-ml.so.1".into(),
            ..SamplerOptions::default()
        };
        let (sampler, rx) = start_collecting(opts);
        let first = rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert!(!first.nvml_up);
        assert!(first.nvml_error.unwrap().contains("library not found"));
        // Shutdown must cut the backoff wait short rather than wait it out.
        let t = Instant::now();
        sampler.shutdown();
        assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    }

    /// The simulated driver: `NVML_SIM_LIB` if set, else the `libnvml_sim.so` that `cargo test`
    /// builds next to this test binary (nvml-sim is a dev-dependency).
    fn sim_options() -> SamplerOptions {
        let lib = std::env::var_os("NVML_SIM_LIB")
            .map(PathBuf::from)
            .or_else(nvml_sim::built_library)
            .expect("libnvml_sim.so built next to the test executable");
        assert!(lib.exists(), "{} not built", lib.display());
        SamplerOptions {
            nvml_lib: lib,
            interval: Duration::from_millis(200),
            device_timeout: Duration::from_millis(200),
            ..SamplerOptions::default()
        }
    }

    #[test]
    fn sample_once_reads_every_simulated_gpu() {
        let opts = sim_options();
        let s = sample_once(&opts);
        assert!(s.nvml_up, "{:?}", s.nvml_error);
        assert!(!s.system.driver_version.is_empty());
        assert!(s.system.cuda_driver_version.contains('.'));
        assert_eq!(s.devices.len(), 8, "the default scenario has eight H100s");
        for (i, d) in s.devices.iter().enumerate() {
            assert_eq!(d.index as usize, i);
            assert!(d.up && !d.stale, "gpu {i}: {d:?}");
            assert!(d.uuid.starts_with("GPU-"), "{}", d.uuid);
            assert_eq!(d.info.architecture, "hopper");
            assert!(d.info.name.contains("H100"), "{}", d.info.name);
            let m = d.memory.expect("memory");
            assert!(m.total_bytes > 0.0 && m.used_bytes <= m.total_bytes);
            assert!(d.utilization.is_some_and(|u| (0.0..=1.0).contains(&u)));
            assert!(d.power_watts.is_some_and(|w| w > 0.0 && w < 2000.0));
            assert!(d.clocks_hertz.iter().all(|(_, hz)| *hz > 1e6));
            assert_eq!(d.clock_events.len(), ClockEventReason::ALL.len());
            assert!(d.fan_speeds.is_empty(), "an H100 SXM has no fan");
            assert!(d.retired_pages.is_none(), "Hopper has no page retirement");
        }
        assert!(s.tick_duration_seconds.is_some());
        assert!(s.last_tick_timestamp_seconds.is_some());
    }

    #[test]
    fn the_sampler_ticks_on_the_simulated_driver_and_shuts_down_promptly() {
        let opts = sim_options();
        let (sampler, rx) = start_collecting(opts);
        let first = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        assert!(first.nvml_up, "{:?}", first.nvml_error);
        let second = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        assert!(second.last_tick_timestamp_seconds > first.last_tick_timestamp_seconds);
        assert_eq!(second.devices.len(), first.devices.len());
        let t = Instant::now();
        sampler.shutdown();
        assert!(t.elapsed() < SHUTDOWN_BOUND, "{:?}", t.elapsed());
    }

    #[test]
    fn processes_are_read_only_when_asked_and_named_by_nvml_without_procfs() {
        let s = sample_once(&sim_options());
        assert!(s.devices.iter().all(|d| d.processes.is_empty()));

        // An empty procfs: names come from nvmlSystemGetProcessName, cgroups are unknown.
        let empty = tempfile::tempdir().unwrap();
        let opts = SamplerOptions {
            processes: Some(empty.path().to_path_buf()),
            ..sim_options()
        };
        let s = sample_once(&opts);
        assert!(s.devices[0].processes.is_empty(), "GPU0 is idle");
        let p = &s.devices[1].processes;
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!((p[0].pid, p[0].name.as_str()), (412301, "tritonserver"));
        assert_eq!(p[0].used_memory_bytes, Some((18432u64 << 20) as f64));
        assert!(
            p[0].sm_utilization
                .is_some_and(|u| (0.0..=1.0).contains(&u))
        );
        assert_eq!(p[0].cgroup, None);
        let last = &s.devices[7].processes;
        assert_eq!(last[0].name, "jupyter-lab");
        assert!(
            s.nvml_errors.is_empty(),
            "no failed process call: {:?}",
            s.nvml_errors
        );
    }

    /// The simulated driver under test implements GPM; the tests below rely on it.
    fn assert_sim_has_gpm(opts: &SamplerOptions) {
        let nvml = discovery::init(&opts.nvml_lib).expect("simulated NVML initialises");
        assert!(
            crate::nvml::gpm::library_has_gpm(&nvml),
            "{} lacks the GPM entry points",
            opts.nvml_lib.display()
        );
    }

    /// No failed GPM call was counted.
    fn no_gpm_errors(s: &Snapshot) -> bool {
        s.nvml_errors.keys().all(|(f, _)| !f.starts_with("nvmlGpm"))
    }

    #[test]
    fn one_tick_knows_gpm_support_but_has_no_gpm_window() {
        let opts = sim_options();
        assert_sim_has_gpm(&opts);
        let s = sample_once(&opts);
        assert!(s.nvml_up, "{:?}", s.nvml_error);
        for d in &s.devices {
            // Every GPU of the default scenario is an H100, which supports GPM.
            assert_eq!(d.gpm_supported, Some(true), "gpu {}", d.index);
            assert_eq!(d.gpm, None, "gpu {}: one sample closes no window", d.index);
        }
        assert!(no_gpm_errors(&s), "{:?}", s.nvml_errors);
    }

    #[test]
    fn gpm_averages_arrive_from_the_second_tick_and_tell_busy_from_saturated() {
        let opts = sim_options();
        assert_sim_has_gpm(&opts);
        let (sampler, rx) = start_collecting(opts);
        let first = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        assert!(first.nvml_up, "{:?}", first.nvml_error);
        assert!(first.devices.iter().all(|d| d.gpm.is_none()), "first tick");
        // Later ticks: every fresh device closes a window (a device that missed its deadline on
        // a loaded machine starts over, so allow a few ticks for all eight).
        let deadline = Instant::now() + Duration::from_secs(10);
        let later = loop {
            let s = rx.recv_timeout(Duration::from_secs(10)).unwrap();
            let windows = s.devices.iter().filter(|d| d.gpm.is_some()).count();
            if windows == s.devices.len() {
                break s;
            }
            assert!(
                Instant::now() < deadline,
                "no GPM window closed on every GPU"
            );
        };
        sampler.shutdown();
        assert!(no_gpm_errors(&later), "{:?}", later.nvml_errors);
        let g = |i: usize| later.devices[i].gpm.clone().unwrap();
        for d in &later.devices {
            let m = d.gpm.as_ref().unwrap();
            for r in [m.sm_active, m.sm_occupancy, m.tensor_active, m.dram_active] {
                assert!(
                    r.is_some_and(|r| (0.0..=1.0).contains(&r)),
                    "gpu {}: {m:?}",
                    d.index
                );
            }
            assert!(m.pcie_transmit_bytes_per_second.is_some_and(|b| b >= 0.0));
        }
        // GPU 1: busy (utilization ~1) but not saturated (SM activity and occupancy low).
        let gpu1 = &later.devices[1];
        assert!(gpu1.utilization.is_some_and(|u| u >= 0.9), "{gpu1:?}");
        assert!(g(1).sm_active.unwrap() < 0.3, "{:?}", g(1));
        assert!(g(1).sm_occupancy.unwrap() < 0.2, "{:?}", g(1));
        // GPUs 2 and 3 train: saturated SMs and busy tensor cores.
        for i in [2, 3] {
            assert!(g(i).sm_active.unwrap() > 0.7, "gpu {i}: {:?}", g(i));
            assert!(g(i).tensor_active.unwrap() > 0.4, "gpu {i}: {:?}", g(i));
        }
        // GPU 4 is memory-bound; GPU 7 holds memory but does nothing.
        assert!(g(4).dram_active.unwrap() > 0.7, "{:?}", g(4));
        assert!(g(7).sm_active.unwrap() < 0.05, "{:?}", g(7));
    }
}
