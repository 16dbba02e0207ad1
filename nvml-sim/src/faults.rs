//! Fault injection: which injected fault, if any, applies to a call at time t.

use nvml_wrapper_sys::bindings::{
    nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST as GPU_IS_LOST,
    nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_POWER as INSUFFICIENT_POWER,
    nvmlReturn_enum_NVML_ERROR_IRQ_ISSUE as IRQ_ISSUE,
    nvmlReturn_enum_NVML_ERROR_NO_PERMISSION as NO_PERMISSION,
    nvmlReturn_enum_NVML_ERROR_UNKNOWN as UNKNOWN,
};

use crate::scenario::{FaultKind, FaultSpec, Window};

/// What `nvmlDeviceGetHandleByIndex` answers besides success and a bad index, by `nvml.h`. An
/// `error` fault on every call of a GPU (no `function`) fails the lookup only with one of these:
/// with another error (TIMEOUT, MEMORY…) the handle resolves and the GPU's queries fail.
const HANDLE_LOOKUP_ERRORS: [u32; 5] = [
    INSUFFICIENT_POWER,
    NO_PERMISSION,
    IRQ_ISSUE,
    GPU_IS_LOST,
    UNKNOWN,
];

/// What an injected fault does to one call.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Effect {
    /// The device is lost: answer NVML_ERROR_GPU_IS_LOST.
    pub lost: bool,
    /// Block this many seconds before answering.
    pub hang_s: Option<f64>,
    /// Answer this error instead of the real result.
    pub error: Option<u32>,
}

/// Whether the fault window covers `t`, honouring `repeat`.
pub fn window_active(f: &FaultSpec, t: f64) -> bool {
    let window = Window {
        from: f.from,
        to: f.to,
        repeat: f.repeat,
    };
    window.active(t)
}

/// Strips a `_vN` version suffix so a fault on `nvmlDeviceGetMemoryInfo` covers `_v2` too.
fn base_name(name: &str) -> &str {
    match name.rsplit_once("_v") {
        Some((base, n)) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => base,
        _ => name,
    }
}

/// The combined effect of every fault on a call of `function` on GPU `gpu` at `t`.
pub fn effect(faults: &[FaultSpec], gpu: usize, function: &str, t: f64) -> Effect {
    let mut effect = Effect::default();
    for f in faults {
        if f.kind == FaultKind::Init || f.gpu.is_some_and(|g| g != gpu) || !window_active(f, t) {
            continue;
        }
        let matches = f
            .function
            .as_deref()
            .is_none_or(|want| base_name(want) == base_name(function));
        match f.kind {
            FaultKind::Lost => effect.lost = true,
            FaultKind::Hang if matches => {
                effect.hang_s = Some(effect.hang_s.unwrap_or(0.0).max(f.seconds.unwrap_or(0.0)))
            }
            FaultKind::Error
                if matches
                    && effect.error.is_none()
                    && (f.function.is_some()
                        || base_name(function) != "nvmlDeviceGetHandleByIndex"
                        || HANDLE_LOOKUP_ERRORS.contains(&f.code)) =>
            {
                effect.error = Some(f.code)
            }
            _ => {}
        }
    }
    effect
}

/// The error an init attempt fails with, if any: `since_first_attempt` is the clock of `init`
/// faults (seconds since the process first tried), `t` the simulated time that driver restarts
/// follow.
pub fn init_error(faults: &[FaultSpec], since_first_attempt: f64, t: f64) -> Option<u32> {
    faults.iter().find_map(|f| match f.kind {
        FaultKind::Init if window_active(f, since_first_attempt) => Some(f.code),
        // While the driver is being reloaded there is no driver to attach to.
        FaultKind::DriverRestart if window_active(f, t) => {
            Some(nvml_wrapper_sys::bindings::nvmlReturn_enum_NVML_ERROR_DRIVER_NOT_LOADED)
        }
        _ => None,
    })
}

/// The error every call answers at `t` because the driver is restarting, if it is.
pub fn driver_down(faults: &[FaultSpec], t: f64) -> Option<u32> {
    faults
        .iter()
        .find(|f| f.kind == FaultKind::DriverRestart && window_active(f, t))
        .map(|f| f.code)
}

/// How many windows of `f` have ended by `t`.
fn windows_ended(f: &FaultSpec, t: f64) -> u64 {
    if t < f.to {
        return 0;
    }
    match f.repeat {
        Some(period) => ((t - f.to) / period).floor() as u64 + 1,
        None => 1,
    }
}

/// Whether GPU `gpu` is absent at `t`: a driver restart dropped it (an odd number of that
/// fault's windows have ended).
pub fn absent(faults: &[FaultSpec], gpu: usize, t: f64) -> bool {
    faults.iter().any(|f| {
        f.kind == FaultKind::DriverRestart
            && f.drop_gpus.contains(&gpu)
            && windows_ended(f, t) % 2 == 1
    })
}

/// The scenario indices of the GPUs present at `t`, in NVML index order.
pub fn present(faults: &[FaultSpec], gpus: usize, t: f64) -> Vec<usize> {
    (0..gpus).filter(|&g| !absent(faults, g, t)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::Scenario;

    fn faults() -> Vec<FaultSpec> {
        Scenario::parse(
            r#"
            [[gpu]]
            model = "L4"
            uuid = "GPU-a"
            pci_bus_id = "01:00.0"
            serial = "1"
            [[gpu]]
            model = "L4"
            uuid = "GPU-b"
            pci_bus_id = "02:00.0"
            serial = "2"
            [[fault]]
            kind = "lost"
            gpu = 0
            from = 10
            to = 20
            repeat = 60
            [[fault]]
            kind = "error"
            gpu = 1
            function = "nvmlDeviceGetMemoryInfo"
            error = "TIMEOUT"
            from = 5
            to = 6
            [[fault]]
            kind = "hang"
            gpu = 1
            seconds = 2.5
            from = 30
            to = 40
            [[fault]]
            kind = "init"
            error = "DRIVER_NOT_LOADED"
            to = 3
            "#,
        )
        .unwrap()
        .faults
    }

    #[test]
    fn windows_repeat_and_target_one_device_and_function() {
        let f = faults();
        assert!(!effect(&f, 0, "nvmlDeviceGetName", 9.9).lost);
        assert!(effect(&f, 0, "nvmlDeviceGetName", 10.0).lost);
        assert!(!effect(&f, 0, "nvmlDeviceGetName", 20.0).lost);
        assert!(effect(&f, 0, "nvmlDeviceGetName", 75.0).lost);
        assert!(!effect(&f, 1, "nvmlDeviceGetName", 15.0).lost);
        assert_eq!(
            effect(&f, 1, "nvmlDeviceGetMemoryInfo_v2", 5.5).error,
            Some(10)
        );
        assert_eq!(effect(&f, 1, "nvmlDeviceGetPowerUsage", 5.5).error, None);
        assert_eq!(
            effect(&f, 1, "nvmlDeviceGetPowerUsage", 35.0).hang_s,
            Some(2.5)
        );
        assert_eq!(init_error(&f, 2.9, 100.0), Some(9));
        assert_eq!(init_error(&f, 3.0, 0.0), None);
    }

    #[test]
    fn an_error_on_every_call_fails_the_handle_lookup_only_with_a_code_it_can_answer() {
        let f = Scenario::parse(
            r#"
            [[gpu]]
            model = "L4"
            uuid = "GPU-a"
            pci_bus_id = "01:00.0"
            serial = "1"
            [[fault]]
            kind = "error"
            error = "IRQ_ISSUE"
            from = 0
            to = 10
            [[fault]]
            kind = "error"
            error = "TIMEOUT"
            from = 10
            to = 20
            [[fault]]
            kind = "error"
            function = "nvmlDeviceGetHandleByIndex"
            error = "TIMEOUT"
            from = 20
            to = 30
            "#,
        )
        .unwrap()
        .faults;
        let lookup = |t| effect(&f, 0, "nvmlDeviceGetHandleByIndex", t).error;
        let power = |t| effect(&f, 0, "nvmlDeviceGetPowerUsage", t).error;
        assert_eq!(
            (lookup(5.0), power(5.0)),
            (Some(IRQ_ISSUE), Some(IRQ_ISSUE))
        );
        // nvml.h lists no TIMEOUT for the lookup: the handle resolves, the queries time out.
        let timeout = nvml_wrapper_sys::bindings::nvmlReturn_enum_NVML_ERROR_TIMEOUT;
        assert_eq!((lookup(15.0), power(15.0)), (None, Some(timeout)));
        // A fault that names the lookup gets what it asks.
        assert_eq!((lookup(25.0), power(25.0)), (Some(timeout), None));
    }

    #[test]
    fn a_driver_restart_fails_every_call_and_toggles_the_dropped_gpus() {
        let f = Scenario::parse(
            r#"
            [[gpu]]
            model = "L4"
            uuid = "GPU-a"
            pci_bus_id = "01:00.0"
            serial = "1"
            [[gpu]]
            model = "L4"
            uuid = "GPU-b"
            pci_bus_id = "02:00.0"
            serial = "2"
            [[fault]]
            kind = "driver_restart"
            from = 10
            to = 12
            repeat = 20
            drop_gpus = [0]
            "#,
        )
        .unwrap()
        .faults;
        let uninitialized = nvml_wrapper_sys::bindings::nvmlReturn_enum_NVML_ERROR_UNINITIALIZED;
        let not_loaded = nvml_wrapper_sys::bindings::nvmlReturn_enum_NVML_ERROR_DRIVER_NOT_LOADED;
        assert_eq!(driver_down(&f, 9.9), None);
        assert_eq!(driver_down(&f, 10.0), Some(uninitialized));
        assert_eq!(driver_down(&f, 31.0), Some(uninitialized));
        assert_eq!(init_error(&f, 0.0, 11.0), Some(not_loaded));
        assert_eq!(init_error(&f, 11.0, 12.0), None);
        // Present before the first restart, gone after it, back after the second, and so on.
        assert_eq!(present(&f, 2, 5.0), vec![0, 1]);
        assert_eq!(present(&f, 2, 12.0), vec![1]);
        assert_eq!(present(&f, 2, 29.9), vec![1]);
        assert_eq!(present(&f, 2, 32.0), vec![0, 1]);
        assert_eq!(present(&f, 2, 52.0), vec![1]);
    }
}
