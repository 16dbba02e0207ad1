//! Captures the build's provenance for `nvml_exporter_build_info`: the git revision of the source
//! tree and the compiler's version. Either falls back to "unknown" — a release tarball or a
//! container build without `.git` must still build.
//!
//! `NVML_EXPORTER_REVISION` in the environment overrides the git lookup (for builds from an
//! exported tree that know their revision).

use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=NVML_EXPORTER_REVISION");

    let revision = std::env::var("NVML_EXPORTER_REVISION")
        .ok()
        .filter(|r| !r.trim().is_empty())
        .or_else(git_revision)
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=NVML_EXPORTER_REVISION={}", revision.trim());

    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_owned());
    let rustc_version = command_output(&rustc, &["--version"]).unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=NVML_EXPORTER_RUSTC={rustc_version}");
}

/// The short hash of HEAD, with rebuild triggers on the files that change when HEAD moves.
fn git_revision() -> Option<String> {
    let revision = command_output("git", &["rev-parse", "--short=12", "HEAD"])?;
    // HEAD itself changes on checkout; the branch's ref file (or packed-refs) on commit. In a
    // worktree these live in different directories, so ask git for each path.
    for git_path in ["HEAD", "packed-refs"] {
        rerun_if_git_path_changed(git_path);
    }
    if let Some(branch_ref) = command_output("git", &["symbolic-ref", "-q", "HEAD"]) {
        rerun_if_git_path_changed(&branch_ref);
    }
    Some(revision)
}

fn rerun_if_git_path_changed(git_path: &str) {
    let path = command_output("git", &["rev-parse", "--git-path", git_path]);
    if let Some(path) = path.filter(|p| Path::new(p).exists()) {
        println!("cargo:rerun-if-changed={path}");
    }
}

/// Trimmed stdout of a successful command, `None` on any failure (including a missing program).
fn command_output(program: &str, args: &[&str]) -> Option<String> {
    let output = Command::new(program).args(args).output().ok()?;
    if !output.status.success() {
        return None;
    }
    let text = String::from_utf8(output.stdout).ok()?.trim().to_owned();
    (!text.is_empty()).then_some(text)
}
