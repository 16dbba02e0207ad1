#!/usr/bin/env python3
"""Queries a live Prometheus that scrapes the demo exporter (default scenario, h100x8) and checks
that each alert of alerts.yaml selects exactly the GPUs the scenario says it should. With
--mig-job / --mig-kubernetes-job it also checks exporters running h100-mig.toml (GPU 0 in MIG
mode), without and with a kubelet assigning MIG devices: every rule must evaluate without error
(a join that meets a GPU's series next to its instances' fails), and each alert and fleet rule
must select the MIG instances the scenario implies.

Run by scripts/e2e-prometheus.sh, which starts the exporter and Prometheus. Each alert's `expr` is
read from the rules file and evaluated as an instant query, without its `for`: the question is
which GPUs the condition selects now, not whether it has held for 30 minutes.
"""

import argparse
import json
import os
import signal
import sys
import time
import urllib.parse
import urllib.request

import yaml

# What the default scenario (nvml-sim/scenarios/h100x8.toml) implies for each alert, as the set of
# `gpu` labels the expression returns. The run starts the simulated clock at 25 s so that GPU 6's
# XID 79 (t = 30 s) arrives during the run.
EXPECTED = {
    # GPU 1: utilization ~1 with SM activity ~0.15 (busy, not saturated).
    "NvidiaGpuLowSaturation": {"1"},
    # GPU 7: a process holds 20 GiB, SM activity 0. GPU 0 is idle too but holds no memory.
    "NvidiaGpuIdleWhileAllocated": {"7"},
    "NvidiaGpuXidError": {"6"},
    # The verdict: GPU 6 failed by its XID 79 (reboot_node), GPU 5 degraded by its thermal slowdown.
    "NvidiaGpuUnhealthy": {"6"},
    "NvidiaGpuDegraded": {"5"},
    "NvidiaGpuLost": set(),
    # The machine's own PCI bus has no GPU that NVML (the simulator) lacks.
    "NvidiaGpuMissing": set(),
    # GPU 5: hot, SW thermal slowdown active.
    "NvidiaGpuThermalThrottling": {"5"},
    "NvidiaGpuUncorrectableEccErrors": set(),
    "NvidiaGpuRowRemapFailure": set(),
    "NvmlExporterDown": set(),
    "NvmlExporterStale": set(),
    "NvmlExporterConfigReloadFailed": set(),
    # No pods on this node (alerts.test.yaml has a pod holding 4 GPUs and using 1).
    "NvidiaGpuWorkloadPartiallyIdle": set(),
    # Needs --processes with --kubernetes (alerts.test.yaml has the firing case).
    "NvidiaGpuMemoryOutsideAllocation": set(),
}

# Fleet recording rules over the eight GPUs: all up, GPUs 1-7 hold memory (allocated), GPU 7 idle.
EXPECTED_FLEET = {
    "cluster:nvidia_gpu_up:sum": 8,
    "cluster:nvidia_gpu_lost:sum": 0,
    "cluster:nvidia_gpu_allocated:sum": 7,
    "cluster:nvidia_gpu_allocated_idle:sum": 1,
}


# h100-mig.toml from t = 10 s (before its reconfiguration at 60 s): GPU 0 in MIG mode with GI 2
# (3g.40gb, busy, 30 GiB), GI 3 (2g.20gb, inference, 12 GiB), GI 9 (1g.10gb, idle, 2 GiB held) and
# GI 10 (1g.10gb, bursty, SM activity never under 10 %, 2 GiB); GPU 1 whole, busy, 40 GiB. Devices
# are "GPU" or "GPU/GI". GI 9 is the only idle allocation in both runs. Without Kubernetes every
# instance and GPU 1 hold over 1 GiB: 5 allocated, GPU 0 itself not (its memory is its instances').
# With the kubelet of e2e-prometheus.sh (GI 2, GI 9 and GPU 1 assigned): 3.
EXPECTED_MIG = {
    "NvidiaGpuLowSaturation": set(),  # no utilization in MIG mode; GPU 1 is at 60 %
    "NvidiaGpuIdleWhileAllocated": {"0/9"},
    "NvidiaGpuXidError": set(),
    "NvidiaGpuUnhealthy": set(),  # both GPUs healthy until the reconfiguration at 60 s
    "NvidiaGpuDegraded": set(),
    "NvidiaGpuLost": set(),
    "NvidiaGpuMissing": set(),
    "NvidiaGpuThermalThrottling": set(),
    "NvidiaGpuUncorrectableEccErrors": set(),
    "NvidiaGpuRowRemapFailure": set(),
    "NvmlExporterDown": set(),
    "NvmlExporterStale": set(),
    "NvmlExporterConfigReloadFailed": set(),
    # Each pod of the Kubernetes run holds one device.
    "NvidiaGpuWorkloadPartiallyIdle": set(),
    "NvidiaGpuMemoryOutsideAllocation": set(),
}
EXPECTED_MIG_FLEET = {
    "instance:nvidia_gpu_up:sum": 2,
    "instance:nvidia_gpu_lost:sum": 0,
    "instance:nvidia_gpu_allocated:count": 5,
    "instance:nvidia_gpu_allocated_idle:count": 1,
    # Both GPUs have a verdict; none is missing from NVML.
    "instance:nvidia_gpu_judged:count": 2,
}
EXPECTED_MIG_KUBERNETES_FLEET = EXPECTED_MIG_FLEET | {"instance:nvidia_gpu_allocated:count": 3}
# The per-exporter rule each cluster-wide sum adds up.
CLUSTER_OF = {
    "cluster:nvidia_gpu_up:sum": "instance:nvidia_gpu_up:sum",
    "cluster:nvidia_gpu_lost:sum": "instance:nvidia_gpu_lost:sum",
    "cluster:nvidia_gpu_allocated:sum": "instance:nvidia_gpu_allocated:count",
    "cluster:nvidia_gpu_allocated_idle:sum": "instance:nvidia_gpu_allocated_idle:count",
}


class Prometheus:
    """The few HTTP API calls the check needs."""

    def __init__(self, base):
        self.base = base.rstrip("/")

    def get(self, path, **params):
        url = self.base + path
        if params:
            url += "?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read()

    def query(self, expr):
        """Instant query; returns the result vector (list of {metric, value})."""
        _, body = self.get("/api/v1/query", query=expr)
        answer = json.loads(body)
        if answer.get("status") != "success":
            raise RuntimeError(f"query failed: {answer}")
        if answer["data"]["resultType"] != "vector":
            raise RuntimeError(f"expected a vector from {expr!r}: {answer['data']}")
        return answer["data"]["result"]

    def ready(self):
        try:
            status, _ = self.get("/-/ready")
            return status == 200
        except OSError:
            return False


def wait_for(what, predicate, timeout):
    """Polls predicate() every 0.5 s until it is true; fails the run after timeout seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.5)
    sys.exit(f"FAIL: timed out after {timeout} s waiting for {what}")


def alerts(rules_path):
    """(name, expr) of every alerting rule in the rules file, in file order."""
    with open(rules_path) as f:
        doc = yaml.safe_load(f)
    return [
        (rule["alert"], rule["expr"])
        for group in doc["groups"]
        for rule in group["rules"]
        if "alert" in rule
    ]


def gpu_set(result):
    """The devices of a query result: the `gpu` label, "GPU/GI" for a MIG instance's series; a
    series without a gpu counts as "<no gpu>"."""
    def device(labels):
        gpu = labels.get("gpu", "<no gpu>")
        return f"{gpu}/{labels['gpu_instance']}" if labels.get("gpu_instance") else gpu
    return {device(series["metric"]) for series in result}


def of_job(result, job):
    """The series of one scrape job."""
    return [series for series in result if series["metric"].get("job") == job]


def show(gpus):
    return "{" + ", ".join(sorted(gpus)) + "}"


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--prometheus", required=True, help="base URL, e.g. http://127.0.0.1:9090")
    parser.add_argument("--rules", required=True, help="path to alerts.yaml")
    parser.add_argument("--job", required=True, help="the exporter's scrape job name")
    parser.add_argument("--exporter-pid", type=int, required=True,
                        help="stopped at the end to check that NvmlExporterDown selects the target")
    parser.add_argument("--mig-job", help="job of an exporter running h100-mig.toml")
    parser.add_argument("--mig-kubernetes-job",
                        help="job of an exporter running h100-mig.toml with --kubernetes")
    parser.add_argument("--data-seconds", type=int, default=20,
                        help="scrapes (at 1 s) to collect before querying")
    args = parser.parse_args()

    prom = Prometheus(args.prometheus)
    wait_for("Prometheus to be ready", prom.ready, 60)

    jobs = [j for j in (args.job, args.mig_job, args.mig_kubernetes_job) if j]
    samples = "count_over_time(nvml_exporter_gpus[5m])"

    def enough_data():
        counts = {s["metric"].get("job"): float(s["value"][1]) for s in prom.query(samples)}
        return all(counts.get(j, 0) >= args.data_seconds for j in jobs)

    wait_for(f"{args.data_seconds} s of scraped data", enough_data, args.data_seconds + 60)

    failures = 0

    def check(name, ok, detail):
        nonlocal failures
        print(f"{'PASS' if ok else 'FAIL'}  {name}: {detail}")
        failures += 0 if ok else 1

    # Every rule evaluates without error (a join that matched many-to-many would show up here).
    _, body = prom.get("/api/v1/rules")
    broken = [
        f"{rule['name']}: {rule.get('lastError')}"
        for group in json.loads(body)["data"]["groups"]
        for rule in group["rules"]
        if rule.get("health") != "ok"
    ]
    check("rule health", not broken, "; ".join(broken) or "every rule evaluated without error")

    runs = [(args.job, EXPECTED, None)]
    if args.mig_job:
        runs.append((args.mig_job, EXPECTED_MIG, EXPECTED_MIG_FLEET))
    if args.mig_kubernetes_job:
        runs.append((args.mig_kubernetes_job, EXPECTED_MIG, EXPECTED_MIG_KUBERNETES_FLEET))
    for job, expected, fleet in runs:
        names = []
        for name, expr in alerts(args.rules):
            names.append(name)
            if name not in expected:
                check(f"{job}: {name}", False, "no expectation for this alert in check_alerts.py")
                continue
            got = gpu_set(of_job(prom.query(expr), job))
            want = expected[name]
            check(f"{job}: {name}", got == want, f"GPUs {show(got)}, expected {show(want)}")
        for name in sorted(set(expected) - set(names)):
            check(f"{job}: {name}", False, "expected alert is missing from the rules file")
        for record, want in (fleet or {}).items():
            got = [float(series["value"][1]) for series in of_job(prom.query(record), job)]
            check(f"{job}: {record}", got == [want], f"{got}, expected [{want}]")

    # The cluster-wide sums add up every job's per-exporter values.
    for record, want in EXPECTED_FLEET.items():
        total = want + sum(fleet[CLUSTER_OF[record]] for _, _, fleet in runs if fleet)
        got = [float(series["value"][1]) for series in prom.query(record)]
        check(record, got == [total], f"{got}, expected [{total}]")

    # The exporter goes away: NvmlExporterDown's condition must now select its target.
    os.kill(args.exporter_pid, signal.SIGTERM)
    down = f'up{{job="{args.job}"}} == 0'
    wait_for("Prometheus to see the exporter down", lambda: bool(prom.query(down)), 30)
    expr = dict(alerts(args.rules))["NvmlExporterDown"]
    result = prom.query(expr)
    jobs = [series["metric"].get("job") for series in result]
    check("NvmlExporterDown (exporter stopped)", jobs == [args.job],
          f"jobs selected {jobs}, expected [{args.job!r}]")

    print(f"e2e-prometheus: {'FAILED, ' + str(failures) + ' failing' if failures else 'all passed'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
