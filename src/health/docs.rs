//! `docs/health.md`, rendered from the rule table (checked by a test; `UPDATE_DOCS=1 cargo test
//! --lib health::docs` writes it), and the critical list of the `NvidiaGpuXidError` alert in
//! `deploy/prometheus/alerts.yaml`, which the same command rewrites from the table.

use std::fmt::Write;

use super::rules::{RULES, SOURCES, Signal, action_doc, critical_xids};
use super::{REPLAY_WINDOW, RETIRED_PAGES_LIMIT, XID_WINDOW};
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
Each rule follows NVIDIA's own sources (listed [below](#sources)); where they disagree, its source\n\
column says which it follows and why. The driver's recovery action (R565 and newer) comes first:\n\
where the driver gives it, the XIDs marked *linked* (the catalogue's \"Xid 154 linkage\") change no\n\
verdict by themselves, since the driver holds its action until the GPU is reset.\n\n\
## Rules\n\n| signal | state | reason | action | meaning | source |\n|---|---|---|---|---|---|\n",
    );
    for r in RULES {
        let linked = if r.recovery_linked { " (linked)" } else { "" };
        let _ = writeln!(
            md,
            "| {}{linked} | {} | `{}` | `{}` | {} | {} |",
            signal(r.signal),
            r.state.label(),
            r.reason,
            r.action.label(),
            r.doc,
            r.source
        );
    }
    let _ = write!(
        md,
        "\nRules in state `healthy` never become a reason: they say which signals leave the GPU healthy.\n\
An XID no row lists degrades the GPU (`xid_unlisted`); every XID is counted in\n\
`nvidia_gpu_xid_errors_total`, and the `NvidiaGpuXidError` alert is critical for the XIDs whose\n\
row fails the GPU: {}.\n\n\
Notes on the readings: the SRAM threshold needs root (NVML answers NO_PERMISSION otherwise: the\n\
exporter logs it once per GPU and does not ask again; the DaemonSet runs as root); the\n\
unrepairable-memory flag needs a driver of R590 or newer and the recovery action R565 or newer\n\
(older drivers lack them, and the XID rows judge alone). PCIe replays are counted over the last {} s against DCGM's bound: 1e-12 of\n\
the link's bit rate per lane (0.15, 0.3, 0.48, 0.96, 1.92, 3.84 a minute for generations 1 to 6)\n\
times the lanes, rounded up. DCGM also fails a GPU with more than 15 pages retired for double-bit\n\
errors that retires more than one a week; that needs a week of history and is not judged here, its\n\
limit of {} retired pages is.\n",
        critical_xids()
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(", "),
        REPLAY_WINDOW.as_secs(),
        RETIRED_PAGES_LIMIT,
    );
    md.push_str(NODE_RULES);
    md.push_str("\n## Actions\n\n| action | what to do |\n|---|---|\n");
    for a in HealthAction::ALL {
        let _ = writeln!(md, "| `{}` | {} |", a.label(), action_doc(*a));
    }
    let _ = write!(
        md,
        "\n## How long a verdict holds\n\n\
- A condition NVML shows (the driver's recovery action, uncorrectable volatile ECC count, row\n  \
remap pending or failed, the unrepairable-memory and SRAM flags, a down NVLink link, the replay\n  \
rate, a slowdown, a lost or unreadable GPU) is active while the reading shows it and clears with\n  \
it. The driver holds its recovery action until the GPU is reset.\n\
- An XID is news when its count grew since the previous tick (for the first reading, since the\n  \
exporter started). An XID whose action is `reset_gpu`, `reboot_node` or `drain_and_service` holds\n  \
until the GPU is seen reset; any other XID holds {} minutes after its last event.\n\
- A GPU's registration with the NVLink fabric may take `--fabric-registration-timeout` (default {}\n  \
minutes) after the exporter's first tick (or the driver's re-initialisation) before\n  \
`fabric_not_registered` is a reason; a condition of the fabric health mask is a reason while the\n  \
mask shows it.\n\
- `gpus_missing` holds while the PCI bus (read every 30 s) lists a GPU that NVML does not enumerate.\n\n\
What \"seen reset\" is, first to last:\n\n\
1. The driver's recovery action went from a reset or reboot (GPU_RESET, NODE_REBOOT,\n   \
DRAIN_AND_RESET) back to none (R565 and newer): the driver itself says the reset was done.\n\
2. NVML answered GPU_IS_LOST or RESET_REQUIRED for the GPU, then answers again.\n\
3. The driver was re-initialised while the exporter ran (it went away and came back), or, across a\n   \
restart of the exporter, the GPU's energy counter (which NVML counts since the driver loaded) is\n   \
below the one written with the hold.\n\
4. The node rebooted: the state file is kept per boot.\n\n\
With `--health-state-file` (the DaemonSet keeps it on the node, in `/var/lib/nvml-exporter`) the\n\
XIDs held until a reset survive a restart of the exporter; without it a restart forgets them, and\n\
XID events are never replayed. A reset that happened while the exporter was stopped, on a driver\n\
before R565, cannot be seen: the GPU stays failed. After such a reset remove the GPU's entry from the\n\
file on the node (or the file, for every GPU) and restart the exporter's pod. A file that cannot be\n\
read or written never stops the exporter: it is counted in\n\
`nvml_exporter_health_state_errors_total{{operation=\"read\"|\"write\"}}` and logged; a failed read\n\
means the verdicts held before the restart are lost, so a GPU may read healthy that needs a reset.\n\n\
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
hold and how to act on them (a cordon, a remediation controller).\n\n## Sources\n\n",
    );
    for (name, what) in SOURCES {
        let _ = writeln!(md, "- **{name}**: {what}");
    }
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
        Signal::RecoveryAction(r) => format!("recovery action: {}", recovery(r)),
        Signal::Xid(code) => format!("XID {code}"),
        Signal::Xids(codes) => match codes {
            [first, .., last] if codes.len() == (last - first + 1) as usize => {
                format!("XID {first}-{last}")
            }
            _ => "XIDs listed in the meaning".into(),
        },
        Signal::XidUnlisted => "an XID no row lists".into(),
        Signal::UnrepairableMemory => "unrepairable-memory flag".into(),
        Signal::SramThreshold => "SRAM error threshold exceeded".into(),
        Signal::EccUncorrectable => "volatile uncorrectable ECC errors > 0".into(),
        Signal::RowRemapFailure => "row remap failed".into(),
        Signal::RetiredPagesLimit => "retired pages ≥ 63".into(),
        Signal::RowRemapPending => "row remap pending".into(),
        Signal::RetiredPagesPending => "retired pages pending".into(),
        Signal::NvlinkDown => "an NVLink link of the board down, no GPU in MIG mode".into(),
        Signal::PcieReplayRate => "PCIe replays per minute above DCGM's bound".into(),
        Signal::PcieWidth => "PCIe width below its maximum".into(),
        Signal::ThermalSlowdown => "clock event: thermal slowdown (sw or hw)".into(),
        Signal::PowerSlowdown => "clock event: hw power brake".into(),
        Signal::Lost => "NVML: GPU_IS_LOST".into(),
        Signal::ResetRequired => "NVML: RESET_REQUIRED".into(),
        Signal::Unreadable => "no fresh reading past --stale-grace".into(),
        Signal::FabricNotRegistered => {
            "NVLink fabric registration not completed past --fabric-registration-timeout".into()
        }
        Signal::FabricRegistrationFailed => "NVLink fabric registration failed".into(),
        Signal::Fabric(c) => format!("fabric health mask: {}", c.label().replace('_', " ")),
        Signal::GpusMissing => "node: a GPU on the PCI bus that NVML does not list".into(),
    }
}

fn recovery(r: super::rules::Recovery) -> &'static str {
    use super::rules::Recovery;
    match r {
        Recovery::GpuReset => "GPU_RESET (1)",
        Recovery::NodeReboot => "NODE_REBOOT (2)",
        Recovery::DrainP2p => "DRAIN_P2P (3)",
        Recovery::DrainAndReset => "DRAIN_AND_RESET (4)",
        Recovery::Other => "any other value",
    }
}

/// `alerts.yaml` with the `NvidiaGpuXidError` severity template's list of critical XIDs written
/// from the table: the one line that holds `match "^(…)$" $labels.xid`.
pub fn render_alerts(alerts: &str) -> String {
    const START: &str = "{{ if match \"^(";
    const END: &str = ")$\" $labels.xid }}";
    let list = critical_xids()
        .iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join("|");
    alerts
        .lines()
        .map(|line| match (line.find(START), line.find(END)) {
            (Some(start), Some(end)) if start < end => {
                format!("{}{list}{}", &line[..start + START.len()], &line[end..])
            }
            _ => line.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
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

    #[test]
    fn the_xid_alert_is_critical_for_the_table_s_failing_xids() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/prometheus/alerts.yaml");
        let alerts = std::fs::read_to_string(path).unwrap();
        assert!(
            alerts.contains("{{ if match \"^(") && alerts.contains(")$\" $labels.xid }}"),
            "the NvidiaGpuXidError severity template is not where the table writes its list"
        );
        crate::files::assert_generated(
            "deploy/prometheus/alerts.yaml",
            &render_alerts(&alerts),
            "UPDATE_DOCS=1 cargo test --lib health::docs && scripts/gen-prometheusrule.py",
        );
    }

    #[test]
    fn the_alert_list_is_rewritten_in_place() {
        let line = "  severity: '{{ if match \"^(48|79)$\" $labels.xid }}critical{{ else }}warning{{ end }}'";
        let out = render_alerts(&format!("a\n{line}\nb\n"));
        let expected = critical_xids()
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join("|");
        assert_eq!(
            out,
            format!(
                "a\n  severity: '{{{{ if match \"^({expected})$\" $labels.xid }}}}critical{{{{ else }}}}warning{{{{ end }}}}'\nb\n"
            )
        );
    }
}
