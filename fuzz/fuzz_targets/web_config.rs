//! Fuzz target: any bytes as the `--web-config` YAML file.
//!
//! `WebSettings::load` must accept the file or return a one-line error naming it; a panic, a hang
//! or a multi-line message is a finding. The directory holds no certificates, so a file that
//! names TLS files fails at reading them; basic auth and the YAML parser are reached fully.

#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use nvml_exporter::http::WebSettings;

/// One file rewritten for every input: the parser only takes a path.
fn file() -> &'static PathBuf {
    static FILE: OnceLock<PathBuf> = OnceLock::new();
    FILE.get_or_init(|| {
        let dir = tempfile::Builder::new()
            .prefix("nvml-exporter-fuzz")
            .tempdir()
            .expect("temporary directory");
        // Kept for the whole run; libFuzzer ends the process without running destructors anyway.
        dir.keep().join("web.yml")
    })
}

fuzz_target!(|data: &[u8]| {
    let path = file();
    std::fs::write(path, data).expect("write the input");
    if let Err(e) = WebSettings::load(Some(path)) {
        let msg = e.to_string();
        assert!(!msg.contains(['\n', '\r']), "not one line: {msg:?}");
        assert!(
            msg.contains(&*path.to_string_lossy()),
            "file not named: {msg}"
        );
    }
});
