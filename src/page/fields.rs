//! The node page's fields, declared once: every reading `/` and `/api/v1/gpus` show for a GPU
//! or MIG instance, the family `/metrics` serves it as, and how the page shows it.
//!
//! Each value is read through its family's row of the [`catalog`], so the page and the JSON
//! show the served value in its base unit. The JSON has one key per row (in this order), the
//! HTML one `data-field` per row (a flag shows as its words), and the tests, the browser check
//! (`scripts/check-page.py`, which reads `docs/node-page.md`) and `docs/node-page.md` itself are
//! derived from [`FIELDS`].

use serde::ser::{Serialize, SerializeMap, Serializer};

use crate::metrics::catalog::{self, Source};
use crate::metrics::samples::Samples;
use crate::sample::{DeviceSample, SystemInfo};

/// One reading of the page.
#[derive(Debug, Clone, Copy)]
pub struct Field {
    /// Its key in the JSON and its `data-field` on the page.
    pub name: &'static str,
    /// The family `/metrics` serves it as: a per-GPU family without labels of its own.
    pub family: &'static str,
    /// How the page shows it.
    pub shown: Shown,
}

/// How the page shows a field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shown {
    /// A row of the bars: `label`, a bar from 0 to 1 and the value in percent.
    Ratio {
        /// The row's words.
        label: &'static str,
    },
    /// A row of the bars: `label` and the value in `unit`, against the field `max` (a bar and
    /// "/ max" when there is that value).
    Bar {
        /// The row's words.
        label: &'static str,
        /// The field that is the bar's end.
        max: &'static str,
        /// The unit both numbers are shown in.
        unit: Unit,
    },
    /// The end of the bar of the field that names it as its `max`, shown in that row.
    Max,
    /// A line under the bars: `label` and the value in `unit`.
    Line {
        /// The line's words.
        label: &'static str,
        /// The unit the value is shown in.
        unit: Unit,
    },
    /// A flag with `text` while the family's value is 1; `true` or `false` in the JSON.
    Flag {
        /// The flag's words.
        text: &'static str,
    },
}

/// The unit the page shows a value in (the JSON keeps the base unit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// Bytes as GiB, to one decimal.
    Gib,
    /// Watts, whole.
    Watts,
    /// Degrees Celsius, whole.
    Celsius,
}

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

impl Unit {
    /// The number as the page shows it.
    pub fn number(self, value: f64) -> String {
        match self {
            Unit::Gib => format!("{:.1}", value / GIB),
            Unit::Watts | Unit::Celsius => format!("{value:.0}"),
        }
    }

    /// Its symbol.
    pub fn symbol(self) -> &'static str {
        match self {
            Unit::Gib => "GiB",
            Unit::Watts => "W",
            Unit::Celsius => "°C",
        }
    }
}

const fn ratio(name: &'static str, family: &'static str, label: &'static str) -> Field {
    Field {
        name,
        family,
        shown: Shown::Ratio { label },
    }
}

/// Every field, in the order of the JSON's keys and of the page's rows.
pub const FIELDS: &[Field] = &[
    ratio("utilization", "nvidia_gpu_utilization_ratio", "utilization"),
    ratio("sm_active", "nvidia_gpu_sm_active_ratio", "SM active"),
    ratio(
        "sm_occupancy",
        "nvidia_gpu_sm_occupancy_ratio",
        "SM occupancy",
    ),
    ratio(
        "tensor_active",
        "nvidia_gpu_tensor_active_ratio",
        "tensor active",
    ),
    ratio("dram_active", "nvidia_gpu_dram_active_ratio", "DRAM active"),
    Field {
        name: "memory_used_bytes",
        family: "nvidia_gpu_memory_used_bytes",
        shown: Shown::Bar {
            label: "memory",
            max: "memory_total_bytes",
            unit: Unit::Gib,
        },
    },
    Field {
        name: "memory_total_bytes",
        family: "nvidia_gpu_memory_total_bytes",
        shown: Shown::Max,
    },
    Field {
        name: "power_watts",
        family: "nvidia_gpu_power_watts",
        shown: Shown::Bar {
            label: "power",
            max: "power_limit_watts",
            unit: Unit::Watts,
        },
    },
    Field {
        name: "power_limit_watts",
        family: "nvidia_gpu_power_limit_watts",
        shown: Shown::Max,
    },
    Field {
        name: "temperature_celsius",
        family: "nvidia_gpu_temperature_celsius",
        shown: Shown::Line {
            label: "temperature",
            unit: Unit::Celsius,
        },
    },
    Field {
        name: "thermal_slowdown",
        family: "nvidia_gpu_thermal_slowdown_active",
        shown: Shown::Flag {
            text: "thermal slowdown",
        },
    },
];

/// The position of the field `name` in [`FIELDS`]; a name that is not there is a mistake in
/// the code that asks.
fn index(name: &str) -> usize {
    FIELDS
        .iter()
        .position(|f| f.name == name)
        .unwrap_or_else(|| panic!("{name} is not a field of the node page"))
}

/// A GPU's or MIG instance's value of every field, in base units; `None` where `/metrics`
/// serves none. Serialised as one key per field, flags as `true` or `false`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Readings([Option<f64>; FIELDS.len()]);

impl Default for Readings {
    fn default() -> Readings {
        Readings([None; FIELDS.len()])
    }
}

impl Readings {
    /// The values `/metrics` serves for `sample` (a device, or a MIG instance's stand-in
    /// reading), read by each field's catalog family.
    pub fn read(system: &SystemInfo, sample: &DeviceSample) -> Readings {
        let mut readings = Readings::default();
        let mut out = Samples::default();
        for (value, field) in readings.0.iter_mut().zip(FIELDS) {
            if let Some(Source::Device(read)) = catalog::find(field.family).map(|d| d.source) {
                out.clear();
                read(system, sample, &mut out);
                *value = out.iter().next().map(|(_, v)| v);
            }
        }
        readings
    }

    /// The value of the field `name`.
    pub fn get(&self, name: &str) -> Option<f64> {
        self.0[index(name)]
    }

    /// Each field with its value, in [`FIELDS`] order.
    pub fn iter(&self) -> impl Iterator<Item = (&'static Field, Option<f64>)> + '_ {
        FIELDS.iter().zip(self.0.iter().copied())
    }
}

impl Serialize for Readings {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(FIELDS.len()))?;
        for (field, value) in self.iter() {
            match field.shown {
                Shown::Flag { .. } => map.serialize_entry(field.name, &value.map(|v| v == 1.0))?,
                _ => map.serialize_entry(field.name, &value)?,
            }
        }
        map.end()
    }
}
