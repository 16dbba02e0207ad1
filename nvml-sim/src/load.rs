//! The `load` table: what a GPU (or a MIG GPU instance) is asked to do over time, one
//! [`Pattern`] per input.

use crate::pattern::Pattern;
use serde::Deserialize;

/// Load over time. Ratios are 0..1; rates are MB/s or GB/s (10^6 / 10^9 bytes per second).
///
/// Each input is an independent pattern: "utilization" (a kernel ran) says nothing about how
/// much of the GPU the kernels used, so the GPM activity inputs are set separately; the optional
/// ones default to a value derived from another input (see each field).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Load {
    /// Share of time a kernel ran (nvmlDeviceGetUtilizationRates.gpu).
    pub utilization: Pattern,
    /// Share of time device memory was read or written.
    pub memory_utilization: Pattern,
    /// Memory in use as a share of (total − reserved); never less than the processes' sum.
    pub memory_used: Pattern,
    /// Power intensity: 0 = idle draw, 1 = default limit, > 1 demands more than the limit
    /// (the power cap then clips it). Defaults to `utilization`.
    pub power: Option<Pattern>,
    /// Encoder utilization ratio.
    pub encoder: Pattern,
    /// Decoder utilization ratio.
    pub decoder: Pattern,
    /// PCIe transmit, MB/s.
    pub pcie_tx_mb_s: Pattern,
    /// PCIe receive, MB/s.
    pub pcie_rx_mb_s: Pattern,
    /// NVLink transmit over all active links, GB/s.
    pub nvlink_tx_gb_s: Pattern,
    /// NVLink receive over all active links, GB/s.
    pub nvlink_rx_gb_s: Pattern,
    /// Graphics/compute engine active ratio (GPM GRAPHICS_UTIL). Default: `utilization`, since
    /// both measure the share of time any work was running.
    pub graphics_active: Option<Pattern>,
    /// Average share of SMs with a resident warp (GPM SM_UTIL). Default: `utilization`.
    pub sm_active: Option<Pattern>,
    /// Resident warps over the maximum (GPM SM_OCCUPANCY). Default: half of `sm_active`.
    pub sm_occupancy: Option<Pattern>,
    /// Share of cycles any tensor pipe was active (GPM ANY_TENSOR_UTIL). Default: 0.
    pub tensor_active: Pattern,
    /// DRAM interface busy ratio (GPM DRAM_BW_UTIL). Default: `memory_utilization`.
    pub dram_active: Option<Pattern>,
    /// FP64 pipe (non-tensor) active ratio. Default: 0.
    pub fp64_active: Pattern,
    /// FP32 pipe (non-tensor) active ratio. Default: a quarter of `sm_active`.
    pub fp32_active: Option<Pattern>,
    /// FP16 pipe (non-tensor) active ratio. Default: 0.
    pub fp16_active: Pattern,
    /// Integer pipe active ratio. Default: 0.15 × `sm_active`.
    pub integer_active: Option<Pattern>,
    /// DFMA (FP64) tensor pipe active ratio. Default: 0.
    pub dfma_tensor_active: Pattern,
    /// HMMA (FP16/BF16/TF32) tensor pipe active ratio. Default: `tensor_active` (training and
    /// inference tensor work is almost all HMMA).
    pub hmma_tensor_active: Option<Pattern>,
    /// IMMA (integer) tensor pipe active ratio. Default: 0.
    pub imma_tensor_active: Pattern,
    /// Each NVJPG engine's utilization ratio. Default: 0.
    pub nvjpg: Pattern,
    /// Each NVOFA engine's utilization ratio. Default: 0.
    pub nvofa: Pattern,
}

impl Load {
    /// Checks every pattern; the error names the input, e.g. "load.utilization: …".
    pub fn validate(&self) -> Result<(), String> {
        let l = self;
        let patterns = [
            ("utilization", Some(&l.utilization)),
            ("memory_utilization", Some(&l.memory_utilization)),
            ("memory_used", Some(&l.memory_used)),
            ("power", l.power.as_ref()),
            ("encoder", Some(&l.encoder)),
            ("decoder", Some(&l.decoder)),
            ("pcie_tx_mb_s", Some(&l.pcie_tx_mb_s)),
            ("pcie_rx_mb_s", Some(&l.pcie_rx_mb_s)),
            ("nvlink_tx_gb_s", Some(&l.nvlink_tx_gb_s)),
            ("nvlink_rx_gb_s", Some(&l.nvlink_rx_gb_s)),
            ("graphics_active", l.graphics_active.as_ref()),
            ("sm_active", l.sm_active.as_ref()),
            ("sm_occupancy", l.sm_occupancy.as_ref()),
            ("tensor_active", Some(&l.tensor_active)),
            ("dram_active", l.dram_active.as_ref()),
            ("fp64_active", Some(&l.fp64_active)),
            ("fp32_active", l.fp32_active.as_ref()),
            ("fp16_active", Some(&l.fp16_active)),
            ("integer_active", l.integer_active.as_ref()),
            ("dfma_tensor_active", Some(&l.dfma_tensor_active)),
            ("hmma_tensor_active", l.hmma_tensor_active.as_ref()),
            ("imma_tensor_active", Some(&l.imma_tensor_active)),
            ("nvjpg", Some(&l.nvjpg)),
            ("nvofa", Some(&l.nvofa)),
        ];
        for (name, p) in patterns {
            if let Some(p) = p {
                p.validate().map_err(|e| format!("load.{name}: {e}"))?;
            }
        }
        Ok(())
    }
}
