//! nvml-record: reads a GPU node through NVML and writes a scenario file that nvml-sim replays.
//!
//! A [`Recorder`] reads each GPU's static facts once (identity, memory, limits, maximum clocks,
//! thresholds, links, ECC and MIG mode, driver versions) and then, at every [`Recorder::sample`],
//! every reading nvml-exporter makes (utilization, memory, power, energy, temperatures, clocks,
//! P-state, clock-event reasons, fans, PCIe, violation time, ECC and NVLink counters, processes).
//! [`Recorder::scenario`] writes them as nvml-sim's TOML: the facts as the `[[gpu]]` keys, the
//! readings as the GPU's `[gpu.replay]` table, one value per sampling period in the unit the NVML
//! call returned. A reading the GPU answered `NOT_SUPPORTED` is left out, and the simulator then
//! answers `NOT_SUPPORTED` for it too; a reading is never written as a zero it did not have.
//!
//! The binary samples on a timer; a caller can drive [`Recorder::sample`] itself (the round-trip
//! test steps a pinned simulator clock between samples).

mod gpm;
mod gpu;
mod mig;
mod trace;

use std::time::Duration;

use nvml_wrapper::Nvml;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use toml::{Table, Value};

pub use gpm::Session;
use gpm::gpm_window;
use gpu::GpuRecording;
use trace::{float, int, table};

/// Bytes in a MiB, the unit of the scenario's memory keys.
const MIB: u64 = 1024 * 1024;

/// Why recording could not start or go on.
#[derive(Debug)]
pub struct Error(String);

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

fn fail(what: &str, e: NvmlError) -> Error {
    Error(format!("{what}: {e}"))
}

/// Records every GPU of an NVML session: static facts at creation, readings at each sample.
#[derive(Debug)]
pub struct Recorder {
    period: Duration,
    driver: Table,
    gpus: Vec<GpuRecording>,
    samples: usize,
    /// XID events: (sample, GPU index, XID).
    xids: Vec<(usize, u32, u64)>,
}

impl Recorder {
    /// Reads the driver versions and every GPU's static facts; readings are taken every
    /// `period` (the scenario's step).
    pub fn new(nvml: &Nvml, period: Duration) -> Result<Recorder, Error> {
        let mut driver = Table::new();
        let version = nvml
            .sys_driver_version()
            .map_err(|e| fail("nvmlSystemGetDriverVersion", e))?;
        driver.insert("version".into(), Value::String(version));
        if let Ok(v) = nvml.sys_nvml_version() {
            driver.insert("nvml_version".into(), Value::String(v));
        }
        if let Ok(v) = nvml.sys_cuda_driver_version() {
            driver.insert("cuda_version".into(), Value::Integer(v.into()));
        }
        let count = nvml
            .device_count()
            .map_err(|e| fail("nvmlDeviceGetCount", e))?;
        let mut gpus = Vec::new();
        for index in 0..count {
            let device = nvml
                .device_by_index(index)
                .map_err(|e| fail(&format!("GPU {index}: nvmlDeviceGetHandleByIndex"), e))?;
            gpus.push(GpuRecording::new(index, &device)?);
        }
        Ok(Recorder {
            period,
            driver,
            gpus,
            samples: 0,
            xids: Vec::new(),
        })
    }

    /// Takes one sample of every GPU's readings (and their processes). `nvml` must list the same
    /// GPUs as the session the recorder was created on.
    pub fn sample(&mut self, nvml: &Nvml) -> Result<(), Error> {
        for gpu in &mut self.gpus {
            let device = nvml
                .device_by_index(gpu.index)
                .map_err(|e| fail(&format!("GPU {}: nvmlDeviceGetHandleByIndex", gpu.index), e))?;
            gpu.sample(nvml, &device, self.samples);
        }
        self.samples += 1;
        Ok(())
    }

    /// What only time passing shows, since the previous call with the same `session`: each
    /// GPU's GPM averages over the window (nothing on the first call) and the XID events that
    /// arrived (dated at this sample). Called right after [`Recorder::sample`].
    pub fn sample_over_time(&mut self, session: &mut Session<'_>) {
        let k = self.samples.saturating_sub(1);
        if let Some(set) = &session.xids {
            while let Ok(event) = set.wait(0) {
                let (Ok(index), Some(XidError::Value(xid))) =
                    (event.device.index(), event.event_data)
                else {
                    continue;
                };
                self.xids.push((k, index, xid));
            }
        }
        let nvml = session.nvml;
        session.gpm.resize_with(self.gpus.len(), || None);
        for (gpu, prev) in self.gpus.iter_mut().zip(&mut session.gpm) {
            let Ok(device) = nvml.device_by_index(gpu.index) else {
                continue;
            };
            if !device.gpm_support().unwrap_or(false) {
                continue;
            }
            let Ok(now) = device.gpm_sample() else {
                *prev = None;
                continue;
            };
            if let Some(before) = prev.take() {
                gpm_window(nvml, &before, &now, &mut gpu.traces.gpm);
            }
            *prev = Some(now);
        }
        for (position, gpu) in self.gpus.iter_mut().enumerate() {
            let Ok(device) = nvml.device_by_index(gpu.index) else {
                continue;
            };
            for instance in &mut gpu.instances {
                let key = (position, instance.id);
                let Ok(now) = device.gpm_mig_sample(instance.id) else {
                    session.instance_gpm.remove(&key);
                    continue;
                };
                if let Some(before) = session.instance_gpm.remove(&key) {
                    gpm_window(nvml, &before, &now, &mut instance.gpm);
                }
                session.instance_gpm.insert(key, now);
            }
        }
    }

    /// Samples taken so far.
    pub fn samples(&self) -> usize {
        self.samples
    }

    /// Readings that failed (other than NOT_SUPPORTED) and were filled from the sample before:
    /// (GPU index, reading, failures).
    pub fn gaps(&self) -> Vec<(u32, String, usize)> {
        let mut gaps = Vec::new();
        for gpu in &self.gpus {
            let t = &gpu.traces;
            let named = t
                .single
                .iter()
                .chain(&t.violations)
                .map(|(k, tr)| (k.to_string(), tr))
                .chain(
                    t.fans
                        .iter()
                        .enumerate()
                        .map(|(i, tr)| (format!("fan {i}"), tr)),
                )
                .chain(t.links.iter().flat_map(|(k, l)| {
                    l.iter()
                        .enumerate()
                        .map(move |(i, tr)| (format!("{k}[{i}]"), tr))
                }));
            for (name, trace) in named {
                if trace.failures > 0 {
                    gaps.push((gpu.index, name, trace.failures));
                }
            }
        }
        gaps
    }

    /// The scenario file: `[driver]`, one `[[gpu]]` per GPU with its facts, its processes and
    /// its `[gpu.replay]` table (step = the sampling period).
    pub fn scenario(&self) -> String {
        let step = self.period.as_secs_f64();
        let mut root = Table::new();
        root.insert("driver".into(), Value::Table(self.driver.clone()));
        let gpus = self
            .gpus
            .iter()
            .map(|g| Value::Table(g.table(step, self.samples)))
            .collect();
        root.insert("gpu".into(), Value::Array(gpus));
        // Each XID at the sample that saw it, again every pass of the replay.
        let events: Vec<Value> = self
            .xids
            .iter()
            .map(|&(k, gpu, xid)| {
                table([
                    ("t", float(k as f64 * step)),
                    ("gpu", int(gpu.into())),
                    ("xid", int(xid)),
                    ("repeat", float(self.samples as f64 * step)),
                ])
            })
            .collect();
        if !events.is_empty() {
            root.insert("event".into(), Value::Array(events));
        }
        let header = format!(
            "# Recorded by nvml-record: {} GPU(s), {} samples every {} s. Replay with nvml-sim\n\
             # (NVML_SIM_SCENARIO=this file); the readings cycle, counters keep growing.\n\n",
            self.gpus.len(),
            self.samples,
            step
        );
        header + &toml::to_string(&root).expect("a TOML table serializes")
    }
}
