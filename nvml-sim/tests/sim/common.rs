//! Shared test setup: load the built `libnvml_sim.so` through nvml-wrapper, exactly as the
//! exporter does, with the environment each test needs.
//!
//! The library reads its environment and scenario at the first `nvmlInit` after a full shutdown
//! (nvml-sim/README.md), and the tests of this binary run on parallel threads, so a test takes
//! its turn with the library: under one lock it sets the environment, initializes NVML, runs and
//! shuts NVML down again (drops its `Nvml`) before the next test starts.

use nvml_wrapper::Nvml;
use nvml_wrapper::error::NvmlError;
use std::ops::Deref;
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The simulator's environment variables: a test's environment sets or removes each of them.
const VARS: [&str; 5] = [
    "NVML_SIM_SCENARIO",
    "NVML_SIM_TIME",
    "NVML_SIM_START",
    "NVML_SIM_EPOCH",
    "NVML_SIM_PRIVILEGED",
];

static LIBRARY: Mutex<()> = Mutex::new(());

/// The cdylib cargo built next to this test binary.
pub fn lib_path() -> PathBuf {
    nvml_sim::built_library().expect("libnvml_sim.so built next to the test executable")
}

/// Path of a shipped scenario.
pub fn scenario(name: &str) -> String {
    format!("{}/scenarios/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// The library's turn: while a test holds it, no other test touches the library or the
/// environment.
pub type Turn = MutexGuard<'static, ()>;

/// Waits until no other test uses the library, then sets the simulator's environment to `vars`
/// (see [`set_env`]). The library is this test's until the returned guard drops; whatever the
/// test initialized must be shut down by then.
pub fn turn(vars: &[(&str, Option<&str>)]) -> Turn {
    // A test that failed while holding the lock has shut its NVML down while unwinding.
    let turn = LIBRARY.lock().unwrap_or_else(|e| e.into_inner());
    set_env(&turn, vars);
    turn
}

/// Sets the simulator's environment to `vars`: a listed variable is set (None: removed), one not
/// listed is removed.
pub fn set_env(_turn: &Turn, vars: &[(&str, Option<&str>)]) {
    for name in VARS {
        let value = vars.iter().find(|(k, _)| *k == name).and_then(|(_, v)| *v);
        // SAFETY: the caller holds the turn: the other tests of this binary wait for it before
        // they touch the environment or the library, and nothing else here reads the environment.
        unsafe {
            match value {
                Some(v) => std::env::set_var(name, v),
                None => std::env::remove_var(name),
            }
        }
    }
}

/// Initializes NVML against the simulator.
pub fn init() -> Result<Nvml, NvmlError> {
    Nvml::builder().lib_path(lib_path().as_os_str()).init()
}

/// An initialized library for one test, in the environment it asked for.
pub struct Session {
    // Dropped first (nvmlShutdown), then the turn ends.
    nvml: Nvml,
    _turn: Turn,
}

impl Deref for Session {
    type Target = Nvml;

    fn deref(&self) -> &Nvml {
        &self.nvml
    }
}

/// Takes the library's turn with the environment `vars` (see [`turn`]) and initializes NVML.
pub fn session(vars: &[(&str, Option<&str>)]) -> Session {
    let turn = turn(vars);
    Session {
        nvml: init().expect("nvml init against the simulator"),
        _turn: turn,
    }
}

/// Polls `f` until it returns Some, for at most 5 s.
pub fn eventually<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}
