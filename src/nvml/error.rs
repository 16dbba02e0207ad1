//! Classifying NVML errors: what a failed call means for the sampler (skip it from now on, the
//! device is lost, the driver went away, or just count it), the snake_case names used as the
//! `error` label, the cumulative error counter, and rate-limited logging.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use nvml_wrapper::error::NvmlError;

/// What a failed call means to the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// NOT_SUPPORTED (or a symbol the library lacks): the device will never answer this call;
    /// skip it until NVML is re-initialised, and never count it.
    Unsupported,
    /// GPU_IS_LOST / RESET_REQUIRED: the device is unreachable until it comes back.
    GpuLost,
    /// UNINITIALIZED / DRIVER_NOT_LOADED: the library lost its driver (e.g. a driver restart).
    DriverGone,
    /// Anything else: this reading is missing for this tick and the failure is counted.
    Other,
}

/// Sorts an error into the class that decides what the sampler does next.
pub fn classify(error: &NvmlError) -> ErrorClass {
    match error {
        NvmlError::NotSupported => ErrorClass::Unsupported,
        // A symbol missing from the library cannot appear later: treat it like NOT_SUPPORTED so
        // the call is skipped, but it is still counted once by the caller (see `DeviceReader`).
        NvmlError::FailedToLoadSymbol(_) => ErrorClass::Unsupported,
        NvmlError::GpuLost | NvmlError::ResetRequired => ErrorClass::GpuLost,
        NvmlError::Uninitialized | NvmlError::DriverNotLoaded => ErrorClass::DriverGone,
        _ => ErrorClass::Other,
    }
}

/// The snake_case name of an error, as served in the `error` label of
/// `nvml_exporter_nvml_errors_total` (the NVML_ERROR_* suffix, lowercased).
#[allow(deprecated)] // AlreadyInitialized is deprecated in nvml-wrapper but still a variant.
pub fn error_name(error: &NvmlError) -> &'static str {
    match error {
        NvmlError::Uninitialized => "uninitialized",
        NvmlError::InvalidArg => "invalid_argument",
        NvmlError::NotSupported => "not_supported",
        NvmlError::NoPermission => "no_permission",
        NvmlError::AlreadyInitialized => "already_initialized",
        NvmlError::NotFound => "not_found",
        NvmlError::InsufficientSize(_) => "insufficient_size",
        NvmlError::InsufficientPower => "insufficient_power",
        NvmlError::DriverNotLoaded => "driver_not_loaded",
        NvmlError::Timeout => "timeout",
        NvmlError::IrqIssue => "irq_issue",
        NvmlError::LibraryNotFound => "library_not_found",
        NvmlError::FunctionNotFound | NvmlError::FailedToLoadSymbol(_) => "function_not_found",
        NvmlError::CorruptedInfoROM => "corrupted_inforom",
        NvmlError::GpuLost => "gpu_is_lost",
        NvmlError::ResetRequired => "reset_required",
        NvmlError::OperatingSystem => "operating_system",
        NvmlError::LibRmVersionMismatch => "lib_rm_version_mismatch",
        NvmlError::InUse => "in_use",
        NvmlError::InsufficientMemory => "memory",
        NvmlError::NoData => "no_data",
        NvmlError::VgpuEccNotSupported => "vgpu_ecc_not_supported",
        NvmlError::Unknown => "unknown",
        NvmlError::UnexpectedVariant(_) => "unexpected_value",
        NvmlError::IncorrectBits(_) => "unexpected_value",
        NvmlError::Utf8Error(_) | NvmlError::NulError(_) | NvmlError::StringTooLong { .. } => {
            "invalid_string"
        }
        NvmlError::LibloadingError(_) => "library_not_found",
        NvmlError::SetReleaseFailed | NvmlError::GetPciInfoFailed | NvmlError::PciInfoToCFailed => {
            "unknown"
        }
    }
}

/// Why NVML cannot be sampled now. The text is the one-line reason served in
/// `Snapshot::nvml_error` (so in `/readyz` and on the node page) and logged.
#[derive(Debug, thiserror::Error)]
pub enum NvmlUnavailable {
    /// `nvmlInit` failed: the library is missing or unusable, or the driver is not loaded.
    #[error("{}", init_failure_reason(.lib, .source))]
    Init {
        /// The library that was loaded.
        lib: PathBuf,
        /// What `nvmlInit` (or loading the library) answered.
        source: NvmlError,
    },
    /// NVML initialised but could not count the devices.
    #[error("nvmlDeviceGetCount failed: {} ({source})", error_name(.source))]
    DeviceCount {
        /// What `nvmlDeviceGetCount_v2` answered.
        source: NvmlError,
    },
    /// Every call of a tick answered UNINITIALIZED / DRIVER_NOT_LOADED: the driver went away
    /// (unloaded, restarted).
    #[error("NVML answered UNINITIALIZED / DRIVER_NOT_LOADED on every call")]
    DriverGone,
}

/// A one-line reason why `nvmlInit` failed.
fn init_failure_reason(lib: &Path, error: &NvmlError) -> String {
    match error {
        NvmlError::LibloadingError(e) => {
            format!("NVML library not found: {}: {e}", lib.display())
        }
        NvmlError::DriverNotLoaded => format!(
            "NVIDIA driver not loaded ({} answered NVML_ERROR_DRIVER_NOT_LOADED)",
            lib.display()
        ),
        NvmlError::FailedToLoadSymbol(e) => format!(
            "{} is not a usable NVML library (missing symbol): {e}",
            lib.display()
        ),
        other => format!(
            "NVML initialisation failed: {} ({other})",
            error_name(other)
        ),
    }
}

/// How often the same (function, error) pair may be logged.
const LOG_EVERY: Duration = Duration::from_secs(60);

/// Cumulative count of failed NVML calls by (C function name, error name), shared by every
/// device reader and kept across re-initialisations (the metric is a counter).
#[derive(Debug, Default)]
pub struct ErrorCounter {
    inner: Mutex<ErrorCounterInner>,
}

#[derive(Debug, Default)]
struct ErrorCounterInner {
    counts: BTreeMap<(String, String), u64>,
    limiter: LogLimiter,
}

impl ErrorCounter {
    /// Counts one failure of `function` and logs it at most once a minute per (function, error),
    /// so a persistently failing call cannot flood the log at the tick rate.
    pub fn record(&self, device: Option<u32>, function: &'static str, error: &NvmlError) {
        let name = error_name(error);
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let count = inner
            .counts
            .entry((function.to_string(), name.to_string()))
            .or_insert(0);
        *count += 1;
        let total = *count;
        if inner
            .limiter
            .allow(&format!("{function}/{name}"), Instant::now())
        {
            tracing::warn!(
                gpu = device,
                function,
                error = name,
                total,
                "NVML call failed: {error}"
            );
        }
    }

    /// A copy of the counts, for a snapshot.
    pub fn snapshot(&self) -> BTreeMap<(String, String), u64> {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .counts
            .clone()
    }
}

/// Lets a message through once per key per `LOG_EVERY`.
#[derive(Debug, Default)]
pub struct LogLimiter {
    last: HashMap<String, Instant>,
}

impl LogLimiter {
    /// True when a message under `key` may be logged at `now`; remembers that it was.
    pub fn allow(&mut self, key: &str, now: Instant) -> bool {
        match self.last.get(key) {
            Some(at) if now.duration_since(*at) < LOG_EVERY => false,
            _ => {
                self.last.insert(key.to_string(), now);
                true
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_decide_the_sampler_reaction() {
        assert_eq!(classify(&NvmlError::NotSupported), ErrorClass::Unsupported);
        assert_eq!(
            classify(&NvmlError::FailedToLoadSymbol("x".into())),
            ErrorClass::Unsupported
        );
        assert_eq!(classify(&NvmlError::GpuLost), ErrorClass::GpuLost);
        assert_eq!(classify(&NvmlError::ResetRequired), ErrorClass::GpuLost);
        assert_eq!(classify(&NvmlError::Uninitialized), ErrorClass::DriverGone);
        assert_eq!(
            classify(&NvmlError::DriverNotLoaded),
            ErrorClass::DriverGone
        );
        assert_eq!(classify(&NvmlError::Unknown), ErrorClass::Other);
        assert_eq!(classify(&NvmlError::Timeout), ErrorClass::Other);
    }

    #[test]
    fn names_are_the_snake_case_nvml_suffixes() {
        assert_eq!(error_name(&NvmlError::Unknown), "unknown");
        assert_eq!(error_name(&NvmlError::Timeout), "timeout");
        assert_eq!(error_name(&NvmlError::GpuLost), "gpu_is_lost");
        assert_eq!(
            error_name(&NvmlError::InsufficientSize(Some(3))),
            "insufficient_size"
        );
        assert_eq!(error_name(&NvmlError::InvalidArg), "invalid_argument");
    }

    #[test]
    fn counter_accumulates_per_function_and_error() {
        let c = ErrorCounter::default();
        c.record(Some(0), "nvmlDeviceGetPowerUsage", &NvmlError::Unknown);
        c.record(Some(1), "nvmlDeviceGetPowerUsage", &NvmlError::Unknown);
        c.record(Some(1), "nvmlDeviceGetPowerUsage", &NvmlError::Timeout);
        let s = c.snapshot();
        let key = |f: &str, e: &str| (f.to_string(), e.to_string());
        assert_eq!(s[&key("nvmlDeviceGetPowerUsage", "unknown")], 2);
        assert_eq!(s[&key("nvmlDeviceGetPowerUsage", "timeout")], 1);
        assert_eq!(s.len(), 2);
    }

    #[test]
    fn limiter_lets_one_message_per_minute_through() {
        let mut l = LogLimiter::default();
        let t0 = Instant::now();
        assert!(l.allow("a", t0));
        assert!(!l.allow("a", t0 + Duration::from_secs(59)));
        assert!(l.allow("b", t0 + Duration::from_secs(1)));
        assert!(l.allow("a", t0 + Duration::from_secs(61)));
    }

    #[test]
    fn unavailable_reasons_read_as_served() {
        let lib = PathBuf::from("/usr/lib/libnvidia-ml.so.1");
        let init = NvmlUnavailable::Init {
            lib,
            source: NvmlError::DriverNotLoaded,
        };
        assert_eq!(
            init.to_string(),
            "NVIDIA driver not loaded (/usr/lib/libnvidia-ml.so.1 answered \
             NVML_ERROR_DRIVER_NOT_LOADED)"
        );
        let count = NvmlUnavailable::DeviceCount {
            source: NvmlError::Unknown,
        };
        assert_eq!(
            count.to_string(),
            format!(
                "nvmlDeviceGetCount failed: unknown ({})",
                NvmlError::Unknown
            )
        );
        assert_eq!(
            NvmlUnavailable::DriverGone.to_string(),
            "NVML answered UNINITIALIZED / DRIVER_NOT_LOADED on every call"
        );
    }

    #[test]
    fn init_reasons_say_what_is_wrong() {
        let lib = Path::new("/usr/lib/libnvidia-ml.so.1");
        assert!(
            init_failure_reason(lib, &NvmlError::DriverNotLoaded).contains("driver not loaded")
        );
        let r = init_failure_reason(lib, &NvmlError::NoPermission);
        assert!(r.contains("no_permission"), "{r}");
    }
}
