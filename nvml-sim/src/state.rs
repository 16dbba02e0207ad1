//! Process-global state: the init reference count and the current simulation (a loaded scenario,
//! its clocks and its runtime state).
//!
//! An `nvmlInit` that finds no live reference (the count at 0: the first init of the process, the
//! first after every reference was shut down, or a retry after a failed init) reads the
//! environment (`NVML_SIM_SCENARIO`, `NVML_SIM_TIME`, `NVML_SIM_START`, `NVML_SIM_EPOCH`,
//! `NVML_SIM_PRIVILEGED`)
//! and the scenario file again:
//! - both as the current simulation was loaded from them: that simulation goes on, with its
//!   clock, its init-fault clock and its event sets, as a real driver outlives a client that shuts
//!   NVML down and initialises it again (after a driver restart, say);
//! - anything changed: a new simulation starts, and its t = 0 is its own first successful init,
//!   or `NVML_SIM_EPOCH` (a Unix time) when set: then every process reads one clock.
//!
//! A load error is printed to stderr once per environment and scenario text, and every `nvmlInit`
//! fails until one of them changes.
//!
//! Handles of an earlier simulation never reach into the current one's state: event sets and GPM
//! samples answer INVALID_ARGUMENT; device, MIG device and GPU instance handles name a GPU index
//! and instance ids, and answer for what the current simulation has there (INVALID_ARGUMENT where
//! it has nothing).

#![allow(
    unsafe_code,
    reason = "dlopen keeps this library mapped for the life of the process"
)]

use crate::events::EventSets;
use crate::faults;
use crate::integrals::Integrals;
use crate::scenario::{DEFAULT_SCENARIO, Scenario};
use nvml_wrapper_sys::bindings as b;
use std::ffi::OsString;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Instant;

/// Path of the scenario file; unset: the compiled-in `h100x8.toml`.
pub const ENV_SCENARIO: &str = "NVML_SIM_SCENARIO";
/// Pins t to this many seconds (a frozen clock).
pub const ENV_TIME: &str = "NVML_SIM_TIME";
/// Starts the running clock at this many seconds.
pub const ENV_START: &str = "NVML_SIM_START";
/// Unix time (seconds) of t = 0 for every process: the running clock reads the wall clock
/// against it, so separate processes agree on t.
pub const ENV_EPOCH: &str = "NVML_SIM_EPOCH";
/// `0`/`false`: the caller is an unprivileged user, not root (default `1`, privileged).
pub const ENV_PRIVILEGED: &str = "NVML_SIM_PRIVILEGED";

/// A loaded scenario, its clocks and its runtime state.
#[derive(Debug)]
pub struct Sim {
    /// Tells this simulation from the others of the process (a GPM sample records it).
    pub id: u64,
    /// The scenario.
    pub scenario: Scenario,
    /// Per-GPU integral caches.
    pub integrals: Vec<Integrals>,
    /// Event sets.
    pub events: EventSets,
    /// Per-GPU GPM streaming state (`nvmlGpmSetStreamingEnabled`); off until enabled.
    pub gpm_streaming: Vec<AtomicBool>,
    /// How time is read.
    pub clock: Clock,
    /// The caller has root/admin privileges (`NVML_SIM_PRIVILEGED`); only calls `nvml.h`
    /// restricts to privileged callers look at it.
    pub privileged: bool,
    /// The first init attempt: `init` faults count from here.
    first_attempt: Instant,
    /// The first successful init: t = 0 of the running clock.
    origin: OnceLock<Instant>,
}

/// How the simulated time is obtained.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    /// Frozen at this t.
    pub pinned: Option<f64>,
    /// Running clock offset.
    pub start: f64,
    /// Unix time of t = 0 shared by every process (`NVML_SIM_EPOCH`); None: t = 0 is this
    /// simulation's first successful init.
    pub epoch: Option<f64>,
}

/// What a simulation is loaded from: the environment and the scenario text.
#[derive(Debug, PartialEq)]
struct Source {
    scenario_path: Option<OsString>,
    time: Option<OsString>,
    start: Option<OsString>,
    epoch: Option<OsString>,
    privileged: Option<OsString>,
    /// The scenario text, or why it could not be read.
    text: Result<String, String>,
}

impl Source {
    fn read() -> Source {
        let scenario_path = std::env::var_os(ENV_SCENARIO);
        let text = match &scenario_path {
            Some(path) => std::fs::read_to_string(path)
                .map_err(|e| format!("cannot read {}: {e}", path.to_string_lossy())),
            None => Ok(DEFAULT_SCENARIO.to_owned()),
        };
        Source {
            scenario_path,
            time: std::env::var_os(ENV_TIME),
            start: std::env::var_os(ENV_START),
            epoch: std::env::var_os(ENV_EPOCH),
            privileged: std::env::var_os(ENV_PRIVILEGED),
            text,
        }
    }
}

/// The init reference count and the simulation, which init and shutdown change together.
struct Driver {
    /// Live `nvmlInit` references.
    count: u32,
    /// The last load: what it read, and the simulation or why there is none.
    loaded: Option<(Source, Result<Arc<Sim>, String>)>,
}

static DRIVER: RwLock<Driver> = RwLock::new(Driver {
    count: 0,
    loaded: None,
});

fn driver() -> RwLockReadGuard<'static, Driver> {
    DRIVER.read().unwrap_or_else(|e| e.into_inner())
}

fn driver_mut() -> RwLockWriteGuard<'static, Driver> {
    DRIVER.write().unwrap_or_else(|e| e.into_inner())
}

/// A non-UTF-8 value counts as unset.
fn env_str(value: &Option<OsString>) -> Option<&str> {
    value.as_deref().and_then(|v| v.to_str())
}

fn env_seconds(name: &str, value: &Option<OsString>) -> Result<Option<f64>, String> {
    match env_str(value) {
        Some(v) => v
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|x| x.is_finite() && *x >= 0.0)
            .map(Some)
            .ok_or_else(|| format!("{name}={v:?} is not a number of seconds >= 0")),
        None => Ok(None),
    }
}

fn env_bool(name: &str, value: &Option<OsString>, default: bool) -> Result<bool, String> {
    match env_str(value) {
        Some(v) => match v.trim() {
            "1" | "true" => Ok(true),
            "0" | "false" => Ok(false),
            _ => Err(format!("{name}={v:?} is not 0, 1, true or false")),
        },
        None => Ok(default),
    }
}

impl Sim {
    fn load(source: &Source) -> Result<Sim, String> {
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        let text = source.text.as_deref().map_err(Clone::clone)?;
        let origin = match &source.scenario_path {
            Some(path) => path.to_string_lossy().into_owned(),
            None => "built-in h100x8.toml".into(),
        };
        let scenario = Scenario::parse(text).map_err(|e| format!("scenario {origin}: {e}"))?;
        let clock = Clock {
            pinned: env_seconds(ENV_TIME, &source.time)?,
            start: env_seconds(ENV_START, &source.start)?.unwrap_or(0.0),
            epoch: env_seconds(ENV_EPOCH, &source.epoch)?,
        };
        Ok(Sim {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            integrals: scenario.gpus.iter().map(Integrals::for_gpu).collect(),
            events: EventSets::default(),
            gpm_streaming: scenario
                .gpus
                .iter()
                .map(|_| AtomicBool::new(false))
                .collect(),
            scenario,
            clock,
            privileged: env_bool(ENV_PRIVILEGED, &source.privileged, true)?,
            first_attempt: Instant::now(),
            origin: OnceLock::new(),
        })
    }

    /// The current simulated time, seconds.
    pub fn now(&self) -> f64 {
        self.clock.pinned.unwrap_or_else(|| {
            let elapsed = match self.clock.epoch {
                Some(epoch) => since_epoch(epoch),
                None => {
                    let origin = self.origin.get().copied().unwrap_or_else(Instant::now);
                    origin.elapsed().as_secs_f64()
                }
            };
            self.clock.start + elapsed
        })
    }

    /// Time for the `init` faults: since the first init attempt, or the shared clock's t.
    fn since_first_attempt(&self) -> f64 {
        match self.clock {
            Clock {
                pinned: Some(t), ..
            } => t,
            Clock { epoch: Some(_), .. } => self.now(),
            Clock { start, .. } => start + self.first_attempt.elapsed().as_secs_f64(),
        }
    }
}

/// Seconds of wall-clock time since the Unix time `epoch`; 0 before it (the simulated time
/// never runs backwards past its start).
fn since_epoch(epoch: f64) -> f64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    (now - epoch).max(0.0)
}

impl Driver {
    /// Loads the simulation again unless the environment and the scenario text are the ones the
    /// current simulation (or the last failed load) came from.
    fn reload(&mut self) {
        let source = Source::read();
        if self.loaded.as_ref().is_some_and(|(s, _)| *s == source) {
            return;
        }
        let sim = Sim::load(&source).map(Arc::new);
        if let Err(e) = &sim {
            eprintln!("nvml-sim: {e}");
        }
        self.loaded = Some((source, sim));
    }
}

/// nvmlInit: reference-counted; fails with an injected init error or a bad scenario.
pub fn init() -> u32 {
    let mut driver = driver_mut();
    stay_loaded();
    if driver.count == 0 {
        driver.reload();
    }
    let Some((_, Ok(sim))) = &driver.loaded else {
        return b::nvmlReturn_enum_NVML_ERROR_UNKNOWN;
    };
    let sim = Arc::clone(sim);
    let since_first_attempt = sim.since_first_attempt();
    // Driver restarts follow the simulated clock, which starts at the first successful init.
    let t = match sim.origin.get() {
        Some(_) => sim.now(),
        None => since_first_attempt,
    };
    if let Some(code) = faults::init_error(&sim.scenario.faults, since_first_attempt, t) {
        return code;
    }
    sim.origin.get_or_init(Instant::now);
    driver.count += 1;
    b::nvmlReturn_enum_NVML_SUCCESS
}

/// Keeps this library mapped for the life of the process, as the first init happens.
///
/// A client that fails to initialise drops the library (`dlclose`), and a later attempt loads it
/// anew. The real driver's state lives in the kernel and survives that; ours lives in statics, so
/// without this an init fault "for the first N seconds" would restart its clock at every retry.
fn stay_loaded() {
    static PINNED: OnceLock<()> = OnceLock::new();
    PINNED.get_or_init(|| {
        // SAFETY: Dl_info is a plain C struct of pointers and integers; all-zero is a valid value.
        let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
        // SAFETY: dladdr only reads the address of a function of this library and fills `info`;
        // dlopen with RTLD_NOLOAD returns a new reference to the already-mapped library (never
        // loads anything), and RTLD_NODELETE makes later dlclose calls leave it mapped.
        unsafe {
            if libc::dladdr(stay_loaded as *const libc::c_void, &mut info) != 0
                && !info.dli_fname.is_null()
            {
                libc::dlopen(
                    info.dli_fname,
                    libc::RTLD_NOW | libc::RTLD_NOLOAD | libc::RTLD_NODELETE,
                );
            }
        }
    });
}

/// nvmlShutdown: drops one reference.
pub fn shutdown() -> u32 {
    let mut driver = driver_mut();
    if driver.count == 0 {
        return b::nvmlReturn_enum_NVML_ERROR_UNINITIALIZED;
    }
    driver.count -= 1;
    b::nvmlReturn_enum_NVML_SUCCESS
}

/// The simulation, if the library is initialized and the driver is not restarting (then the
/// restart's error, UNINITIALIZED by default, as a client's session does not survive a reload).
pub fn sim() -> Result<Arc<Sim>, u32> {
    let sim = match &*driver() {
        Driver {
            count: 1..,
            loaded: Some((_, Ok(sim))),
        } => Arc::clone(sim),
        _ => return Err(b::nvmlReturn_enum_NVML_ERROR_UNINITIALIZED),
    };
    match faults::driver_down(&sim.scenario.faults, sim.now()) {
        Some(code) => Err(code),
        None => Ok(sim),
    }
}
