//! The held verdicts kept on disk (`--health-state-file`), so that an XID that needs a reset
//! still fails its GPU after the exporter restarts: XID events are never replayed, and drivers
//! before R565 hold no recovery action of their own.
//!
//! The file holds, for the boot it was written in (`/proc/sys/kernel/random/boot_id`), each GPU
//! (by UUID) with the XIDs it holds until a reset, when each was first seen, and the GPU's energy
//! counter then (NVML counts it "since the driver was last reloaded": a lower reading later means
//! the driver, and so the GPU, was reloaded since). It is written whole, to a temporary file
//! renamed over it, whenever what it holds changes.
//!
//! Failures never stop the exporter and never pass silently: a file that is missing is a first
//! start; one that cannot be read or parsed is counted (`read`), logged and replaced at the next
//! write, and the verdicts it held are lost; a write that fails is counted (`write`) and logged,
//! and tried again every tick while the verdicts in memory differ from the file's.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::files::read_bounded_file;
use crate::sample::HealthStateErrors;

/// Where the kernel says which boot this is.
pub const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";

/// The most the file may hold: a few hundred bytes per GPU in practice.
const MAX_BYTES: u64 = 1 << 20;

/// The format version written in the file.
const FORMAT: u32 = 1;

/// What one GPU holds until a reset.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuHolds {
    /// Each XID code held, with when it was first seen (seconds since the Unix epoch).
    pub xids: BTreeMap<u64, f64>,
    /// The GPU's energy counter when the holds were written; `None` when it was not read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub energy_joules: Option<f64>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    format: u32,
    /// The boot the holds were recorded in; empty when it could not be read.
    boot_id: String,
    gpus: BTreeMap<String, GpuHolds>,
}

/// The file, and what became of reading and writing it.
#[derive(Debug)]
pub struct Store {
    path: PathBuf,
    boot_id: Option<String>,
    errors: HealthStateErrors,
    /// The holds last written (without the energy marks), or read at start.
    saved: BTreeMap<String, BTreeMap<u64, f64>>,
    /// The last write failed: the next success is logged.
    failing: bool,
}

impl Store {
    /// Opens the file at `path` for this boot (read from [`BOOT_ID`]) and returns what it holds
    /// for it, by GPU UUID.
    pub fn open(path: PathBuf) -> (Store, BTreeMap<String, GpuHolds>) {
        let boot_id = match std::fs::read_to_string(BOOT_ID) {
            Ok(id) => Some(id.trim().to_string()),
            Err(e) => {
                tracing::warn!(
                    "cannot read the boot id ({BOOT_ID}: {e}): the held verdicts of {} are kept whatever boot wrote them",
                    path.display()
                );
                None
            }
        };
        Store::open_for_boot(path, boot_id)
    }

    /// [`Store::open`] for the boot `boot_id` (`None`: unknown, every entry is kept).
    pub fn open_for_boot(
        path: PathBuf,
        boot_id: Option<String>,
    ) -> (Store, BTreeMap<String, GpuHolds>) {
        let mut store = Store {
            path,
            boot_id,
            errors: HealthStateErrors::default(),
            saved: BTreeMap::new(),
            failing: false,
        };
        let held = match store.read() {
            Ok(held) => held,
            Err(e) => {
                store.errors.read += 1;
                tracing::error!(
                    "cannot read the held health verdicts from {}: {e}; the verdicts held before this start are lost (a GPU that needed a reset may read healthy until it shows again), and the file is replaced at the next write",
                    store.path.display()
                );
                BTreeMap::new()
            }
        };
        store.saved = held
            .iter()
            .map(|(u, h)| (u.clone(), h.xids.clone()))
            .collect();
        if !held.is_empty() {
            tracing::info!(
                gpus = held.len(),
                "health verdicts held until a reset, read from {}",
                store.path.display()
            );
        }
        (store, held)
    }

    fn read(&self) -> io::Result<BTreeMap<String, GpuHolds>> {
        let bytes = match read_bounded_file(&self.path, MAX_BYTES) {
            Ok(bytes) => bytes,
            // A first start: nothing was held.
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
            Err(e) => return Err(e),
        };
        let file: File = serde_json::from_slice(&bytes)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        if file.format != FORMAT {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("format {} (this exporter writes {FORMAT})", file.format),
            ));
        }
        match &self.boot_id {
            // Written in another boot: a reboot resets every GPU.
            Some(now) if !file.boot_id.is_empty() && file.boot_id != *now => Ok(BTreeMap::new()),
            _ => Ok(file.gpus),
        }
    }

    /// Writes `holds` unless the file already holds them (energy marks aside); a failed write is
    /// counted and tried again at the next call.
    pub fn save(&mut self, holds: &BTreeMap<String, GpuHolds>) {
        let view: BTreeMap<String, BTreeMap<u64, f64>> = holds
            .iter()
            .map(|(u, h)| (u.clone(), h.xids.clone()))
            .collect();
        if view == self.saved {
            return;
        }
        match self.write(holds) {
            Ok(()) => {
                if self.failing {
                    tracing::info!(
                        "held health verdicts written to {} again",
                        self.path.display()
                    );
                }
                self.failing = false;
                self.saved = view;
            }
            Err(e) => {
                self.errors.write += 1;
                if !self.failing {
                    tracing::error!(
                        "cannot write the held health verdicts to {}: {e}; they hold while the exporter runs but not across a restart (tried again every tick)",
                        self.path.display()
                    );
                }
                self.failing = true;
            }
        }
    }

    fn write(&self, holds: &BTreeMap<String, GpuHolds>) -> io::Result<()> {
        let file = File {
            format: FORMAT,
            boot_id: self.boot_id.clone().unwrap_or_default(),
            gpus: holds.clone(),
        };
        let text = serde_json::to_vec_pretty(&file).map_err(io::Error::other)?;
        let tmp = temporary(&self.path);
        std::fs::write(&tmp, text)?;
        std::fs::rename(&tmp, &self.path).inspect_err(|_| {
            let _ = std::fs::remove_file(&tmp);
        })
    }

    /// The failures so far.
    pub fn errors(&self) -> HealthStateErrors {
        self.errors
    }
}

/// The temporary file written before it is renamed over `path`, in the same directory.
fn temporary(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".tmp");
    path.with_file_name(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holds(code: u64) -> BTreeMap<String, GpuHolds> {
        BTreeMap::from([(
            "GPU-a".to_string(),
            GpuHolds {
                xids: BTreeMap::from([(code, 1_700_000_000.0)]),
                energy_joules: Some(5e6),
            },
        )])
    }

    fn open(path: &Path, boot: &str) -> (Store, BTreeMap<String, GpuHolds>) {
        Store::open_for_boot(path.to_path_buf(), Some(boot.to_string()))
    }

    #[test]
    fn holds_survive_a_restart_in_the_same_boot_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("health.json");
        let (mut store, held) = open(&path, "boot-1");
        assert!(held.is_empty(), "a missing file is a first start");
        assert_eq!(store.errors(), HealthStateErrors::default());
        store.save(&holds(48));
        assert_eq!(open(&path, "boot-1").1, holds(48));
        assert!(
            open(&path, "boot-2").1.is_empty(),
            "a reboot resets every GPU"
        );
        // Nothing held any more (a reset): the file says so.
        store.save(&BTreeMap::new());
        assert!(open(&path, "boot-1").1.is_empty());
        assert_eq!(store.errors(), HealthStateErrors::default());
    }

    #[test]
    fn an_unknown_boot_keeps_every_entry() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("health.json");
        open(&path, "boot-1").0.save(&holds(79));
        let (_, held) = Store::open_for_boot(path, None);
        assert_eq!(held, holds(79));
    }

    #[test]
    fn a_corrupt_file_is_counted_and_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("health.json");
        for text in [
            "{not json",
            "{\"format\":9,\"boot_id\":\"\",\"gpus\":{}}",
            "",
        ] {
            std::fs::write(&path, text).unwrap();
            let (mut store, held) = open(&path, "boot-1");
            assert!(held.is_empty(), "{text:?}");
            assert_eq!(store.errors().read, 1, "{text:?}");
            store.save(&holds(48));
            assert_eq!(open(&path, "boot-1").1, holds(48), "{text:?}: replaced");
        }
    }

    #[test]
    fn an_unwritable_file_is_counted_and_tried_again() {
        let dir = tempfile::tempdir().unwrap();
        // A directory that does not exist: every write fails, as on a missing mount.
        let path = dir.path().join("missing").join("health.json");
        let (mut store, held) = open(&path, "boot-1");
        assert!(held.is_empty());
        store.save(&holds(48));
        store.save(&holds(48));
        assert_eq!(
            store.errors().write,
            2,
            "tried again while the holds differ"
        );
        std::fs::create_dir(dir.path().join("missing")).unwrap();
        store.save(&holds(48));
        assert_eq!(store.errors().write, 2);
        assert_eq!(open(&path, "boot-1").1, holds(48));
        // Written: the same holds again write nothing.
        std::fs::remove_file(&path).unwrap();
        store.save(&holds(48));
        assert!(!path.exists());
    }
}
