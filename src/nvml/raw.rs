//! NVML calls that nvml-wrapper 0.13 does not wrap (or wraps without a parameter we need), made
//! through `nvml.lib()` the same way the wrapper makes its own calls: look the symbol up with
//! `nvml_sym`, call it, turn the return code into a `Result` with `nvml_try`.

#![allow(
    unsafe_code,
    reason = "the NVML C calls nvml-wrapper does not make for us"
)]

use std::mem;
use std::sync::Arc;

use nvml_wrapper::error::{NvmlError, nvml_sym, nvml_try};
use nvml_wrapper::{Device, Nvml};
use nvml_wrapper_sys::bindings::{
    self as sys, NVML_GPM_METRICS_GET_VERSION, nvmlDevice_t, nvmlEccSramErrorStatus_v1_t,
    nvmlFieldValue_t, nvmlGpmMetricsGet_t, nvmlGpmSample_t, nvmlGpuFabricInfo_t,
    nvmlGpuFabricInfo_v2_t, nvmlGpuFabricInfo_v3_t, nvmlGpuInstance_t, nvmlGpuInstanceInfo_t,
    nvmlGpuInstanceProfileInfo_v2_t, nvmlReturn_t, nvmlValue_t, nvmlValueType_t,
};

/// Current clock-event (throttle) reasons as the raw `nvmlClocksEventReason*` bitmask, from
/// `nvmlDeviceGetCurrentClocksEventReasons` (the name since CUDA 12.2). `FailedToLoadSymbol` when
/// the library predates it: the caller then falls back to the older ThrottleReasons call.
pub fn current_clocks_event_reasons(device: &Device) -> Result<u64, NvmlError> {
    let lib = device.nvml().lib();
    device_mask(
        device,
        nvml_sym(lib.nvmlDeviceGetCurrentClocksEventReasons.as_ref())?,
    )
}

/// A function of nvml.h that writes one 64-bit mask of a device.
type MaskFn = unsafe extern "C" fn(nvmlDevice_t, *mut u64) -> nvmlReturn_t;

/// The mask `sym` writes for `device`.
fn device_mask(device: &Device, sym: &MaskFn) -> Result<u64, NvmlError> {
    let mut mask: u64 = 0;
    // SAFETY: the handle comes from a live `Device` of a live `Nvml`; the out-pointer is valid.
    unsafe { nvml_try(sym(device.handle(), &mut mask))? };
    Ok(mask)
}

/// The answer of `nvmlDeviceGetRemappedRows`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawRemappedRows {
    /// Rows remapped for correctable errors.
    pub correctable: u32,
    /// Rows remapped for uncorrectable errors.
    pub uncorrectable: u32,
    /// A remapping is pending (takes effect at the next GPU reset).
    pub pending: bool,
    /// A remapping failed: the GPU needs service.
    pub failure_occurred: bool,
}

/// Row-remapping counters (Ampere and newer), from `nvmlDeviceGetRemappedRows`.
pub fn remapped_rows(device: &Device) -> Result<RawRemappedRows, NvmlError> {
    let sym = nvml_sym(device.nvml().lib().nvmlDeviceGetRemappedRows.as_ref())?;
    let (mut corr, mut unc, mut pending, mut failed) = (0u32, 0u32, 0u32, 0u32);
    // SAFETY: valid handle, four valid out-pointers.
    unsafe {
        nvml_try(sym(
            device.handle(),
            &mut corr,
            &mut unc,
            &mut pending,
            &mut failed,
        ))?
    };
    Ok(RawRemappedRows {
        correctable: corr,
        uncorrectable: unc,
        pending: pending != 0,
        failure_occurred: failed != 0,
    })
}

/// A decoded field value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum FieldValue {
    /// NVML_VALUE_TYPE_DOUBLE.
    Float(f64),
    /// Any unsigned integer type.
    Unsigned(u64),
    /// Any signed integer type.
    Signed(i64),
}

impl FieldValue {
    /// The value as a float (for gauges).
    pub fn as_f64(self) -> f64 {
        match self {
            FieldValue::Float(v) => v,
            FieldValue::Unsigned(v) => v as f64,
            FieldValue::Signed(v) => v as f64,
        }
    }

    /// The value as an unsigned integer (for counters); `None` for a negative or fractional value.
    pub fn as_u64(self) -> Option<u64> {
        match self {
            FieldValue::Unsigned(v) => Some(v),
            FieldValue::Signed(v) => u64::try_from(v).ok(),
            FieldValue::Float(v) if v >= 0.0 && v.fract() == 0.0 => Some(v as u64),
            FieldValue::Float(_) => None,
        }
    }
}

/// Reads several field values in one `nvmlDeviceGetFieldValues` call. Each request is
/// (field id, scope id); the scope is the NVLink link for per-link fields and 0 otherwise
/// (nvml-wrapper's `field_values_for` cannot set it). The outer error is the call's; each inner
/// result is that field's own `nvmlReturn`.
///
/// Field ids are passed as `nvml.h` numbers them: nvml-wrapper renumbers only ids 251–273 for
/// drivers ≥ 580.82, and the ids used here (82, 138, 139, 230) are outside that range.
pub fn field_values(
    device: &Device,
    requests: &[(u32, u32)],
) -> Result<Vec<Result<FieldValue, NvmlError>>, NvmlError> {
    if requests.is_empty() {
        return Ok(Vec::new());
    }
    let sym = nvml_sym(device.nvml().lib().nvmlDeviceGetFieldValues.as_ref())?;
    let mut values: Vec<nvmlFieldValue_t> = requests
        .iter()
        .map(|&(field, scope)| {
            // SAFETY: nvmlFieldValue_t is plain old data; all-zero is a valid value.
            let mut v: nvmlFieldValue_t = unsafe { mem::zeroed() };
            v.fieldId = field;
            v.scopeId = scope;
            v
        })
        .collect();
    let count = i32::try_from(values.len()).map_err(|_| NvmlError::InvalidArg)?;
    // SAFETY: the buffer holds exactly `count` initialised entries.
    unsafe { nvml_try(sym(device.handle(), count, values.as_mut_ptr()))? };
    Ok(values
        .iter()
        .map(|v| {
            nvml_try(v.nvmlReturn)?;
            decode_value(v.valueType, v.value)
        })
        .collect())
}

/// A GPM sample (`nvmlGpmSample_t`): a snapshot of a GPU's (or one MIG instance's) performance
/// counters, which [`GpmRequest::get`] turns into averages over the time between two of them.
///
/// It owns its handle and the `Nvml` that allocated it, so a device's previous sample can be kept
/// from one tick to the next on whichever thread reads the device; the handle is freed on drop,
/// before the library can be shut down. nvml-wrapper's own `GpmSample` borrows the `Nvml`, which
/// would tie the device's reading state to one borrow.
pub struct GpmSample {
    handle: nvmlGpmSample_t,
    nvml: Arc<Nvml>,
}

// SAFETY: the handle is owned by this value alone (never copied out) and only passed to NVML,
// which may be called from any thread; `&mut`/ownership keeps its use to one thread at a time.
unsafe impl Send for GpmSample {}

impl std::fmt::Debug for GpmSample {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpmSample").finish_non_exhaustive()
    }
}

impl GpmSample {
    /// Samples the whole GPU now (`nvmlGpmSampleAlloc`, then `nvmlGpmSampleGet`). The caller
    /// checks first that the library has every GPM entry point ([`super::gpm::library_has_gpm`]).
    pub fn of_device(nvml: &Arc<Nvml>, device: &Device) -> Result<GpmSample, NvmlError> {
        let get = nvml_sym(nvml.lib().nvmlGpmSampleGet.as_ref())?;
        let sample = GpmSample::alloc(nvml)?;
        // SAFETY: a valid device handle of this `Nvml` and a sample handle it just allocated.
        unsafe { nvml_try(get(device.handle(), sample.handle))? };
        Ok(sample)
    }

    /// Samples GPU instance `gpu_instance` of `device` now (`nvmlGpmMigSampleGet`).
    pub fn of_instance(
        nvml: &Arc<Nvml>,
        device: &Device,
        gpu_instance: u32,
    ) -> Result<GpmSample, NvmlError> {
        let get = nvml_sym(nvml.lib().nvmlGpmMigSampleGet.as_ref())?;
        let sample = GpmSample::alloc(nvml)?;
        // SAFETY: a valid device handle of this `Nvml` and a sample handle it just allocated.
        unsafe { nvml_try(get(device.handle(), gpu_instance, sample.handle))? };
        Ok(sample)
    }

    /// An empty sample (`nvmlGpmSampleAlloc`), freed on drop.
    fn alloc(nvml: &Arc<Nvml>) -> Result<GpmSample, NvmlError> {
        let alloc = nvml_sym(nvml.lib().nvmlGpmSampleAlloc.as_ref())?;
        let mut handle: nvmlGpmSample_t = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; NVML writes the new handle there.
        unsafe { nvml_try(alloc(&mut handle))? };
        Ok(GpmSample {
            handle,
            nvml: Arc::clone(nvml),
        })
    }
}

impl Drop for GpmSample {
    fn drop(&mut self) {
        // The symbol is looked up rather than assumed: a library without it cannot have
        // allocated the sample either, but a missing symbol must not panic in a destructor.
        if let Ok(free) = self.nvml.lib().nvmlGpmSampleFree.as_ref() {
            // SAFETY: the handle was allocated by this library's `nvmlGpmSampleAlloc`, is owned
            // by this value alone and is freed once, here. The error cannot be acted on.
            let _ = unsafe { free(self.handle) };
        }
    }
}

/// A `nvmlGpmMetricsGet` request kept across ticks: it asks for the same metrics with the same
/// call as nvml-wrapper's `gpm_metrics_get`, which zeroes a fresh 8 KiB request per call and copies
/// the three name strings of every metric; this reads back only each metric's return code and
/// value.
pub struct GpmRequest(Box<nvmlGpmMetricsGet_t>);

// SAFETY: the request owns no memory through its pointers: the sample handles are only passed
// to NVML (which may be called from any thread), and the name pointers NVML sets are never read.
// `&mut self` keeps it to one thread at a time.
unsafe impl Send for GpmRequest {}

impl std::fmt::Debug for GpmRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpmRequest").finish_non_exhaustive()
    }
}

impl Default for GpmRequest {
    fn default() -> Self {
        // SAFETY: nvmlGpmMetricsGet_t is plain old data (integers, doubles, pointers); all-zero
        // is a valid value.
        GpmRequest(Box::new(unsafe { mem::zeroed() }))
    }
}

impl GpmRequest {
    /// The averages of metrics `ids` between two samples: the call's own error, or each
    /// metric's value or error in the order of `ids` (written into `out`, which is cleared).
    /// More ids than the request holds is `InvalidArg`.
    pub fn get(
        &mut self,
        nvml: &Nvml,
        sample1: &GpmSample,
        sample2: &GpmSample,
        ids: impl ExactSizeIterator<Item = u32>,
        out: &mut Vec<Result<f64, NvmlError>>,
    ) -> Result<(), NvmlError> {
        out.clear();
        let sym = nvml_sym(nvml.lib().nvmlGpmMetricsGet.as_ref())?;
        let r = &mut *self.0;
        if ids.len() > r.metrics.len() {
            return Err(NvmlError::InvalidArg);
        }
        let count = ids.len();
        r.version = NVML_GPM_METRICS_GET_VERSION;
        r.numMetrics = count as u32;
        // The handles belong to live samples of the `Nvml` whose symbol is called; they are only
        // passed to the driver.
        (r.sample1, r.sample2) = (sample1.handle, sample2.handle);
        for (m, id) in r.metrics.iter_mut().zip(ids) {
            m.metricId = id;
            m.nvmlReturn = 0;
            m.value = 0.0;
        }
        // SAFETY: a versioned request with `numMetrics` entries initialised; NVML writes only
        // within it (the name pointers it may set point into the library's own memory and are
        // never read here).
        unsafe { nvml_try(sym(r))? };
        let answered = &r.metrics[..count];
        out.extend(
            answered
                .iter()
                .map(|m| nvml_try(m.nvmlReturn).map(|()| m.value)),
        );
        Ok(())
    }
}

/// Interprets the `nvmlValue_t` union by its `nvmlValueType_t` tag.
fn decode_value(kind: nvmlValueType_t, value: nvmlValue_t) -> Result<FieldValue, NvmlError> {
    // SAFETY: each arm reads the member the tag names; every member is plain data, so a
    // mismatched tag from a broken library yields a wrong number, never undefined behaviour.
    unsafe {
        Ok(match kind {
            sys::nvmlValueType_enum_NVML_VALUE_TYPE_DOUBLE => FieldValue::Float(value.dVal),
            sys::nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_INT => {
                FieldValue::Unsigned(u64::from(value.uiVal))
            }
            sys::nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_LONG => {
                FieldValue::Unsigned(value.ulVal)
            }
            sys::nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_LONG_LONG => {
                FieldValue::Unsigned(value.ullVal)
            }
            sys::nvmlValueType_enum_NVML_VALUE_TYPE_SIGNED_LONG_LONG => {
                FieldValue::Signed(value.sllVal)
            }
            sys::nvmlValueType_enum_NVML_VALUE_TYPE_SIGNED_INT => {
                FieldValue::Signed(i64::from(value.siVal))
            }
            sys::nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_SHORT => {
                FieldValue::Unsigned(u64::from(value.usVal))
            }
            other => return Err(NvmlError::UnexpectedVariant(other)),
        })
    }
}

/// Which id of a MIG device [`mig_instance_id`] asks for.
#[derive(Debug, Clone, Copy)]
pub enum IdKind {
    /// Its GPU instance.
    Gpu,
    /// Its compute instance within that GPU instance.
    Compute,
}

/// `nvmlDeviceGetGpuInstanceId` / `nvmlDeviceGetComputeInstanceId` of a MIG device handle.
pub fn mig_instance_id(mig: &Device, kind: IdKind) -> Result<u32, NvmlError> {
    let lib = mig.nvml().lib();
    let sym = nvml_sym(match kind {
        IdKind::Gpu => lib.nvmlDeviceGetGpuInstanceId.as_ref(),
        IdKind::Compute => lib.nvmlDeviceGetComputeInstanceId.as_ref(),
    })?;
    let mut id = 0;
    // SAFETY: the handle comes from a live `Device` of a live `Nvml`; the out-pointer is valid.
    unsafe { nvml_try(sym(mig.handle(), &mut id))? };
    Ok(id)
}

/// Parent, id, profile id and placement of GPU instance `gi` of `device`; `None` when no
/// instance has that id now (destroyed since the MIG devices were listed).
pub fn gpu_instance_info(
    device: &Device,
    gi: u32,
) -> Result<Option<nvmlGpuInstanceInfo_t>, NvmlError> {
    let lib = device.nvml().lib();
    let by_id = nvml_sym(lib.nvmlDeviceGetGpuInstanceById.as_ref())?;
    let get_info = nvml_sym(lib.nvmlGpuInstanceGetInfo.as_ref())?;
    // SAFETY: nvmlGpuInstance_t is an opaque pointer; null is a valid "none yet".
    let mut instance: nvmlGpuInstance_t = std::ptr::null_mut();
    // SAFETY: valid device handle and out-pointer.
    match unsafe { nvml_try(by_id(device.handle(), gi, &mut instance)) } {
        Err(NvmlError::NotFound) => return Ok(None),
        other => other?,
    }
    // SAFETY: plain old data; all-zero is a valid value.
    let mut info: nvmlGpuInstanceInfo_t = unsafe { mem::zeroed() };
    // SAFETY: the instance handle was just returned by NVML; the out-pointer is valid.
    unsafe { nvml_try(get_info(instance, &mut info))? };
    Ok(Some(info))
}

/// Profile id and name (e.g. "MIG 1g.10gb") of the `NVML_GPU_INSTANCE_PROFILE_*` value `profile`
/// (`nvmlDeviceGetGpuInstanceProfileInfoV`, v2 struct); `None` when the board has no such profile
/// (NOT_SUPPORTED, INVALID_ARGUMENT).
pub fn gpu_instance_profile(
    device: &Device,
    profile: u32,
) -> Result<Option<(u32, String)>, NvmlError> {
    let sym = nvml_sym(
        device
            .nvml()
            .lib()
            .nvmlDeviceGetGpuInstanceProfileInfoV
            .as_ref(),
    )?;
    // SAFETY: plain old data; all-zero is a valid value.
    let mut info: nvmlGpuInstanceProfileInfo_v2_t = unsafe { mem::zeroed() };
    // NVML_STRUCT_VERSION(GpuInstanceProfileInfo, 2): the size, and the version in the top byte.
    info.version = struct_version::<nvmlGpuInstanceProfileInfo_v2_t>(2);
    // SAFETY: valid handle, out-pointer to a struct of the size the version word says.
    match unsafe { nvml_try(sym(device.handle(), profile, &mut info)) } {
        Err(NvmlError::NotSupported | NvmlError::InvalidArg) => return Ok(None),
        other => other?,
    }
    let name: Vec<u8> = info
        .name
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    Ok(Some((info.id, String::from_utf8_lossy(&name).into_owned())))
}

/// `NVML_STRUCT_VERSION(name, version)` of nvml.h: the struct's size, the version in the top byte.
fn struct_version<T>(version: u32) -> u32 {
    mem::size_of::<T>() as u32 | (version << 24)
}

/// Whether the SRAM uncorrectable error threshold of NVIDIA's field diagnostic is exceeded
/// (`nvmlDeviceGetSramEccErrorStatus`, v1 struct, `bThresholdExceeded`). nvml.h: Ampere and
/// newer, root only (NO_PERMISSION otherwise).
pub fn sram_threshold_exceeded(device: &Device) -> Result<bool, NvmlError> {
    let sym = nvml_sym(device.nvml().lib().nvmlDeviceGetSramEccErrorStatus.as_ref())?;
    // SAFETY: plain old data; all-zero is a valid value.
    let mut status: nvmlEccSramErrorStatus_v1_t = unsafe { mem::zeroed() };
    status.version = struct_version::<nvmlEccSramErrorStatus_v1_t>(1);
    // SAFETY: valid handle, out-pointer to a struct of the size the version word says.
    unsafe { nvml_try(sym(device.handle(), &mut status))? };
    Ok(status.bThresholdExceeded != 0)
}

/// `nvmlUnrepairableMemoryStatus_v1_t` of nvml.h (R590), which nvml-wrapper-sys 0.10 predates.
#[repr(C)]
struct UnrepairableMemoryStatusV1 {
    version: u32,
    unrepairable_memory: u32,
}

/// `nvmlDeviceGetUnrepairableMemoryFlag_v1` of nvml.h (R590, Hopper and newer), which
/// nvml-wrapper-sys 0.10 predates.
type UnrepairableMemoryFlagFn =
    unsafe extern "C" fn(nvmlDevice_t, *mut UnrepairableMemoryStatusV1) -> nvmlReturn_t;

/// Whether the GPU has memory it can no longer repair (`nvmlDeviceGetUnrepairableMemoryFlag_v1`,
/// R590 and newer). A library without the entry point answers NOT_SUPPORTED: the flag is newer
/// than the driver, not an error.
pub fn unrepairable_memory(device: &Device) -> Result<bool, NvmlError> {
    // SAFETY: the symbol, when the library has it, has the signature nvml.h declares.
    let sym = unsafe {
        device
            .nvml()
            .lib()
            .__library
            .get::<UnrepairableMemoryFlagFn>(b"nvmlDeviceGetUnrepairableMemoryFlag_v1\0")
    }
    .map_err(|_| NvmlError::NotSupported)?;
    let mut status = UnrepairableMemoryStatusV1 {
        version: struct_version::<UnrepairableMemoryStatusV1>(1),
        unrepairable_memory: 0,
    };
    // SAFETY: valid handle, out-pointer to a struct of the size the version word says.
    unsafe { nvml_try(sym(device.handle(), &mut status))? };
    Ok(status.unrepairable_memory != 0)
}

/// The event types the device reports, as nvml.h's raw mask: nvml-wrapper's `EventTypes` drops
/// the bits it predates, such as `nvmlEventTypeGpuRecoveryAction` (R565).
pub fn supported_event_types(device: &Device) -> Result<u64, NvmlError> {
    let lib = device.nvml().lib();
    device_mask(
        device,
        nvml_sym(lib.nvmlDeviceGetSupportedEventTypes.as_ref())?,
    )
}

/// A GPU's NVLink fabric information, from whichever call and struct version answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawFabricInfo {
    /// The fabric cluster's UUID.
    pub cluster_uuid: [u8; 16],
    /// The registration's `nvmlReturn_t`, meaningful once the state is completed.
    pub status: u32,
    /// The fabric clique.
    pub clique_id: u32,
    /// `NVML_GPU_FABRIC_STATE_*`.
    pub state: u8,
    /// `NVML_GPU_FABRIC_HEALTH_MASK_*` fields (struct version 2 and later).
    pub health_mask: Option<u32>,
    /// `NVML_GPU_FABRIC_HEALTH_SUMMARY_*` (struct version 3 and later).
    pub health_summary: Option<u8>,
}

/// `nvmlDeviceGetGpuFabricInfo`, the call of R525 and later, without a health mask.
pub fn gpu_fabric_info(device: &Device) -> Result<RawFabricInfo, NvmlError> {
    let sym = nvml_sym(device.nvml().lib().nvmlDeviceGetGpuFabricInfo.as_ref())?;
    // SAFETY: plain old data; all-zero is a valid value.
    let mut info: nvmlGpuFabricInfo_t = unsafe { mem::zeroed() };
    // SAFETY: valid handle, out-pointer to the struct the function takes.
    unsafe { nvml_try(sym(device.handle(), &mut info))? };
    Ok(RawFabricInfo {
        cluster_uuid: info.clusterUuid,
        status: info.status,
        clique_id: info.cliqueId,
        state: info.state,
        health_mask: None,
        health_summary: None,
    })
}

/// `nvmlDeviceGetGpuFabricInfoV` with struct version `version`: 3 (`nvmlGpuFabricInfo_v3_t`, with
/// the health summary; R580 and later) or 2 (`_v2_t`, with the health mask; R550 and later). A
/// driver that does not know the version answers ARGUMENT_VERSION_MISMATCH, which nvml-wrapper
/// 0.13 gives as `UnexpectedVariant(25)`.
pub fn gpu_fabric_info_v(device: &Device, version: u32) -> Result<RawFabricInfo, NvmlError> {
    let sym = nvml_sym(device.nvml().lib().nvmlDeviceGetGpuFabricInfoV.as_ref())?;
    // SAFETY: plain old data; all-zero is a valid value.
    let mut v3: nvmlGpuFabricInfo_v3_t = unsafe { mem::zeroed() };
    if version == 3 {
        v3.version = struct_version::<nvmlGpuFabricInfo_v3_t>(3);
        // SAFETY: valid handle, out-pointer to a struct of the size its version word says.
        unsafe { nvml_try(sym(device.handle(), &mut v3))? };
        return Ok(RawFabricInfo {
            cluster_uuid: v3.clusterUuid,
            status: v3.status,
            clique_id: v3.cliqueId,
            state: v3.state,
            health_mask: Some(v3.healthMask),
            health_summary: Some(v3.healthSummary),
        });
    }
    // SAFETY: plain old data; all-zero is a valid value.
    let mut v2: nvmlGpuFabricInfo_v2_t = unsafe { mem::zeroed() };
    v2.version = struct_version::<nvmlGpuFabricInfo_v2_t>(2);
    // SAFETY: the v2 struct, of the size its version word says, through the pointer type the
    // binding declares (v3): the driver reads the version word and writes only v2's fields.
    unsafe {
        nvml_try(sym(
            device.handle(),
            (&raw mut v2).cast::<nvmlGpuFabricInfo_v3_t>(),
        ))?
    };
    Ok(RawFabricInfo {
        cluster_uuid: v2.clusterUuid,
        status: v2.status,
        clique_id: v2.cliqueId,
        state: v2.state,
        health_mask: Some(v2.healthMask),
        health_summary: None,
    })
}

/// A key that tells devices apart: the handle's address, only ever compared.
pub fn device_key(device: &Device) -> usize {
    // SAFETY: the handle is only turned into a number, never dereferenced or passed on.
    unsafe { device.handle() as usize }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_decode_by_their_tag() {
        let v = nvmlValue_t { ullVal: 1 << 40 };
        assert_eq!(
            decode_value(
                sys::nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_LONG_LONG,
                v
            )
            .unwrap(),
            FieldValue::Unsigned(1 << 40)
        );
        let v = nvmlValue_t { dVal: 71.5 };
        assert_eq!(
            decode_value(sys::nvmlValueType_enum_NVML_VALUE_TYPE_DOUBLE, v)
                .unwrap()
                .as_f64(),
            71.5
        );
        let v = nvmlValue_t { siVal: -3 };
        let d = decode_value(sys::nvmlValueType_enum_NVML_VALUE_TYPE_SIGNED_INT, v).unwrap();
        assert_eq!(d, FieldValue::Signed(-3));
        assert_eq!(d.as_u64(), None);
        assert!(matches!(
            decode_value(99, nvmlValue_t { uiVal: 0 }),
            Err(NvmlError::UnexpectedVariant(99))
        ));
    }
}
