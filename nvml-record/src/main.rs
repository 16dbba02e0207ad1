//! `nvml-record`: records this node's GPUs through NVML for a while and writes a scenario file
//! that nvml-sim replays (see the crate's documentation and nvml-sim/README.md).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use nvml_record::{Recorder, Session};
use nvml_wrapper::Nvml;

/// Records every GPU of this node through NVML (static facts and a sampled trace of every
/// reading nvml-exporter makes) and writes a scenario file that nvml-sim replays.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// How long to record, e.g. `60s`, `5m`. The replay cycles through this span.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "60s")]
    duration: Duration,
    /// Time between two samples, e.g. `1s`, `500ms`: the scenario's step.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "1s")]
    period: Duration,
    /// Where to write the scenario (`-`: standard output).
    #[arg(long)]
    out: PathBuf,
    /// The NVML library to load, as nvml-exporter's `--nvml-lib`.
    #[arg(long, default_value = "libnvidia-ml.so.1")]
    nvml_lib: PathBuf,
}

fn main() -> ExitCode {
    let args = Args::parse();
    if args.period.is_zero() || args.duration < args.period {
        eprintln!(
            "nvml-record: --period ({}) must be > 0 and at most --duration ({})",
            humantime::format_duration(args.period),
            humantime::format_duration(args.duration)
        );
        return ExitCode::from(2);
    }
    // A path (not a bare soname for the loader to find) must exist.
    if args.nvml_lib.components().count() > 1 && !args.nvml_lib.exists() {
        eprintln!(
            "nvml-record: --nvml-lib {}: no such file",
            args.nvml_lib.display()
        );
        return ExitCode::from(2);
    }
    // The output is opened before recording, so a bad --out fails now, not after --duration.
    let out = if args.out.as_os_str() == "-" {
        None
    } else {
        match Output::create(&args.out) {
            Ok(out) => Some(out),
            Err(e) => {
                eprintln!("nvml-record: --out {}: {e}", args.out.display());
                return ExitCode::from(2);
            }
        }
    };
    let scenario = match record(&args) {
        Ok(scenario) => scenario,
        Err(e) => {
            eprintln!("nvml-record: {e}");
            return ExitCode::FAILURE;
        }
    };
    let Some(out) = out else {
        print!("{scenario}");
        return ExitCode::SUCCESS;
    };
    match out.commit(&scenario) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("nvml-record: --out {}: {e}", args.out.display());
            ExitCode::from(2)
        }
    }
}

/// Samples every `--period` for `--duration` (on a fixed schedule: a slow sample does not shift
/// the later ones) and returns the scenario.
fn record(args: &Args) -> Result<String, Box<dyn std::error::Error>> {
    let nvml = Nvml::builder()
        .lib_path(args.nvml_lib.as_os_str())
        .init()
        .map_err(|e| format!("loading NVML from {}: {e}", args.nvml_lib.display()))?;
    let mut recorder = Recorder::new(&nvml, args.period)?;
    let samples = (args.duration.as_nanos() / args.period.as_nanos()) as u32;
    let mut session = Session::new(&nvml);
    let start = Instant::now();
    for k in 0..samples {
        if let Some(wait) = (start + args.period * k).checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        recorder.sample(&nvml)?;
        recorder.sample_over_time(&mut session);
    }
    for (gpu, reading, failures) in recorder.gaps() {
        eprintln!(
            "nvml-record: GPU {gpu}: {reading} failed {failures} time(s); the gaps repeat the value before"
        );
    }
    eprintln!(
        "nvml-record: {} samples every {:?}",
        recorder.samples(),
        args.period
    );
    Ok(recorder.scenario())
}

/// The scenario file being written: a temporary file next to it, renamed over it once complete,
/// so a reader never sees half a scenario and a failed recording leaves the old file alone.
struct Output {
    file: std::fs::File,
    tmp: PathBuf,
    path: PathBuf,
}

impl Output {
    fn create(path: &Path) -> std::io::Result<Output> {
        if path.is_dir() {
            return Err(std::io::Error::other("is a directory"));
        }
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(".tmp");
        let tmp = PathBuf::from(tmp);
        let file = std::fs::File::create(&tmp)?;
        Ok(Output {
            file,
            tmp,
            path: path.to_owned(),
        })
    }

    fn commit(mut self, text: &str) -> std::io::Result<()> {
        self.file.write_all(text.as_bytes())?;
        self.file.sync_all()?;
        std::fs::rename(&self.tmp, &self.path)
    }
}

impl Drop for Output {
    fn drop(&mut self) {
        // Gone after a successful rename; otherwise the half-done file is removed.
        let _ = std::fs::remove_file(&self.tmp);
    }
}
