//! Helpers shared by every exported function: panic containment, pointer checks, C strings,
//! device handles and the per-call fault checks.
//!
//! Handles are addresses inside a static table, so a handle is valid exactly when it points into
//! the first `gpu count` bytes of that table: no allocation, nothing to free, cheap to check.
//! MIG device handles and GPU instance handles come from two more tables, one slot per (GPU,
//! GPU instance id, compute instance id): a handle names instance ids, so once its instance is
//! destroyed it stays invalid (INVALID_ARGUMENT) until an instance with those ids exists again,
//! as `nvml.h` says a real driver's MIG handles may be reused.

#![allow(
    unsafe_code,
    reason = "the helpers of the exported C functions: raw pointers from C callers"
)]

use crate::faults;
use crate::integrals::Totals;
use crate::mig::{MAX_CI_IDS, MAX_GI_IDS, MigDevice};
use crate::physics::Sample;
use crate::replay::{Replay, Series};
use crate::scenario::{GpuSpec, MAX_GPUS};
use crate::state::{self, Sim};
use nvml_wrapper_sys::bindings::{self as b, nvmlDevice_t, nvmlGpuInstance_t, nvmlReturn_t};
use std::cell::OnceCell;
use std::os::raw::{c_char, c_uint};
use std::panic::{AssertUnwindSafe, catch_unwind};

/// Result of an entry point body: `Err(code)` is returned to the caller as is.
pub type NvmlResult = Result<(), nvmlReturn_t>;

/// Success.
pub const SUCCESS: nvmlReturn_t = b::nvmlReturn_enum_NVML_SUCCESS;
/// Bad argument.
pub const INVALID_ARGUMENT: nvmlReturn_t = b::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
/// Not supported by this device.
pub const NOT_SUPPORTED: nvmlReturn_t = b::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED;
/// Buffer too small.
pub const INSUFFICIENT_SIZE: nvmlReturn_t = b::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE;
/// Versioned struct with the wrong version word.
pub const VERSION_MISMATCH: nvmlReturn_t = b::nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
/// Not found.
pub const NOT_FOUND: nvmlReturn_t = b::nvmlReturn_enum_NVML_ERROR_NOT_FOUND;
/// The caller lacks the privileges the call needs.
pub const NO_PERMISSION: nvmlReturn_t = b::nvmlReturn_enum_NVML_ERROR_NO_PERMISSION;
/// Device lost.
pub const GPU_IS_LOST: nvmlReturn_t = b::nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST;
/// Internal failure (a caught panic).
pub const UNKNOWN: nvmlReturn_t = b::nvmlReturn_enum_NVML_ERROR_UNKNOWN;

static HANDLES: [u8; MAX_GPUS] = [0; MAX_GPUS];

const GI_SLOTS: usize = MAX_GI_IDS as usize;
const MIG_SLOTS: usize = GI_SLOTS * MAX_CI_IDS as usize;
static MIG_HANDLES: [u8; MAX_GPUS * MIG_SLOTS] = [0; MAX_GPUS * MIG_SLOTS];
static GI_HANDLES: [u8; MAX_GPUS * GI_SLOTS] = [0; MAX_GPUS * GI_SLOTS];

/// Device functions that answer on a MIG device handle; every other one answers NOT_SUPPORTED
/// there (a MIG device has no clocks, fans, power or links of its own).
const MIG_HANDLE_FUNCTIONS: &[&str] = &[
    "nvmlDeviceGetName",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetIndex",
    "nvmlDeviceGetArchitecture",
    "nvmlDeviceGetCudaComputeCapability",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetMemoryInfo_v2",
    "nvmlDeviceGetBAR1MemoryInfo",
    "nvmlDeviceGetTotalEccErrors",
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetEncoderUtilization",
    "nvmlDeviceGetDecoderUtilization",
    "nvmlDeviceGetProcessUtilization",
    "nvmlDeviceGetComputeRunningProcesses",
    "nvmlDeviceGetComputeRunningProcesses_v2",
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetGraphicsRunningProcesses",
    "nvmlDeviceGetGraphicsRunningProcesses_v2",
    "nvmlDeviceGetGraphicsRunningProcesses_v3",
    "nvmlDeviceGetMPSComputeRunningProcesses_v3",
    "nvmlDeviceIsMigDeviceHandle",
    "nvmlDeviceGetGpuInstanceId",
    "nvmlDeviceGetComputeInstanceId",
    "nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
    "nvmlDeviceGetAttributes",
    "nvmlDeviceGetAttributes_v2",
    "nvmlGpmQueryDeviceSupport",
    "nvmlGpmSampleGet",
];

/// Runs an entry point body; a panic becomes NVML_ERROR_UNKNOWN instead of unwinding into C.
pub fn guard(body: impl FnOnce() -> NvmlResult) -> nvmlReturn_t {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => SUCCESS,
        Ok(Err(code)) => code,
        Err(_) => UNKNOWN,
    }
}

/// The handle of GPU `index`.
pub fn handle_of(index: usize) -> nvmlDevice_t {
    HANDLES[..].as_ptr().wrapping_add(index) as nvmlDevice_t
}

/// The index behind a handle, if it names one of the scenario's GPUs.
pub fn index_of(sim: &Sim, device: nvmlDevice_t) -> Option<usize> {
    let offset = (device as usize).checked_sub(HANDLES.as_ptr() as usize)?;
    (offset < sim.scenario.gpus.len()).then_some(offset)
}

/// The handle of the MIG device (GPU `index`, GPU instance `gi_id`, compute instance `ci_id`).
pub fn mig_handle_of(index: usize, gi_id: u32, ci_id: u32) -> nvmlDevice_t {
    let slot = index * MIG_SLOTS + gi_id as usize * MAX_CI_IDS as usize + ci_id as usize;
    MIG_HANDLES[..].as_ptr().wrapping_add(slot) as nvmlDevice_t
}

/// The (GPU index, GPU instance id, compute instance id) a MIG device handle names.
fn mig_of(sim: &Sim, device: nvmlDevice_t) -> Option<(usize, u32, u32)> {
    let offset = (device as usize).checked_sub(MIG_HANDLES.as_ptr() as usize)?;
    let index = offset / MIG_SLOTS;
    let slot = offset % MIG_SLOTS;
    (index < sim.scenario.gpus.len()).then_some((
        index,
        (slot / MAX_CI_IDS as usize) as u32,
        (slot % MAX_CI_IDS as usize) as u32,
    ))
}

/// The handle of GPU instance `gi_id` of GPU `index`.
pub fn gi_handle_of(index: usize, gi_id: u32) -> nvmlGpuInstance_t {
    GI_HANDLES[..]
        .as_ptr()
        .wrapping_add(index * GI_SLOTS + gi_id as usize) as nvmlGpuInstance_t
}

/// The (GPU index, GPU instance id) a GPU instance handle names.
pub fn gi_of(sim: &Sim, gpu_instance: nvmlGpuInstance_t) -> Option<(usize, u32)> {
    let offset = (gpu_instance as usize).checked_sub(GI_HANDLES.as_ptr() as usize)?;
    let index = offset / GI_SLOTS;
    (index < sim.scenario.gpus.len()).then_some((index, (offset % GI_SLOTS) as u32))
}

/// The scenario indices of the GPUs the driver lists now (a restart may have dropped some), in
/// NVML index order.
pub fn present(sim: &Sim) -> Vec<usize> {
    faults::present(&sim.scenario.faults, sim.scenario.gpus.len(), sim.now())
}

/// The NVML index of scenario GPU `index` now: its position among the present GPUs.
pub fn nvml_index(sim: &Sim, index: usize) -> Option<usize> {
    present(sim).iter().position(|&g| g == index)
}

/// Writes `value` through `ptr` after a null check.
///
/// The caller of the exported function promises `ptr` is null or valid (the NVML contract);
/// this is the single place that trusts it.
pub(crate) fn write<T>(ptr: *mut T, value: T) -> NvmlResult {
    if ptr.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    // SAFETY: non-null, and valid for writes per the NVML contract of the exported function.
    unsafe { ptr.write_unaligned(value) };
    Ok(())
}

/// Reads the value behind `ptr` after a null check (used for versioned structs' version word).
pub(crate) fn read<T: Copy>(ptr: *const T) -> Result<T, nvmlReturn_t> {
    if ptr.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    // SAFETY: non-null, and valid for reads per the NVML contract of the exported function.
    Ok(unsafe { ptr.read_unaligned() })
}

/// Copies `s` and a NUL into `buf` of `len` bytes; too small: NVML_ERROR_INSUFFICIENT_SIZE.
pub(crate) fn write_str(buf: *mut c_char, len: c_uint, s: &str) -> NvmlResult {
    if buf.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    if (len as usize) < s.len() + 1 {
        return Err(INSUFFICIENT_SIZE);
    }
    // SAFETY: `buf` holds `len` >= s.len() + 1 bytes per the caller's contract.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr(), buf.cast::<u8>(), s.len());
        *buf.add(s.len()) = 0;
    }
    Ok(())
}

/// Reads a NUL-terminated C string argument.
pub(crate) fn read_str<'a>(s: *const c_char) -> Result<&'a str, nvmlReturn_t> {
    if s.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    // SAFETY: non-null and NUL-terminated per the NVML contract.
    unsafe { std::ffi::CStr::from_ptr(s) }
        .to_str()
        .map_err(|_| INVALID_ARGUMENT)
}

/// Writes `items` into the caller's array of `*count` entries with the INSUFFICIENT_SIZE
/// protocol: `*count` always ends up holding the number of items; a null array or a short one
/// answers NVML_ERROR_INSUFFICIENT_SIZE (unless there is nothing to write).
pub(crate) fn write_array<T: Copy>(count: *mut c_uint, array: *mut T, items: &[T]) -> NvmlResult {
    let capacity = read(count)? as usize;
    write(count, items.len() as c_uint)?;
    if items.is_empty() {
        return Ok(());
    }
    if array.is_null() || capacity < items.len() {
        return Err(INSUFFICIENT_SIZE);
    }
    for (i, item) in items.iter().enumerate() {
        // SAFETY: the array holds `capacity` >= items.len() entries.
        unsafe { array.add(i).write_unaligned(*item) };
    }
    Ok(())
}

/// Checks a versioned struct's version word (`sizeof(T) | version << 24`).
pub(crate) fn check_version<T>(found: u32, version: u32) -> NvmlResult {
    if found == (std::mem::size_of::<T>() as u32 | (version << 24)) {
        Ok(())
    } else {
        Err(VERSION_MISMATCH)
    }
}

/// What a device entry point gets: the GPU, the time of the call and lazily computed state.
pub struct DeviceCall<'a> {
    /// The simulation.
    pub sim: &'a Sim,
    /// The GPU's index.
    pub index: usize,
    /// The GPU.
    pub gpu: &'a GpuSpec,
    /// Simulated time of the call.
    pub t: f64,
    /// The MIG device, when the handle is a MIG device handle (`gpu` is then its parent).
    pub mig: Option<MigDevice<'a>>,
    sample: OnceCell<Sample>,
}

impl DeviceCall<'_> {
    /// The GPU's instantaneous state.
    pub fn sample(&self) -> &Sample {
        self.sample.get_or_init(|| Sample::at(self.gpu, self.t))
    }

    /// The GPU's accumulated counters.
    pub fn totals(&self) -> Totals {
        self.sim.integrals[self.index].at(self.gpu, self.t)
    }

    /// Fails with NOT_SUPPORTED when the GPU runs in MIG mode or the handle is a MIG device:
    /// what `nvml.h` says "is not currently supported" on MIG-enabled GPUs.
    pub fn require_no_mig(&self) -> NvmlResult {
        self.require(self.mig.is_none() && !self.gpu.mig.enabled)
    }

    /// Fails with NO_PERMISSION when an unprivileged caller (`NVML_SIM_PRIVILEGED=0`) asks the
    /// GPU handle of a GPU in MIG mode: `nvml.h` says the parent answers the aggregate "only if
    /// the caller has appropriate privileges" and sends everyone else to the MIG device handles,
    /// which keep answering.
    pub fn require_privileged_on_mig_parent(&self) -> NvmlResult {
        if self.sim.privileged || self.mig.is_some() || !self.gpu.mig.enabled {
            Ok(())
        } else {
            Err(NO_PERMISSION)
        }
    }

    /// A recorded gauge: `Ok(None)` without a `replay` table (the simulation answers),
    /// `Ok(Some(value at t))` when the recording has the reading `pick` selects, NOT_SUPPORTED
    /// when it has not (the recorded GPU did not support it).
    pub fn replayed(&self, pick: impl Fn(&Replay) -> Option<&Series>) -> Result<Option<f64>, u32> {
        self.replayed_with(pick, Series::gauge)
    }

    /// A recorded counter, as [`DeviceCall::replayed`] (counters keep growing across passes).
    pub fn replayed_counter(
        &self,
        pick: impl Fn(&Replay) -> Option<&Series>,
    ) -> Result<Option<u64>, u32> {
        Ok(self.replayed_with(pick, Series::counter)?.map(|v| v as u64))
    }

    fn replayed_with(
        &self,
        pick: impl Fn(&Replay) -> Option<&Series>,
        at: fn(&Series, f64, f64) -> f64,
    ) -> Result<Option<f64>, u32> {
        let Some(replay) = &self.gpu.replay else {
            return Ok(None);
        };
        let series = pick(replay).ok_or(NOT_SUPPORTED)?;
        Ok(Some(at(series, replay.step, self.t)))
    }

    /// Fails with NOT_SUPPORTED unless `supported`.
    pub fn require(&self, supported: bool) -> NvmlResult {
        if supported {
            Ok(())
        } else {
            Err(NOT_SUPPORTED)
        }
    }
}

/// Applies the injected faults for a call of `function` on GPU `index`: a lost GPU answers
/// NVML_ERROR_GPU_IS_LOST, a hang sleeps, an error is returned.
pub fn inject_faults(sim: &Sim, index: usize, function: &str) -> NvmlResult {
    let effect = faults::effect(&sim.scenario.faults, index, function, sim.now());
    if effect.lost {
        return Err(GPU_IS_LOST);
    }
    if let Some(seconds) = effect.hang_s {
        // A real sleep: the point is to make the caller's deadline handling observable.
        std::thread::sleep(std::time::Duration::from_secs_f64(seconds));
    }
    effect.error.map_or(Ok(()), Err)
}

/// Common prologue of every call taking a device handle: init and handle checks, then injected
/// faults for `function`, then the body.
pub fn with_device(
    function: &str,
    device: nvmlDevice_t,
    body: impl FnOnce(&DeviceCall) -> NvmlResult,
) -> nvmlReturn_t {
    guard(|| {
        let sim = state::sim()?;
        let (index, mig_ids) = match index_of(&sim, device) {
            Some(index) => (index, None),
            None => {
                let (index, gi, ci) = mig_of(&sim, device).ok_or(INVALID_ARGUMENT)?;
                (index, Some((gi, ci)))
            }
        };
        // A GPU that a driver restart dropped is gone: its old handle finds nothing there.
        if faults::absent(&sim.scenario.faults, index, sim.now()) {
            return Err(GPU_IS_LOST);
        }
        inject_faults(&sim, index, function)?;
        let gpu = &sim.scenario.gpus[index];
        let t = sim.now();
        let mig = match mig_ids {
            None => None,
            Some((gi, ci)) => {
                // The instance was destroyed (or not created yet): the handle is invalid.
                let device = gpu.mig.device_at(gi, ci, t).ok_or(INVALID_ARGUMENT)?;
                if !MIG_HANDLE_FUNCTIONS.contains(&function) {
                    return Err(NOT_SUPPORTED);
                }
                Some(device)
            }
        };
        let call = DeviceCall {
            sim: &sim,
            index,
            gpu,
            t,
            mig,
            sample: OnceCell::new(),
        };
        body(&call)
    })
}

/// Declares exported functions that take a device handle first. Each body gets `call:
/// &DeviceCall` and returns `NvmlResult`.
macro_rules! device_fns {
    ($(
        $(#[$meta:meta])*
        fn $name:ident($($arg:ident: $ty:ty),* $(,)?) |$call:ident| $body:block
    )*) => {$(
        $(#[$meta])*
        ///
        /// # Safety
        /// Pointer arguments must be null or valid for the accesses `nvml.h` describes.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(
            device: nvml_wrapper_sys::bindings::nvmlDevice_t,
            $($arg: $ty),*
        ) -> nvml_wrapper_sys::bindings::nvmlReturn_t {
            $crate::ffi::with_device(stringify!($name), device, |$call| $body)
        }
    )*};
}
pub(crate) use device_fns;

/// Declares exported functions that need no device (a panic still becomes NVML_ERROR_UNKNOWN).
macro_rules! plain_fns {
    ($(
        $(#[$meta:meta])*
        fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $body:block
    )*) => {$(
        $(#[$meta])*
        ///
        /// # Safety
        /// Pointer arguments must be null or valid for the accesses `nvml.h` describes.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> nvml_wrapper_sys::bindings::nvmlReturn_t {
            $crate::ffi::guard(|| $body)
        }
    )*};
}
pub(crate) use plain_fns;
