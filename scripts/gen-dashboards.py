#!/usr/bin/env python3
"""Writes the Grafana dashboards in dashboards/ (gpu-fleet.json, gpu-node.json, workloads.json,
waste.json).

    scripts/gen-dashboards.py           # rewrite dashboards/*.json
    scripts/gen-dashboards.py --check   # exit 1 if a committed dashboard differs from this script

The dashboards are written from here so that every panel gets the same datasource reference,
variables and selectors. What must agree with deploy/prometheus/alerts.yaml (what "allocated" and
"idle" mean), and what would read every GPU's series at every step of a range, is read from the
series its recording rules keep. Edit this file, not the JSON; scripts/check-dashboards.py checks
the JSON (and, with --check here, that it is up to date).
"""

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "dashboards"

DS = {"type": "prometheus", "uid": "${datasource}"}

# Series selectors. `node` exists where Kubernetes service discovery adds it (the ServiceMonitor
# in deploy/kubernetes does); every variable's "All" is `.*`, which also matches a missing label.
DEV = 'node=~"$node", instance=~"$instance", gpu=~"$gpu"'
POD = DEV + ', namespace=~"$namespace"'
# A GPU in MIG mode serves the memory and GPM families twice: the whole GPU's series
# (gpu_instance="") and one per GPU instance (gpu_instance, mig_profile). Panels about whole GPUs
# select the GPU's own series (WHOLE), the MIG panels the instances' (MIG); panels about what a pod holds or what is allocated join on
# KEY, which tells a MIG instance from its GPU and from its sibling instances, so a pod holding an
# instance meets that instance's series, never the GPU's or another instance's.
WHOLE = DEV + ', gpu_instance=""'
# The per-node series that the recording rules of alerts.yaml keep (instance:..., one per
# exporter): only the node and instance selections apply to them.
NODE = 'node=~"$node", instance=~"$instance"'
MIG = DEV + ', gpu_instance!=""'
KEY = "job, instance, gpu, uuid, gpu_instance"
# A process series' identity (its pod labels only where the kubelet names it).
PROC_KEY = "instance, gpu, gpu_instance, pid, process_name, namespace, pod, container"


# What "idle" and "allocated" mean is spelled once, in the rules of deploy/prometheus/alerts.yaml
# that record them per GPU (or MIG instance) every evaluation; the dashboards read those series.
SM_OR_UTIL = "gpu:nvidia_gpu_sm_active_ratio:or_utilization"
ALLOCATED = "gpu:nvidia_gpu_allocated:pod_info_or_memory_used"


def fleet_avg(metric):
    """The average over the selected nodes' whole GPUs, from the per-node sums and counts."""
    return f"sum(instance:{metric}:sum{{{NODE}}}) / sum(instance:{metric}:count{{{NODE}}})"


def pod_gpus(sel, by="namespace, pod"):
    """One series per (pod, GPU) assignment: containers of one pod sharing a GPU count once."""
    return f"group by ({by}, {KEY}) (nvidia_gpu_pod_info{{{sel}}})"


def pod_usage_doc(pod_metric, gpu_metric, rule):
    """The panel-description text of the per-pod usage rules of alerts.yaml (pod:..._or_...)."""
    return (
        f" Per pod and GPU: on a GPU where the exporter serves per-pod usage (--processes with"
        f" --kubernetes) the pod's own, {pod_metric} summed over its containers; on other GPUs the"
        f" GPU's {gpu_metric}, whole, for each pod assigned it (a shared GPU's value is then counted"
        f" for each of its pods); 0 for a pod assigned a GPU with per-pod usage on which it runs"
        f" nothing: sum by (namespace, pod, gpu) ({pod_metric}) or ({gpu_metric} * on (gpu) group_right"
        f" () pod assignments unless on (gpu) {pod_metric}) or pod assignments * 0. A pod holding a"
        f" MIG instance gets the instance's own {gpu_metric} where the exporter serves one (memory;"
        f" not utilization, which NVML does not report for MIG instances)."
        f" Read from the per-pod rule {rule} of deploy/prometheus/alerts.yaml, which the GPU selection"
        f" does not narrow."
    )


# Grafana gives $__interval_ms for the subquery step below; the sum of a 0/1-per-step series
# times the step in hours is the GPU-hours over the dashboard range, exact whatever the range,
# including GPUs and pods that exist for only part of it.
HOURS_PER_STEP = "$__interval_ms / 3600000"


def gpu_hours(expr):
    """GPU-hours of a series that counts GPUs, over the dashboard range."""
    return f"sum_over_time(({expr})[$__range:$__interval]) * {HOURS_PER_STEP}"


# ---------------------------------------------------------------------------------------------
# Panel builders


class Layout:
    """Places panels left to right in Grafana's 24-column grid, wrapping to a new row."""

    def __init__(self):
        self.x = self.y = self.row_h = 0
        self.next_id = 1

    def place(self, w, h):
        if self.x + w > 24:
            self.x, self.y, self.row_h = 0, self.y + self.row_h, 0
        pos = {"h": h, "w": w, "x": self.x, "y": self.y}
        self.x += w
        self.row_h = max(self.row_h, h)
        return pos

    def id(self):
        self.next_id += 1
        return self.next_id - 1


def target(expr, legend="", instant=False, ref="A", fmt=None):
    t = {"datasource": DS, "editorMode": "code", "expr": expr, "refId": ref}
    if legend:
        t["legendFormat"] = legend
    t["instant"] = instant
    t["range"] = not instant
    if fmt:
        t["format"] = fmt
    return t


def targets(*specs, instant=False, fmt=None):
    """targets(("expr", "legend"), ...) with refIds A, B, ..."""
    return [
        target(expr, legend, instant=instant, ref=chr(ord("A") + i), fmt=fmt)
        for i, (expr, legend) in enumerate(specs)
    ]


def panel(layout, kind, title, description, unit, tgts, w, h, **extra):
    p = {
        "id": layout.id(),
        "type": kind,
        "title": title,
        "description": description,
        "datasource": DS,
        "gridPos": layout.place(w, h),
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "targets": tgts,
    }
    defaults = p["fieldConfig"]["defaults"]
    if kind == "timeseries":
        defaults["custom"] = {
            "drawStyle": "line",
            "lineWidth": 1,
            "fillOpacity": 10,
            "showPoints": "never",
            "spanNulls": False,
        }
        p["options"] = {
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
            "tooltip": {"mode": "multi", "sort": "desc"},
        }
    elif kind == "stat":
        defaults["color"] = {"mode": "thresholds"}
        defaults["thresholds"] = extra.pop(
            "thresholds", {"mode": "absolute", "steps": [{"color": "green", "value": None}]}
        )
        p["options"] = {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "value",
            "graphMode": "none",
            "justifyMode": "auto",
            "orientation": "auto",
            "textMode": "auto",
        }
    elif kind == "table":
        p["options"] = {"showHeader": True, "cellHeight": "sm"}
        p["transformations"] = extra.pop("transformations", [
            {"id": "merge", "options": {}},
            {"id": "organize", "options": {"excludeByName": {"Time": True}}},
        ])
    elif kind == "heatmap":
        # The buckets come from the query, one series per bucket named by its upper bound.
        p["options"] = {
            "calculate": False,
            "rowsFrame": {"layout": "le"},
            "color": {"mode": "scheme", "scheme": "Oranges", "steps": 64},
            "cellGap": 1,
            "yAxis": {"unit": unit, "axisPlacement": "left"},
            "tooltip": {"show": True, "yHistogram": True},
            "legend": {"show": True},
        }
    p.update(extra)
    return p


def renamed(names):
    """A table's transformations: the queries' frames merged into one, the time column dropped and
    the columns renamed by `names`."""
    return [
        {"id": "merge", "options": {}},
        {"id": "organize", "options": {"excludeByName": {"Time": True}, "renameByName": names}},
    ]


def stat(layout, title, description, unit, expr, w=4, h=4, **extra):
    return panel(layout, "stat", title, description, unit, [target(expr, instant=True)], w, h, **extra)


def warn_if_above(value):
    return {"mode": "absolute", "steps": [
        {"color": "green", "value": None}, {"color": "orange", "value": value}]}


# ---------------------------------------------------------------------------------------------
# Variables


def datasource_var():
    return {
        "name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
        "current": {}, "hide": 0, "includeAll": False, "multi": False, "options": [],
        "refresh": 1, "regex": "",
    }


def query_var(name, label, query):
    return {
        "name": name, "label": label, "type": "query", "datasource": DS,
        "definition": query,
        "query": {"qryType": 1, "query": query, "refId": "PrometheusVariableQueryEditor-VariableQuery"},
        "current": {}, "hide": 0, "includeAll": True, "multi": True, "allValue": ".*",
        "options": [], "refresh": 2, "regex": "", "sort": 3,
    }


def variables():
    """Chained in order: node, then the instances on it, their GPUs, the namespaces holding them.
    Nodes and instances come from a series each exporter serves once (nvml_exporter_gpus), GPUs
    from nvidia_gpu_up (few labels): Grafana lists a variable's values from every matching series
    over the range, which for nvidia_gpu_info on 10,240 GPUs took seconds."""
    return {"list": [
        datasource_var(),
        query_var("node", "Node", "label_values(nvml_exporter_gpus, node)"),
        query_var("instance", "Instance", 'label_values(nvml_exporter_gpus{node=~"$node"}, instance)'),
        query_var("gpu", "GPU", 'label_values(nvidia_gpu_up{node=~"$node", instance=~"$instance"}, gpu)'),
        query_var("namespace", "Namespace",
                  'label_values(nvidia_gpu_pod_info{node=~"$node", instance=~"$instance"}, namespace)'),
    ]}


def dashboard(uid, title, description, panels):
    return {
        "annotations": {"list": [{
            "builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"},
            "enable": True, "hide": True, "iconColor": "rgba(0, 211, 255, 1)",
            "name": "Annotations & Alerts", "type": "dashboard",
        }]},
        "description": description,
        "editable": True,
        "fiscalYearStartMonth": 0,
        "graphTooltip": 1,
        "id": None,
        "links": [{
            "asDropdown": True, "includeVars": True, "keepTime": True, "tags": ["nvml-exporter"],
            "title": "GPU dashboards", "type": "dashboards",
        }],
        "panels": panels,
        "refresh": "1m",
        "schemaVersion": 39,
        "tags": ["nvml-exporter", "gpu", "nvidia"],
        "templating": variables(),
        "time": {"from": "now-6h", "to": "now"},
        "timepicker": {},
        "timezone": "",
        "title": title,
        "uid": uid,
        "version": 1,
        "weekStart": "",
    }


UTIL_VS_SAT = (
    " Utilization says a kernel ran, not how much of the GPU it used; SM activity, occupancy,"
    " tensor and DRAM activity (NVML GPM, Hopper and newer) say how saturated it is."
)
ALLOC_DEF = (
    " Allocated means what the NvidiaGpuIdleWhileAllocated alert means (deploy/prometheus/alerts.yaml):"
    " assigned to a pod where the exporter runs with --kubernetes, else its processes hold more than"
    " 1 GiB of device memory. Idle: SM activity (utilization where the GPU has no GPM) under 5 %."
    " On a GPU in MIG mode the unit is the MIG instance (what the kubelet assigns): each allocated"
    " instance counts as one, judged by its own memory and SM activity, and the GPU itself never."
)
PER_NODE = (
    " Read from the per-node recording rules of deploy/prometheus/alerts.yaml (instance:...), so"
    " that it stays fast on thousands of GPUs: the Node and Instance selections apply, GPU and"
    " Namespace do not."
)
NODE_NS = NODE + ', namespace=~"$namespace"'
NS_PER_NODE = (
    " Read from the per-node, per-namespace recording rules of deploy/prometheus/alerts.yaml"
    " (instance_namespace:...), so that it stays fast on thousands of GPUs: the Node, Instance and"
    " Namespace selections apply, GPU does not."
)
POD_RULES = (
    " Read from the per-pod recording rules of deploy/prometheus/alerts.yaml (pod:...), so that it"
    " stays fast on thousands of GPUs: the GPU selection does not narrow it."
)
HEALTH_DEF = (
    " The verdict is the exporter's own (the health collector group, on by default), from the rule"
    " table of docs/health.md: nvidia_gpu_health_state is 0 healthy, 1 degraded (works with less, or"
    " needs action soon), 2 failed (must not take work); nvidia_gpu_health_reason names each active"
    " reason with the action it asks for (none, restart_workload, reset_gpu, reboot_node,"
    " drain_and_service; the Actions table of docs/health.md says what each means). Served while a"
    " GPU is down too."
)
# One series per GPU and action among its active reasons: a GPU with two reasons asking for the
# same action counts once for it.
HEALTH_ACTIONS = f"group by (job, instance, gpu, uuid, action) (nvidia_gpu_health_reason{{{DEV}}})"
# The queue labels the Workloads dashboard groups by: Kueue's queue label and Volcano's queue
# annotation of a pod, as --kubernetes-pod-labels and --kubernetes-pod-annotations name them.
KUEUE_QUEUE = "label_kueue_x_k8s_io_queue_name"
VOLCANO_QUEUE = "annotation_scheduling_volcano_sh_queue_name"
OWNER_NEEDS = (
    " The controller comes from the kubelet's pod list: it needs --kubelet-pods (or --processes, or"
    " --kubernetes-pod-labels) and the RBAC of deploy/kubernetes/processes. Without it every pod of"
    " a namespace falls in one row without a controller."
)
QUEUE_NEEDS = (
    " The queue is the pod's Kueue label (--kubernetes-pod-labels=kueue.x-k8s.io/queue-name, served"
    " as label_kueue_x_k8s_io_queue_name) or Volcano annotation"
    " (--kubernetes-pod-annotations=scheduling.volcano.sh/queue-name), whichever is copied; for another"
    " scheduler's label, edit the query's label. Without them, or for pods in no queue, the GPUs"
    " fall in one row with an empty queue."
)
# GPU-seconds per namespace from the exporter's per-container counters (recorded per node).
NS_GPU_SECONDS = f"sum by (namespace) (instance_namespace:nvidia_gpu_pod_gpu_seconds:rate5m{{{NODE_NS}}})"
NS_IDLE_GPU_SECONDS = f"sum by (namespace) (instance_namespace:nvidia_gpu_pod_idle_gpu_seconds:rate5m{{{NODE_NS}}})"
NS_COUNTED = (
    " Measured, not sampled: from the exporter's per-container counters (with --kubernetes; the"
    " workloads group), which add up every sampling tick, so a GPU busy in bursts between scrapes"
    " counts for what it did. A GPU containers share is split between them (by their own SM"
    " utilization with --processes, else evenly), not counted in full for each. Idle: SM activity,"
    " or utilization without GPM, under --idle-threshold (5 %). Read from the per-node,"
    " per-namespace rules instance_namespace:nvidia_gpu_pod_gpu_seconds:rate5m and"
    " ..._idle_gpu_seconds:rate5m of deploy/prometheus/alerts.yaml (GPUs held, averaged over 5"
    " minutes), so that it stays fast on thousands of GPUs: the Node, Instance and Namespace"
    " selections apply, GPU does not."
)
HOURS_DEF = (
    " GPU-hours over the dashboard range: the count is sampled every $__interval over $__range"
    " (a subquery) and each sample weighs the step in hours: sum_over_time(count[$__range:$__interval])"
    " * $__interval_ms / 3600000."
)


# ---------------------------------------------------------------------------------------------
# 1. GPU fleet


def fleet():
    l = Layout()
    alloc_count = f"count(group by ({KEY}) ({ALLOCATED}{{{POD}}}))"
    xid = f"nvidia_gpu_xid_errors_total{{{DEV}}}"
    idle_count = f"count({SM_OR_UTIL}{{{DEV}}} < 0.05 and on ({KEY}) {ALLOCATED}{{{POD}}})"
    alloc_sum = f"sum(instance:nvidia_gpu_allocated:count{{{NODE}}})"
    idle_sum = f"sum(instance:nvidia_gpu_allocated_idle:count{{{NODE}}})"
    health = f"nvidia_gpu_health_state{{{DEV}}}"
    panels = [
        stat(l, "GPUs", "GPUs the selected exporters report (nvidia_gpu_info), lost ones included.",
             "none", f"count(nvidia_gpu_info{{{DEV}}}) or vector(0)", w=3),
        stat(l, "GPUs up", "GPUs whose last sampling tick read them (nvidia_gpu_up 1).",
             "none", f"count(nvidia_gpu_up{{{DEV}}} == 1) or vector(0)", w=3),
        stat(l, "GPUs lost",
             "GPUs the exporter can no longer read (nvidia_gpu_up 0: fell off the bus, needs a reset);"
             " the NvidiaGpuLost alert fires for them. 0 is healthy.",
             "none", f"count(nvidia_gpu_up{{{DEV}}} == 0) or vector(0)", w=3, thresholds=warn_if_above(1)),
        stat(l, "GPUs missing",
             "GPUs the nodes' PCI buses list (bound to the nvidia driver or to none) that NVML does not"
             " enumerate: GPUs the driver lost, with no index or UUID, so no other panel counts them"
             " (nvidia_node_gpus_missing, the inventory group; the NvidiaGpuMissing alert fires for"
             " them). 0 is healthy. A node whose bus cannot be read adds none." + PER_NODE,
             "none", f"sum(nvidia_node_gpus_missing{{{NODE}}}) or vector(0)", w=3,
             thresholds={"mode": "absolute", "steps": [
                 {"color": "green", "value": None}, {"color": "red", "value": 1}]}),
        stat(l, "GPUs failed",
             "GPUs whose health verdict is failed now (nvidia_gpu_health_state 2): they must not take"
             " work, and the NvidiaGpuUnhealthy alert fires for them after a minute. A lost GPU is"
             " failed too. 0 is healthy; the table of unhealthy GPUs by action below says what to do."
             + HEALTH_DEF,
             "none", f"count({health} == 2) or vector(0)", w=3, thresholds={"mode": "absolute", "steps": [
                 {"color": "green", "value": None}, {"color": "red", "value": 1}]}),
        stat(l, "GPUs degraded",
             "GPUs whose health verdict is degraded now (nvidia_gpu_health_state 1): they work with"
             " less (a slowdown, a link down) or need action soon; the NvidiaGpuDegraded alert fires"
             " for them after 15 minutes. 0 is healthy." + HEALTH_DEF,
             "none", f"count({health} == 1) or vector(0)", w=3, thresholds=warn_if_above(1)),
        stat(l, "Fleet health score",
             "The share of the selected GPUs whose health verdict is healthy (nvidia_gpu_health_state"
             " 0) among those judged: every GPU with a verdict, and every GPU a PCI bus lists that NVML"
             " does not enumerate (never healthy). A degraded GPU is not healthy. GPUs of an exporter"
             " that is down, or whose NVML does not answer, have no verdict and are not counted."
             " Recorded for the whole cluster as cluster:nvidia_gpu_healthy:ratio and per node pool as"
             " node_pool:nvidia_gpu_healthy:ratio; here from their per-node parts,"
             " instance:nvidia_gpu_healthy:sum / instance:nvidia_gpu_judged:count. Red under 90 %,"
             " orange under 99 %. docs/alerts.md, \"The fleet health score\", says how to label node"
             " pools." + HEALTH_DEF + PER_NODE,
             "percentunit",
             f"sum(instance:nvidia_gpu_healthy:sum{{{NODE}}}) / sum(instance:nvidia_gpu_judged:count{{{NODE}}})",
             w=3, thresholds={"mode": "absolute", "steps": [
                 {"color": "red", "value": None}, {"color": "orange", "value": 0.9},
                 {"color": "green", "value": 0.99}]}),
        stat(l, "GPUs allocated", "GPUs allocated now." + ALLOC_DEF, "none", f"{alloc_count} or vector(0)",
             w=3),

        panel(l, "timeseries", "Fleet utilization vs SM activity",
              "Average over the selected GPUs. Utilization: share of time at least one kernel ran."
              " SM activity: share of SMs with work; occupancy: resident warps of the maximum; tensor:"
              " tensor-core pipes busy. A wide gap between utilization and SM activity means busy but"
              " far from saturated GPUs." + UTIL_VS_SAT + PER_NODE,
              "percentunit", targets(
                  (fleet_avg("nvidia_gpu_utilization_ratio"), "utilization (a kernel ran)"),
                  (fleet_avg("nvidia_gpu_sm_active_ratio"), "SM activity"),
                  (fleet_avg("nvidia_gpu_sm_occupancy_ratio"), "SM occupancy"),
                  (fleet_avg("nvidia_gpu_tensor_active_ratio"), "tensor activity"),
              ), 12, 8),
        panel(l, "heatmap", "SM activity across GPUs",
              "How many of the selected GPUs are at each SM activity (share of SMs with work, GPM),"
              " over time: a band near 0 is GPUs doing nothing, one near 1 is saturated GPUs."
              " Utilization would put a busy-but-unsaturated GPU near 1; SM activity does not. Buckets"
              " of 0.05 (the idle threshold), named by their upper bound, counted per node by the rule"
              " instance:nvidia_gpu_sm_active_ratio:count_by_bucket." + PER_NODE,
              "percentunit", [target(
                  f"sum by (le) (instance:nvidia_gpu_sm_active_ratio:count_by_bucket{{{NODE}}})", "{{le}}")],
              12, 8),

        panel(l, "timeseries", "Allocated and idle GPUs",
              "GPUs allocated, and those of them idle, over time." + ALLOC_DEF + PER_NODE,
              "none", targets(
                  (f"{alloc_sum} or vector(0)", "allocated"),
                  (f"{idle_sum} or vector(0)", "allocated but idle"),
              ), 12, 8),
        panel(l, "timeseries", "Power draw and limit",
              "Board power drawn by the selected GPUs per instance, next to the sum of their enforced"
              " power limits." + PER_NODE,
              "watt", targets(
                  (f"sum by (instance) (instance:nvidia_gpu_power_watts:sum{{{NODE}}})", "{{instance}} draw"),
                  (f"sum by (instance) (instance:nvidia_gpu_power_limit_watts:sum{{{NODE}}})", "{{instance}} limit"),
              ), 12, 8),

        stat(l, "Allocated but idle now",
             "Allocated GPUs that are idle now (the NvidiaGpuIdleWhileAllocated condition, without"
             " its 30 minutes)." + ALLOC_DEF,
             "none", f"{idle_count} or vector(0)", h=8, thresholds=warn_if_above(1)),
        stat(l, "GPU-hours allocated but idle",
             "GPU-hours wasted over the dashboard range: allocated GPUs that were idle." + ALLOC_DEF + HOURS_DEF
             + PER_NODE,
             "suffix: GPU-h", gpu_hours(f"{idle_sum} or vector(0)"), h=8, thresholds=warn_if_above(1)),
        stat(l, "Energy over the range",
             "Energy the selected GPUs consumed over the dashboard range, in kWh: their average board"
             " power over the range (each evaluation of the rule instance:nvidia_gpu_power_watts:sum)"
             " times its length." + PER_NODE,
             "kwatth",
             f"sum(avg_over_time(instance:nvidia_gpu_power_watts:sum{{{NODE}}}[$__range])) * $__range_s / 3600000"
             " or vector(0)",
             h=8),
        stat(l, "XID events over the range",
             "XID error events (driver-reported GPU faults) during the dashboard range. A code's counter"
             " (nvidia_gpu_xid_errors_total) appears with its first event, at 1: a series that already"
             " existed before the range counts its growth (max - min), a new one its value. The XID"
             " table in docs/alerts.md says what each code means.",
             "none",
             f"sum((max_over_time({xid}[$__range]) - min_over_time({xid}[$__range])"
             f" and {xid} offset $__range) or max_over_time({xid}[$__range])) or vector(0)",
             h=8, thresholds=warn_if_above(1)),
        panel(l, "table", "Top namespaces by GPU-hours",
              "GPU-hours each namespace's pods held over the dashboard range." + NS_COUNTED + HOURS_DEF,
              "suffix: GPU-h", [target(
                  "topk(10, " + gpu_hours(NS_GPU_SECONDS) + ")", instant=True, fmt="table")], 8, 8),
        panel(l, "table", "Top namespaces by idle GPU-hours",
              "GPU-hours each namespace's pods held GPUs that were idle, over the dashboard range."
              + NS_COUNTED + HOURS_DEF,
              "suffix: GPU-h", [target(
                  "topk(10, " + gpu_hours(NS_IDLE_GPU_SECONDS) + ")", instant=True, fmt="table")], 8, 8),

        panel(l, "table", "Unhealthy GPUs by action",
              "How many GPUs ask for each action now: a GPU counts once for every action among its"
              " active health reasons (nvidia_gpu_health_reason), so a GPU with reasons asking for"
              " two actions counts in both rows and the rows can add up to more than the failed and"
              " degraded GPUs. Empty when every selected GPU is healthy. The node dashboard's GPU"
              " health table names each GPU's reasons." + HEALTH_DEF,
              "none", [target(f"count by (action) ({HEALTH_ACTIONS})", instant=True, fmt="table")],
              8, 8, transformations=renamed({"Value": "GPUs"})),
        panel(l, "table", "XID events by GPU",
              "XID codes each GPU reported, with the count since the exporter started"
              " (nvidia_gpu_xid_errors_total at its highest in the range). 48, 64, 74, 79, 95, 119 and"
              " 120 mean the GPU needs a reset or service.",
              "none", [target(
                  f"sum by (instance, gpu, xid) (max_over_time(nvidia_gpu_xid_errors_total{{{DEV}}}[$__range]))",
                  instant=True, fmt="table")], 8, 8),
        panel(l, "timeseries", "ECC errors",
              "Corrected and uncorrected ECC errors per second. Corrected errors are"
              " fixed by the hardware; uncorrected ones may have corrupted data (NvidiaGpuUncorrectableEccErrors)."
              " The rate over 5 minutes, summed over the selected nodes (instance:nvidia_gpu_ecc_errors:rate5m);"
              " the GPU node dashboard shows them per GPU." + PER_NODE,
              "short", targets(
                  (f"sum by (error_type) (instance:nvidia_gpu_ecc_errors:rate5m{{{NODE}}})", "{{error_type}}"),
              ), 24, 8),
    ]
    by_action = next(p for p in panels if p["title"] == "Unhealthy GPUs by action")
    by_action["options"]["sortBy"] = [{"displayName": "GPUs", "desc": True}]
    return dashboard(
        "nvml-gpu-fleet", "GPU fleet",
        "Every GPU nvml-exporter reports: how many are up, failed or degraded, how busy versus how"
        " saturated, which are allocated but idle and the GPU-hours that wastes, power and energy,"
        " namespaces, unhealthy GPUs by action, XID and ECC.",
        panels)


# ---------------------------------------------------------------------------------------------
# 2. GPU node / device


def per_gpu_ts(l, title, description, unit, *specs, w=12, h=8):
    return panel(l, "timeseries", title, description, unit, targets(*specs), w, h)


def node():
    l = Layout()
    g = "{{instance}} GPU {{gpu}}"
    panels = [
        panel(l, "table", "GPUs",
              "Identity of each selected GPU (nvidia_gpu_info) and whether the exporter reads it"
              " now (nvidia_gpu_up: 1 up, 0 lost).",
              "none", targets(
                  (f"max by (instance, gpu, uuid, name, pci_bus_id, driver_version, vbios_version)"
                   f" (nvidia_gpu_info{{{DEV}}})", ""),
                  (f"max by (instance, gpu, uuid) (nvidia_gpu_up{{{DEV}}})", ""),
                  instant=True, fmt="table",
              ), 24, 6, transformations=[
                  {"id": "merge", "options": {}},
                  {"id": "organize", "options": {
                      "excludeByName": {"Time": True, "Value #A": True},
                      "renameByName": {"Value #B": "up"},
                  }},
              ]),

        per_gpu_ts(l, "Utilization (a kernel ran)",
                   "Share of the sample period during which at least one kernel ran, per GPU. 100 % can"
                   " be one small kernel on a few SMs: compare SM activity." + UTIL_VS_SAT,
                   "percentunit", (f"nvidia_gpu_utilization_ratio{{{DEV}}}", g)),
        per_gpu_ts(l, "SM activity (saturation)",
                   "Share of SMs with at least one warp resident, per GPU (GPM): how much of the GPU the"
                   " work spreads over. High utilization with low SM activity is busy but unsaturated.",
                   "percentunit", (f"nvidia_gpu_sm_active_ratio{{{WHOLE}}}", g)),
        per_gpu_ts(l, "SM occupancy",
                   "Resident warps as a share of what the SMs can hold, per GPU (GPM): how fully loaded"
                   " the active SMs are.",
                   "percentunit", (f"nvidia_gpu_sm_occupancy_ratio{{{WHOLE}}}", g), w=8),
        per_gpu_ts(l, "Tensor-core activity",
                   "Share of time any tensor-core pipe was active, per GPU (GPM): high for dense matrix"
                   " math, low when the GPU is busy with little math.",
                   "percentunit", (f"nvidia_gpu_tensor_active_ratio{{{WHOLE}}}", g), w=8),
        per_gpu_ts(l, "DRAM activity",
                   "Share of time the device memory interface was busy, per GPU (GPM); near 100 % means"
                   " memory-bandwidth bound.",
                   "percentunit", (f"nvidia_gpu_dram_active_ratio{{{WHOLE}}}", g), w=8),

        per_gpu_ts(l, "Device memory used",
                   "Device memory allocated by processes, per GPU, with each GPU's total as a dashed line.",
                   "bytes",
                   (f"nvidia_gpu_memory_used_bytes{{{WHOLE}}}", g + " used"),
                   (f"nvidia_gpu_memory_total_bytes{{{WHOLE}}}", g + " total")),
        per_gpu_ts(l, "Power vs limit",
                   "Board power per GPU, and the power limit the driver enforces (dashed). Sitting at the"
                   " limit means the GPU is power-capped (see the sw_power_cap clock-event reason).",
                   "watt",
                   (f"nvidia_gpu_power_watts{{{DEV}}}", g + " draw"),
                   (f"nvidia_gpu_power_limit_watts{{{DEV}}}", g + " limit")),
        per_gpu_ts(l, "Temperature vs thresholds",
                   "GPU core and memory (HBM) temperature per GPU, with the slowdown threshold (dashed)"
                   " above which the driver slows the GPU down (the threshold needs"
                   " --collector.thermal-thresholds).",
                   "celsius",
                   (f"nvidia_gpu_temperature_celsius{{{DEV}}}", g + " core"),
                   (f"nvidia_gpu_memory_temperature_celsius{{{DEV}}}", g + " memory"),
                   (f'nvidia_gpu_temperature_threshold_celsius{{{DEV}, threshold="slowdown"}}', g + " slowdown")),
        per_gpu_ts(l, "Clocks",
                   "Current SM and memory clock per GPU. A SM clock below its maximum under load means a"
                   " clock-event reason holds it down. Needs --collector.clocks.",
                   "hertz",
                   (f'nvidia_gpu_clock_hertz{{{DEV}, clock=~"sm|memory"}}', g + " {{clock}}")),
        panel(l, "table", "Active clock-event reasons",
              "Reasons holding each GPU's clocks down now (nvidia_gpu_clock_event_active 1). gpu_idle is"
              " normal on an idle GPU; thermal or power reasons under load cost performance. Needs"
              " --collector.clock-events (by default nvidia_gpu_thermal_slowdown_active says whether a"
              " thermal slowdown holds the clocks down).",
              "none", [target(f"nvidia_gpu_clock_event_active{{{DEV}}} == 1", instant=True, fmt="table")],
              12, 8),
        per_gpu_ts(l, "Time throttled",
                   "Share of time clocks were held down, by violation policy (rate of"
                   " nvidia_gpu_throttle_seconds_total). Needs --collector.clock-events.",
                   "percentunit",
                   (f"sum by (instance, gpu, reason) (rate(nvidia_gpu_throttle_seconds_total{{{DEV}}}[$__rate_interval]))",
                    g + " {{reason}}")),

        per_gpu_ts(l, "PCIe throughput",
                   "PCIe bytes per second per GPU: transmit (GPU to host) and receive (host to GPU), over"
                   " the driver's sampling window.",
                   "Bps",
                   (f"nvidia_gpu_pcie_transmit_bytes_per_second{{{DEV}}}", g + " tx"),
                   (f"nvidia_gpu_pcie_receive_bytes_per_second{{{DEV}}}", g + " rx")),
        per_gpu_ts(l, "NVLink throughput",
                   "NVLink bytes per second per GPU over all its links (rate of the per-GPU sums of the"
                   " link counters).",
                   "Bps",
                   (f"sum by (instance, gpu) (rate(nvidia_gpu_nvlink_links_transmit_bytes_total{{{DEV}}}[$__rate_interval]))",
                    g + " tx"),
                   (f"sum by (instance, gpu) (rate(nvidia_gpu_nvlink_links_receive_bytes_total{{{DEV}}}[$__rate_interval]))",
                    g + " rx")),

        panel(l, "table", "GPU health",
              "Each GPU's health verdict now (nvidia_gpu_health_state: healthy, degraded or failed) and"
              " its active reasons (nvidia_gpu_health_reason), one row per reason with the action it"
              " asks for; a healthy GPU has one row without reason. docs/health.md lists the rules"
              " (the signal behind each reason) and what each action means." + HEALTH_DEF,
              "none", [target(
                  f"max by (instance, gpu) (nvidia_gpu_health_state{{{DEV}}})"
                  f" * on (instance, gpu) group_right ()"
                  f" max by (instance, gpu, reason, action) (nvidia_gpu_health_reason{{{DEV}}})"
                  f" or on (instance, gpu) max by (instance, gpu) (nvidia_gpu_health_state{{{DEV}}})",
                  instant=True, fmt="table")],
              24, 8, transformations=[
                  {"id": "organize", "options": {
                      "excludeByName": {"Time": True},
                      "indexByName": {"instance": 0, "gpu": 1, "Value": 2, "reason": 3, "action": 4},
                      "renameByName": {"Value": "state"},
                  }},
              ]),
        panel(l, "table", "NVLink fabric",
              "Each GPU's registration with the NVLink fabric of an NVSwitch system"
              " (nvidia_gpu_fabric_state: not started, in progress, completed, failed: completed with"
              " an error). Fabric Manager registers the GPUs after each boot; a GPU not registered"
              " within --fabric-registration-timeout (5 minutes), or whose registration failed, is"
              " failed (the fabric_* reasons of the GPU health table, whose sources the runbook names:"
              " docs/alerts.md, \"NVLink fabric and missing GPUs\"). Empty where no GPU is on a fabric.",
              "none", [target(f"max by (instance, gpu) (nvidia_gpu_fabric_state{{{DEV}}})",
                              instant=True, fmt="table")],
              12, 8, transformations=[
                  {"id": "organize", "options": {
                      "excludeByName": {"Time": True},
                      "renameByName": {"Value": "registration"},
                  }},
              ]),
        panel(l, "table", "GPUs NVML does not list",
              "GPUs the node's PCI bus lists, bound to the nvidia driver or to none, that NVML does not"
              " enumerate (nvidia_node_missing_gpu_info, the inventory group): the driver lost them."
              " By PCI address, device id and driver (empty: none bound). A GPU bound to vfio-pci or"
              " another driver on purpose is not listed. Empty when the node has none; the"
              " NvidiaGpuMissing alert says what to do.",
              "none", [target(
                  f"max by (instance, pci_bus_id, device_id, driver) (nvidia_node_missing_gpu_info{{{NODE}}})",
                  instant=True, fmt="table")],
              12, 8, transformations=[
                  {"id": "organize", "options": {"excludeByName": {"Time": True, "Value": True}}},
              ]),
        panel(l, "table", "ECC and remapped rows",
              "Per GPU: ECC errors since the driver loaded (volatile) and over the GPU's life (InfoROM),"
              " memory rows remapped, and whether a remap is pending (needs a reset) or failed (needs"
              " service). Uncorrected errors, pending or failed remaps need attention. The lifetime"
              " counts and the rows remapped need --collector.ecc-lifetime.",
              "none", targets(
                  (f"sum by (instance, gpu, error_type) (nvidia_gpu_ecc_errors_total{{{DEV}}})", ""),
                  (f"sum by (instance, gpu, error_type) (nvidia_gpu_ecc_lifetime_errors{{{DEV}}})", ""),
                  (f"sum by (instance, gpu, error_type) (nvidia_gpu_remapped_rows{{{DEV}}})", ""),
                  (f"max by (instance, gpu) (nvidia_gpu_row_remap_pending{{{DEV}}})", ""),
                  (f"max by (instance, gpu) (nvidia_gpu_row_remap_failed{{{DEV}}})", ""),
                  instant=True, fmt="table"),
              12, 8, transformations=[
                  {"id": "organize", "options": {"excludeByName": {"Time": True}}},
              ]),
        panel(l, "table", "XID events",
              "XID codes each GPU reported and how many times since the exporter started; a GPU that"
              " reported none shows 0. 48, 64, 74, 79, 95, 119 and 120 mean the GPU needs a reset or"
              " service.",
              "none", [target(
                  f"sum by (instance, gpu, xid) (max_over_time(nvidia_gpu_xid_errors_total{{{DEV}}}[$__range]))"
                  f" or on (instance, gpu) sum by (instance, gpu) (nvidia_gpu_up{{{DEV}}} * 0)",
                  instant=True, fmt="table")], 12, 8),
        panel(l, "table", "Workloads on the GPUs",
              "The containers the kubelet assigned each GPU to (nvidia_gpu_pod_info, with --kubernetes),"
              " with the device memory used on that GPU (by all its processes; each container's own"
              " share, with --processes, is in the Workloads dashboard). A GPU listed twice is shared."
              " A container holding a MIG instance is listed with the instance (gpu_instance, mig_profile)"
              " and the instance's memory.",
              "bytes", [target(
                  f"max without (namespace, pod, container) (nvidia_gpu_memory_used_bytes{{{DEV}}})"
                  f" * on ({KEY}) group_right () nvidia_gpu_pod_info{{{POD}}}",
                  instant=True, fmt="table")], 12, 8),

        panel(l, "table", "Processes",
              "Each GPU process (with --processes): the device memory it holds"
              " (nvidia_gpu_process_memory_used_bytes) and the share of the last interval it had a"
              " kernel on the SMs (nvidia_gpu_process_sm_utilization_ratio; the driver reports none on"
              " MIG), with its pod and container where the kubelet names them and its GPU instance on"
              " MIG. At most --max-processes-per-gpu per GPU, the largest by memory. Empty on nodes"
              " without --processes.",
              "bytes", targets(
                  (f"max by ({PROC_KEY}) (nvidia_gpu_process_memory_used_bytes{{{DEV}}})", ""),
                  (f"max by ({PROC_KEY}) (nvidia_gpu_process_sm_utilization_ratio{{{DEV}}})", ""),
                  instant=True, fmt="table"),
              12, 8, transformations=renamed({"Value #A": "memory used", "Value #B": "SM utilization"})),
        panel(l, "table", "MIG instances",
              "The GPU instances of each GPU in MIG mode (nvidia_gpu_mig_instance_info): profile, the MIG"
              " device UUID that CUDA_VISIBLE_DEVICES and the kubelet name it by, device memory used of"
              " the instance's total and its SM activity now (GPM of the instance). The per-GPU panels"
              " above show the whole GPU; empty where no GPU is in MIG mode.",
              "none", targets(
                  (f"max by (instance, gpu, gpu_instance, mig_profile, mig_uuid)"
                   f" (nvidia_gpu_mig_instance_info{{{DEV}}})", ""),
                  (f"max by (instance, gpu, gpu_instance, mig_profile)"
                   f" (nvidia_gpu_memory_used_bytes{{{MIG}}})", ""),
                  (f"max by (instance, gpu, gpu_instance, mig_profile)"
                   f" (nvidia_gpu_memory_total_bytes{{{MIG}}})", ""),
                  (f"max by (instance, gpu, gpu_instance, mig_profile)"
                   f" (nvidia_gpu_sm_active_ratio{{{MIG}}})", ""),
                  instant=True, fmt="table"),
              12, 8, transformations=[
                  {"id": "merge", "options": {}},
                  {"id": "organize", "options": {
                      "excludeByName": {"Time": True, "Value #A": True},
                      "renameByName": {
                          "Value #B": "memory used", "Value #C": "memory total",
                          "Value #D": "SM activity",
                      },
                  }},
              ]),
        per_gpu_ts(l, "MIG instances: SM activity",
                   "Share of each MIG instance's SMs with work (GPM of the instance), per GPU instance:"
                   " how saturated each partition is; the SM activity panel above is the whole GPU's.",
                   "percentunit",
                   (f"nvidia_gpu_sm_active_ratio{{{MIG}}}", g + " GI {{gpu_instance}} {{mig_profile}}")),
    ]
    panels[-2]["fieldConfig"]["overrides"] = [
        {"matcher": {"id": "byRegexp", "options": "memory used|memory total"},
         "properties": [{"id": "unit", "value": "bytes"}]},
        {"matcher": {"id": "byName", "options": "SM activity"},
         "properties": [{"id": "unit", "value": "percentunit"}]},
    ]
    health = next(p for p in panels if p["title"] == "GPU health")
    # The state's name in words and in colour, so that colour is never the only signal.
    health["fieldConfig"]["overrides"] = [
        {"matcher": {"id": "byName", "options": "state"}, "properties": [
            {"id": "mappings", "value": [{"type": "value", "options": {
                "0": {"text": "healthy", "color": "green", "index": 0},
                "1": {"text": "degraded", "color": "orange", "index": 1},
                "2": {"text": "failed", "color": "red", "index": 2},
            }}]},
            {"id": "custom.cellOptions", "value": {"type": "color-background", "mode": "basic"}},
        ]},
    ]
    health["options"]["sortBy"] = [{"displayName": "state", "desc": True}]
    fabric = next(p for p in panels if p["title"] == "NVLink fabric")
    fabric["fieldConfig"]["overrides"] = [
        {"matcher": {"id": "byName", "options": "registration"}, "properties": [
            {"id": "mappings", "value": [{"type": "value", "options": {
                "1": {"text": "not started", "color": "orange", "index": 0},
                "2": {"text": "in progress", "color": "orange", "index": 1},
                "3": {"text": "completed", "color": "green", "index": 2},
                "4": {"text": "failed", "color": "red", "index": 3},
            }}]},
            {"id": "custom.cellOptions", "value": {"type": "color-background", "mode": "basic"}},
        ]},
    ]
    processes = next(p for p in panels if p["title"] == "Processes")
    processes["fieldConfig"]["overrides"] = [
        {"matcher": {"id": "byName", "options": "SM utilization"},
         "properties": [{"id": "unit", "value": "percentunit"}]},
    ]
    # Limits and thresholds are drawn dashed.
    for p in panels:
        for t in p["targets"]:
            legend = t.get("legendFormat", "")
            if legend.endswith((" limit", " total", " slowdown")):
                p["fieldConfig"]["overrides"].append({
                    "matcher": {"id": "byRegexp", "options": ".* (limit|total|slowdown)$"},
                    "properties": [{"id": "custom.lineStyle", "value": {"dash": [10, 10], "fill": "dash"}}],
                })
                break
    return dashboard(
        "nvml-gpu-node", "GPU node / device",
        "Per GPU on the selected nodes: utilization next to saturation (SM activity, occupancy, tensor,"
        " DRAM), memory, power, temperature, clocks and their throttling reasons, PCIe and NVLink,"
        " ECC and row remapping, XIDs and the workloads on each GPU.",
        panels)


# ---------------------------------------------------------------------------------------------
# 3. Workloads


def workloads():
    l = Layout()
    np = "{{namespace}}/{{pod}}"
    idle_pods = f"({pod_gpus(POD)} and on ({KEY}) {SM_OR_UTIL}{{{DEV}}} < 0.05)"
    held = f"sum by (namespace, pod) (pod:nvidia_gpu_held:count{{{NODE_NS}}})"
    held_idle = f"sum by (namespace, pod) (pod:nvidia_gpu_held_idle:count{{{NODE_NS}}})"

    def pod_avg(metric):
        return f"avg by (namespace, pod) (pod:{metric}:avg{{{NODE_NS}}})"
    seam = (
        " A GPU shared by several pods shows the whole GPU's value for each of them: the exporter"
        " reads the device, not the share of each container (the memory and SM utilization panels"
        " use each pod's own share where --processes gives it). A pod holding a MIG instance gets"
        " the instance's own reading (GPM of the instance), not the GPU's."
    )
    panels = [
        stat(l, "Pods holding GPUs", "Pods the kubelet assigned at least one GPU to (nvidia_gpu_pod_info).",
             "none", f"count(count by (namespace, pod) (nvidia_gpu_pod_info{{{POD}}})) or vector(0)", w=6),
        stat(l, "GPUs held", "GPUs assigned to at least one of the selected pods.",
             "none", f"count(group by ({KEY}) (nvidia_gpu_pod_info{{{POD}}})) or vector(0)", w=6),
        stat(l, "Shared GPUs", "GPUs assigned to more than one container (time-slicing or MPS sharing).",
             "none", f"count(count by ({KEY}) (nvidia_gpu_pod_info{{{POD}}}) > 1) or vector(0)", w=6),
        stat(l, "Held GPUs idle now",
             "GPUs held by the selected pods whose SM activity (utilization without GPM) is under 5 %:"
             " the NvidiaGpuIdleWhileAllocated condition without its 30 minutes.",
             "none", f"count(group by ({KEY}) {idle_pods}) or vector(0)", w=6,
             thresholds=warn_if_above(1)),

        panel(l, "table", "Pods: GPUs, GPU-hours and idle GPU-hours",
              "Per pod: GPUs held now, GPU-hours held over the dashboard range, the GPU-hours of those"
              " that were idle (SM activity, or utilization without GPM, under 5 %; 0 for a pod that"
              " never idled) and its GPUs' average SM activity over the range." + HOURS_DEF
              + " All but the first column read the per-pod recording rules of"
              " deploy/prometheus/alerts.yaml (pod:...): the GPU selection does not narrow them.",
              "none", targets(
                  (f"count by (namespace, pod) ({pod_gpus(POD)})", ""),
                  (gpu_hours(held), ""),
                  (gpu_hours(held_idle) + f" or on (namespace, pod) ({held} * 0)", ""),
                  (f"avg_over_time(({pod_avg('nvidia_gpu_sm_active_ratio')})[$__range:$__interval])", ""),
                  instant=True, fmt="table"),
              24, 8, transformations=renamed({
                  "Value #A": "GPUs now", "Value #B": "GPU-hours",
                  "Value #C": "idle GPU-hours", "Value #D": "avg SM activity",
              })),

        panel(l, "timeseries", "GPUs held per namespace",
              "GPUs assigned to each namespace's pods over time (a GPU shared across namespaces counts"
              " for each)." + NS_PER_NODE,
              "none", targets((f"sum by (namespace) (instance_namespace:nvidia_gpu_held:count{{{NODE_NS}}})",
                               "{{namespace}}")),
              12, 8),
        panel(l, "timeseries", "Idle GPUs per pod",
              "GPUs each pod holds that are idle (SM activity, or utilization without GPM, under 5 %);"
              " 0 while they work." + POD_RULES,
              "none", targets((f"{held_idle} or on (namespace, pod) ({held} * 0)", np)),
              12, 8),

        panel(l, "timeseries", "Utilization vs SM activity per pod",
              "Average over each pod's GPUs. Utilization: share of time a kernel of the pod ran;"
              " SM activity: share of SMs with work (GPM), the whole GPU's." + UTIL_VS_SAT
              + pod_usage_doc("nvidia_gpu_pod_sm_utilization_ratio", "nvidia_gpu_utilization_ratio",
                              "pod:nvidia_gpu_pod_sm_utilization_ratio:avg_or_utilization")
              + " SM activity has no per-pod breakdown: a shared GPU's is counted for each of its pods;"
              " it is read from the per-pod rule pod:nvidia_gpu_sm_active_ratio:avg of"
              " deploy/prometheus/alerts.yaml, which the GPU selection does not narrow.",
              "percentunit", targets(
                  (f"avg by (namespace, pod) (pod:nvidia_gpu_pod_sm_utilization_ratio:avg_or_utilization"
                   f"{{{NODE_NS}}})", np + " utilization"),
                  (pod_avg("nvidia_gpu_sm_active_ratio"), np + " SM activity"),
              ), 12, 8),
        panel(l, "timeseries", "Tensor and DRAM activity per pod",
              "Average over each pod's GPUs: tensor-core pipes busy (dense math) and device memory"
              " interface busy (bandwidth bound), GPM." + seam + POD_RULES,
              "percentunit", targets(
                  (pod_avg("nvidia_gpu_tensor_active_ratio"), np + " tensor"),
                  (pod_avg("nvidia_gpu_dram_active_ratio"), np + " DRAM"),
              ), 12, 8),
        panel(l, "timeseries", "Device memory per pod",
              "Device memory each pod uses, summed over the GPUs it holds."
              + pod_usage_doc("nvidia_gpu_pod_memory_used_bytes", "nvidia_gpu_memory_used_bytes",
                              "pod:nvidia_gpu_pod_memory_used_bytes:sum_or_memory_used"),
              "bytes", targets((f"sum by (namespace, pod) (pod:nvidia_gpu_pod_memory_used_bytes:sum_or_memory_used"
                                f"{{{NODE_NS}}})", np)), 12, 8),
        panel(l, "timeseries", "Power per namespace",
              "Board power of the GPUs each namespace's pods hold." + seam
              + " Pods holding a MIG instance count nothing here: NVML reads power for the whole board"
              " only, and giving each instance's pod the board's power would count it once per instance."
              + NS_PER_NODE,
              "watt", targets((f"sum by (namespace) (instance_namespace:nvidia_gpu_power_watts:sum{{{NODE_NS}}})",
                               "{{namespace}}")), 12, 8),
    ]
    # Workloads: the pods grouped by their controller and by their queue. Both read the per-pod
    # rules, whose series keep every label of nvidia_gpu_pod_info but the GPU's and the
    # container: the controller and the copied pod labels and annotations come along.
    owner = "namespace, controller_kind, controller_name"
    queue = f"{KUEUE_QUEUE}, {VOLCANO_QUEUE}"

    def by_owner(rule):
        return f"sum by ({owner}) ({rule}{{{NODE_NS}}})"

    def by_queue(rule):
        return f"sum by ({queue}) ({rule}{{{NODE_NS}}})"
    held_rule, idle_rule = "pod:nvidia_gpu_held:count", "pod:nvidia_gpu_held_idle:count"
    panels += [
        panel(l, "table", "Workloads: GPUs and GPU-hours by controller",
              "Per controller of the pods holding GPUs (controller_kind, controller_name: a"
              " Deployment for its ReplicaSet, a StatefulSet, a Job, a RayCluster, ...): pods and"
              " GPUs held now, GPU-hours held over the range and those idle (SM activity, or"
              " utilization without GPM, under 5 %)." + HOURS_DEF + OWNER_NEEDS + POD_RULES,
              "none", targets(
                  (f"count by ({owner}) (group by ({owner}, pod) ({held_rule}{{{NODE_NS}}}))", ""),
                  (by_owner(held_rule), ""),
                  (gpu_hours(by_owner(held_rule)), ""),
                  (gpu_hours(by_owner(idle_rule)) + f" or on ({owner}) ({by_owner(held_rule)} * 0)", ""),
                  instant=True, fmt="table"),
              12, 8, transformations=renamed({
                  "controller_kind": "kind", "controller_name": "controller",
                  "Value #A": "pods", "Value #B": "GPUs now",
                  "Value #C": "GPU-hours", "Value #D": "idle GPU-hours",
              })),
        panel(l, "timeseries", "GPUs held per controller",
              "GPUs held by each controller's pods over time." + OWNER_NEEDS + POD_RULES,
              "none", targets((by_owner(held_rule),
                               "{{namespace}}/{{controller_kind}}/{{controller_name}}")),
              12, 8),
        panel(l, "table", "Queues: GPUs and GPU-hours by queue",
              "Per scheduler queue of the pods holding GPUs: GPUs held now, GPU-hours held over the"
              " range and those idle." + HOURS_DEF + QUEUE_NEEDS + POD_RULES,
              "none", targets(
                  (by_queue(held_rule), ""),
                  (gpu_hours(by_queue(held_rule)), ""),
                  (gpu_hours(by_queue(idle_rule)) + f" or on ({queue}) ({by_queue(held_rule)} * 0)", ""),
                  instant=True, fmt="table"),
              12, 8, transformations=renamed({
                  KUEUE_QUEUE: "Kueue queue", VOLCANO_QUEUE: "Volcano queue",
                  "Value #A": "GPUs now", "Value #B": "GPU-hours", "Value #C": "idle GPU-hours",
              })),
        panel(l, "timeseries", "GPUs held and idle per queue",
              "GPUs held by each queue's pods over time, and those of them idle." + QUEUE_NEEDS
              + POD_RULES,
              "none", targets(
                  (by_queue(held_rule), "{{%s}}{{%s}} held" % (KUEUE_QUEUE, VOLCANO_QUEUE)),
                  (by_queue(idle_rule), "{{%s}}{{%s}} idle" % (KUEUE_QUEUE, VOLCANO_QUEUE)),
              ), 12, 8),
    ]
    # The tables mix counts, GPU-hours and a ratio: a unit per column.
    for table in (panels[-4], panels[-2]):
        table["fieldConfig"]["overrides"] = [
            {"matcher": {"id": "byRegexp", "options": "GPU-hours|idle GPU-hours"},
             "properties": [{"id": "unit", "value": "suffix: GPU-h"}, {"id": "decimals", "value": 2}]},
        ]
    # The pods table mixes counts, GPU-hours and a ratio: a unit per column.
    panels[4]["fieldConfig"]["overrides"] = [
        {"matcher": {"id": "byRegexp", "options": "GPU-hours|idle GPU-hours"},
         "properties": [{"id": "unit", "value": "suffix: GPU-h"}, {"id": "decimals", "value": 2}]},
        {"matcher": {"id": "byName", "options": "avg SM activity"},
         "properties": [{"id": "unit", "value": "percentunit"}]},
    ]
    return dashboard(
        "nvml-workloads", "GPU workloads",
        "Per namespace and pod (nvml-exporter with --kubernetes): GPUs held, how saturated they are,"
        " device memory, power and idle GPU-hours; then per controller (Deployment, Job, ...) and"
        " per scheduler queue (Kueue, Volcano).",
        panels)


# ---------------------------------------------------------------------------------------------
# 4. Waste

# The smallest MIG profile whose memory holds a peak, on the 80 GB A100 and H100 (the profile
# names of NVIDIA's MIG user guide, the same on both): by memory alone, so of two profiles with
# the same memory the one with fewer compute slices (1g.20gb before 2g.20gb, 3g.40gb before
# 4g.40gb). Each size is the profile's memory as `nvidia-smi mig -lgip` lists it, the smaller of
# the two models' (A100 80GB: 9.50, 19.50, 39.25 and 79.25 GiB; H100 80GB has 9.75, 19.62, 39.50
# and 79.25), so a peak that fits says the same on either. In MiB, as nvml-sim/src/mig.rs has them.
MIG_80GB_PROFILES = [("1g.10gb", 9728), ("1g.20gb", 19968), ("3g.40gb", 40192), ("7g.80gb", 81152)]


def mig_profile_mappings():
    """Grafana value mappings by range (bytes) to each profile's name. Both ends of a range match
    and the first mapping that matches wins, so a peak of exactly a profile's size gets it."""
    mappings, low = [], 0
    for i, (name, mib) in enumerate(MIG_80GB_PROFILES):
        high = mib * 2**20
        mappings.append({"type": "range", "options": {
            "from": low, "to": high, "result": {"text": name, "index": i}}})
        low = high
    # An upper bound far past any GPU's memory (1 PiB): Grafana's editor rewrites a missing one as 0.
    mappings.append({"type": "range", "options": {
        "from": low, "to": 2**50, "result": {"text": "none: more than a whole GPU", "index": len(mappings)}}})
    return mappings


FUNNEL_DEF = (
    " The funnel: GPUs present (up or lost) → allocated → active (allocated and not idle: SM"
    " activity, or utilization where the GPU has no GPM, at least 5 %) → saturated (allocated with"
    " SM activity at least 0.5, half of the SMs with work; GPM only, so a GPU without GPM, Ampere"
    " and older or Ada, is never counted saturated). Present counts physical GPUs, a GPU in MIG"
    " mode once; the later steps count allocations, each MIG instance as one, so on MIG nodes"
    " they can exceed the GPUs present."
)
IDLE_SAMPLED = (
    " Idle is judged by the rules once a minute from the SM activity (utilization without GPM) of"
    " the latest scrape, a gauge that covers only the exporter's last sampling interval: work in"
    " the rest of the minute is not seen, so a GPU busy in bursts counts as idle or as busy by"
    " chance. These are samples, not measured GPU-seconds."
)


def waste():
    l = Layout()
    # Summed before they are added: one series per step to match, not one per node.
    present = f"(sum(instance:nvidia_gpu_up:sum{{{NODE}}}) + sum(instance:nvidia_gpu_lost:sum{{{NODE}}}))"
    allocated = f"sum(instance:nvidia_gpu_allocated:count{{{NODE}}})"
    active = f"({allocated} - sum(instance:nvidia_gpu_allocated_idle:count{{{NODE}}}))"
    saturated = f"sum(instance:nvidia_gpu_allocated_saturated:count{{{NODE}}})"
    funnel = [
        (present, "present"), (allocated, "allocated"), (active, "active"), (saturated, "saturated"),
    ]
    now_doc = " As of the rules' last evaluation (every two minutes)." + FUNNEL_DEF + PER_NODE

    ns_held, ns_idle = NS_GPU_SECONDS, NS_IDLE_GPU_SECONDS
    ns_idle_hours = f"{gpu_hours(ns_idle)} or on (namespace) ({gpu_hours(ns_held)} * 0)"

    pod = "namespace, pod"
    partial = f"sum by ({pod}) (pod:nvidia_gpu_partially_idle:count{{{NODE_NS}}})"
    top_partial = f"topk(10, {gpu_hours(partial)})"

    def pod_max(rule):
        return f"max by ({pod}) (max_over_time({rule}{{{NODE_NS}}}[$__range]))"
    peak_memory = pod_max("pod:nvidia_gpu_pod_memory_used_bytes:sum_or_memory_used")

    outside_key = "node, instance, gpu, uuid"
    outside = f"max by ({outside_key}) (nvidia_gpu_memory_outside_allocation_bytes{{{DEV}}})"
    outside_peak = (f"topk(20, max by ({outside_key})"
                    f" (max_over_time(nvidia_gpu_memory_outside_allocation_bytes{{{DEV}}}[$__range])))")

    panels = [
        stat(l, "GPUs present", "GPUs the selected exporters report, up or lost: the funnel's first"
             " step." + now_doc, "none", f"{present} or vector(0)", w=6),
        stat(l, "GPUs allocated", "GPUs (or MIG instances) allocated: the funnel's second step."
             + ALLOC_DEF + now_doc, "none", f"{allocated} or vector(0)", w=6),
        stat(l, "GPUs active", "Allocated GPUs (or MIG instances) that are not idle: SM activity, or"
             " utilization where the GPU has no GPM, at least 5 % (allocated minus"
             " instance:nvidia_gpu_allocated_idle:count)." + now_doc, "none", f"{active} or vector(0)", w=6),
        stat(l, "GPUs saturated", "Allocated GPUs (or MIG instances) whose SM activity is at least"
             " 0.5 (the rule instance:nvidia_gpu_allocated_saturated:count). GPUs without GPM have no"
             " SM activity and never count here." + now_doc, "none", f"{saturated} or vector(0)", w=6),

        panel(l, "timeseries", "Funnel over time",
              "The four steps of the funnel over the dashboard range: the gap between two lines is"
              " what drops out at that step." + FUNNEL_DEF + PER_NODE,
              "none", targets(*[(f"{e} or vector(0)", legend) for e, legend in funnel]), 16, 8),
        panel(l, "stat", "Funnel in GPU-hours over the range",
              "GPU-hours of each step of the funnel over the dashboard range: present, allocated,"
              " active, saturated." + FUNNEL_DEF + HOURS_DEF + PER_NODE,
              "suffix: GPU-h",
              targets(*[(gpu_hours(f"{e} or vector(0)"), legend) for e, legend in funnel], instant=True),
              8, 8),

        panel(l, "table", "Idle GPU-hours by namespace",
              "Per namespace over the dashboard range: GPU-hours its pods held, those of them idle"
              " and the idle share." + NS_COUNTED + HOURS_DEF,
              "none", targets(
                  (gpu_hours(ns_held), ""),
                  (ns_idle_hours, ""),
                  (f"({ns_idle_hours}) / ({gpu_hours(ns_held)})", ""),
                  instant=True, fmt="table"),
              12, 8, transformations=renamed({
                  "Value #A": "GPU-hours", "Value #B": "idle GPU-hours", "Value #C": "idle share",
              })),
        panel(l, "table", "Top partially idle workloads",
              "Pods that hold two or more GPUs (or MIG instances) and left some idle while they used"
              " the others (pod:nvidia_gpu_partially_idle:count, the NvidiaGpuWorkloadPartiallyIdle"
              " condition without its 30 minutes): the ten with the most GPU-hours left idle that way"
              " over the range, the most GPUs they held and the most left idle at once. A pod whose"
              " GPUs are all idle is not here (NvidiaGpuIdleWhileAllocated covers it)."
              + IDLE_SAMPLED + HOURS_DEF + POD_RULES,
              "none", targets(
                  (f"{pod_max('pod:nvidia_gpu_held:count')} and on ({pod}) {top_partial}", ""),
                  (f"{pod_max('pod:nvidia_gpu_partially_idle:count')} and on ({pod}) {top_partial}", ""),
                  (top_partial, ""),
                  instant=True, fmt="table"),
              12, 8, transformations=renamed({
                  "Value #A": "GPUs held", "Value #B": "most idle at once",
                  "Value #C": "idle GPU-hours while partially idle",
              })),

        panel(l, "table", "Right-sizing per workload",
              "Per pod over the dashboard range: the most GPUs (or MIG instances) it held at once, the"
              " GPU-hours it held, its mean SM activity (the average over its GPUs, a shared GPU's"
              " whole value; empty on GPUs without GPM), its peak device memory (summed over its GPUs:"
              " its own where --processes gives per-pod usage, else the memory used on the GPUs or MIG"
              " instances it holds) and the smallest MIG profile whose memory would hold that peak."
              " The profile column is valid for the 80 GB A100 and H100 only (profiles 1g.10gb,"
              " 1g.20gb, 3g.40gb, 7g.80gb, sized as nvidia-smi mig -lgip lists them for the A100 80GB,"
              " the smaller of the two): it weighs memory alone, so a pod that needs more compute"
              " than one or three slices needs 2g.20gb or 4g.40gb instead, and for a pod holding"
              " several GPUs it says whether all its memory would fit in one instance. Mean and peak"
              " are over the rules' evaluations (every two minutes): a peak shorter than that can be"
              " missed." + HOURS_DEF + POD_RULES,
              "none", targets(
                  (pod_max("pod:nvidia_gpu_held:count"), ""),
                  (gpu_hours(f"sum by ({pod}) (pod:nvidia_gpu_held:count{{{NODE_NS}}})"), ""),
                  (f"avg by ({pod}) (avg_over_time(pod:nvidia_gpu_sm_active_ratio:avg{{{NODE_NS}}}[$__range]))", ""),
                  (peak_memory, ""),
                  (peak_memory, ""),
                  instant=True, fmt="table"),
              24, 10, transformations=renamed({
                  "Value #A": "GPUs held", "Value #B": "GPU-hours", "Value #C": "mean SM activity",
                  "Value #D": "peak memory", "Value #E": "smallest MIG profile (A100/H100 80GB)",
              })),

        panel(l, "table", "Memory held outside allocations",
              "Device memory on each GPU held by processes of no pod the GPU (or their MIG instance)"
              " is assigned to: host processes, leftovers of ended pods, pods that see the GPU"
              " without requesting it (nvidia_gpu_memory_outside_allocation_bytes). Served only by"
              " exporters run with --processes and --kubernetes (deploy/kubernetes/processes; a"
              " process whose cgroup cannot be read counts for nobody); other nodes have no rows."
              " The 20 GPUs with the highest"
              " peak over the range, and their value now; the NvidiaGpuMemoryOutsideAllocation alert"
              " fires above 1 GiB for 15 minutes. An instant query over the range: each GPU's series"
              " is read once, not at every step.",
              "bytes", targets(
                  (f"{outside} and on ({outside_key}) {outside_peak}", ""),
                  (outside_peak, ""),
                  instant=True, fmt="table"),
              24, 8, transformations=renamed({"Value #A": "now", "Value #B": "peak over the range"})),
    ]
    by_title = {p["title"]: p for p in panels}
    hours = {"id": "unit", "value": "suffix: GPU-h"}
    by_title["Idle GPU-hours by namespace"]["fieldConfig"]["overrides"] = [
        {"matcher": {"id": "byRegexp", "options": "GPU-hours|idle GPU-hours"},
         "properties": [hours, {"id": "decimals", "value": 2}]},
        {"matcher": {"id": "byName", "options": "idle share"},
         "properties": [{"id": "unit", "value": "percentunit"}]},
    ]
    by_title["Idle GPU-hours by namespace"]["options"]["sortBy"] = [
        {"displayName": "idle GPU-hours", "desc": True}]
    by_title["Top partially idle workloads"]["fieldConfig"]["overrides"] = [
        {"matcher": {"id": "byName", "options": "idle GPU-hours while partially idle"},
         "properties": [hours, {"id": "decimals", "value": 2}]},
    ]
    by_title["Top partially idle workloads"]["options"]["sortBy"] = [
        {"displayName": "idle GPU-hours while partially idle", "desc": True}]
    right_sizing = by_title["Right-sizing per workload"]
    right_sizing["fieldConfig"]["overrides"] = [
        {"matcher": {"id": "byName", "options": "GPU-hours"},
         "properties": [hours, {"id": "decimals", "value": 2}]},
        {"matcher": {"id": "byName", "options": "mean SM activity"},
         "properties": [{"id": "unit", "value": "percentunit"}]},
        {"matcher": {"id": "byName", "options": "peak memory"},
         "properties": [{"id": "unit", "value": "bytes"}]},
        {"matcher": {"id": "byName", "options": "smallest MIG profile (A100/H100 80GB)"},
         "properties": [{"id": "mappings", "value": mig_profile_mappings()}]},
    ]
    right_sizing["options"]["sortBy"] = [{"displayName": "GPU-hours", "desc": True}]
    by_title["Memory held outside allocations"]["options"]["sortBy"] = [
        {"displayName": "peak over the range", "desc": True}]
    return dashboard(
        "nvml-waste", "GPU waste",
        "Where GPUs are paid for and doing little, and whose they are: the fleet funnel (present,"
        " allocated, active, saturated), idle GPU-hours per namespace, pods that leave some of their"
        " GPUs idle, memory held outside allocations and a right-sizing table per pod.",
        panels)


DASHBOARDS = {
    "gpu-fleet.json": fleet, "gpu-node.json": node, "workloads.json": workloads, "waste.json": waste,
}


def render(build):
    return json.dumps(build(), indent=2) + "\n"


def main():
    check = sys.argv[1:] == ["--check"]
    if sys.argv[1:] not in ([], ["--check"]):
        sys.exit(__doc__)
    stale = []
    for name, build in DASHBOARDS.items():
        path, text = OUT / name, render(build)
        if check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
    if stale:
        print(f"out of date (run scripts/gen-dashboards.py): {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
