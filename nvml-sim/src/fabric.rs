//! A GPU's NVLink fabric in a scenario (its `fabric` table): the registration with Fabric Manager
//! and the health NVML reports for it, as `api::fabric` answers them.

use serde::Deserialize;

/// The GPU's registration with the NVLink fabric of an NVSwitch system. Absent, the GPU is on no
/// fabric: both fabric calls answer NOT_SUPPORTED.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FabricSpec {
    /// Where the registration stands (`NVML_GPU_FABRIC_STATE_*`).
    pub state: FabricState,
    /// The registration's `nvmlReturn_t` (0: success), meaningful once completed.
    #[serde(default)]
    pub status: u32,
    /// The fabric clique.
    #[serde(default)]
    pub clique_id: u32,
    /// The fabric cluster's UUID, 8-4-4-4-12 hex; empty: all zero.
    #[serde(default)]
    pub cluster_uuid: String,
    /// The `NVML_GPU_FABRIC_HEALTH_MASK_*` fields as the driver packs them (0x1AA: every condition
    /// false, the configuration correct); 0: none reported.
    #[serde(default)]
    pub health_mask: u32,
    /// The driver's summary (`NVML_GPU_FABRIC_HEALTH_SUMMARY_*`); absent: not supported.
    #[serde(default)]
    pub health_summary: Option<FabricSummary>,
}

/// `NVML_GPU_FABRIC_STATE_*` but NOT_SUPPORTED (a GPU on no fabric has no `fabric` table).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FabricState {
    /// Fabric Manager has not started registering the GPU.
    NotStarted,
    /// The registration is under way.
    InProgress,
    /// The registration ended; `status` says how.
    Completed,
}

impl FabricState {
    /// Its `nvml.h` number.
    pub fn code(self) -> u8 {
        match self {
            FabricState::NotStarted => 1,
            FabricState::InProgress => 2,
            FabricState::Completed => 3,
        }
    }
}

/// `NVML_GPU_FABRIC_HEALTH_SUMMARY_*` but NOT_SUPPORTED (absent).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FabricSummary {
    /// Healthy.
    Healthy,
    /// Unhealthy.
    Unhealthy,
    /// Limited capacity.
    LimitedCapacity,
}

impl FabricSummary {
    /// Its `nvml.h` number.
    pub fn code(self) -> u8 {
        match self {
            FabricSummary::Healthy => 1,
            FabricSummary::Unhealthy => 2,
            FabricSummary::LimitedCapacity => 3,
        }
    }
}

impl FabricSpec {
    /// The cluster UUID's 16 bytes.
    pub fn cluster_uuid_bytes(&self) -> Result<[u8; 16], String> {
        let digits: String = self.cluster_uuid.chars().filter(|c| *c != '-').collect();
        let mut bytes = [0u8; 16];
        if digits.is_empty() {
            return Ok(bytes);
        }
        let bad = || format!("fabric.cluster_uuid: not a UUID: {:?}", self.cluster_uuid);
        if digits.len() != 32 || !digits.is_ascii() {
            return Err(bad());
        }
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = u8::from_str_radix(&digits[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
        }
        Ok(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cluster_uuid_reads_as_its_bytes_and_a_bad_one_is_refused() {
        let spec = |uuid: &str| FabricSpec {
            state: FabricState::Completed,
            status: 0,
            clique_id: 0,
            cluster_uuid: uuid.into(),
            health_mask: 0,
            health_summary: None,
        };
        let b = spec("8b2f4c1e-6a0d-4e59-9c3b-715e2a84d016")
            .cluster_uuid_bytes()
            .unwrap();
        assert_eq!((b[0], b[15]), (0x8b, 0x16));
        assert_eq!(spec("").cluster_uuid_bytes(), Ok([0; 16]));
        assert!(spec("8b2f4c1e").cluster_uuid_bytes().is_err());
        assert!(
            spec("zz2f4c1e-6a0d-4e59-9c3b-715e2a84d016")
                .cluster_uuid_bytes()
                .is_err()
        );
    }
}
