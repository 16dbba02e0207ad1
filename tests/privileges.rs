//! The exporter needs no privileges: it runs as an unprivileged user (uid 65534, "nobody"), with
//! `no_new_privs`, on a read-only root filesystem, and still reads every GPU and serves. That is
//! how the Kubernetes manifests run it (non-root, read-only root filesystem, no capabilities).
//!
//! As root, the test makes that environment for real: a private mount namespace whose `/` is
//! remounted read-only (`unshare`, `mount`; the machine's own mounts stay as they are), then
//! `setpriv` drops to uid/gid 65534. As any other
//! user it runs the exporter as that user (already unprivileged) on the normal filesystem.

mod common;

use common::Exporter;
use std::process::Command;
use std::time::Duration;

#[allow(unsafe_code, reason = "geteuid(2) is a C call")]
fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// The exporter command, wrapped so that it runs unprivileged on a read-only root filesystem.
fn unprivileged(env: &[(&str, &str)]) -> Command {
    let bin = common::exporter_bin();
    if !is_root() {
        return common::exporter_command(env, &[]);
    }
    let mut cmd = Command::new("unshare");
    cmd.args(["--mount", "--propagation", "private", "--", "sh", "-c"]);
    // `exec` keeps one process from sh to the exporter, so the harness's pid is the exporter's.
    cmd.arg(
        "mount -o remount,bind,ro / && \
         exec setpriv --reuid=65534 --regid=65534 --clear-groups --no-new-privs \"$0\" \"$@\"",
    );
    cmd.arg(bin);
    for (key, _) in std::env::vars() {
        if key.starts_with("NVML_EXPORTER_") || key.starts_with("NVML_SIM_") {
            cmd.env_remove(key);
        }
    }
    cmd.envs(env.iter().copied());
    cmd
}

#[test]
fn serves_every_gpu_unprivileged_on_a_read_only_filesystem() {
    let sim = common::sim_lib();
    let mut e = Exporter::start_command(
        unprivileged(&[]),
        &["--nvml-lib", sim.to_str().unwrap(), "--interval", "250ms"],
    );
    let m = e.wait_metrics(Duration::from_secs(20), "8 GPUs up", |m| {
        m.find("nvidia_gpu_up", &[])
            .iter()
            .filter(|s| s.value == 1.0)
            .count()
            == 8
    });
    assert_eq!(m.value("nvml_exporter_nvml_up", &[]), Some(1.0));
    assert_eq!(e.get("/readyz").status, 200);

    let status = std::fs::read_to_string(format!("/proc/{}/status", e.child.id())).unwrap();
    let uid_line = status
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .unwrap()
        .to_string();
    if is_root() {
        assert!(
            uid_line.split_whitespace().skip(1).all(|id| id == "65534"),
            "runs as nobody: {uid_line}"
        );
        let nnp = status
            .lines()
            .find(|l| l.starts_with("NoNewPrivs:"))
            .unwrap();
        assert!(nnp.ends_with('1'), "{nnp}");
        let mounts = std::fs::read_to_string(format!("/proc/{}/mounts", e.child.id())).unwrap();
        let root = mounts
            .lines()
            .find(|l| l.split_whitespace().nth(1) == Some("/"))
            .unwrap();
        assert!(
            root.split_whitespace()
                .nth(3)
                .unwrap()
                .split(',')
                .any(|o| o == "ro"),
            "read-only /: {root}"
        );
    } else {
        assert!(
            !uid_line.split_whitespace().skip(1).any(|id| id == "0"),
            "{uid_line}"
        );
    }
    assert!(
        e.terminate(Duration::from_secs(10))
            .expect("exits on SIGTERM")
            .success()
    );
}
