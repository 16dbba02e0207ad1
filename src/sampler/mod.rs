//! The sampler: reads every GPU on a fixed schedule on dedicated threads and hands one complete
//! [`Snapshot`] per tick to a `publish` callback, whatever the GPUs do. It publishes and gets
//! nothing back. No thread here runs on an async runtime.
//!
//! - `coordinator.rs`: NVML initialisation with backoff, one session per initialisation, ticks on
//!   a fixed schedule, publishing.
//! - `session.rs`: one NVML initialisation: its devices, their staleness, one tick's answers and
//!   its snapshot.
//! - `busy.rs`: busy-time counters, each device's readings integrated over time.
//! - `readers.rs`: the reader threads, and the job queue and answers channel that connect them to
//!   the session.
//! - `threads.rs`: a group of threads joined within a time bound, hung ones left detached.
//!
//! Isolation: NVML calls block, and a failing GPU can hang one for seconds. A device that misses
//! the per-device deadline is served from its last reading marked `stale` (and `up = false` once
//! that is older than the grace period); a device whose read is still inside a call is not asked
//! again, and its late reading is taken when it arrives. A hung call holds one reader thread;
//! the other devices are read by another.
//!
//! GPM saturation metrics are averages between a device's samples of two consecutive ticks, so
//! each read carries the tick number and each device keeps its previous GPM sample; a device
//! that missed a tick starts a new window.

mod busy;
mod coordinator;
mod readers;
mod session;
mod threads;

use std::io;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;

use crate::nvml::discovery;
use crate::nvml::error::{ErrorCounter, NvmlUnavailable};
use crate::sample::Snapshot;
use coordinator::Coordinator;
use session::Session;
use threads::ThreadGroup;

use crate::groups::Groups;

/// How long `Sampler::shutdown` waits for the coordinator (which itself waits a bounded time
/// for its readers).
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
    /// The collector groups: the NVML calls only other groups need are not made.
    pub groups: Groups,
    /// Below this activity (SM activity, or utilization without GPM) a reading is idle
    /// (`--idle-threshold`): the busy-time totals count its time as idle.
    pub idle_threshold: f64,
    /// Where the health verdicts held until a reset are kept across restarts
    /// (`--health-state-file`); read at start only. `None`: in memory only.
    pub health_state_file: Option<PathBuf>,
    /// The host's sysfs, whose PCI bus lists the GPUs NVML should enumerate (`--host-sys`; read
    /// with the `inventory` group on).
    pub host_sys: PathBuf,
    /// How long a GPU may take to register with the NVLink fabric after a session's first tick
    /// before its verdict says so (`--fabric-registration-timeout`).
    pub fabric_registration_timeout: Duration,
}

impl Default for SamplerOptions {
    /// The driver's library by soname, 1 s ticks, a 1 s deadline, 5 s grace, every group, idle
    /// below 5 %, the PCI bus of `/sys`, 5 minutes to register with the NVLink fabric.
    fn default() -> Self {
        SamplerOptions {
            nvml_lib: PathBuf::from("libnvidia-ml.so.1"),
            interval: Duration::from_secs(1),
            device_timeout: Duration::from_secs(1),
            stale_grace: Duration::from_secs(5),
            processes: None,
            groups: Groups::all(),
            idle_threshold: 0.05,
            health_state_file: None,
            host_sys: PathBuf::from("/sys"),
            fabric_registration_timeout: crate::health::FABRIC_REGISTRATION_TIMEOUT,
        }
    }
}

/// The sampler was stopped while it waited.
struct Stopped;

/// A running sampler's options, read by its coordinator at every tick and replaced by a
/// configuration reload ([`Sampler::live_options`]).
#[derive(Debug, Clone)]
pub struct LiveOptions(Arc<Mutex<Arc<SamplerOptions>>>);

impl LiveOptions {
    fn new(opts: SamplerOptions) -> LiveOptions {
        LiveOptions(Arc::new(Mutex::new(Arc::new(opts))))
    }

    /// The options in force.
    pub fn get(&self) -> Arc<SamplerOptions> {
        // A poisoned lock only means a swap panicked; the value is one Arc.
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Samples with `opts` from the next tick on. What a session set up at its start (the
    /// library, the readers' stall limit) follows at the next initialisation; the schedule and
    /// whether processes are read follow at once.
    pub fn set(&self, opts: SamplerOptions) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Arc::new(opts);
    }
}

/// The running sampler: a coordinator thread and, while NVML is up, the device readers and
/// the XID thread. Stops on [`Sampler::shutdown`] or when dropped.
pub struct Sampler {
    /// Dropped to stop the coordinator: nothing is ever sent on it.
    stop: Option<Sender<()>>,
    threads: Option<ThreadGroup>,
    options: LiveOptions,
}

impl Sampler {
    /// Starts sampling on dedicated threads. `publish` is called after every tick with a complete
    /// Snapshot — also while NVML is not (yet) initialised: then nvml_up=false and nvml_error says
    /// why, once per retry. Never blocks the caller.
    pub fn start(
        opts: SamplerOptions,
        publish: impl Fn(Snapshot) + Send + 'static,
    ) -> io::Result<Sampler> {
        let (stop, stopped) = crossbeam_channel::bounded(0);
        let options = LiveOptions::new(opts);
        let coordinator = Coordinator::new(options.clone(), publish, stopped);
        let mut threads = ThreadGroup::new();
        threads.spawn("nvml-sampler".into(), move || coordinator.run())?;
        Ok(Sampler {
            stop: Some(stop),
            threads: Some(threads),
            options,
        })
    }

    /// The options it samples with, to be replaced by a configuration reload (they outlive
    /// [`shutdown`](Self::shutdown), which takes the sampler).
    pub fn live_options(&self) -> LiveOptions {
        self.options.clone()
    }

    /// Signals every thread and joins those that return within a short bound; a reader stuck
    /// inside a hung NVML call is left detached (it holds its own reference to the library and
    /// exits by itself if the call ever returns). Idempotent / also on Drop.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        // The coordinator may already be gone (e.g. `publish` panicked): then nobody notices.
        drop(self.stop.take());
        let Some(threads) = self.threads.take() else {
            return;
        };
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
/// created, so a single tick would always see none. Nor is the health state file read: the
/// verdicts are those of this one reading.
pub fn sample_once(opts: &SamplerOptions) -> Snapshot {
    let errors = Arc::new(ErrorCounter::default());
    let nvml = match discovery::init(&opts.nvml_lib) {
        Ok(n) => Arc::new(n),
        Err(reason) => return down_snapshot(&reason, &errors),
    };
    let mut session = match Session::start(nvml, opts, &errors, None) {
        Ok(s) => s,
        Err(reason) => return down_snapshot(&reason, &errors),
    };
    let started = Instant::now();
    let deadline = started + opts.device_timeout;
    let mut health = crate::health::Tracker::default();
    health.set_fabric_registration_timeout(opts.fabric_registration_timeout);
    let snapshot = match session.tick(started, deadline, &crossbeam_channel::never()) {
        Ok(()) => session.snapshot(started, opts.stale_grace, &errors, None, &mut health),
        Err(Stopped) => unreachable!("a tick that `never()` stops ran to its end"),
    };
    session.stop();
    snapshot
}

/// A snapshot for "NVML is not answering", with the reason.
fn down_snapshot(reason: &NvmlUnavailable, errors: &ErrorCounter) -> Snapshot {
    Snapshot {
        nvml_up: false,
        nvml_error: Some(reason.to_string()),
        nvml_errors: errors.snapshot(),
        ..Snapshot::default()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::sync::mpsc;

    use super::*;
    use crate::sample::ClockEventReason;

    #[test]
    fn the_sampler_can_be_moved_to_another_thread() {
        fn assert_send<T: Send>() {}
        assert_send::<Sampler>();
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
            let _ = tx.lock().unwrap().send(s);
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
