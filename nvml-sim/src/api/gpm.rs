//! GPM entry points: device support, sample buffers, samples and metrics
//! (`nvmlGpm*` in `nvml.h`).
//!
//! A sample handle is an opaque id into a table of live samples, never a pointer the library
//! dereferences: freeing an unknown or already freed handle is a clean INVALID_ARGUMENT, and a
//! freed sample leaves nothing behind.

use crate::ffi::{
    INVALID_ARGUMENT, NvmlResult, UNKNOWN, VERSION_MISMATCH, device_fns, inject_faults, plain_fns,
    read, write,
};
use crate::gpm::{self, Snapshot};
use crate::state;
use nvml_wrapper_sys::bindings::{
    self as b, nvmlGpmMetric_t, nvmlGpmMetricsGet_t, nvmlGpmSample_t, nvmlGpmSupport_t,
};
use std::collections::BTreeMap;
use std::os::raw::{c_char, c_uint};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Live samples by handle: `None` until `nvmlGpmSampleGet` fills one.
static SAMPLES: Mutex<BTreeMap<usize, Option<Snapshot>>> = Mutex::new(BTreeMap::new());
/// The next handle id. Ids are never reused, so a stale handle cannot alias a new sample.
static NEXT_ID: AtomicUsize = AtomicUsize::new(1);

/// Handles are spaced like aligned allocations so they look like the pointers clients expect.
const HANDLE_STRIDE: usize = 16;

/// Most metrics one `nvmlGpmMetricsGet` may ask for: the length of `nvmlGpmMetricsGet_t.metrics`.
const MAX_METRICS: usize = b::nvmlGpmMetricId_t_NVML_GPM_METRIC_MAX as usize;

fn with_samples<T>(f: impl FnOnce(&mut BTreeMap<usize, Option<Snapshot>>) -> T) -> T {
    f(&mut SAMPLES.lock().unwrap_or_else(|e| e.into_inner()))
}

fn id_of(sample: nvmlGpmSample_t) -> usize {
    sample as usize
}

/// The recorded snapshot behind a handle: unknown or never filled → INVALID_ARGUMENT.
fn snapshot_of(sample: nvmlGpmSample_t) -> Result<Snapshot, u32> {
    with_samples(|s| s.get(&id_of(sample)).cloned().flatten()).ok_or(INVALID_ARGUMENT)
}

/// Stores `snapshot` in a live sample buffer.
fn fill(sample: nvmlGpmSample_t, snapshot: Snapshot) -> NvmlResult {
    with_samples(|s| match s.get_mut(&id_of(sample)) {
        Some(slot) => {
            *slot = Some(snapshot);
            Ok(())
        }
        None => Err(INVALID_ARGUMENT),
    })
}

plain_fns! {
    /// Allocates a sample buffer.
    fn nvmlGpmSampleAlloc(gpm_sample: *mut nvmlGpmSample_t) {
        state::sim()?;
        if gpm_sample.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed).checked_mul(HANDLE_STRIDE).ok_or(UNKNOWN)?;
        with_samples(|s| s.insert(id, None));
        write(gpm_sample, id as nvmlGpmSample_t)
    }
    /// Frees a sample buffer; an unknown (or already freed) handle is INVALID_ARGUMENT.
    ///
    /// Works without an initialized library so a client can always release what it holds.
    fn nvmlGpmSampleFree(gpm_sample: nvmlGpmSample_t) {
        with_samples(|s| s.remove(&id_of(gpm_sample)))
            .map(|_| ())
            .ok_or(INVALID_ARGUMENT)
    }
    /// Computes each requested metric from two samples of the same GPU.
    fn nvmlGpmMetricsGet(metrics_get: *mut nvmlGpmMetricsGet_t) {
        metrics_get_body(metrics_get)
    }
}

device_fns! {
    /// Whether the GPU supports GPM (Hopper and newer); versioned struct, version 1.
    fn nvmlGpmQueryDeviceSupport(gpm_support: *mut nvmlGpmSupport_t) |c| {
        let version = read(gpm_support)?.version;
        if version != b::NVML_GPM_SUPPORT_VERSION {
            return Err(VERSION_MISMATCH);
        }
        let supported = gpm::supported(c.gpu);
        write(gpm_support, nvmlGpmSupport_t { version, isSupportedDevice: c_uint::from(supported) })
    }
    /// Records the GPU's GPM counters into a sample buffer; on a MIG device handle, its GPU
    /// instance's (`nvml.h`: "This API supports the device handle and MIG device handle").
    fn nvmlGpmSampleGet(gpm_sample: nvmlGpmSample_t) |c| {
        c.require(gpm::supported(c.gpu))?;
        let snapshot = match c.mig {
            Some(d) => Snapshot::take_instance(c.sim, c.index, d.gi_index, c.t),
            None => Snapshot::take(c.sim, c.index, c.t),
        };
        fill(gpm_sample, snapshot)
    }
    /// Records the counters of the MIG GPU instance `gpu_instance_id` of this GPU:
    /// NOT_SUPPORTED on boards without GPM or MIG, INVALID_ARGUMENT when no instance has that
    /// id now (MIG disabled, or the instance destroyed).
    fn nvmlGpmMigSampleGet(gpu_instance_id: c_uint, gpm_sample: nvmlGpmSample_t) |c| {
        c.require(gpm::supported(c.gpu) && c.gpu.mig_capable)?;
        let (gi_index, _) = c
            .gpu
            .mig
            .instances_at(c.t)
            .find(|(_, gi)| gi.id == gpu_instance_id)
            .ok_or(INVALID_ARGUMENT)?;
        fill(gpm_sample, Snapshot::take_instance(c.sim, c.index, gi_index, c.t))
    }
    /// Whether GPM streaming is enabled (NOT_SUPPORTED without GPM).
    fn nvmlGpmQueryIfStreamingEnabled(state: *mut c_uint) |c| {
        c.require(gpm::supported(c.gpu))?;
        write(state, c_uint::from(c.sim.gpm_streaming[c.index].load(Ordering::Relaxed)))
    }
    /// Enables (1) or disables (0) GPM streaming.
    fn nvmlGpmSetStreamingEnabled(state: c_uint) |c| {
        c.require(gpm::supported(c.gpu))?;
        match state {
            0 | 1 => c.sim.gpm_streaming[c.index].store(state == 1, Ordering::Relaxed),
            _ => return Err(INVALID_ARGUMENT),
        }
        Ok(())
    }
}

/// `nvmlGpmMetricsGet`: the struct is read field by field through raw pointers, because a
/// client built against an older `nvml.h` passes a shorter `metrics` array; only the first
/// `numMetrics` entries are touched.
fn metrics_get_body(m: *mut nvmlGpmMetricsGet_t) -> NvmlResult {
    let sim = state::sim()?;
    if m.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    // SAFETY: non-null; the NVML contract makes it a valid nvmlGpmMetricsGet_t whose `metrics`
    // holds at least `numMetrics` entries. Fields are read through raw pointers (no references).
    let (version, count, sample1, sample2) = unsafe {
        (
            read(&raw const (*m).version)?,
            read(&raw const (*m).numMetrics)? as usize,
            read(&raw const (*m).sample1)?,
            read(&raw const (*m).sample2)?,
        )
    };
    if version != b::NVML_GPM_METRICS_GET_VERSION {
        return Err(VERSION_MISMATCH);
    }
    if count > MAX_METRICS {
        return Err(INVALID_ARGUMENT);
    }
    let s1 = snapshot_of(sample1)?;
    let s2 = snapshot_of(sample2)?;
    // A sample of an earlier simulation (before a shutdown and an init with another scenario or
    // environment) says nothing about this one's GPUs.
    if s1.sim != sim.id || s2.sim != sim.id {
        return Err(INVALID_ARGUMENT);
    }
    // Both samples must come from the same GPU, and from the same GPU instance (or both from the
    // whole GPU): a window across a MIG reconfiguration has nothing to average.
    if s1.index != s2.index || s1.instance != s2.instance {
        return Err(INVALID_ARGUMENT);
    }
    inject_faults(&sim, s1.index, "nvmlGpmMetricsGet")?;
    // Same refresh (or reversed order): there is no window to average over.
    if s2.t <= s1.t {
        return Err(INVALID_ARGUMENT);
    }
    let gpu = &sim.scenario.gpus[s1.index];
    // SAFETY: as above; `metrics` has at least `count` entries.
    let entries = unsafe { (&raw mut (*m).metrics).cast::<nvmlGpmMetric_t>() };
    for i in 0..count {
        // SAFETY: i < count <= the caller's array length.
        let entry = unsafe { entries.add(i) };
        // SAFETY: `entry` points at a valid nvmlGpmMetric_t (see above).
        let id = unsafe { read(&raw const (*entry).metricId)? };
        let (code, value, names) = match gpm::metric(gpu, id, &s1, &s2) {
            Ok((value, info)) => (
                b::nvmlReturn_enum_NVML_SUCCESS,
                value,
                [info.short_name, info.long_name, info.unit].map(|s| s.as_ptr() as *mut c_char),
            ),
            Err(code) => (code, 0.0, [std::ptr::null_mut(); 3]),
        };
        // SAFETY: as above. The name pointers are static strings of this library; `nvml.h` types
        // them `char *` but clients only read them.
        unsafe {
            write(&raw mut (*entry).nvmlReturn, code)?;
            write(&raw mut (*entry).value, value)?;
            write(&raw mut (*entry).metricInfo.shortName, names[0])?;
            write(&raw mut (*entry).metricInfo.longName, names[1])?;
            write(&raw mut (*entry).metricInfo.unit, names[2])?;
        }
    }
    Ok(())
}
