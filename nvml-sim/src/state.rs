//! Process-global state: the loaded scenario, the init reference count and the simulated clock.
//!
//! The scenario is loaded once per process, at the first nvmlInit; a load error is printed to
//! stderr once and every nvmlInit then fails. t = 0 is the first successful init.

use crate::events::EventSets;
use crate::integrals::Integrals;
use crate::scenario::{DEFAULT_SCENARIO, Scenario};
use nvml_wrapper_sys::bindings as b;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

/// Path of the scenario file; unset: the compiled-in `h100x8.toml`.
pub const ENV_SCENARIO: &str = "NVML_SIM_SCENARIO";
/// Pins t to this many seconds (a frozen clock).
pub const ENV_TIME: &str = "NVML_SIM_TIME";
/// Starts the running clock at this many seconds.
pub const ENV_START: &str = "NVML_SIM_START";
/// `0`/`false`: the caller is an unprivileged user, not root (default `1`, privileged).
pub const ENV_PRIVILEGED: &str = "NVML_SIM_PRIVILEGED";

/// A loaded scenario and its runtime caches.
#[derive(Debug)]
pub struct Sim {
    /// The scenario.
    pub scenario: Scenario,
    /// Per-GPU integral caches.
    pub integrals: Vec<Integrals>,
    /// Event sets.
    pub events: EventSets,
    /// How time is read.
    pub clock: Clock,
    /// The caller has root/admin privileges (`NVML_SIM_PRIVILEGED`); only calls `nvml.h`
    /// restricts to privileged callers look at it.
    pub privileged: bool,
}

/// How the simulated time is obtained.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    /// Frozen at this t.
    pub pinned: Option<f64>,
    /// Running clock offset.
    pub start: f64,
}

static LOADED: OnceLock<Result<Arc<Sim>, String>> = OnceLock::new();
static FIRST_ATTEMPT: OnceLock<Instant> = OnceLock::new();
static ORIGIN: OnceLock<Instant> = OnceLock::new();
static INIT_COUNT: AtomicU32 = AtomicU32::new(0);
/// Serializes init/shutdown transitions so the count and the origin change together.
static TRANSITION: Mutex<()> = Mutex::new(());

fn env_seconds(name: &str) -> Result<Option<f64>, String> {
    match std::env::var(name) {
        Ok(v) => v
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|x| x.is_finite() && *x >= 0.0)
            .map(Some)
            .ok_or_else(|| format!("{name}={v:?} is not a number of seconds >= 0")),
        Err(_) => Ok(None),
    }
}

fn env_bool(name: &str, default: bool) -> Result<bool, String> {
    match std::env::var(name) {
        Ok(v) => match v.trim() {
            "1" | "true" => Ok(true),
            "0" | "false" => Ok(false),
            _ => Err(format!("{name}={v:?} is not 0, 1, true or false")),
        },
        Err(_) => Ok(default),
    }
}

fn load() -> Result<Arc<Sim>, String> {
    let (text, origin) = match std::env::var_os(ENV_SCENARIO) {
        Some(path) => {
            let text = std::fs::read_to_string(&path)
                .map_err(|e| format!("cannot read {}: {e}", path.to_string_lossy()))?;
            (text, path.to_string_lossy().into_owned())
        }
        None => (DEFAULT_SCENARIO.to_owned(), "built-in h100x8.toml".into()),
    };
    let scenario = Scenario::parse(&text).map_err(|e| format!("scenario {origin}: {e}"))?;
    let clock = Clock {
        pinned: env_seconds(ENV_TIME)?,
        start: env_seconds(ENV_START)?.unwrap_or(0.0),
    };
    Ok(Arc::new(Sim {
        integrals: scenario.gpus.iter().map(Integrals::for_gpu).collect(),
        events: EventSets::default(),
        scenario,
        clock,
        privileged: env_bool(ENV_PRIVILEGED, true)?,
    }))
}

fn loaded() -> Result<&'static Arc<Sim>, &'static str> {
    LOADED
        .get_or_init(|| {
            let r = load();
            if let Err(e) = &r {
                // Printed once: the OnceLock makes this the only load attempt in the process.
                eprintln!("nvml-sim: {e}");
            }
            r
        })
        .as_ref()
        .map_err(|e| e.as_str())
}

/// nvmlInit: reference-counted; fails with an injected init error or a bad scenario.
pub fn init() -> u32 {
    let _guard = TRANSITION.lock().unwrap_or_else(|e| e.into_inner());
    stay_loaded();
    let first_attempt = *FIRST_ATTEMPT.get_or_init(Instant::now);
    let Ok(sim) = loaded() else {
        return b::nvmlReturn_enum_NVML_ERROR_UNKNOWN;
    };
    let since_first_attempt = sim
        .clock
        .pinned
        .unwrap_or_else(|| sim.clock.start + first_attempt.elapsed().as_secs_f64());
    // Driver restarts follow the simulated clock, which starts at the first successful init.
    let t = match ORIGIN.get() {
        Some(_) => sim.now(),
        None => since_first_attempt,
    };
    if let Some(code) = crate::faults::init_error(&sim.scenario.faults, since_first_attempt, t) {
        return code;
    }
    ORIGIN.get_or_init(Instant::now);
    INIT_COUNT.fetch_add(1, Ordering::SeqCst);
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
    let _guard = TRANSITION.lock().unwrap_or_else(|e| e.into_inner());
    if INIT_COUNT.load(Ordering::SeqCst) == 0 {
        return b::nvmlReturn_enum_NVML_ERROR_UNINITIALIZED;
    }
    INIT_COUNT.fetch_sub(1, Ordering::SeqCst);
    b::nvmlReturn_enum_NVML_SUCCESS
}

/// The simulation, if the library is initialized and the driver is not restarting (then the
/// restart's error, UNINITIALIZED by default, as a client's session does not survive a reload).
pub fn sim() -> Result<&'static Sim, u32> {
    if INIT_COUNT.load(Ordering::SeqCst) == 0 {
        return Err(b::nvmlReturn_enum_NVML_ERROR_UNINITIALIZED);
    }
    let sim = loaded()
        .map(|s| s.as_ref())
        .map_err(|_| b::nvmlReturn_enum_NVML_ERROR_UNINITIALIZED)?;
    match crate::faults::driver_down(&sim.scenario.faults, sim.now()) {
        Some(code) => Err(code),
        None => Ok(sim),
    }
}

impl Sim {
    /// The current simulated time, seconds.
    pub fn now(&self) -> f64 {
        self.clock.pinned.unwrap_or_else(|| {
            let origin = ORIGIN.get().copied().unwrap_or_else(Instant::now);
            self.clock.start + origin.elapsed().as_secs_f64()
        })
    }
}
