//! `docs/health.md`, rendered from the rule table (checked by a test; `UPDATE_DOCS=1 cargo test
//! --lib health::docs` writes it).

use std::fmt::Write;

use super::XID_WINDOW;
use super::rules::{RULES, Signal, action_doc};
use crate::sample::{HealthAction, HealthState};

/// The whole page.
pub fn render_markdown() -> String {
    let mut md = String::from(
        "# GPU health\n\n<!-- Generated from src/health/rules.rs: `UPDATE_DOCS=1 cargo test --lib health::docs`. -->\n\n\
Every tick the exporter gives each GPU a verdict from the rules below (the `health` collector group,\n\
on by default): `nvidia_gpu_health_state` (0 healthy, 1 degraded, 2 failed: the worst state among\n\
the active rules) and, for each active rule, `nvidia_gpu_health_reason{reason, action} 1` (absent\n\
when the GPU is healthy). Both are served while a GPU is down. The rules read what they need\n\
whatever other collector groups are on. A MIG instance's health is its GPU's: join on `gpu`/`uuid`.\n\n\
## Rules\n\n| signal | state | reason | action | meaning |\n|---|---|---|---|---|\n",
    );
    for r in RULES {
        let _ = writeln!(
            md,
            "| {} | {} | `{}` | `{}` | {} |",
            signal(r.signal),
            r.state.label(),
            r.reason,
            r.action.label(),
            r.doc
        );
    }
    md.push_str("\nRules in state `healthy` never become a reason: they say which XIDs leave the GPU healthy.\nAn XID the table does not list changes no verdict; it is counted in `nvidia_gpu_xid_errors_total`.\n");
    md.push_str(NODE_RULES);
    md.push_str("\n## Actions\n\n| action | what to do |\n|---|---|\n");
    for a in HealthAction::ALL {
        let _ = writeln!(md, "| `{}` | {} |", a.label(), action_doc(*a));
    }
    let _ = write!(
        md,
        "\n## How long a verdict holds\n\n\
- A condition NVML shows (uncorrectable volatile ECC count, row remap pending or failed, an NVLink link\n  \
down, PCIe width, a slowdown, a lost or unreadable GPU) is active while the reading shows it and\n  \
clears with it: links back up, a remap applied by a reset (which also restarts the volatile ECC count).\n\
- An XID is news when its count grew since the previous tick (for the first reading, since the exporter\n  \
started or the driver was re-initialised). An XID whose action is `reset_gpu`, `reboot_node` or\n  \
`drain_and_service` holds until the GPU is seen reset: NVML answered GPU_IS_LOST or GPU_REQUIRES_RESET\n  \
and then answers again, or the driver was re-initialised, or the exporter restarted (with the node).\n  \
Any other XID holds {} minutes after its last event.\n\
- A GPU's registration with the NVLink fabric may take `--fabric-registration-timeout` (default {}\n  \
minutes) after the NVML session's first tick (the exporter's start, or the driver's\n  \
re-initialisation) before `fabric_not_registered` is a reason; a condition of the fabric health\n  \
mask is a reason while the mask shows it.\n\
- `gpus_missing` holds while the PCI bus (read every 30 s) lists a GPU that NVML does not enumerate.\n\n\
States: `{}` needs nothing, `{}` works with less (or needs action soon), `{}` must not take work.\n",
        XID_WINDOW.as_secs() / 60,
        super::FABRIC_REGISTRATION_TIMEOUT.as_secs() / 60,
        HealthState::Healthy.label(),
        HealthState::Degraded.label(),
        HealthState::Failed.label(),
    );
    md.push_str(
        "\nWith `--kubernetes-node-condition` the verdicts also reach Kubernetes, as the node condition\n\
`NvidiaGpuHealthy` and Events: [kubernetes.md](kubernetes.md#gpu-health-on-the-node) says what they\n\
hold and how to act on them (a cordon, a remediation controller).\n",
    );
    md
}

/// What the docs say of the node's rules (and of the fabric's, whose sources are in the
/// runbook).
const NODE_RULES: &str = "The `fabric_*` rules read the NVLink fabric of NVSwitch systems (the `fabric` group's\n\
`nvidia_gpu_fabric_state`); their sources and what to do are in\n\
[alerts.md](alerts.md#nvlink-fabric-and-missing-gpus). The `gpus_missing` rule is the node's: a GPU\n\
NVML does not enumerate has no UUID, so it reaches no GPU's verdict but `nvidia_node_gpus_missing`\n\
(the `inventory` group, `--host-sys`), the node condition and the node page.\n";

fn signal(s: Signal) -> String {
    match s {
        Signal::Xid(code) => format!("XID {code}"),
        Signal::EccUncorrectable => "volatile uncorrectable ECC errors > 0".into(),
        Signal::RowRemapFailure => "row remap failed".into(),
        Signal::RowRemapPending => "row remap pending".into(),
        Signal::RetiredPagesPending => "retired pages pending".into(),
        Signal::NvlinkDown => "an NVLink link of the board down".into(),
        Signal::PcieWidth => "PCIe width below its maximum".into(),
        Signal::ThermalSlowdown => "clock event: thermal slowdown (sw or hw)".into(),
        Signal::PowerSlowdown => "clock event: hw power brake".into(),
        Signal::Lost => "GPU lost".into(),
        Signal::Unreadable => "no fresh reading past --stale-grace".into(),
        Signal::FabricNotRegistered => {
            "NVLink fabric registration not completed past --fabric-registration-timeout".into()
        }
        Signal::FabricRegistrationFailed => "NVLink fabric registration failed".into(),
        Signal::Fabric(c) => format!("fabric health mask: {}", c.label().replace('_', " ")),
        Signal::GpusMissing => "node: a GPU on the PCI bus that NVML does not list".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checked_in_docs_match_the_rule_table() {
        crate::files::assert_generated(
            "docs/health.md",
            &render_markdown(),
            "UPDATE_DOCS=1 cargo test --lib health::docs",
        );
    }
}
