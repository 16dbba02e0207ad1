//! Initialization, error strings, system queries and device enumeration.

use crate::ffi::{self, INVALID_ARGUMENT, NOT_FOUND, plain_fns, read_str, write, write_str};
use crate::scenario::parse_bus_id;
use crate::state;
use nvml_wrapper_sys::bindings::{nvmlDevice_t, nvmlReturn_t};
use std::os::raw::{c_char, c_int, c_uint};

fn init() -> ffi::NvmlResult {
    match state::init() {
        ffi::SUCCESS => Ok(()),
        code => Err(code),
    }
}

fn count(out: *mut c_uint) -> ffi::NvmlResult {
    write(out, ffi::present(&*state::sim()?).len() as c_uint)
}

fn by_index(index: c_uint, out: *mut nvmlDevice_t) -> ffi::NvmlResult {
    let sim = state::sim()?;
    // NVML indices count the GPUs present now; a restart that dropped one renumbers the rest.
    let i = *ffi::present(&sim)
        .get(index as usize)
        .ok_or(INVALID_ARGUMENT)?;
    // A lost GPU cannot be opened, just as the real driver answers when it fell off the bus;
    // error and hang faults naming this function apply too.
    ffi::inject_faults(&sim, i, "nvmlDeviceGetHandleByIndex")?;
    write(out, ffi::handle_of(i))
}

fn by_bus_id(bus: *const c_char, out: *mut nvmlDevice_t) -> ffi::NvmlResult {
    let sim = state::sim()?;
    let want = parse_bus_id(read_str(bus)?).ok_or(INVALID_ARGUMENT)?;
    let i = sim
        .scenario
        .gpus
        .iter()
        .position(|g| parse_bus_id(&g.pci_bus_id) == Some(want))
        .filter(|i| ffi::present(&sim).contains(i))
        .ok_or(NOT_FOUND)?;
    write(out, ffi::handle_of(i))
}

plain_fns! {
    /// Initializes the library (reference-counted).
    fn nvmlInit() { init() }
    /// Initializes the library (reference-counted).
    fn nvmlInit_v2() { init() }
    /// Initializes the library; the flags (no GPUs / no attach) change nothing here.
    fn nvmlInitWithFlags(_flags: c_uint) { init() }
    /// Drops one initialization reference.
    fn nvmlShutdown() {
        match state::shutdown() {
            ffi::SUCCESS => Ok(()),
            code => Err(code),
        }
    }
    /// Driver version string.
    fn nvmlSystemGetDriverVersion(version: *mut c_char, length: c_uint) {
        write_str(version, length, &state::sim()?.scenario.driver.version)
    }
    /// NVML version string.
    fn nvmlSystemGetNVMLVersion(version: *mut c_char, length: c_uint) {
        write_str(version, length, &state::sim()?.scenario.driver.nvml_version)
    }
    /// CUDA driver version, e.g. 12040.
    fn nvmlSystemGetCudaDriverVersion(version: *mut c_int) {
        write(version, state::sim()?.scenario.driver.cuda_version)
    }
    /// CUDA driver version, e.g. 12040.
    fn nvmlSystemGetCudaDriverVersion_v2(version: *mut c_int) {
        write(version, state::sim()?.scenario.driver.cuda_version)
    }
    /// Name of a process that holds a context on any GPU.
    fn nvmlSystemGetProcessName(pid: c_uint, name: *mut c_char, length: c_uint) {
        let sim = state::sim()?;
        let process = sim
            .scenario
            .gpus
            .iter()
            .flat_map(|g| &g.processes)
            .find(|p| p.pid == pid && p.alive(sim.now()))
            .ok_or(NOT_FOUND)?;
        // The real call truncates rather than failing on a short buffer.
        if name.is_null() || length == 0 {
            return Err(INVALID_ARGUMENT);
        }
        let mut n = process.name.len().min(length as usize - 1);
        while !process.name.is_char_boundary(n) {
            n -= 1;
        }
        write_str(name, length, &process.name[..n])
    }
    /// Number of GPUs.
    fn nvmlDeviceGetCount(device_count: *mut c_uint) { count(device_count) }
    /// Number of GPUs.
    fn nvmlDeviceGetCount_v2(device_count: *mut c_uint) { count(device_count) }
    /// Handle of the GPU with this index.
    fn nvmlDeviceGetHandleByIndex(index: c_uint, device: *mut nvmlDevice_t) { by_index(index, device) }
    /// Handle of the GPU with this index.
    fn nvmlDeviceGetHandleByIndex_v2(index: c_uint, device: *mut nvmlDevice_t) { by_index(index, device) }
    /// Handle of the GPU with this UUID.
    fn nvmlDeviceGetHandleByUUID(uuid: *const c_char, device: *mut nvmlDevice_t) {
        let sim = state::sim()?;
        let want = read_str(uuid)?;
        let i = sim
            .scenario
            .gpus
            .iter()
            .position(|g| g.uuid.eq_ignore_ascii_case(want))
            .filter(|i| ffi::present(&sim).contains(i))
            .ok_or(NOT_FOUND)?;
        write(device, ffi::handle_of(i))
    }
    /// Handle of the GPU with this serial number.
    fn nvmlDeviceGetHandleBySerial(serial: *const c_char, device: *mut nvmlDevice_t) {
        let sim = state::sim()?;
        let want = read_str(serial)?;
        let i = sim
            .scenario
            .gpus
            .iter()
            .position(|g| g.serial == want)
            .filter(|i| ffi::present(&sim).contains(i))
            .ok_or(NOT_FOUND)?;
        write(device, ffi::handle_of(i))
    }
    /// Handle of the GPU at this PCI bus id (any of the usual spellings).
    fn nvmlDeviceGetHandleByPciBusId(bus_id: *const c_char, device: *mut nvmlDevice_t) {
        by_bus_id(bus_id, device)
    }
    /// Handle of the GPU at this PCI bus id (any of the usual spellings).
    fn nvmlDeviceGetHandleByPciBusId_v2(bus_id: *const c_char, device: *mut nvmlDevice_t) {
        by_bus_id(bus_id, device)
    }
}

/// Description of a return code (a static string, never null).
#[unsafe(no_mangle)]
pub extern "C" fn nvmlErrorString(result: nvmlReturn_t) -> *const c_char {
    crate::errors::description(result).as_ptr()
}
