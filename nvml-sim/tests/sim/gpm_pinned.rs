//! GPM argument checking on h100x8 with the clock pinned at t = 100 s: versioned structs, the
//! metric-count bound, sample handles, MIG samples and samples taken at the same instant.

use crate::common::{self, Session};
use nvml_wrapper::Nvml;
use nvml_wrapper::enums::gpm::GpmMetricId as M;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::gpm::gpm_metrics_get;
use nvml_wrapper_sys::bindings::{
    NVML_GPM_METRICS_GET_VERSION, NVML_GPM_SUPPORT_VERSION, nvmlGpmMetricsGet_t, nvmlGpmSample_t,
    nvmlGpmSupport_t, nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH as VERSION_MISMATCH,
    nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT as INVALID_ARGUMENT,
    nvmlReturn_enum_NVML_SUCCESS as SUCCESS,
};

fn session() -> Session {
    common::session(&[
        ("NVML_SIM_SCENARIO", None),
        ("NVML_SIM_TIME", Some("100")),
        ("NVML_SIM_START", None),
    ])
}

#[test]
fn support_query_checks_its_version_word() {
    let nvml = session();
    let device = nvml.device_by_index(0).unwrap();
    for (version, expected, supported) in [
        (NVML_GPM_SUPPORT_VERSION, SUCCESS, 1),
        (NVML_GPM_SUPPORT_VERSION + 1, VERSION_MISMATCH, 0),
        (0, VERSION_MISMATCH, 0),
    ] {
        let mut support = nvmlGpmSupport_t {
            version,
            isSupportedDevice: 0,
        };
        // SAFETY: a valid device handle and a valid out-struct.
        let r = unsafe {
            nvml.lib()
                .nvmlGpmQueryDeviceSupport(device.handle(), &mut support)
        };
        assert_eq!(
            (r, support.isSupportedDevice),
            (expected, supported),
            "version {version}"
        );
    }
}

/// Calls nvmlGpmMetricsGet with a hand-built request asking for SM activity.
fn metrics_get(
    nvml: &Nvml,
    version: u32,
    count: u32,
    s1: nvmlGpmSample_t,
    s2: nvmlGpmSample_t,
) -> (u32, u32) {
    // SAFETY: all-zero is a valid nvmlGpmMetricsGet_t (null samples, null name pointers).
    let mut request: Box<nvmlGpmMetricsGet_t> = Box::new(unsafe { std::mem::zeroed() });
    request.version = version;
    request.numMetrics = count;
    request.sample1 = s1;
    request.sample2 = s2;
    request.metrics[0].metricId = 2;
    request.metrics[0].nvmlReturn = u32::MAX;
    // SAFETY: the request is a valid struct with room for every metric NVML may touch.
    let r = unsafe { nvml.lib().nvmlGpmMetricsGet(&mut *request) };
    (r, request.metrics[0].nvmlReturn)
}

#[test]
fn metrics_get_checks_version_and_count_before_anything_else() {
    let nvml = session();
    let untouched = u32::MAX;
    let bogus = 0x1234 as nvmlGpmSample_t;
    assert_eq!(
        metrics_get(&nvml, 2, 1, bogus, bogus),
        (VERSION_MISMATCH, untouched)
    );
    assert_eq!(
        metrics_get(&nvml, NVML_GPM_METRICS_GET_VERSION, 211, bogus, bogus),
        (INVALID_ARGUMENT, untouched)
    );
    // Right version and count, but handles that were never allocated.
    assert_eq!(
        metrics_get(&nvml, NVML_GPM_METRICS_GET_VERSION, 1, bogus, bogus),
        (INVALID_ARGUMENT, untouched)
    );
}

#[test]
fn samples_at_the_same_instant_are_too_close() {
    let nvml = session();
    let device = nvml.device_by_index(1).unwrap();
    let s1 = device.gpm_sample().unwrap();
    let s2 = device.gpm_sample().unwrap();
    let r = gpm_metrics_get(&nvml, &s1, &s2, &[M::SmUtil]);
    assert!(matches!(r, Err(NvmlError::InvalidArg)), "{r:?}");
}

#[test]
fn an_allocated_but_unfilled_sample_is_rejected() {
    let nvml = session();
    let device = nvml.device_by_index(1).unwrap();
    let filled = device.gpm_sample().unwrap();
    // A MIG sample fails (MIG is disabled), so the wrapper frees its buffer; build one by hand.
    let mut empty: nvmlGpmSample_t = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    assert_eq!(
        unsafe { nvml.lib().nvmlGpmSampleAlloc(&mut empty) },
        SUCCESS
    );
    // SAFETY: both handles are live.
    let r = metrics_get(
        &nvml,
        NVML_GPM_METRICS_GET_VERSION,
        1,
        unsafe { filled.handle() },
        empty,
    );
    assert_eq!(r.0, INVALID_ARGUMENT);
    // SAFETY: `empty` is ours to free.
    assert_eq!(unsafe { nvml.lib().nvmlGpmSampleFree(empty) }, SUCCESS);
}

#[test]
fn freeing_an_unknown_or_freed_handle_is_an_invalid_argument() {
    let nvml = session();
    let mut sample: nvmlGpmSample_t = std::ptr::null_mut();
    // SAFETY: valid out-pointer; the handle is freed only through these raw calls.
    unsafe {
        assert_eq!(nvml.lib().nvmlGpmSampleAlloc(&mut sample), SUCCESS);
        assert!(!sample.is_null());
        assert_eq!(nvml.lib().nvmlGpmSampleFree(sample), SUCCESS);
        assert_eq!(nvml.lib().nvmlGpmSampleFree(sample), INVALID_ARGUMENT);
        assert_eq!(
            nvml.lib().nvmlGpmSampleFree(0xdead0 as nvmlGpmSample_t),
            INVALID_ARGUMENT
        );
        assert_eq!(
            nvml.lib().nvmlGpmSampleAlloc(std::ptr::null_mut()),
            INVALID_ARGUMENT
        );
    }
}

#[test]
fn mig_samples_need_mig_mode() {
    let nvml = session();
    let device = nvml.device_by_index(0).unwrap();
    let r = device.gpm_mig_sample(0);
    assert!(matches!(r, Err(NvmlError::InvalidArg)), "{r:?}");
}

#[test]
fn streaming_state_can_be_toggled() {
    let nvml = session();
    let device = nvml.device_by_index(5).unwrap();
    assert!(!device.gpm_streaming_enabled().unwrap());
    device.set_gpm_streaming_enabled(true).unwrap();
    assert!(device.gpm_streaming_enabled().unwrap());
    device.set_gpm_streaming_enabled(false).unwrap();
    assert!(!device.gpm_streaming_enabled().unwrap());
}
