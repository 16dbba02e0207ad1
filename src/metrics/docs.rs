//! Renders `docs/metrics.md` from the [catalog](super::catalog), so the reference can't drift
//! from what is served. A unit test compares the checked-in file with [`render_markdown`];
//! `UPDATE_DOCS=1 cargo test -p nvml-exporter metrics::docs` rewrites it.

use std::fmt::Write;

use super::catalog::{CATALOG, Dcgm, IDENTITY_LABELS, MIG_LABELS, MetricDef, POD_LABELS, Source};
use crate::groups::{DROP_ORDER, GROUPS, Group};

/// The full `docs/metrics.md`.
pub fn render_markdown() -> String {
    let mut md = String::new();
    md.push_str(
        "# Metrics\n\n\
         <!-- Generated from src/metrics/catalog.rs by `UPDATE_DOCS=1 cargo test -p nvml-exporter \
         metrics::docs`; do not edit by hand. -->\n\n\
         Values are in base units (bytes, seconds, joules, watts, hertz, celsius; ratios in 0..1). \
         A reading the GPU does not support is absent, never 0. While a GPU is lost \
         (`nvidia_gpu_up 0`) only `nvidia_gpu_info`, `nvidia_gpu_up` and its health verdict \
         remain for it.\n\n",
    );

    groups_section(&mut md);

    md.push_str("## Device metrics\n\n");
    let _ = writeln!(
        md,
        "Every series carries the identity labels {}.\n",
        code_list(IDENTITY_LABELS)
    );
    table(&mut md, CATALOG.iter().filter(|d| d.source.is_per_device()));
    md.push_str(
        "\nThe saturation metrics (from `nvidia_gpu_graphics_engine_active_ratio` to \
         `nvidia_gpu_media_engine_active_ratio`) come from NVML GPM (Hopper and newer). Each is \
         the average between the GPU's GPM samples of two consecutive sampling ticks, so they \
         appear from the second tick on (never with `--once`, which samples once), and restart \
         after NVML re-initialises or the GPU misses a tick or is lost. On a GPU without GPM \
         they are absent and `nvidia_gpu_gpm_supported` is 0.\n",
    );

    md.push_str(
        "\n### Kubernetes attribution\n\n\
         With `--kubernetes` the exporter asks the kubelet's pod-resources API (`List`) which \
         container holds each GPU, on its own schedule (`--kubernetes-refresh`, by default every \
         sampling interval; never during a scrape) with a deadline (`--kubernetes-timeout`). \
         Devices of `nvidia.com/gpu`, every `nvidia.com/mig-*` and the resources named by \
         `--kubernetes-resource-names` count; a device ID is a GPU UUID (`GPU-…`, a `::N` \
         time-slicing replica suffix ignored) or a device name `nvidiaN` (GKE; the GPU with minor \
         number N, a `/vgpuK` suffix ignored); a MIG device ID (`MIG-…`, or GKE's `nvidiaN/giM`) is \
         that GPU instance, whose `nvidia_gpu_pod_info` and instance series carry `gpu_instance` and \
         `mig_profile`.\n\n\
         With `--kubernetes-dra`, the devices a container holds through resource claims of \
         NVIDIA's DRA driver (`--kubernetes-dra-driver`, `gpu.nvidia.com`) count too: each is named \
         exactly by the driver's ResourceSlice for this node (its `uuid` attribute, or for a MIG \
         device created at allocation its `parentUUID`, `profile` and placement), read from the API \
         server, and `nvidia_gpu_pod_info` carries the claim's name as `claim` (absent for a \
         device plugin's GPU). A claimed device the slices do not name stays unattributed and is \
         counted under `dra_unknown_device` (`dra_malformed` for a claim the kubelet names without \
         a pool or device); a failed read of the slices under `dra_slices`.\n\n\
         `nvidia_gpu_pod_info` has one series per (GPU, container). Unless \
         `--kubernetes-labels=false`, every other series of a GPU held by exactly one container \
         also carries its `namespace`, `pod` and `container`; a GPU shared by several containers \
         carries none (its power or memory is no single container's) and is attributed through \
         `nvidia_gpu_pod_info` alone. An assignment disappears with the first successful `List` \
         that lacks it; while the kubelet does not answer (`nvml_exporter_kubernetes_up 0`) the \
         last answer is kept. Where the kubelet's pod list is read (`--processes`, \
         `--kubelet-pods`), a pod it shows ended (`Succeeded`, `Failed`) or no longer has loses \
         its GPUs at that refresh, although `List` still names its devices. The pod list also \
         gives `nvidia_gpu_pod_info` the pod's controller (`controller_kind`, `controller_name`: \
         the owner reference marked controller, a ReplicaSet named by its Deployment where the \
         `pod-template-hash` label shows it) and the labels and annotations named by \
         `--kubernetes-pod-labels` and `--kubernetes-pod-annotations`, as `label_<key>` and \
         `annotation_<key>` (every character outside `[a-zA-Z0-9_]` an `_`), each only where the \
         pod has it. The GPU's other series keep `namespace`, `pod` and `container` alone.\n",
    );

    md.push_str(
        "\n### HPC jobs\n\n\
         With `--hpc-job-mapping-dir DIR` the directory is read at every tick, in \
         dcgm-exporter's format: a file per GPU named by its index (`0`), or per MIG GPU \
         instance named `<gpu>.<gpu_instance>` (`2.1`), holding the IDs of the jobs on it, one a \
         line; other names are passed over. `nvidia_gpu_job_info` has one series per (GPU or GPU \
         instance, job), its `hpc_job` label the ID, and goes with the file or the ID. A file \
         that is unreadable, malformed (not text, over 64 KiB, a job ID over 256 bytes) or that \
         names a GPU or GPU instance not seen is left out whole and counted in \
         `nvml_exporter_jobs_errors_total{reason}` at every read, and logged once.\n",
    );

    md.push_str(
        "\n### Processes\n\n\
         With `--processes` every GPU's compute and graphics processes are read each tick \
         (`nvidia_gpu_process_*`, one series per pid, at most `--max-processes-per-gpu` per GPU: \
         the largest by memory). The process name and its pod come from the host's procfs \
         (`--host-proc`): the container and pod UID in `/proc/<pid>/cgroup`, named by the \
         kubelet's pod list, or else by the GPU's only container. A process whose container is \
         not known has no `namespace`/`pod`/`container` labels. `nvidia_gpu_pod_memory_used_bytes` \
         and `nvidia_gpu_pod_sm_utilization_ratio` are the sums over each container's processes on the GPU (all of them, beyond the series limit): on a \
         shared GPU each pod gets its own usage. On a GPU in MIG mode a process's series and its \
         pod's sums also carry the `gpu_instance` and `mig_profile` of the instance it runs in \
         (sums are per instance), the instance's only container stands in for the GPU's, and \
         the driver reports no per-process utilization (no series). See docs/processes.md.\n",
    );

    md.push_str(
        "\n### NVLink fabric\n\n\
         On NVSwitch systems (HGX and DGX H100, H200, B200; GB200 NVL72) a GPU joins the NVLink \
         fabric when Fabric Manager registers it. `nvidia_gpu_fabric_state` says where that \
         stands (absent where the GPU is on no fabric); the `fabric-health` group adds each \
         condition of the driver's fabric health mask, its summary and the clique, cluster, \
         status and configuration. They come from the newest call the driver has: \
         `nvmlDeviceGetGpuFabricInfoV` with the v3 struct (R580: the summary), the v2 struct \
         (R550: the mask; most of its conditions from R570), else `nvmlDeviceGetGpuFabricInfo` \
         (R525: state, status, clique and cluster only). The health verdict reads them whatever \
         the groups (the `fabric_*` reasons of docs/health.md).\n",
    );

    md.push_str("\n## Node metrics\n\n");
    md.push_str(
        "With the `inventory` group (on by default) the exporter reads the PCI bus of the host's \
         sysfs (`--host-sys`, `/sys` by default; the DaemonSet mounts the host's) at the first \
         tick after NVML starts and every 30 s, and counts at each tick the \
         NVIDIA GPUs on it (display controllers, class 0x0300 or 0x0302: not NVSwitches, not \
         other vendors' devices) that NVML does not enumerate, comparing PCI addresses. A GPU \
         bound to another driver than `nvidia` (`vfio-pci` for a virtual machine, `pci-stub`) \
         was set aside on purpose, as its `driver` link in sysfs says, and is not counted; one \
         bound to none (the nvidia driver failed to set it up) is. When the bus cannot be read \
         or NVML does not answer, the count is absent (unknown), never 0. These series carry no \
         `gpu` or `uuid`: a GPU NVML does not enumerate has neither.\n\n",
    );
    table(
        &mut md,
        CATALOG
            .iter()
            .filter(|d| !d.source.is_per_device() && d.name.starts_with("nvidia_node_")),
    );

    md.push_str("\n## Exporter self-metrics\n\n");
    table(
        &mut md,
        CATALOG
            .iter()
            .filter(|d| !d.source.is_per_device() && !d.name.starts_with("nvidia_node_")),
    );
    md.push_str(
        "\n`nvml_exporter_scrapes_total` is counted as responses are sent but encoded with the next \
         sampling tick, so it lags by up to one interval; so are `nvml_exporter_http_connections` \
         and `nvml_exporter_http_connections_closed_total`.\n\n\
         The standard `process_*` metrics (CPU seconds, resident and virtual memory, open and \
         maximum file descriptors, threads, start time) follow on Linux.\n",
    );
    md
}

fn table<'a>(md: &mut String, defs: impl Iterator<Item = &'a MetricDef>) {
    md.push_str(
        "| name | type | unit | group | labels | description | dcgm-exporter equivalent |\n",
    );
    md.push_str("|---|---|---|---|---|---|---|\n");
    for d in defs {
        let _ = writeln!(
            md,
            "| `{}` | {} | {} | {} | {} | {} | {} |",
            d.name,
            d.kind.as_str(),
            d.unit,
            group_cell(d.group),
            labels_cell(d),
            cell(d.help),
            dcgm_cell(d.dcgm),
        );
    }
}

/// The collector groups: name, default, what they hold and their families.
fn groups_section(md: &mut String) {
    md.push_str(
        "## Collector groups\n\n\
         Every family belongs to one collector group. `--collector.NAME` turns a group on, \
         `--no-collector.NAME` off, `--collector.disable-defaults` starts from none (also \
         `collector.NAME = true` in the `--config` file and `NVML_EXPORTER_COLLECTOR_NAME=true` in \
         the environment, with `-` as `_`). A group that is off is not sampled: its NVML calls are \
         not made. `core` is always on. With `--dcgm-compat` every group that one of \
         dcgm-exporter's fields comes from is sampled unless turned off by name, so that the \
         fields of docs/migrating-from-dcgm-exporter.md are served (with `--dcgm-compat=both` the \
         native families served stay those of the groups on): ",
    );
    let dcgm: Vec<String> = super::dcgm::groups()
        .iter()
        .filter(|g| *g != Group::Core)
        .map(|g| format!("`{g}`"))
        .collect();
    md.push_str(&dcgm.join(", "));
    md.push_str(".\n\n| group | default | what | families |\n|---|---|---|---|\n");
    for g in GROUPS {
        let families: Vec<String> = CATALOG
            .iter()
            .filter(|d| d.group == g.group)
            .map(|d| format!("`{}`", d.name))
            .collect();
        let _ = writeln!(
            md,
            "| `{}` | {} | {} | {} |",
            g.name,
            if g.group == Group::Core {
                "always"
            } else if g.default {
                "on"
            } else {
                "off"
            },
            cell(g.help),
            families.join(", ")
        );
    }
    md.push_str(
        "\n`--max-series N` bounds the series of the GPU families, dcgm-exporter's names \
         (`--dcgm-compat`) included, each in the group of the family it is read from (the \
         exporter's own not counted): above it, whole groups are left out in this order until \
         the rest fits, the most detailed first: ",
    );
    let order: Vec<String> = DROP_ORDER.iter().map(|g| format!("`{g}`")).collect();
    md.push_str(&order.join(", "));
    md.push_str(
        ". `core` (identity, `nvidia_gpu_up`, pod assignment) is never left out. The series \
         are counted before anything is written, so what is left out costs no memory. The first \
         exposition that leaves a group out logs one warning (and one line when all are served \
         again); `nvml_exporter_series{group}` says what each group serves, \
         `nvml_exporter_series_dropped_total{group}` counts what was left out.\n\n",
    );
}

/// The group of a family and whether it is on by default.
fn group_cell(group: Group) -> String {
    let info = group.info();
    match (group, info.default) {
        (Group::Core, _) => format!("`{}` (always)", info.name),
        (_, true) => format!("`{}` (on)", info.name),
        (_, false) => format!("`{}` (off)", info.name),
    }
}

fn code_list(items: &[&str]) -> String {
    items
        .iter()
        .map(|i| format!("`{i}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Label names, each followed by its values when the set is closed.
fn labels_cell(d: &MetricDef) -> String {
    let cell = labels_list(d);
    if matches!(d.source, Source::Processes(_)) {
        // The pod labels of a process series depend on the process.
        return format!(
            "{cell} (+ {} on a MIG GPU; + {} when known)",
            code_list(MIG_LABELS),
            code_list(POD_LABELS)
        );
    }
    if matches!(d.source, Source::PodProcesses(_)) {
        return format!("{cell} (+ {} on a MIG GPU)", code_list(MIG_LABELS));
    }
    cell
}

fn labels_list(d: &MetricDef) -> String {
    d.labels
        .iter()
        .map(
            |l| match d.closed_labels.iter().find(|(name, _)| name == l) {
                Some((_, values)) => format!("`{l}` ({})", values().join(", ")),
                None => format!("`{l}`"),
            },
        )
        .collect::<Vec<_>>()
        .join(", ")
}

fn dcgm_cell(fields: &[Dcgm]) -> String {
    fields
        .iter()
        .map(|f| {
            let mut s = format!("`{}`", f.field);
            if !f.unit.is_empty() {
                let _ = write!(s, " ({})", f.unit);
            }
            if let Some(v) = f.label_value {
                let _ = write!(s, " for `{v}`");
            }
            s
        })
        .collect::<Vec<_>>()
        .join("<br>")
}

/// Table cells can't contain a bare `|`.
fn cell(text: &str) -> String {
    text.replace('|', "\\|")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checked_in_docs_match_the_catalog() {
        crate::files::assert_generated(
            "docs/metrics.md",
            &render_markdown(),
            "UPDATE_DOCS=1 cargo test -p nvml-exporter metrics::docs",
        );
    }

    #[test]
    fn every_family_is_documented_once() {
        let md = render_markdown();
        for d in CATALOG {
            let row = format!("\n| `{}` | {} |", d.name, d.kind.as_str());
            assert_eq!(md.matches(&row).count(), 1, "{}", d.name);
        }
    }
}
