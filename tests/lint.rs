//! promtool's lint of what `--once` prints with every collector group alone, every group but
//! one, and all of them, on every shipped scenario at t = 60 s: no warning, no error.
//!
//! One process: each scenario is loaded into the simulator once (the simulator reads
//! `NVML_SIM_SCENARIO` and `NVML_SIM_TIME` at `nvmlInit`), and each set of flags goes through
//! what `--once` runs, [`nvml_exporter::config::load`] then [`nvml_exporter::sample_once`]; every
//! exposition is linted by the real `promtool check metrics` (`PROMTOOL`, else `promtool` on the
//! PATH; Debian's `prometheus` package, which scripts/test.sh installs). scripts/test.sh lints the
//! binary's own `--once` on every scenario with the default groups, and with `--dcgm-compat`.

#![allow(
    unsafe_code,
    reason = "std::env::set_var: the simulator reads its scenario and clock at nvmlInit"
)]

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use common::every_group;

/// promtool runs side by side: each is a short process that mostly starts up.
const LINTERS: usize = 4;

/// Every set of collector groups linted: what it is called in a failure, and its flags.
fn group_sets() -> Vec<(String, Vec<String>)> {
    let all = every_group();
    let mut sets = Vec::new();
    for flag in &all {
        let name = flag.trim_start_matches("--collector.");
        sets.push((
            format!("{name} alone"),
            vec!["--collector.disable-defaults".to_owned(), flag.clone()],
        ));
        let mut but = all.clone();
        but.push(format!("--no-collector.{name}"));
        sets.push((format!("all but {name}"), but));
    }
    sets.push(("all".to_owned(), all));
    sets
}

fn scenarios() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("nvml-sim/scenarios");
    let mut found: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    found.sort();
    assert!(found.len() > 1, "no scenarios in {}", dir.display());
    found
}

/// Sets the simulator's variables for the next `nvmlInit`, and no other `NVML_SIM_*` or
/// `NVML_EXPORTER_*` variable.
fn simulate(scenario: &Path) {
    // SAFETY: this is the only test of its binary (a process of its own), and the sampler
    // threads of the previous `--once` were joined before it returned: nothing else reads the
    // environment meanwhile.
    unsafe {
        for (key, _) in std::env::vars() {
            if key.starts_with("NVML_EXPORTER_") || key.starts_with("NVML_SIM_") {
                std::env::remove_var(key);
            }
        }
        std::env::set_var("NVML_SIM_SCENARIO", scenario);
        std::env::set_var("NVML_SIM_TIME", "60");
    }
}

/// `--once` with `flags`: the exposition, or why there is none.
fn once(flags: &[String]) -> Result<Vec<u8>, String> {
    let sim = common::sim_lib();
    let mut args = vec!["nvml-exporter".into(), "--once".into(), "--nvml-lib".into()];
    args.push(sim.to_str().unwrap().to_owned());
    args.extend_from_slice(flags);
    let config = nvml_exporter::config::load(&args).map_err(|e| e.to_string())?;
    match nvml_exporter::sample_once(&config) {
        (text, true) => Ok(text),
        (_, false) => Err("NVML did not answer".into()),
    }
}

/// `promtool check metrics` reading `text`.
fn promtool(text: &[u8]) -> Child {
    let program = std::env::var_os("PROMTOOL").unwrap_or_else(|| "promtool".into());
    let mut child = Command::new(&program)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "{}: {e}; install Debian's prometheus (scripts/test.sh does) or set PROMTOOL",
                program.to_string_lossy()
            )
        });
    // promtool reads all of its input before it answers, so the write cannot wait on it.
    child.stdin.take().unwrap().write_all(text).unwrap();
    child
}

/// What promtool said of a document it did not pass: empty when it passed.
fn verdict(child: Child) -> String {
    let out = child.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() && said.is_empty() {
        String::new()
    } else {
        format!("{} {said}", out.status)
    }
}

#[test]
fn every_collector_group_alone_all_but_one_and_all_lint_clean_on_every_scenario() {
    let sets = group_sets();
    let mut failures = Vec::new();
    let mut linted = 0;
    for scenario in scenarios() {
        simulate(&scenario);
        let name = scenario.file_name().unwrap().to_string_lossy().into_owned();
        let mut documents = Vec::new();
        for (set, flags) in &sets {
            match once(flags) {
                Ok(text) => documents.push((set, text)),
                Err(e) => failures.push(format!("{name}, {set}: --once: {e}")),
            }
        }
        for batch in documents.chunks(LINTERS) {
            let running: Vec<Child> = batch.iter().map(|(_, text)| promtool(text)).collect();
            for ((set, _), child) in batch.iter().zip(running) {
                let said = verdict(child);
                if !said.is_empty() {
                    failures.push(format!("{name}, {set}: promtool: {said}"));
                }
                linted += 1;
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    println!(
        "{linted} expositions lint clean ({} group sets)",
        sets.len()
    );
}
