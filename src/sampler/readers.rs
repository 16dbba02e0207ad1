//! The threads that read the devices, and the inbox their readings go to.
//!
//! One reader thread normally reads every device in turn, so a tick wakes one thread and is
//! answered by one wake-up of the coordinator ([`Inbox`]), however many GPUs there are. Each
//! wake-up of a sleeping thread is a context switch; with a thread per device, at 8 GPUs those
//! cost more CPU than the exporter's own work of reading the devices.
//!
//! A tick is queued ahead, as soon as the previous one is published, with the time it starts.
//! The reader that read the last tick sleeps until the next one is due (the last start plus the
//! interval) and takes it then: the coordinator sleeps from one publish until the next tick's
//! answers, and does not have to wake at the start of a tick to wake a reader.
//!
//! Isolation: a device's state ([`DeviceWork`]) is not tied to a thread, so when a read takes
//! longer than the stall limit the coordinator wakes another reader (starting one when none is
//! idle) for the devices still queued. A hung GPU thus holds one thread (as many as there are
//! hung GPUs, plus one reading the rest) and delays the others by at most the stall limit. A
//! reader idle for [`READER_IDLE_LIMIT`] ends while another is left.

use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

use nvml_wrapper::Nvml;

use super::ThreadGroup;
use crate::nvml::device::{DeviceReader, ReadOutcome};
use crate::nvml::gpm::GpmState;

/// How long a surplus reader (one started while another was stuck) waits for work before it
/// ends.
const READER_IDLE_LIMIT: Duration = Duration::from_secs(10);

/// The most a device queued behind a slow or hung one waits for another reader.
const STALL_LIMIT: Duration = Duration::from_millis(50);

/// A reading, as delivered to the coordinator.
pub(super) struct Reading {
    /// Tells readings of a previous NVML session apart.
    pub generation: u64,
    /// The tick that asked for it.
    pub tick: u64,
    pub index: u32,
    pub outcome: ReadOutcome,
    /// When it was finished.
    pub at: Instant,
}

/// Where readers leave their readings and the coordinator waits: for the answers to the tick it
/// asked (woken by the last one), for a deadline, or for shutdown.
#[derive(Default)]
pub(super) struct Inbox {
    state: Mutex<InboxState>,
    wake: Condvar,
}

#[derive(Default)]
struct InboxState {
    shutdown: bool,
    /// Delivered and not yet taken, in arrival order.
    readings: Vec<Reading>,
    /// The (generation, tick) whose answers the coordinator awaits, and how many are missing.
    awaiting: Option<(u64, u64)>,
    missing: usize,
}

/// How [`Inbox::wait`] ended.
pub(super) struct Waited {
    pub shutdown: bool,
    /// Every awaited answer arrived.
    pub answered: bool,
}

impl Inbox {
    fn lock(&self) -> MutexGuard<'_, InboxState> {
        // A poisoned lock means a reader panicked mid-push; the queue itself is whole.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Leaves a reading; wakes the coordinator when it was the last one its tick awaited.
    fn deliver(&self, reading: Reading) {
        let mut state = self.lock();
        let key = (reading.generation, reading.tick);
        state.readings.push(reading);
        if state.awaiting == Some(key) && state.missing > 0 {
            state.missing -= 1;
            if state.missing == 0 {
                drop(state);
                // After the unlock, so the woken coordinator does not block on the lock again.
                self.wake.notify_one();
            }
        }
    }

    /// Asks the coordinator to stop.
    pub fn shut_down(&self) {
        self.lock().shutdown = true;
        self.wake.notify_one();
    }

    /// From now until [`Inbox::collect`], `count` answers to `tick` are awaited.
    fn expect(&self, generation: u64, tick: u64, count: usize) {
        let mut state = self.lock();
        state.awaiting = Some((generation, tick));
        state.missing = count;
    }

    /// Sleeps until shutdown, until `until`, or, while answers are awaited, until the last one
    /// arrives.
    pub fn wait(&self, until: Instant) -> Waited {
        let mut state = self.lock();
        loop {
            let answered = state.awaiting.is_some() && state.missing == 0;
            let left = until.saturating_duration_since(Instant::now());
            if state.shutdown || answered || left.is_zero() {
                return Waited {
                    shutdown: state.shutdown,
                    answered,
                };
            }
            state = self
                .wake
                .wait_timeout(state, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Moves every delivered reading into `into` (empty; it keeps its capacity for the next
    /// tick) and stops awaiting. True on shutdown.
    pub fn collect(&self, into: &mut Vec<Reading>) -> bool {
        let mut state = self.lock();
        std::mem::swap(&mut state.readings, into);
        state.awaiting = None;
        state.missing = 0;
        state.shutdown
    }
}

/// One device's reading state. It moves between reader threads, so it holds the `Nvml` that
/// its GPM samples borrow.
pub(super) struct DeviceWork {
    reader: DeviceReader,
    /// Borrows `*nvml` (see [`DeviceWork::read`]). Declared before `nvml`, so dropped first.
    gpm: GpmState<'static>,
    nvml: Arc<Nvml>,
}

impl DeviceWork {
    pub fn new(reader: DeviceReader, nvml: Arc<Nvml>) -> Self {
        DeviceWork {
            reader,
            gpm: GpmState::new(),
            nvml,
        }
    }

    fn read(&mut self, tick: u64) -> ReadOutcome {
        // SAFETY: the `Nvml` lives in its `Arc` for as long as `self.nvml` holds it, which is
        // longer than `self.gpm` (dropped first), the only place this borrow is kept.
        let nvml: &'static Nvml = unsafe { &*Arc::as_ptr(&self.nvml) };
        self.reader.read(nvml, tick, &mut self.gpm)
    }
}

/// The devices of one NVML session and the threads that read them.
pub(super) struct Readers {
    shared: Arc<Shared>,
    /// Delays after which another reader takes over the devices still queued.
    stall: Duration,
}

struct Shared {
    generation: u64,
    /// The sampling interval: a tick is expected this long after the last one started.
    interval: Duration,
    devices: Vec<Mutex<DeviceWork>>,
    queue: Mutex<Queue>,
    inbox: Arc<Inbox>,
}

struct Queue {
    /// The tick the queued devices are read for.
    tick: u64,
    /// When that tick starts: its devices are not read before.
    start: Instant,
    /// Device positions not yet taken by a reader.
    next: VecDeque<u32>,
    /// Readers alive.
    readers: usize,
    /// Readers waiting for work (parked), by number; the last one idle is woken first, so a
    /// surplus reader stays idle long enough to end.
    idle: Vec<(usize, Thread)>,
    /// The idle reader that wakes by itself, and when: at the start of the queued tick, or,
    /// with nothing queued, when the next one is expected. A tick queued to start then needs no
    /// other wake-up.
    timer: Option<(usize, Instant)>,
    /// Numbers the readers (and names their threads).
    started: usize,
    stop: bool,
}

impl Queue {
    /// Takes the idle reader woken last-idle-first off the idle list, for its waker to unpark.
    fn pop_idle(&mut self) -> Option<Thread> {
        let (number, reader) = self.idle.pop()?;
        if self.timer.is_some_and(|(n, _)| n == number) {
            self.timer = None;
        }
        Some(reader)
    }
}

impl Readers {
    /// The readers of `devices` (by position), sampled every `interval`; the first reader
    /// starts with the first tick.
    pub fn new(
        generation: u64,
        devices: Vec<DeviceWork>,
        inbox: Arc<Inbox>,
        interval: Duration,
        device_timeout: Duration,
    ) -> Self {
        Readers {
            shared: Arc::new(Shared {
                generation,
                interval,
                devices: devices.into_iter().map(Mutex::new).collect(),
                queue: Mutex::new(Queue {
                    tick: 0,
                    start: Instant::now(),
                    next: VecDeque::new(),
                    readers: 0,
                    idle: Vec::new(),
                    timer: None,
                    started: 0,
                    stop: false,
                }),
                inbox,
            }),
            stall: STALL_LIMIT.min(device_timeout / 4),
        }
    }

    /// Queues `devices` (positions) to be read for `tick` from `start` on. Unless an idle
    /// reader wakes by itself by then, wakes one, or starts one when none is idle. Returns how
    /// many were queued.
    pub fn ask(
        &self,
        tick: u64,
        devices: impl IntoIterator<Item = u32>,
        start: Instant,
        threads: &mut ThreadGroup,
    ) -> usize {
        let mut queue = self.shared.lock_queue();
        queue.tick = tick;
        queue.start = start;
        queue.next.clear();
        queue.next.extend(devices);
        let count = queue.next.len();
        if count > 0 {
            // Before a reader can take one (the queue is still locked), so that no answer comes
            // before it is awaited.
            self.shared
                .inbox
                .expect(self.shared.generation, tick, count);
        }
        let timed = queue.timer.is_some_and(|(_, at)| at <= start);
        drop(queue);
        if !timed {
            self.wake_or_start(threads);
        }
        count
    }

    /// Waits until every device queued for the tick that starts at `start` is answered,
    /// `deadline` passes or shutdown; with none queued, until `start`. Every stall limit after
    /// the start without all answers, another reader is woken for what is still queued.
    ///
    /// Returns the positions that no reader started on (still queued at the deadline), and
    /// whether to shut down.
    pub fn wait(
        &self,
        queued: usize,
        start: Instant,
        deadline: Instant,
        threads: &mut ThreadGroup,
    ) -> (Vec<u32>, bool) {
        if queued == 0 {
            // Nothing is awaited, so this sleeps until the start (a tick is not over before).
            return (Vec::new(), self.shared.inbox.wait(start).shutdown);
        }
        let mut next_check = start + self.stall;
        loop {
            let waited = self.shared.inbox.wait(next_check.min(deadline));
            let now = Instant::now();
            if waited.shutdown || waited.answered || now >= deadline {
                let mut queue = self.shared.lock_queue();
                return (queue.next.drain(..).collect(), waited.shutdown);
            }
            if now >= next_check {
                self.wake_or_start(threads);
                next_check += self.stall;
            }
        }
    }

    /// When devices are still queued: wakes an idle reader, or starts one when none is idle.
    fn wake_or_start(&self, threads: &mut ThreadGroup) {
        let mut queue = self.shared.lock_queue();
        if queue.next.is_empty() {
            return;
        }
        if let Some(reader) = queue.pop_idle() {
            drop(queue);
            reader.unpark();
            return;
        }
        queue.readers += 1;
        queue.started += 1;
        let number = queue.started;
        drop(queue);
        let shared = Arc::clone(&self.shared);
        let name = format!("nvml-reader{number}");
        if let Err(e) = threads.spawn(name, move || shared.run(number)) {
            // Tried again at the next stall check; until then the queued devices wait.
            tracing::error!("cannot start a device reader thread: {e}");
            self.shared.lock_queue().readers -= 1;
        }
    }

    /// Tells every reader to end once it is out of NVML.
    pub fn stop(&self) {
        let mut queue = self.shared.lock_queue();
        queue.stop = true;
        queue.timer = None;
        for (_, reader) in queue.idle.drain(..) {
            reader.unpark();
        }
    }
}

impl Shared {
    fn lock_queue(&self) -> MutexGuard<'_, Queue> {
        // Only counters and positions live here, each changed in one step.
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reader thread `number`: takes the queued devices one at a time once their tick has
    /// started, reads each and delivers the reading, then waits for more. Ends on stop, or after
    /// [`READER_IDLE_LIMIT`] without work while another reader is left.
    fn run(&self, number: usize) {
        let mut queue = self.lock_queue();
        loop {
            if queue.stop {
                queue.readers -= 1;
                return;
            }
            if Instant::now() >= queue.start
                && let Some(position) = queue.next.pop_front()
            {
                let tick = queue.tick;
                drop(queue);
                self.read(position, tick);
                queue = self.lock_queue();
                continue;
            }
            queue.idle.push((number, thread::current()));
            let mut idle_since = Instant::now();
            loop {
                let wake = self.set_timer(&mut queue, number);
                let limit = idle_since + READER_IDLE_LIMIT;
                let until = wake.map_or(limit, |at| at.min(limit));
                drop(queue);
                thread::park_timeout(until.saturating_duration_since(Instant::now()));
                queue = self.lock_queue();
                // Woken: whoever unparked it took it off the idle list.
                let Some(at) = queue.idle.iter().position(|(n, _)| *n == number) else {
                    break;
                };
                let now = Instant::now();
                if queue
                    .timer
                    .is_some_and(|(n, due)| n == number && now >= due)
                {
                    // Its own timer: the tick it waited for is due.
                    queue.timer = None;
                    queue.idle.remove(at);
                    break;
                }
                if now >= limit {
                    if queue.readers > 1 && queue.timer.is_none_or(|(n, _)| n != number) {
                        queue.idle.remove(at);
                        queue.readers -= 1;
                        return;
                    }
                    // The last reader stays, idle for another period.
                    idle_since = now;
                }
                // Woken early without being taken off the list (park may): wait on.
            }
        }
    }

    /// Makes idle reader `number` the one that wakes by itself for the next tick, unless another
    /// idle reader already is: at the queued tick's start, or with nothing queued, when the next
    /// is expected. Returns when it is to wake, if it is that reader.
    fn set_timer(&self, queue: &mut Queue, number: usize) -> Option<Instant> {
        if queue.timer.is_some_and(|(n, _)| n != number) {
            return None;
        }
        let due = if queue.next.is_empty() {
            queue.start + self.interval
        } else {
            queue.start
        };
        if due <= Instant::now() {
            // Past: a tick queued from now on wakes a reader itself.
            queue.timer = None;
            return None;
        }
        queue.timer = Some((number, due));
        Some(due)
    }

    /// Reads the device at `position` for `tick` and delivers the reading. A panic (a bug) is
    /// logged and delivers nothing: the device is then served stale, then down, and the reader
    /// goes on with the others.
    fn read(&self, position: u32, tick: u64) {
        let Some(work) = self.devices.get(position as usize) else {
            return;
        };
        let read = catch_unwind(AssertUnwindSafe(|| {
            work.lock().unwrap_or_else(|p| p.into_inner()).read(tick)
        }));
        match read {
            Ok(outcome) => self.inbox.deliver(Reading {
                generation: self.generation,
                tick,
                index: position,
                outcome,
                at: Instant::now(),
            }),
            Err(_) => tracing::error!(gpu = position, "reading the device panicked"),
        }
    }
}
