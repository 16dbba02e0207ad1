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
    md.push_str("\nRules in state `healthy` never become a reason: they say which XIDs leave the GPU healthy.\nAn XID the table does not list changes no verdict; it is counted in `nvidia_gpu_xid_errors_total`.\n\n## Actions\n\n| action | what to do |\n|---|---|\n");
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
Any other XID holds {} minutes after its last event.\n\n\
States: `{}` needs nothing, `{}` works with less (or needs action soon), `{}` must not take work.\n",
        XID_WINDOW.as_secs() / 60,
        HealthState::Healthy.label(),
        HealthState::Degraded.label(),
        HealthState::Failed.label(),
    );
    md.push_str(&node_condition());
    md
}

/// How the verdicts reach Kubernetes, and how to act on them there.
fn node_condition() -> String {
    use crate::kubernetes::node_condition::{
        CONDITION_TYPE, FIRST_BACKOFF, HEARTBEAT, MAX_BACKOFF, MAX_PENDING_EVENTS,
    };
    let seconds = |d: std::time::Duration| humantime::format_duration(d).to_string();
    format!(
        "\n## The node condition\n\n\
With `--kubernetes-node-condition` (and `--kubernetes-node-name`; `deploy/kubernetes/health` has the\n\
RBAC, exactly `patch` on `nodes/status` and `create` on events, and the environment) the exporter\n\
writes the verdicts to its node:\n\n\
- The condition `{CONDITION_TYPE}` on the node's status: `True` (reason `GpusHealthy`) when every GPU\n  \
is healthy; `False` when one is not, with reason `GpuFailed` when a GPU failed (else `GpuDegraded`)\n  \
and a message naming each GPU that is not healthy with its state, reasons and actions, e.g.\n  \
`GPU 2 (GPU-…) failed: xid_79 (reboot_node); GPU 4 (GPU-…) degraded: nvlink_down (reset_gpu)`;\n  \
`Unknown` (reason `NvmlUnavailable`) while NVML does not answer. It is written when it changes and\n  \
every {} (`lastHeartbeatTime`: older than that and a margin, the exporter stopped reporting);\n  \
`lastTransitionTime` is when the exporter first saw the status, so a restarted exporter starts it\n  \
again. The patch is a strategic merge of this one condition: the kubelet's and every other\n  \
condition of the node stay as they are.\n\
- An Event (events.k8s.io/v1, regarding the Node, in namespace `default` as the kubelet's node\n  \
events, reported by `nvml-exporter`) for each GPU whose state changes, and at the start for each\n  \
GPU that is not healthy: type `Warning`, reason `GpuFailed` or `GpuDegraded` and the GPU's most\n  \
disruptive action as `action`; type `Normal`, reason `GpuHealthy` when it recovers.\n  \
`kubectl describe node NAME` lists them.\n\
- A call the API server refuses (401/403: the RBAC is missing; 409; 5xx) or does not answer within\n  \
`--kubernetes-timeout` is counted in `nvml_exporter_kubernetes_errors_total` (reasons\n  \
`node_condition_forbidden`, `_conflict`, `_http`, `_timeout`, `_unavailable`), logged once when the\n  \
API server stops accepting, and retried after a wait that doubles from {} to {}; Events wait\n  \
meanwhile (at most {MAX_PENDING_EVENTS}, the oldest dropped first). Sampling and `/metrics` never\n  \
wait for it.\n\n\
### Acting on it\n\n\
- See it: `kubectl get nodes -o custom-columns='NAME:.metadata.name,GPUS:.status.conditions[?(@.type==\"{CONDITION_TYPE}\")].reason'`\n  \
lists each node's `GpusHealthy`, `GpuDegraded` or `GpuFailed`; `kubectl describe node NAME` shows the\n  \
message and the Events.\n\
- A condition does not keep pods off a node by itself. To stop new work landing on a failed GPU's\n  \
node, cordon it: by hand (`kubectl cordon NAME`), or from a script over the nodes whose reason is\n  \
`GpuFailed`, then drain it when the action (in the message) is `reboot_node` or\n  \
`drain_and_service`. `reset_gpu` needs the GPU's workloads gone, not the node's; `restart_workload`\n  \
needs nothing of the node.\n\
- A remediation controller that reads node conditions acts on it unchanged: for example Medik8s'\n  \
Node Healthcheck operator with `unhealthyConditions: [{{type: {CONDITION_TYPE}, status: \"False\",\n  \
duration: 10m}}]` and the remediation of your choice. It matches the status, so it acts on degraded\n  \
GPUs too: a `duration` longer than a transient slowdown keeps it to what lasts. Alerts\n  \
`NvidiaGpuUnhealthy` and `NvidiaGpuDegraded` (docs/alerts.md) say the same per GPU from Prometheus.\n\
- The node's GPUs stay allocatable: the device plugin, not the exporter, decides that.\n",
        seconds(HEARTBEAT),
        seconds(FIRST_BACKOFF),
        seconds(MAX_BACKOFF),
    )
}

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
