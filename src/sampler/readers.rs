//! The reader threads, and the two channels between them and their session: a job queue they
//! take devices to read from, and an answers channel each reading goes back on.
//!
//! A device's whole reading state (its [`DeviceReader`]: NOT_SUPPORTED memory, GPM window,
//! process and MIG readers) travels with its job and comes back with its answer. So a device
//! belongs to no thread: the session holds it while it is idle, the queue while it waits and a
//! reader while it is read. A device whose read hangs stays with the hung reader, and is thus
//! not asked again until its late answer comes back.
//!
//! Normally one reader takes the queued devices in turn: a tick wakes it once, however many GPUs
//! there are. A thread per device, woken each tick, spent more CPU switching threads than
//! reading. When answers are missing after the stall limit and devices are still queued (a read
//! is slow or hung), another reader is started for them: a hung call holds one thread and
//! delays the other GPUs by at most the stall limit. Readers beyond one per read still inside
//! NVML, plus one, are surplus; after [`SURPLUS_LIMIT`] of that, one is told to end.
//!
//! A reader ends when it takes [`Job::Retire`], or once its session drops the queue (and its
//! answers channel) when the session stops.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, select};

use super::Stopped;
use super::threads::ThreadGroup;
use crate::nvml::device::{DeviceReader, ReadOutcome};

/// The most a device queued behind a slow or hung one waits for another reader.
const STALL_LIMIT: Duration = Duration::from_millis(50);

/// How long more readers than needed may stay before one is told to end.
const SURPLUS_LIMIT: Duration = Duration::from_secs(10);

/// What a reader takes from the queue.
pub(super) enum Job {
    /// Read `device` for tick number `tick` of the session.
    Read {
        /// The tick that asked.
        tick: u64,
        /// The device, with all its reading state (boxed once, so that a job moves a pointer).
        device: Box<DeviceReader>,
    },
    /// End the reader that takes this.
    Retire,
}

/// A reading, as sent back to the session.
pub(super) struct Answer {
    /// The tick that asked for it.
    pub tick: u64,
    pub outcome: ReadOutcome,
    /// The device it read, back for the next tick.
    pub device: Box<DeviceReader>,
    /// When it was finished.
    pub at: Instant,
}

/// The reader threads of one session and the channels to them.
pub(super) struct Readers {
    jobs: Sender<Job>,
    /// The session's own end of the queue: what no reader started on is taken back from it.
    queued: Receiver<Job>,
    /// Cloned into every reader. Held here too, so the answers channel stays connected.
    answers_tx: Sender<Answer>,
    answers: Receiver<Answer>,
    /// The wait for answers after which another reader is started for what is still queued.
    stall: Duration,
    /// Readers started and not yet told to end.
    alive: usize,
    /// Readers ever started (numbers their threads' names).
    started: usize,
    /// Since when more readers than needed are alive.
    surplus_since: Option<Instant>,
}

impl Readers {
    /// No reader yet: the first is started with the first job. `device_timeout` is the per-device
    /// deadline; a stall is declared after at most a quarter of it.
    pub(super) fn new(device_timeout: Duration) -> Readers {
        let (jobs, queued) = crossbeam_channel::unbounded();
        let (answers_tx, answers) = crossbeam_channel::unbounded();
        Readers {
            jobs,
            queued,
            answers_tx,
            answers,
            stall: STALL_LIMIT.min(device_timeout / 4),
            alive: 0,
            started: 0,
            surplus_since: None,
        }
    }

    /// The wait for answers after which [`Readers::relieve_stall`] is due.
    pub(super) fn stall_limit(&self) -> Duration {
        self.stall
    }

    /// Queues `device` to be read for `tick`; starts a reader when none is alive.
    pub(super) fn queue(
        &mut self,
        tick: u64,
        device: Box<DeviceReader>,
        threads: &mut ThreadGroup,
    ) {
        // Cannot fail: `self.queued` keeps the queue's receiving side open.
        let _ = self.jobs.send(Job::Read { tick, device });
        if self.alive == 0 {
            self.start(threads);
        }
    }

    /// The next answer, or `None` once `until` has passed (answers already waiting are taken
    /// even then); `Err` when the sampler is stopped (`stop` disconnects).
    pub(super) fn next_answer(
        &self,
        stop: &Receiver<()>,
        until: Instant,
    ) -> Result<Option<Answer>, Stopped> {
        select! {
            // Never disconnected: `self.answers_tx` is a sender.
            recv(self.answers) -> answer => Ok(answer.ok()),
            recv(stop) -> _ => Err(Stopped),
            default(until.saturating_duration_since(Instant::now())) => Ok(None),
        }
    }

    /// Called each stall limit while answers are missing: when devices are still queued, every
    /// reader is busy (an idle one would have taken them), so another is started for them.
    pub(super) fn relieve_stall(&mut self, threads: &mut ThreadGroup) {
        if !self.jobs.is_empty() {
            self.start(threads);
        }
    }

    /// Takes back the devices no reader started on, to be asked again at the next tick.
    #[allow(
        clippy::vec_box,
        reason = "each device stays boxed, back into its slot"
    )]
    pub(super) fn take_back(&mut self) -> Vec<Box<DeviceReader>> {
        let mut devices = Vec::new();
        for job in self.queued.try_iter() {
            match job {
                Job::Read { device, .. } => devices.push(device),
                // Taken back before a reader took it: that reader stays.
                Job::Retire => self.alive += 1,
            }
        }
        devices
    }

    /// Called at the end of each tick with the number of devices still being read (inside a
    /// slow or hung call): a reader for each of them and one for the next tick are needed; when
    /// more have been alive for [`SURPLUS_LIMIT`], one is told to end.
    pub(super) fn retire_surplus(&mut self, reading: usize, now: Instant) {
        if self.alive <= reading + 1 {
            self.surplus_since = None;
            return;
        }
        let since = *self.surplus_since.get_or_insert(now);
        if now.duration_since(since) >= SURPLUS_LIMIT {
            let _ = self.jobs.send(Job::Retire);
            self.alive -= 1;
            // Another surplus reader is given its own period.
            self.surplus_since = None;
        }
    }

    /// Starts a reader thread. On failure, tried again at the next stall.
    fn start(&mut self, threads: &mut ThreadGroup) {
        self.started += 1;
        let name = format!("nvml-reader{}", self.started);
        let (jobs, answers) = (self.queued.clone(), self.answers_tx.clone());
        match threads.spawn(name, move || read_jobs(&jobs, &answers, DeviceReader::read)) {
            Ok(()) => self.alive += 1,
            Err(e) => tracing::error!("cannot start a device reader thread: {e}"),
        }
    }

    /// Drops every queued device and the channels: idle readers end at once, a reader inside a
    /// call ends when the call returns.
    pub(super) fn stop(self) {
        for job in self.queued.try_iter() {
            drop(job);
        }
    }
}

/// A reader thread: reads each device it takes from the queue with `read` (its
/// [`DeviceReader::read`]) and sends the reading back. Ends on [`Job::Retire`], or when the queue
/// or the answers channel is gone (the session stopped).
///
/// A panic while reading (a bug) answers as a failed read ([`DeviceReader::panicked`]): the
/// device comes back with it and is read again at the next tick, and the reader goes on.
fn read_jobs(
    jobs: &Receiver<Job>,
    answers: &Sender<Answer>,
    read: impl Fn(&mut DeviceReader, u64) -> ReadOutcome,
) {
    for job in jobs.iter() {
        let Job::Read { tick, mut device } = job else {
            return;
        };
        let outcome = catch_unwind(AssertUnwindSafe(|| read(&mut device, tick)))
            .unwrap_or_else(|_| device.panicked());
        let answer = Answer {
            tick,
            outcome,
            device,
            at: Instant::now(),
        };
        if answers.send(answer).is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The readers' thread count, from the group's view: started minus told to end.
    fn alive(r: &Readers) -> usize {
        r.alive
    }

    #[test]
    fn a_surplus_reader_is_told_to_end_after_the_limit_and_ends() {
        // One group per reader, to see which one ended.
        let (mut first, mut second) = (ThreadGroup::new(), ThreadGroup::new());
        let mut r = Readers::new(Duration::from_secs(1));
        r.start(&mut first);
        r.start(&mut second);
        assert_eq!(alive(&r), 2);

        // One device still inside a call: both readers are needed.
        let t0 = Instant::now();
        r.retire_surplus(1, t0);
        r.retire_surplus(1, t0 + SURPLUS_LIMIT * 2);
        assert_eq!(alive(&r), 2);

        // Nothing is being read: one reader is surplus, and told to end once the limit is over.
        r.retire_surplus(0, t0);
        r.retire_surplus(0, t0 + SURPLUS_LIMIT / 2);
        assert_eq!(alive(&r), 2, "not before the limit");
        r.retire_surplus(0, t0 + SURPLUS_LIMIT);
        assert_eq!(alive(&r), 1);
        // The last reader stays however long it idles.
        r.retire_surplus(0, t0 + SURPLUS_LIMIT * 3);
        r.retire_surplus(0, t0 + SURPLUS_LIMIT * 6);
        assert_eq!(alive(&r), 1);

        // Whichever reader took the message has ended while the queue is still open.
        let bound = Duration::from_secs(2);
        assert!(first.join_within(bound) || second.join_within(bound));
        r.stop();
    }

    #[test]
    fn a_retirement_taken_back_from_the_queue_keeps_its_reader_counted() {
        let mut r = Readers::new(Duration::from_secs(1));
        // Counted as alive without a thread, so the message stays queued.
        r.alive = 2;
        let t0 = Instant::now();
        r.retire_surplus(0, t0);
        r.retire_surplus(0, t0 + SURPLUS_LIMIT);
        assert_eq!(alive(&r), 1);
        assert!(r.take_back().is_empty());
        assert_eq!(alive(&r), 2);
    }

    #[test]
    fn a_read_that_panics_answers_as_a_failed_read_and_the_next_read_works() {
        let lib = nvml_sim::built_library().expect("libnvml_sim.so built next to the test");
        let nvml = std::sync::Arc::new(crate::nvml::discovery::init(&lib).expect("NVML"));
        let errors = std::sync::Arc::default();
        let device = Box::new(DeviceReader::new(nvml, 0, errors));
        let (jobs, queued) = crossbeam_channel::unbounded();
        let (answers_tx, answers) = crossbeam_channel::unbounded();
        jobs.send(Job::Read { tick: 1, device }).unwrap();
        drop(jobs);
        // The first read panics, as a bug would; the reader answers and goes on.
        let reader = std::thread::spawn(move || {
            read_jobs(&queued, &answers_tx, |device, tick| {
                assert!(tick > 1, "a bug in the read");
                device.read(tick)
            })
        });
        let failed = answers.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!(failed.tick, 1);
        assert_eq!(
            failed.outcome.verdict,
            crate::nvml::ledger::Verdict::Unanswered
        );
        assert_eq!(failed.outcome.sample.index, 0);
        assert!(!failed.outcome.sample.up);
        reader.join().unwrap();

        // The device came back with the answer: the next tick reads it.
        let (jobs, queued) = crossbeam_channel::unbounded();
        let (answers_tx, answers) = crossbeam_channel::unbounded();
        jobs.send(Job::Read {
            tick: 2,
            device: failed.device,
        })
        .unwrap();
        drop(jobs);
        read_jobs(&queued, &answers_tx, DeviceReader::read);
        let read = answers.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!(read.outcome.verdict, crate::nvml::ledger::Verdict::Up);
        assert!(read.outcome.sample.up && read.outcome.sample.uuid.starts_with("GPU-"));
    }
}
