//! A GPU's place in the NVLink fabric of an NVSwitch system: its registration with Fabric
//! Manager and the fabric's health, read through the call ledger (`nvml.h`, "Fabric
//! definitions").
//!
//! The newest call the library has answers: `nvmlDeviceGetGpuFabricInfoV` with struct version 3
//! (the health mask and the driver's health summary: R580 and later), then with version 2 (the
//! health mask: R550 and later), then `nvmlDeviceGetGpuFabricInfo` (R525 and later: state,
//! status, clique and cluster only). A struct version the driver does not know
//! (ARGUMENT_VERSION_MISMATCH) is remembered for the session like NOT_SUPPORTED, under its
//! version, so from the second tick on a driver is asked only what it answers: one call a tick.
//! A library with neither symbol is asked nothing and nothing is counted: a driver older than the
//! fabric calls is no error.

use nvml_wrapper::Device;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper_sys::bindings as sys;

use super::error::error_name;
use super::ledger::CallLedger;
use super::raw::{self, RawFabricInfo};
use crate::sample::{
    FabricCondition, FabricConfiguration, FabricSample, FabricState, FabricSummary,
};

/// The versioned call; its ledger argument is the struct version.
const VERSIONED: &str = "nvmlDeviceGetGpuFabricInfoV";
/// The call of R525 and later.
const PLAIN: &str = "nvmlDeviceGetGpuFabricInfo";
/// NVML_ERROR_ARGUMENT_VERSION_MISMATCH, which nvml-wrapper 0.13 has no variant for.
const VERSION_MISMATCH: u32 = sys::nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH;

/// The GPU's fabric information; `None` where it is on no fabric, the library has no fabric call,
/// or the call failed this tick.
pub(super) fn read_fabric(t: &mut CallLedger, d: &Device) -> Option<FabricSample> {
    answer(t, d).and_then(decode)
}

fn answer(t: &mut CallLedger, d: &Device) -> Option<RawFabricInfo> {
    let lib = d.nvml().lib();
    if lib.nvmlDeviceGetGpuFabricInfoV.is_ok() {
        for version in [3, 2] {
            if t.is_unsupported(VERSIONED, version) {
                continue;
            }
            let got = t.call(VERSIONED, version, || {
                raw::gpu_fabric_info_v(d, version).map_err(unknown_version)
            });
            // An answer, or a failure of this tick (counted): no older call this tick.
            if got.is_some() || !t.is_unsupported(VERSIONED, version) {
                return got;
            }
        }
    }
    if lib.nvmlDeviceGetGpuFabricInfo.is_ok() {
        return t.call(PLAIN, 0, || {
            raw::gpu_fabric_info(d).map_err(unknown_version)
        });
    }
    None
}

/// A struct version the driver does not know, or a call the library has but does not implement,
/// is a capability the driver lacks: NOT_SUPPORTED, remembered and not counted.
fn unknown_version(e: NvmlError) -> NvmlError {
    match e {
        NvmlError::UnexpectedVariant(VERSION_MISMATCH) | NvmlError::FunctionNotFound => {
            NvmlError::NotSupported
        }
        other => other,
    }
}

/// The reading of a raw answer; `None` for a state of NOT_SUPPORTED (the GPU is on no fabric) or
/// a state `nvml.h` does not name.
pub fn decode(r: RawFabricInfo) -> Option<FabricSample> {
    let state = match u32::from(r.state) {
        sys::NVML_GPU_FABRIC_STATE_NOT_STARTED => FabricState::NotStarted,
        sys::NVML_GPU_FABRIC_STATE_IN_PROGRESS => FabricState::InProgress,
        sys::NVML_GPU_FABRIC_STATE_COMPLETED => FabricState::Completed,
        _ => return None,
    };
    let status = (state == FabricState::Completed).then(|| {
        if r.status == sys::nvmlReturn_enum_NVML_SUCCESS {
            "success"
        } else {
            error_name(&NvmlError::from(r.status))
        }
    });
    let (conditions, configuration) = r.health_mask.map(decode_mask).unwrap_or_default();
    Some(FabricSample {
        state,
        status,
        clique_id: r.clique_id,
        cluster_uuid: uuid(&r.cluster_uuid),
        conditions,
        configuration,
        summary: match r.health_summary.map(u32::from) {
            Some(sys::NVML_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY) => Some(FabricSummary::Healthy),
            Some(sys::NVML_GPU_FABRIC_HEALTH_SUMMARY_UNHEALTHY) => Some(FabricSummary::Unhealthy),
            Some(sys::NVML_GPU_FABRIC_HEALTH_SUMMARY_LIMITED_CAPACITY) => {
                Some(FabricSummary::LimitedCapacity)
            }
            _ => None,
        },
    })
}

/// The conditions of a health mask the driver reports (each field 0 when not supported, 1 when
/// true, 2 when false), and its configuration field.
pub fn decode_mask(mask: u32) -> (Vec<(FabricCondition, bool)>, Option<FabricConfiguration>) {
    let field = |shift: u32, width: u32| (mask >> shift) & width;
    let mut conditions = Vec::new();
    for (condition, shift) in [
        (
            FabricCondition::DegradedBandwidth,
            sys::NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_DEGRADED_BW,
        ),
        (
            FabricCondition::RouteRecovery,
            sys::NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_RECOVERY,
        ),
        (
            FabricCondition::RouteUnhealthy,
            sys::NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_UNHEALTHY,
        ),
        (
            FabricCondition::AccessTimeoutRecovery,
            sys::NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ACCESS_TIMEOUT_RECOVERY,
        ),
    ] {
        // Every boolean field of the mask says TRUE with 1 and FALSE with 2.
        match field(shift, 0x3) {
            1 => conditions.push((condition, true)),
            2 => conditions.push((condition, false)),
            _ => {}
        }
    }
    let configuration = match field(
        sys::NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_INCORRECT_CONFIGURATION,
        sys::NVML_GPU_FABRIC_HEALTH_MASK_WIDTH_INCORRECT_CONFIGURATION,
    ) {
        0 => None,
        1 => Some(FabricConfiguration::Correct),
        2 => Some(FabricConfiguration::IncorrectSysguid),
        3 => Some(FabricConfiguration::IncorrectChassisSn),
        4 => Some(FabricConfiguration::NoPartition),
        5 => Some(FabricConfiguration::InsufficientNvlinks),
        // 6 to 8: CUDA 13's nvml.h, newer than nvml-wrapper-sys 0.10's bindings.
        6 => Some(FabricConfiguration::IncompatibleGpuFirmware),
        7 => Some(FabricConfiguration::InvalidLocation),
        8 => Some(FabricConfiguration::GpuStateInvalid),
        _ => Some(FabricConfiguration::Unknown),
    };
    if let Some(c) = configuration {
        conditions.push((
            FabricCondition::IncorrectConfiguration,
            c != FabricConfiguration::Correct,
        ));
    }
    (conditions, configuration)
}

/// 16 bytes as a UUID's 8-4-4-4-12 lowercase hex.
fn uuid(bytes: &[u8; 16]) -> String {
    let mut s = String::with_capacity(36);
    for (i, b) in bytes.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            s.push('-');
        }
        s.push_str(&format!("{b:02x}"));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(state: u8, status: u32, mask: Option<u32>, summary: Option<u8>) -> RawFabricInfo {
        RawFabricInfo {
            cluster_uuid: [
                0x8b, 0x2f, 0x4c, 0x1e, 0x6a, 0x0d, 0x4e, 0x59, 0x9c, 0x3b, 0x71, 0x5e, 0x2a, 0x84,
                0xd0, 0x16,
            ],
            status,
            clique_id: 32766,
            state,
            health_mask: mask,
            health_summary: summary,
        }
    }

    #[test]
    fn a_healthy_mask_reports_every_condition_false() {
        // DCGM's tests call 0x1AA "all non-error bits": every boolean FALSE, configuration NONE.
        let (conditions, configuration) = decode_mask(0x1aa);
        assert_eq!(
            conditions,
            FabricCondition::ALL
                .iter()
                .map(|c| (*c, false))
                .collect::<Vec<_>>()
        );
        assert_eq!(configuration, Some(FabricConfiguration::Correct));
    }

    #[test]
    fn each_field_of_the_mask_decodes_on_its_own() {
        let (c, _) = decode_mask(0x1a9);
        assert_eq!(c[0], (FabricCondition::DegradedBandwidth, true));
        let (c, _) = decode_mask(0x19a);
        assert!(c.contains(&(FabricCondition::RouteUnhealthy, true)));
        let (c, cfg) = decode_mask(0x5aa);
        assert_eq!(cfg, Some(FabricConfiguration::InsufficientNvlinks));
        assert!(c.contains(&(FabricCondition::IncorrectConfiguration, true)));
        // Only degraded bandwidth reported (an R550 driver): one condition, no configuration.
        assert_eq!(
            decode_mask(0x2),
            (vec![(FabricCondition::DegradedBandwidth, false)], None)
        );
        assert_eq!(decode_mask(0), (vec![], None));
    }

    #[test]
    fn state_status_and_summary_decode_as_nvml_h_numbers_them() {
        assert_eq!(decode(raw(0, 0, None, None)), None);
        let f = decode(raw(2, 0, Some(0x1aa), Some(1))).unwrap();
        assert_eq!(
            (f.state, f.status, f.summary),
            (FabricState::InProgress, None, Some(FabricSummary::Healthy))
        );
        assert_eq!(f.cluster_uuid, "8b2f4c1e-6a0d-4e59-9c3b-715e2a84d016");
        let f = decode(raw(3, 0, None, None)).unwrap();
        assert_eq!(f.status, Some("success"));
        assert!(!f.registration_failed() && f.conditions.is_empty());
        let f = decode(raw(
            3,
            sys::nvmlReturn_enum_NVML_ERROR_TIMEOUT,
            None,
            Some(3),
        ))
        .unwrap();
        assert_eq!(f.status, Some("timeout"));
        assert!(f.registration_failed());
        assert_eq!(f.summary, Some(FabricSummary::LimitedCapacity));
    }
}
