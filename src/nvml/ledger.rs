//! The ledger of NVML calls made while reading one device once. Every call goes through the
//! ledger's `call`, which skips what the device answered NOT_SUPPORTED before (remembered for
//! the whole NVML session) and sorts each failure into "not supported" (remembered, never
//! counted), "device lost" (no further calls in this read), "driver gone" (counted towards
//! "every call said the driver went away") and "counted error", and counts the calls that
//! answered.
//!
//! The device reader ([`super::device`]) and the parts it delegates to ([`super::gpm`],
//! [`super::mig`], [`super::processes`]) all take the same ledger, so one read of a device ends
//! with one [`Verdict`]: lost, driver gone, unanswered (calls failed and none answered), or up.

use nvml_wrapper::error::NvmlError;

use super::error::{ErrorClass, ErrorCounter, classify};
use crate::sample::Lost;

/// The calls a device answered NOT_SUPPORTED, as (C function, argument), for one NVML session.
///
/// Every NVML call looks here first, so the list is kept sorted for a binary search. It is sorted
/// by name length first: the names share the `nvmlDeviceGet` prefix and mostly differ in length,
/// and a name passed from the same literal is recognised by its address before its bytes are
/// compared.
#[derive(Debug, Default)]
pub(super) struct Unsupported(Vec<(&'static str, u32)>);

impl Unsupported {
    fn position(&self, function: &str, arg: u32) -> Result<usize, usize> {
        self.0.binary_search_by(|&(f, a)| {
            f.len()
                .cmp(&function.len())
                .then_with(|| {
                    if std::ptr::eq(f, function) {
                        std::cmp::Ordering::Equal
                    } else {
                        f.cmp(function)
                    }
                })
                .then(a.cmp(&arg))
        })
    }

    /// Whether `(function, arg)` answered NOT_SUPPORTED.
    pub(super) fn contains(&self, function: &str, arg: u32) -> bool {
        self.position(function, arg).is_ok()
    }

    /// Remembers `(function, arg)` as not supported.
    pub(super) fn insert(&mut self, function: &'static str, arg: u32) {
        if let Err(i) = self.position(function, arg) {
            self.0.insert(i, (function, arg));
        }
    }

    /// Forgets `(function, arg)`.
    pub(super) fn remove(&mut self, function: &str, arg: u32) {
        if let Ok(i) = self.position(function, arg) {
            self.0.remove(i);
        }
    }
}

/// What one read of a device says of it, first match wins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// A call answered GPU_IS_LOST or RESET_REQUIRED (or the index no longer resolves to a
    /// device): its readings are empty.
    Lost,
    /// Every call answered UNINITIALIZED or DRIVER_NOT_LOADED: the driver went away.
    DriverGone,
    /// Calls failed and none answered (NOT_SUPPORTED is neither): nothing was read, whatever the
    /// errors (UNKNOWN, TIMEOUT, IRQ_ISSUE, NO_PERMISSION…). The read is not a reading.
    Unanswered,
    /// The readings are this tick's: some call answered, or none failed.
    Up,
}

/// The calls of one read of one device and what their failures said.
pub(super) struct CallLedger<'a> {
    index: u32,
    errors: &'a ErrorCounter,
    unsupported: &'a mut Unsupported,
    calls: u32,
    driver_gone_calls: u32,
    /// Calls (or items of a batch) that answered a value.
    answered: u32,
    /// Calls (or items of a batch) that failed with anything but NOT_SUPPORTED.
    failed: u32,
    /// What the first call that called the device lost answered.
    lost: Option<Lost>,
}

impl<'a> CallLedger<'a> {
    /// A fresh read of device `index`, counting into `errors` and remembering NOT_SUPPORTED in
    /// `unsupported` (which outlives the read).
    pub(super) fn new(
        index: u32,
        errors: &'a ErrorCounter,
        unsupported: &'a mut Unsupported,
    ) -> Self {
        CallLedger {
            index,
            errors,
            unsupported,
            calls: 0,
            driver_gone_calls: 0,
            answered: 0,
            failed: 0,
            lost: None,
        }
    }

    /// Whether `(function, arg)` answered NOT_SUPPORTED earlier in this session.
    pub(super) fn is_unsupported(&self, function: &'static str, arg: u32) -> bool {
        self.unsupported.contains(function, arg)
    }

    /// Forgets that `(function, arg)` answered NOT_SUPPORTED: for a call that must be tried
    /// again on every read whatever it answered.
    pub(super) fn forget_unsupported(&mut self, function: &'static str, arg: u32) {
        self.unsupported.remove(function, arg);
    }

    /// Makes one NVML call unless it is known unsupported or the device is already lost in this
    /// read (every further call would only wait for the same error), and sorts its failure.
    /// `arg` tells apart calls of one function with different arguments (clock domain, link…).
    pub(super) fn call<T>(
        &mut self,
        function: &'static str,
        arg: u32,
        f: impl FnOnce() -> Result<T, NvmlError>,
    ) -> Option<T> {
        let v = self.batch(function, arg, f)?;
        self.answered += 1;
        Some(v)
    }

    /// [`CallLedger::call`] for a call NVML reserves to root: NO_PERMISSION is the driver's
    /// answer to a caller that is not, like NOT_SUPPORTED is to a board without the feature, so it
    /// is remembered the same way (a process that is not root stays so), logged once, and never
    /// counted as an error.
    pub(super) fn call_as_root<T>(
        &mut self,
        function: &'static str,
        arg: u32,
        f: impl FnOnce() -> Result<T, NvmlError>,
    ) -> Option<T> {
        let gpu = self.index;
        self.call(function, arg, || {
            f().map_err(|e| match e {
                NvmlError::NoPermission => {
                    tracing::info!(
                        gpu,
                        function,
                        "NVML answers this call to root only: not read"
                    );
                    NvmlError::NotSupported
                }
                e => e,
            })
        })
    }

    /// [`CallLedger::call`] for a call whose items carry answers of their own (field values, GPM
    /// metrics): its success says nothing of the device, which answered only where an item did
    /// (each goes through [`CallLedger::field`]). A driver answers such a call SUCCESS with every
    /// item failing on a board that does not respond.
    pub(super) fn batch<T>(
        &mut self,
        function: &'static str,
        arg: u32,
        f: impl FnOnce() -> Result<T, NvmlError>,
    ) -> Option<T> {
        if self.lost.is_some() || self.unsupported.contains(function, arg) {
            return None;
        }
        self.calls += 1;
        match f() {
            Ok(v) => Some(v),
            Err(e) => {
                self.fail(function, arg, &e);
                None
            }
        }
    }

    /// Counts a call made outside [`CallLedger::call`] (one whose answers the caller sorts
    /// itself), so that "every call said the driver is gone" still counts it. Its failures go
    /// through [`CallLedger::fail`]; a value it read, through [`CallLedger::count_answer`].
    pub(super) fn count_call(&mut self) {
        self.calls += 1;
    }

    /// Counts a value read by a call counted with [`CallLedger::count_call`].
    pub(super) fn count_answer(&mut self) {
        self.answered += 1;
    }

    /// Sorts a failure: remember NOT_SUPPORTED, flag loss / driver loss, count the rest.
    pub(super) fn fail(&mut self, function: &'static str, arg: u32, error: &NvmlError) {
        let class = classify(error);
        if class != ErrorClass::Unsupported {
            self.failed += 1;
        }
        match class {
            ErrorClass::Unsupported => {
                // A missing symbol is worth one count (the library is older than expected);
                // NOT_SUPPORTED is a normal answer and never counted.
                if matches!(error, NvmlError::FailedToLoadSymbol(_)) {
                    self.errors.record(Some(self.index), function, error);
                }
                self.unsupported.insert(function, arg);
            }
            ErrorClass::GpuLost => {
                self.lost.get_or_insert(match error {
                    NvmlError::ResetRequired => Lost::ResetRequired,
                    _ => Lost::OffTheBus,
                });
                self.errors.record(Some(self.index), function, error);
            }
            ErrorClass::DriverGone => {
                self.driver_gone_calls += 1;
                self.errors.record(Some(self.index), function, error);
            }
            ErrorClass::Other => self.errors.record(Some(self.index), function, error),
        }
    }

    /// Sorts the per-field result of a field-value call (same rules as a whole call).
    pub(super) fn field<T>(
        &mut self,
        function: &'static str,
        arg: u32,
        r: Result<T, NvmlError>,
    ) -> Option<T> {
        match r {
            Ok(v) => {
                self.answered += 1;
                Some(v)
            }
            Err(e) => {
                self.fail(function, arg, &e);
                None
            }
        }
    }

    /// The device answered GPU_IS_LOST or RESET_REQUIRED in this read.
    pub(super) fn lost(&self) -> bool {
        self.lost.is_some()
    }

    /// Which of the two the device answered first in this read, if either.
    pub(super) fn lost_kind(&self) -> Option<Lost> {
        self.lost
    }

    /// What this read says of the device (see [`Verdict`]).
    pub(super) fn verdict(&self) -> Verdict {
        if self.lost.is_some() {
            Verdict::Lost
        } else if self.calls > 0 && self.driver_gone_calls == self.calls {
            Verdict::DriverGone
        } else if self.answered == 0 && self.failed > 0 {
            Verdict::Unanswered
        } else {
            Verdict::Up
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nvml::error::error_name;

    fn ledger<'a>(errors: &'a ErrorCounter, unsupported: &'a mut Unsupported) -> CallLedger<'a> {
        CallLedger::new(3, errors, unsupported)
    }

    #[test]
    fn the_unsupported_list_tells_functions_and_arguments_apart() {
        let mut u = Unsupported::default();
        for (f, a) in [("nvmlB", 2), ("nvmlA", 7), ("nvmlB", 1), ("nvmlA", 7)] {
            u.insert(f, a);
        }
        assert!(u.contains("nvmlA", 7) && u.contains("nvmlB", 1) && u.contains("nvmlB", 2));
        assert!(!u.contains("nvmlA", 1) && !u.contains("nvmlC", 7));
        // The name counts, not where the string lives.
        assert!(u.contains(&String::from("nvmlA"), 7));
        u.remove("nvmlB", 1);
        assert!(!u.contains("nvmlB", 1) && u.contains("nvmlB", 2));
        assert_eq!(u.0.len(), 2, "a repeated insert is kept once");
    }

    #[test]
    fn not_supported_is_remembered_and_never_counted() {
        let errors = ErrorCounter::default();
        let mut unsupported = Unsupported::default();
        let mut t = ledger(&errors, &mut unsupported);
        let r: Option<u32> = t.call("nvmlDeviceGetFanSpeed_v2", 0, || {
            Err(NvmlError::NotSupported)
        });
        assert_eq!(r, None);
        let mut called = false;
        let _ = t.call("nvmlDeviceGetFanSpeed_v2", 0, || {
            called = true;
            Ok(1u32)
        });
        assert!(!called, "an unsupported call must be skipped");
        // Another argument of the same function is still tried.
        assert_eq!(t.call("nvmlDeviceGetFanSpeed_v2", 1, || Ok(5u32)), Some(5));
        assert!(errors.snapshot().is_empty());
    }

    #[test]
    fn a_call_reserved_to_root_refused_is_remembered_and_never_counted() {
        let errors = ErrorCounter::default();
        let mut unsupported = Unsupported::default();
        let mut t = ledger(&errors, &mut unsupported);
        let mut calls = 0;
        for _ in 0..3 {
            let r: Option<bool> = t.call_as_root("nvmlDeviceGetSramEccErrorStatus", 0, || {
                calls += 1;
                Err(NvmlError::NoPermission)
            });
            assert_eq!(r, None);
        }
        assert_eq!(calls, 1, "asked once");
        assert!(errors.snapshot().is_empty());
        assert_eq!(t.verdict(), Verdict::Up, "no failure");
        // Another error is counted every time, and not remembered.
        let _: Option<bool> = t.call_as_root("nvmlDeviceGetSramEccErrorStatus", 1, || {
            Err(NvmlError::Unknown)
        });
        assert_eq!(errors.snapshot().len(), 1);
        assert_eq!(
            t.call_as_root("nvmlDeviceGetSramEccErrorStatus", 1, || Ok(true)),
            Some(true)
        );
    }

    #[test]
    fn other_errors_are_counted_by_function_and_name() {
        let errors = ErrorCounter::default();
        let mut unsupported = Unsupported::default();
        let mut t = ledger(&errors, &mut unsupported);
        let _: Option<u32> = t.call("nvmlDeviceGetPowerUsage", 0, || Err(NvmlError::Unknown));
        let _: Option<u32> = t.call("nvmlDeviceGetPowerUsage", 0, || Err(NvmlError::Unknown));
        assert!(!t.lost());
        let s = errors.snapshot();
        assert_eq!(
            s[&("nvmlDeviceGetPowerUsage".to_string(), "unknown".to_string())],
            2
        );
    }

    #[test]
    fn a_lost_gpu_stops_further_calls_in_this_read() {
        let errors = ErrorCounter::default();
        let mut unsupported = Unsupported::default();
        let mut t = ledger(&errors, &mut unsupported);
        let _: Option<u32> = t.call("nvmlDeviceGetPowerUsage", 0, || Err(NvmlError::GpuLost));
        assert!(t.lost());
        let mut called = false;
        let _ = t.call("nvmlDeviceGetTemperature", 0, || {
            called = true;
            Ok(1u32)
        });
        assert!(!called);
        let s = errors.snapshot();
        assert_eq!(
            s[&(
                "nvmlDeviceGetPowerUsage".to_string(),
                "gpu_is_lost".to_string()
            )],
            1
        );
    }

    #[test]
    fn driver_gone_is_every_call_answering_uninitialized() {
        let errors = ErrorCounter::default();
        let mut unsupported = Unsupported::default();
        let mut t = ledger(&errors, &mut unsupported);
        assert_eq!(t.verdict(), Verdict::Up, "no call, nothing wrong");
        let _: Option<u32> = t.call("a", 0, || Err(NvmlError::Uninitialized));
        let _: Option<u32> = t.call("b", 0, || Err(NvmlError::DriverNotLoaded));
        assert_eq!(t.verdict(), Verdict::DriverGone);
        let _ = t.call("c", 0, || Ok(1u32));
        assert_eq!(t.verdict(), Verdict::Up);
    }

    #[test]
    fn a_read_whose_every_call_fails_is_unanswered_whatever_the_error() {
        for error in [
            NvmlError::Unknown,
            NvmlError::Timeout,
            NvmlError::IrqIssue,
            NvmlError::NoPermission,
            NvmlError::InsufficientMemory,
            NvmlError::InsufficientPower,
            NvmlError::LibRmVersionMismatch,
        ] {
            let errors = ErrorCounter::default();
            let mut unsupported = Unsupported::default();
            let mut t = ledger(&errors, &mut unsupported);
            let name = error_name(&error);
            let _: Option<u32> = t.call("nvmlDeviceGetPowerUsage", 0, || Err(error));
            // NOT_SUPPORTED is no answer and no failure either.
            let _: Option<u32> = t.call("nvmlDeviceGetFanSpeed_v2", 0, || {
                Err(NvmlError::NotSupported)
            });
            assert_eq!(t.verdict(), Verdict::Unanswered, "{name}");
            // A batch call that succeeds while each of its items fails is still no answer.
            let items = t.batch("nvmlDeviceGetFieldValues", 0, || Ok(vec![1u32]));
            assert_eq!(items, Some(vec![1]));
            let _: Option<u32> = t.field("nvmlDeviceGetFieldValues", 1, Err(NvmlError::Unknown));
            assert_eq!(t.verdict(), Verdict::Unanswered, "{name}");
            // One value read is a reading.
            assert_eq!(t.field("nvmlDeviceGetFieldValues", 2, Ok(40u32)), Some(40));
            assert_eq!(t.verdict(), Verdict::Up, "{name}");
        }
    }

    #[test]
    fn only_unsupported_answers_are_not_a_failure() {
        let errors = ErrorCounter::default();
        let mut unsupported = Unsupported::default();
        let mut t = ledger(&errors, &mut unsupported);
        let _: Option<u32> = t.call("a", 0, || Err(NvmlError::NotSupported));
        assert_eq!(t.verdict(), Verdict::Up);
        // A call counted by hand answers through `count_answer`.
        t.count_call();
        t.fail("b", 0, &NvmlError::Timeout);
        assert_eq!(t.verdict(), Verdict::Unanswered);
        t.count_call();
        t.count_answer();
        assert_eq!(t.verdict(), Verdict::Up);
    }

    #[test]
    fn lost_comes_first() {
        let errors = ErrorCounter::default();
        let mut unsupported = Unsupported::default();
        let mut t = ledger(&errors, &mut unsupported);
        let _ = t.call("a", 0, || Ok(1u32));
        let _: Option<u32> = t.call("b", 0, || Err(NvmlError::GpuLost));
        assert_eq!(t.verdict(), Verdict::Lost);
    }
}
