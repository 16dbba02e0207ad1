//! Recorded readings (`[gpu.replay]`): what a real GPU answered, one value per `step` seconds,
//! played back instead of the load patterns and the physics.
//!
//! `nvml-record` writes these tables. Each reading is kept in the unit of the NVML call that
//! returned it (percent, mW, MHz, KB/s, mJ, ns, KiB), so a replayed answer is the recorded integer
//! itself, with no conversion to round. A reading the table leaves out answers
//! `NVML_ERROR_NOT_SUPPORTED`: the recorder leaves out exactly what the recorded GPU did not
//! support.

use serde::Deserialize;

/// Tolerance when mapping t to a step, so that t = k·step lands on step k despite rounding.
const STEP_EPSILON: f64 = 1e-9;

/// One recorded reading: a constant, or one value per step.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum Series {
    /// The same value at every step.
    Constant(f64),
    /// `values[i]` during the i-th step.
    Values(Vec<f64>),
}

impl Series {
    fn values(&self) -> &[f64] {
        match self {
            Series::Constant(v) => std::slice::from_ref(v),
            Series::Values(v) => v,
        }
    }

    /// A gauge at `t`: the value of the step t falls in, cycling through the list.
    pub fn gauge(&self, step: f64, t: f64) -> f64 {
        let v = self.values();
        v[index(step, t) % v.len()]
    }

    /// A counter at `t`: like a gauge within the first pass; each later pass adds the growth of
    /// one pass (last − first), so the counter never goes back when the trace starts over.
    pub fn counter(&self, step: f64, t: f64) -> f64 {
        let v = self.values();
        let i = index(step, t);
        let (pass, j) = (i / v.len(), i % v.len());
        let growth = (v[v.len() - 1] - v[0]).max(0.0);
        v[j] + pass as f64 * growth
    }

    fn validate(&self, what: &str) -> Result<(), String> {
        let v = self.values();
        if v.is_empty() {
            return Err(format!("replay.{what}: no values"));
        }
        if let Some(x) = v.iter().find(|x| !x.is_finite() || **x < 0.0) {
            return Err(format!("replay.{what}: {x} is not a finite value ≥ 0"));
        }
        Ok(())
    }
}

fn index(step: f64, t: f64) -> usize {
    (t.max(0.0) / step + STEP_EPSILON).floor() as usize
}

/// Time under each performance policy (`nvmlDeviceGetViolationStatus`), ns.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Violations {
    /// Policy 0.
    pub power: Option<Series>,
    /// Policy 1.
    pub thermal: Option<Series>,
    /// Policy 2.
    pub sync_boost: Option<Series>,
    /// Policy 3.
    pub board_limit: Option<Series>,
    /// Policy 4.
    pub low_utilization: Option<Series>,
    /// Policy 5.
    pub reliability: Option<Series>,
    /// Policy 10.
    pub total_app_clocks: Option<Series>,
    /// Policy 11.
    pub total_base_clocks: Option<Series>,
}

impl Violations {
    /// The series of NVML policy `policy`; `Err` for a policy id NVML does not define.
    pub fn policy(&self, policy: u32) -> Result<Option<&Series>, ()> {
        Ok(match policy {
            0 => self.power.as_ref(),
            1 => self.thermal.as_ref(),
            2 => self.sync_boost.as_ref(),
            3 => self.board_limit.as_ref(),
            4 => self.low_utilization.as_ref(),
            5 => self.reliability.as_ref(),
            10 => self.total_app_clocks.as_ref(),
            11 => self.total_base_clocks.as_ref(),
            _ => return Err(()),
        })
    }

    fn all(&self) -> [(&'static str, &Option<Series>); 8] {
        [
            ("power", &self.power),
            ("thermal", &self.thermal),
            ("sync_boost", &self.sync_boost),
            ("board_limit", &self.board_limit),
            ("low_utilization", &self.low_utilization),
            ("reliability", &self.reliability),
            ("total_app_clocks", &self.total_app_clocks),
            ("total_base_clocks", &self.total_base_clocks),
        ]
    }
}

/// A GPU's recorded readings. Gauges cycle through their values; counters (`energy_mj`,
/// `violation_ns`, `pcie_replays`, `ecc_*`, `nvlink_*`) keep growing across passes.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Replay {
    /// Seconds between two recorded values.
    pub step: f64,
    /// `nvmlDeviceGetUtilizationRates.gpu`, percent.
    pub utilization: Option<Series>,
    /// `nvmlDeviceGetUtilizationRates.memory`, percent.
    pub memory_utilization: Option<Series>,
    /// `nvmlDeviceGetEncoderUtilization`, percent.
    pub encoder: Option<Series>,
    /// `nvmlDeviceGetDecoderUtilization`, percent.
    pub decoder: Option<Series>,
    /// `nvmlDeviceGetMemoryInfo_v2.used`, bytes (reserved memory excluded).
    pub memory_used_bytes: Option<Series>,
    /// `nvmlDeviceGetPowerUsage`, mW.
    pub power_mw: Option<Series>,
    /// `nvmlDeviceGetTemperature(GPU)`, °C.
    pub temperature_c: Option<Series>,
    /// Field `NVML_FI_DEV_MEMORY_TEMP`, °C.
    pub memory_temperature_c: Option<Series>,
    /// `nvmlDeviceGetClockInfo(GRAPHICS)`, MHz.
    pub graphics_mhz: Option<Series>,
    /// `nvmlDeviceGetClockInfo(SM)`, MHz.
    pub sm_mhz: Option<Series>,
    /// `nvmlDeviceGetClockInfo(MEM)`, MHz.
    pub memory_mhz: Option<Series>,
    /// `nvmlDeviceGetClockInfo(VIDEO)`, MHz.
    pub video_mhz: Option<Series>,
    /// `nvmlDeviceGetPerformanceState`, 0–15.
    pub pstate: Option<Series>,
    /// `nvmlDeviceGetCurrentClocksEventReasons`, the bitmask.
    pub clocks_event_reasons: Option<Series>,
    /// `nvmlDeviceGetFanSpeed_v2`, percent, one series per fan.
    pub fan_percent: Option<Vec<Series>>,
    /// `nvmlDeviceGetPcieThroughput(TX)`, KB/s.
    pub pcie_tx_kb_s: Option<Series>,
    /// `nvmlDeviceGetPcieThroughput(RX)`, KB/s.
    pub pcie_rx_kb_s: Option<Series>,
    /// `nvmlDeviceGetTotalEnergyConsumption`, mJ (counter).
    pub energy_mj: Option<Series>,
    /// `nvmlDeviceGetViolationStatus` per policy, ns (counters).
    #[serde(default)]
    pub violation_ns: Violations,
    /// `nvmlDeviceGetPcieReplayCounter` (counter).
    pub pcie_replays: Option<Series>,
    /// `nvmlDeviceGetTotalEccErrors(CORRECTED, VOLATILE)` (counter; the aggregate count adds
    /// `ecc.lifetime_corrected`).
    pub ecc_corrected: Option<Series>,
    /// `nvmlDeviceGetTotalEccErrors(UNCORRECTED, VOLATILE)` (counter).
    pub ecc_uncorrected: Option<Series>,
    /// Fields `NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX`, KiB, one series per link (counters).
    pub nvlink_tx_kib: Option<Vec<Series>>,
    /// Fields `NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX`, KiB, one series per link (counters).
    pub nvlink_rx_kib: Option<Vec<Series>>,
    /// `nvmlDeviceGetNvLinkErrorCounter(REPLAY)`, one series per link (counters).
    pub nvlink_replay: Option<Vec<Series>>,
    /// `nvmlDeviceGetNvLinkErrorCounter(RECOVERY)`, one series per link (counters).
    pub nvlink_recovery: Option<Vec<Series>>,
    /// `nvmlDeviceGetNvLinkErrorCounter(CRC_FLIT)`, one series per link (counters).
    pub nvlink_crc_flit: Option<Vec<Series>>,
    /// `nvmlDeviceGetNvLinkErrorCounter(CRC_DATA)`, one series per link (counters).
    pub nvlink_crc_data: Option<Vec<Series>>,
}

impl Replay {
    /// Checks the step, every series, and that per-fan and per-link lists have one series per
    /// fan (`fans`) and per link (`links`).
    pub fn validate(&self, fans: u32, links: u32) -> Result<(), String> {
        if !(self.step.is_finite() && self.step > 0.0) {
            return Err(format!("replay.step must be > 0, got {}", self.step));
        }
        let single = [
            ("utilization", &self.utilization),
            ("memory_utilization", &self.memory_utilization),
            ("encoder", &self.encoder),
            ("decoder", &self.decoder),
            ("memory_used_bytes", &self.memory_used_bytes),
            ("power_mw", &self.power_mw),
            ("temperature_c", &self.temperature_c),
            ("memory_temperature_c", &self.memory_temperature_c),
            ("graphics_mhz", &self.graphics_mhz),
            ("sm_mhz", &self.sm_mhz),
            ("memory_mhz", &self.memory_mhz),
            ("video_mhz", &self.video_mhz),
            ("pstate", &self.pstate),
            ("clocks_event_reasons", &self.clocks_event_reasons),
            ("pcie_tx_kb_s", &self.pcie_tx_kb_s),
            ("pcie_rx_kb_s", &self.pcie_rx_kb_s),
            ("energy_mj", &self.energy_mj),
            ("pcie_replays", &self.pcie_replays),
            ("ecc_corrected", &self.ecc_corrected),
            ("ecc_uncorrected", &self.ecc_uncorrected),
        ];
        for (name, series) in single {
            if let Some(s) = series {
                s.validate(name)?;
            }
        }
        for (name, series) in self.violation_ns.all() {
            if let Some(s) = series {
                s.validate(&format!("violation_ns.{name}"))?;
            }
        }
        let lists = [
            ("fan_percent", &self.fan_percent, fans, "fans"),
            ("nvlink_tx_kib", &self.nvlink_tx_kib, links, "nvlink.links"),
            ("nvlink_rx_kib", &self.nvlink_rx_kib, links, "nvlink.links"),
            ("nvlink_replay", &self.nvlink_replay, links, "nvlink.links"),
            (
                "nvlink_recovery",
                &self.nvlink_recovery,
                links,
                "nvlink.links",
            ),
            (
                "nvlink_crc_flit",
                &self.nvlink_crc_flit,
                links,
                "nvlink.links",
            ),
            (
                "nvlink_crc_data",
                &self.nvlink_crc_data,
                links,
                "nvlink.links",
            ),
        ];
        for (name, list, want, of) in lists {
            let Some(list) = list else { continue };
            if list.len() != want as usize {
                return Err(format!(
                    "replay.{name}: {} series for {want} {of}",
                    list.len()
                ));
            }
            for (i, s) in list.iter().enumerate() {
                s.validate(&format!("{name}[{i}]"))?;
            }
        }
        Ok(())
    }
}

/// A MIG GPU instance's recorded memory use (`[gpu.mig.instance.replay]`): what its MIG devices
/// answered in `nvmlDeviceGetMemoryInfo(_v2)`, bytes, one value per `step` seconds.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InstanceReplay {
    /// Seconds between two recorded values.
    pub step: f64,
    /// Memory used, bytes (a gauge: it cycles).
    pub memory_used_bytes: Series,
}

impl InstanceReplay {
    /// Checks the step and the series.
    pub fn validate(&self) -> Result<(), String> {
        if !(self.step.is_finite() && self.step > 0.0) {
            return Err(format!("replay.step must be > 0, got {}", self.step));
        }
        self.memory_used_bytes.validate("memory_used_bytes")
    }

    /// The instance's memory use at `t`, bytes.
    pub fn memory_used(&self, t: f64) -> u64 {
        self.memory_used_bytes.gauge(self.step, t) as u64
    }
}

/// A process's recorded utilization (`[gpu.process.replay]`): what
/// `nvmlDeviceGetProcessUtilization` answered for it, percent, one value per `step` seconds.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcessReplay {
    /// Seconds between two recorded values.
    pub step: f64,
    /// `smUtil`.
    pub sm: Series,
    /// `memUtil`.
    pub memory: Series,
    /// `encUtil`.
    pub encoder: Series,
    /// `decUtil`.
    pub decoder: Series,
}

impl ProcessReplay {
    /// Checks the step and the series.
    pub fn validate(&self) -> Result<(), String> {
        if !(self.step.is_finite() && self.step > 0.0) {
            return Err(format!("replay.step must be > 0, got {}", self.step));
        }
        self.sm.validate("sm")?;
        self.memory.validate("memory")?;
        self.encoder.validate("encoder")?;
        self.decoder.validate("decoder")
    }

    /// (sm, memory, encoder, decoder) percent at `t`.
    pub fn at(&self, t: f64) -> [u32; 4] {
        [&self.sm, &self.memory, &self.encoder, &self.decoder].map(|s| s.gauge(self.step, t) as u32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gauge_cycles_and_a_counter_keeps_growing() {
        let s = Series::Values(vec![10.0, 12.0, 15.0]);
        let gauge: Vec<f64> = (0..7).map(|t| s.gauge(2.0, t as f64 * 2.0)).collect();
        assert_eq!(gauge, [10.0, 12.0, 15.0, 10.0, 12.0, 15.0, 10.0]);
        let counter: Vec<f64> = (0..7).map(|t| s.counter(2.0, t as f64 * 2.0)).collect();
        assert_eq!(counter, [10.0, 12.0, 15.0, 15.0, 17.0, 20.0, 20.0]);
        // Inside a step the value holds; t = k·step lands on step k despite rounding.
        assert_eq!(s.gauge(0.1, 0.3), 10.0); // 0.3 / 0.1 = 2.999…: still step 3
        assert_eq!(s.gauge(2.0, 3.9), 12.0);
        assert_eq!(Series::Constant(7.0).counter(1.0, 1e6), 7.0);
    }

    #[test]
    fn lists_must_match_the_fans_and_links() {
        let replay: Replay =
            toml::from_str("step = 1\nnvlink_tx_kib = [1, [1, 2]]\nfan_percent = [40]").unwrap();
        replay.validate(1, 2).unwrap();
        let err = replay.validate(1, 3).unwrap_err();
        assert!(
            err.contains("nvlink_tx_kib: 2 series for 3 nvlink.links"),
            "{err}"
        );
        let bad: Replay = toml::from_str("step = 1\npower_mw = []").unwrap();
        assert!(
            bad.validate(0, 0)
                .unwrap_err()
                .contains("power_mw: no values")
        );
        let zero: Replay = toml::from_str("step = 0").unwrap();
        assert!(zero.validate(0, 0).is_err());
    }
}
