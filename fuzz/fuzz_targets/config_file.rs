//! Fuzz target: any bytes as the `--config` TOML file.
//!
//! `config::load` must return a configuration that passes validation, or a one-line error naming
//! the file; a panic, a hang or a multi-line message is a finding.

#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use nvml_exporter::config::{self, MIN_INTERVAL};

/// One file rewritten for every input: the parser only takes a path.
fn file() -> &'static PathBuf {
    static FILE: OnceLock<PathBuf> = OnceLock::new();
    FILE.get_or_init(|| {
        let dir = tempfile::Builder::new()
            .prefix("nvml-exporter-fuzz")
            .tempdir()
            .expect("temporary directory");
        // Kept for the whole run; libFuzzer ends the process without running destructors anyway.
        dir.keep().join("config.toml")
    })
}

fuzz_target!(|data: &[u8]| {
    let path = file();
    std::fs::write(path, data).expect("write the input");
    match config::load([
        "nvml-exporter".as_ref(),
        "--config".as_ref(),
        path.as_os_str(),
    ]) {
        Ok(c) => {
            assert!(c.interval >= MIN_INTERVAL && c.interval <= Duration::from_secs(3600));
            assert!(!c.device_timeout().is_zero() && c.device_timeout() <= c.interval);
            assert!(c.stale_grace() >= c.interval);
        }
        Err(e) => {
            let msg = e.to_string();
            assert!(!msg.contains(['\n', '\r']), "not one line: {msg:?}");
            assert!(
                msg.contains(&*path.to_string_lossy()),
                "file not named: {msg}"
            );
        }
    }
});
