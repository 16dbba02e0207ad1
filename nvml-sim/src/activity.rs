//! The GPM activity gauges of a GPU at time t: what the SMs, pipes, DRAM, PCIe and media
//! engines were doing, as opposed to "utilization" (whether any kernel ran at all).
//!
//! The real GPM unit keeps cumulative hardware counters and NVML divides their difference between
//! two samples by the elapsed time; the simulator does the same with the integrals of these
//! gauges (see `integrals.rs`).

use crate::load::Load;
use crate::pattern::Pattern;
use crate::physics::{pcie_bytes_per_s, ratio};
use crate::scenario::GpuSpec;

/// One activity gauge. The discriminant is its index in the array [`gauges`] returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activity {
    /// Graphics/compute engine active ratio.
    Graphics,
    /// Share of SMs with a resident warp.
    Sm,
    /// Resident warps over the maximum.
    SmOccupancy,
    /// Any tensor pipe active ratio.
    Tensor,
    /// DRAM interface busy ratio.
    Dram,
    /// FP64 pipe active ratio.
    Fp64,
    /// FP32 pipe active ratio.
    Fp32,
    /// FP16 pipe active ratio.
    Fp16,
    /// Integer pipe active ratio.
    Integer,
    /// DFMA tensor pipe active ratio.
    DfmaTensor,
    /// HMMA tensor pipe active ratio.
    HmmaTensor,
    /// IMMA tensor pipe active ratio.
    ImmaTensor,
    /// PCIe transmit, bytes/s.
    PcieTx,
    /// PCIe receive, bytes/s.
    PcieRx,
    /// Each NVDEC engine's utilization ratio.
    Nvdec,
    /// Each NVJPG engine's utilization ratio.
    Nvjpg,
    /// Each NVOFA engine's utilization ratio.
    Nvofa,
}

/// Number of activity gauges.
pub const COUNT: usize = 17;

/// Fraction of `sm_active` the FP32 pipe is busy when the scenario does not say.
const DEFAULT_FP32_SHARE: f64 = 0.25;
/// Fraction of `sm_active` the integer pipe is busy when the scenario does not say.
const DEFAULT_INTEGER_SHARE: f64 = 0.15;
/// Fraction of `sm_active` that occupancy reaches when the scenario does not say.
const DEFAULT_OCCUPANCY_SHARE: f64 = 0.5;

/// Every activity gauge of `gpu` at `t`, indexed by [`Activity`] (ratios 0..1, PCIe bytes/s).
pub fn gauges(gpu: &GpuSpec, t: f64) -> [f64; COUNT] {
    load_gauges(&gpu.load, gpu.decoder, t)
}

/// Every activity gauge of one load (a GPU's, or a MIG GPU instance's) at `t`; `decoder` says
/// whether the board or instance has NVDEC engines at all.
pub fn load_gauges(l: &Load, decoder: bool, t: f64) -> [f64; COUNT] {
    let at = |p: &Pattern| ratio(p.at(t));
    let or = |p: &Option<Pattern>, default: f64| p.as_ref().map_or(default, at);
    let utilization = at(&l.utilization);
    let sm = or(&l.sm_active, utilization);
    let tensor = at(&l.tensor_active);
    // Without NVDEC the decoder pattern is forced to 0, as the decoder utilization query does.
    let nvdec = if decoder { at(&l.decoder) } else { 0.0 };
    let mut g = [0.0; COUNT];
    g[Activity::Graphics as usize] = or(&l.graphics_active, utilization);
    g[Activity::Sm as usize] = sm;
    g[Activity::SmOccupancy as usize] = or(&l.sm_occupancy, DEFAULT_OCCUPANCY_SHARE * sm);
    g[Activity::Tensor as usize] = tensor;
    g[Activity::Dram as usize] = or(&l.dram_active, at(&l.memory_utilization));
    g[Activity::Fp64 as usize] = at(&l.fp64_active);
    g[Activity::Fp32 as usize] = or(&l.fp32_active, DEFAULT_FP32_SHARE * sm);
    g[Activity::Fp16 as usize] = at(&l.fp16_active);
    g[Activity::Integer as usize] = or(&l.integer_active, DEFAULT_INTEGER_SHARE * sm);
    g[Activity::DfmaTensor as usize] = at(&l.dfma_tensor_active);
    g[Activity::HmmaTensor as usize] = or(&l.hmma_tensor_active, tensor);
    g[Activity::ImmaTensor as usize] = at(&l.imma_tensor_active);
    g[Activity::PcieTx as usize] = pcie_bytes_per_s(&l.pcie_tx_mb_s, t);
    g[Activity::PcieRx as usize] = pcie_bytes_per_s(&l.pcie_rx_mb_s, t);
    g[Activity::Nvdec as usize] = nvdec;
    g[Activity::Nvjpg as usize] = at(&l.nvjpg);
    g[Activity::Nvofa as usize] = at(&l.nvofa);
    g
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::Scenario;

    fn gpu(load: &str) -> GpuSpec {
        let text = format!(
            "[[gpu]]\nmodel = \"H100-SXM5-80GB\"\nuuid = \"GPU-1\"\npci_bus_id = \"01:00.0\"\n\
             serial = \"1\"\n[gpu.load]\n{load}"
        );
        Scenario::parse(&text).unwrap().gpus.remove(0)
    }

    #[test]
    fn unset_inputs_follow_their_documented_defaults() {
        let g = gauges(
            &gpu(
                "utilization = 0.8\nmemory_utilization = 0.3\ntensor_active = 0.4\npcie_tx_mb_s = 5",
            ),
            1.0,
        );
        assert_eq!(g[Activity::Graphics as usize], 0.8);
        assert_eq!(g[Activity::Sm as usize], 0.8);
        assert_eq!(g[Activity::SmOccupancy as usize], 0.4);
        assert_eq!(g[Activity::Dram as usize], 0.3);
        assert_eq!(g[Activity::HmmaTensor as usize], 0.4);
        assert!((g[Activity::Fp32 as usize] - 0.2).abs() < 1e-12);
        assert_eq!(g[Activity::PcieTx as usize], 5e6);
        assert_eq!(g[Activity::Fp64 as usize], 0.0);
    }

    #[test]
    fn explicit_inputs_are_independent_of_utilization() {
        let g = gauges(
            &gpu("utilization = 1.0\nsm_active = 0.15\nsm_occupancy = 0.1\ndram_active = 1.5"),
            1.0,
        );
        assert_eq!(g[Activity::Graphics as usize], 1.0);
        assert_eq!(g[Activity::Sm as usize], 0.15);
        assert_eq!(g[Activity::SmOccupancy as usize], 0.1);
        // Ratios are clamped like every other load ratio.
        assert_eq!(g[Activity::Dram as usize], 1.0);
    }
}
