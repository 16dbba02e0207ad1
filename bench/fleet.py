#!/usr/bin/env python3
"""The fleet benchmark: one Prometheus, then VictoriaMetrics, scraping a simulated fleet
(BENCHMARKS.md, "Fleet").

    bench/fleet.py --exporter target/release/nvml-exporter --sim target/release/libnvml_sim.so \
        [--config NAME=EXPORTERS[:EXPORTER ARGS]]... [--out bench/results/NAME.json]

(or `bench/run.sh --fleet [OPTIONS]`, which builds the release binaries first). Each
configuration runs on its own: EXPORTERS exporters of 64 simulated H100s each
(bench/scenarios/h100x64-fleet.toml: the demo's workloads, its hardware faults on one GPU in 64;
each exporter on its own port, `--interval` 15 s) and one Prometheus (/usr/bin/prometheus, a plain
process on a temporary directory) scraping them every 15 s with the shipped rules
(deploy/prometheus/alerts.yaml) at their own intervals (15 s where a group sets none). Default configurations:
1,024 GPUs with the default flags, 1,024 GPUs with every collector group on (--all-args: by
default every --collector.NAME of the exporter's --help), and 10,240 GPUs with the default flags.

1. Ingestion: after --warmup rounds of 15 s, over --window rounds: active head series, Prometheus's
   resident memory (the highest seen), samples appended per second, the scraped bodies
   (scrape_body_size_bytes, and each exporter's gzip body fetched once), the exporters' and
   Prometheus's CPU (from /proc), each rule group's evaluation time (every evaluation's
   prometheus_rule_group_last_duration_seconds, and each rule's from /api/v1/rules).
2. History: every series the fleet, workloads and waste dashboards read (their metric names,
   recorded series included) is captured from the running Prometheus (/federate) and written back,
   value for value every --history-step seconds (15) over the dashboards' default range, as OpenMetrics;
   `promtool tsdb create-blocks-from openmetrics` turns it into blocks, and a second Prometheus
   starts on those blocks and scrapes the same fleet with the same rules.
3. Queries: once its rules have run, every query of the dashboards as Grafana issues them: the
   variables (label_values: /api/v1/series over the range), each range target over the default
   time range at the step Grafana picks for the panel's width (range / pixels, rounded, at least
   the scrape interval), each instant target at the end; --repeat times, each timed until the answer is
   read whole (what Prometheus spends, not this script's JSON parsing).

VictoriaMetrics (`--engines`, default prometheus,victoria-metrics; Debian's victoria-metrics,
vmagent and vmalert) runs after Prometheus on the same exporters, never beside it, so that neither
shares the machine with the other and both read the same fleet: vmagent scrapes the exporters with
Prometheus's scrape settings and remote-writes to the single-node server, and vmalert evaluates the
same rules file, unchanged, on it (every 15 s where a group sets no interval; results written back
to the server; no Alertmanager). Its phase 1 measures the same window: active series (the series
written this hour, vm_cache_entries{type="storage/hour_metric_ids"}), the resident memory and CPU
of the three processes (each, and their sum), rows inserted per second (vm_rows_inserted_total:
scraped and recorded samples), each group's evaluation time (vmalert_iteration_duration_seconds).
There is no phase 2 for it: its queries (phase 3) run over the live data of its own few minutes,
and so, to compare, do Prometheus's once more before its history is written (queries_live).
`--no-history` skips Prometheus's phases 2 and 3.

Writes the JSON (every figure, the commands, the machine's load) and a Markdown table next to it.
"""

import argparse
import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = ROOT / "bench" / "scenarios" / "h100x64-fleet.toml"
RULES = ROOT / "deploy" / "prometheus" / "alerts.yaml"
DASHBOARDS = [ROOT / "dashboards" / name for name in ("gpu-fleet.json", "workloads.json", "waste.json")]
GPUS_PER_EXPORTER = 64
INTERVAL = 15  # seconds: scrape, rule evaluation and the exporters' sampling interval
DEFAULT_CONFIGS = ["1024-default=16", "1024-all=16:{all}", "10240-default=160"]
# The width in pixels Grafana gives a panel of w grid columns on a 1920-pixel screen.
PIXELS_PER_COLUMN = 1840 / 24

spec = importlib.util.spec_from_file_location("check_dashboards", ROOT / "scripts" / "check-dashboards.py")
check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url, timeout=120, headers=None):
    req = urllib.request.Request(url, headers=headers or {})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.read()


def cpu_seconds(pid):
    """utime + stime of a process (its threads included), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_bytes(pid):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def self_metrics(port):
    """Prometheus's own /metrics as {name{labels}: value}."""
    out = {}
    for line in get(f"http://127.0.0.1:{port}/metrics").decode().splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def total(metrics, name):
    """The sum of every series of one family in self_metrics' answer."""
    return sum(v for k, v in metrics.items() if k == name or k.startswith(name + "{"))


def round_interval(ms):
    """Grafana's roundInterval (@grafana/data rangeutil): the 'nice' interval nearest above."""
    table = [(15, 10), (35, 20), (75, 50), (150, 100), (350, 200), (750, 500), (1500, 1000),
             (3500, 2000), (7500, 5000), (12500, 10000), (17500, 15000), (25000, 20000),
             (45000, 30000), (90000, 60000), (210000, 120000), (450000, 300000),
             (1050000, 600000), (2100000, 1200000), (5400000, 1800000), (9000000, 3600000),
             (16200000, 7200000), (30600000, 10800000), (54000000, 21600000),
             (86400000, 43200000)]
    for limit, value in table:
        if ms < limit:
            return value
    return 86400000


def grafana_builtins(range_s, width):
    """$__interval and friends as Grafana sets them for a panel `width` grid columns wide."""
    interval_ms = max(round_interval(range_s * 1000 / (width * PIXELS_PER_COLUMN)), INTERVAL * 1000)
    step = interval_ms // 1000
    rate = max(step + INTERVAL, 4 * INTERVAL)
    return {
        "__interval": f"{step}s", "__interval_ms": str(interval_ms),
        "__rate_interval": f"{rate}s", "__rate_interval_ms": str(rate * 1000),
        "__range": f"{range_s}s", "__range_s": str(range_s), "__range_ms": str(range_s * 1000),
    }, step


def dashboard_range(path):
    """The dashboard's default time range in seconds ("now-6h" .. "now")."""
    d = json.loads(Path(path).read_text())
    m = re.fullmatch(r"now-(\d+)([mhd])", d["time"]["from"])
    return int(m.group(1)) * {"m": 60, "h": 3600, "d": 86400}[m.group(2)]


def dashboard_names(paths):
    """Every metric name the dashboards' queries and variables read."""
    names = set()
    for path in paths:
        for _, expr in check.all_exprs(check.load(path)):
            names |= check.metric_names(expr or "")
    return sorted(names)


def start(cmd, ready_url, log):
    """Starts a server process and waits until ready_url answers."""
    proc = subprocess.Popen(cmd, stdout=log, stderr=log)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            get(ready_url, timeout=2)
            return proc
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError(f"{cmd[0]} exited with {proc.returncode}")
            time.sleep(1)
    raise RuntimeError(f"{cmd[0]} not ready within 300 s")


def stop(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def scrape_config(targets):
    """The scrape settings of Prometheus and of vmagent."""
    return {"global": {"scrape_interval": f"{INTERVAL}s", "scrape_timeout": "10s"},
            "scrape_configs": [{"job_name": "nvml-exporter", "static_configs": [{"targets": targets}]}]}


class Engine:
    url = None

    def query(self, expr, **params):
        return check.Prometheus(self.url).api("query", query=expr, **params)["result"]

    def scalar(self, expr):
        result = self.query(expr)
        return float(result[0]["value"][1]) if result else 0.0


class Prometheus(Engine):
    def __init__(self, work, data, targets, log):
        self.port = free_port()
        self.url = self.rules_url = f"http://127.0.0.1:{self.port}"
        settings = scrape_config(targets)
        settings["global"]["evaluation_interval"] = f"{INTERVAL}s"
        settings["rule_files"] = [str(RULES)]
        config = work / "prometheus.yml"
        config.write_text(json.dumps(settings, indent=1))
        self.cmd = ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={data}",
                    f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn",
                    "--enable-feature=extra-scrape-metrics", "--storage.tsdb.retention.time=2d"]
        self.proc = start(self.cmd, f"{self.url}/-/ready", log)

    def stop(self):
        stop(self.proc)


class VictoriaMetrics(Engine):
    """The single-node victoria-metrics server, vmagent scraping the exporters into it (remote
    write), and vmalert evaluating the shipped rules, unchanged, on it (its recorded series and
    ALERTS written back to it). No Alertmanager: vmalert's notifier is a port nothing listens on."""

    def __init__(self, work, targets, log):
        ports = {name: free_port() for name in ("victoria-metrics", "vmagent", "vmalert")}
        self.ports = ports
        self.url = f"http://127.0.0.1:{ports['victoria-metrics']}"
        self.rules_url = f"http://127.0.0.1:{ports['vmalert']}"
        (work / "vmagent.yml").write_text(json.dumps(scrape_config(targets), indent=1))
        # Queries up to now, not 30 s behind, and no result cache (Prometheus has none); none of
        # the limits on series per query that Prometheus does not have either.
        self.cmds = {
            "victoria-metrics": ["victoria-metrics", f"-storageDataPath={work / 'vm'}", "-retentionPeriod=1d",
                                 f"-httpListenAddr=127.0.0.1:{ports['victoria-metrics']}",
                                 "-search.latencyOffset=0s", "-search.disableCache",
                                 "-search.maxUniqueTimeseries=100000000", "-search.maxSeries=100000000",
                                 "-loggerLevel=WARN"],
            "vmagent": ["vmagent", f"-promscrape.config={work / 'vmagent.yml'}",
                        f"-remoteWrite.url={self.url}/api/v1/write", f"-remoteWrite.tmpDataPath={work / 'vmagent'}",
                        f"-httpListenAddr=127.0.0.1:{ports['vmagent']}", "-loggerLevel=WARN"],
            "vmalert": ["vmalert", f"-rule={RULES}", f"-datasource.url={self.url}", f"-remoteWrite.url={self.url}",
                        f"-notifier.url=http://127.0.0.1:{free_port()}", f"-evaluationInterval={INTERVAL}s",
                        "-remoteWrite.maxQueueSize=10000000", f"-httpListenAddr=127.0.0.1:{ports['vmalert']}",
                        "-loggerLevel=ERROR"],
        }
        self.procs = {}
        for name in ("victoria-metrics", "vmagent"):
            self.procs[name] = start(self.cmds[name], f"http://127.0.0.1:{ports[name]}/health", log)
        # The rules start once every exporter is scraped, so that no target is absent at first.
        deadline = time.monotonic() + 120
        while self.scalar("count(up == 1)") < len(targets) and time.monotonic() < deadline:
            time.sleep(1)
        self.procs["vmalert"] = start(self.cmds["vmalert"], f"{self.rules_url}/health", log)

    def stop(self):
        for proc in reversed(self.procs.values()):
            stop(proc)


def start_exporters(args, count, extra, log):
    env = dict(os.environ, NVML_SIM_SCENARIO=str(SCENARIO))
    env.pop("NVML_SIM_TIME", None)
    procs = []
    for _ in range(count):
        port = free_port()
        cmd = [args.exporter, "--nvml-lib", args.sim, "--listen", f"127.0.0.1:{port}",
               "--interval", f"{INTERVAL}s", "--log-level", "warn", *extra]
        procs.append((port, subprocess.Popen(cmd, env=env, stdout=log, stderr=log)))
    for port, proc in procs:
        deadline = time.monotonic() + 120
        while True:
            try:
                body = get(f"http://127.0.0.1:{port}/metrics", timeout=10).decode()
                if body.count("nvidia_gpu_up{") >= GPUS_PER_EXPORTER:
                    break
            except OSError:
                pass
            if proc.poll() is not None:
                raise RuntimeError(f"exporter on {port} exited with {proc.returncode}: {cmd}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"exporter on {port}: not serving {GPUS_PER_EXPORTER} GPUs")
            time.sleep(0.5)
    return procs


def wait_rounds(engine, rounds, on_round=None):
    """Waits `rounds` evaluations of the most frequent rule group (one per scrape interval; a
    group with its own longer `interval` evaluates less often), calling on_round(groups) after each
    with the groups of /api/v1/rules."""
    last = None
    seen = 0
    while seen < rounds:
        groups = check.Prometheus(engine.rules_url).api("rules")["groups"]
        stamp = min(groups, key=lambda g: g["interval"])["lastEvaluation"] if groups else None
        if stamp and stamp != last:
            if last is not None:
                seen += 1
                if on_round:
                    on_round(groups)
            last = stamp
        time.sleep(1)


def rule_figures(rules, per_rule, intervals):
    """The rule figures of one window: each group's evaluation times (`rules`, seconds by group),
    each rule's (`per_rule`), the engine's time in rule evaluation per scrape interval, every group
    weighed by how often it runs (`intervals`, seconds by group), and the largest share of its own
    interval any group took."""
    return {
        "rule_group_seconds": {g: {"interval": intervals[g], "mean": statistics.mean(v), "max": max(v),
                                   "evaluations": len(v)} for g, v in sorted(rules.items())},
        "rule_seconds": {r: {"mean": statistics.mean(v), "max": max(v)} for r, v in sorted(
            per_rule.items(), key=lambda kv: -statistics.mean(kv[1]))},
        "rule_seconds_per_interval": sum(statistics.mean(v) * INTERVAL / intervals[g] for g, v in rules.items()),
        "rule_group_share_max": max((max(v) / intervals[g] for g, v in rules.items()), default=0),
    }


def alert_counts(engine):
    """How many series each alert has in each state (`ALERTS`), as "name state": count."""
    return {r["metric"]["alertname"] + " " + r["metric"]["alertstate"]: float(r["value"][1])
            for r in engine.query("count by (alertname, alertstate) (ALERTS)")}


def measure_ingestion(args, prom, exporters, gpus):
    """Phase 1: the figures of one steady window."""
    pids = [p.pid for _, p in exporters]
    wait_rounds(prom, args.warmup)
    rules, per_rule, intervals, seen, rss = {}, {}, {}, {}, [rss_bytes(prom.proc.pid)]

    def on_round(groups):
        rss.append(rss_bytes(prom.proc.pid))
        # Each evaluation once: a group evaluated less often than every round is counted when its
        # lastEvaluation moves.
        for group in groups:
            name = group["name"]
            intervals[name] = group["interval"]
            if seen.get(name) == group["lastEvaluation"]:
                continue
            seen[name] = group["lastEvaluation"]
            rules.setdefault(name, []).append(group["evaluationTime"])
            for rule in group["rules"]:
                per_rule.setdefault(f"{name} / {rule['name']}", []).append(rule["evaluationTime"])

    m0, t0 = self_metrics(prom.port), time.monotonic()
    cpu0 = sum(cpu_seconds(p) for p in pids)
    pcpu0 = cpu_seconds(prom.proc.pid)
    wait_rounds(prom, args.window, on_round)
    m1, t1 = self_metrics(prom.port), time.monotonic()
    cpu1 = sum(cpu_seconds(p) for p in pids)
    pcpu1 = cpu_seconds(prom.proc.pid)
    seconds = t1 - t0
    gzip = 0
    for port, _ in exporters:
        gzip += len(get(f"http://127.0.0.1:{port}/metrics", headers={"Accept-Encoding": "gzip"}))
    head = total(m1, "prometheus_tsdb_head_series")
    served = prom.scalar("sum(scrape_samples_scraped)")
    return {
        "head_series": head,
        "head_series_per_gpu": head / gpus,
        "served_series": served,
        "served_series_per_gpu": served / gpus,
        "recorded_series": prom.scalar('count({__name__=~".+:.+"})'),
        "alerts": alert_counts(prom),
        "prometheus_rss_bytes_max": max(rss),
        "samples_per_second": (total(m1, "prometheus_tsdb_head_samples_appended_total")
                               - total(m0, "prometheus_tsdb_head_samples_appended_total")) / seconds,
        "body_bytes_per_interval": prom.scalar("sum(scrape_body_size_bytes)"),
        "gzip_bytes_per_interval": gzip,
        "scrape_seconds_max": prom.scalar("max(scrape_duration_seconds)"),
        "exporters_cpu_cores": (cpu1 - cpu0) / seconds,
        "prometheus_cpu_cores": (pcpu1 - pcpu0) / seconds,
        "window_seconds": seconds,
        **rule_figures(rules, per_rule, intervals),
    }


def measure_vm_ingestion(args, vm, exporters, gpus):
    """Phase 1 on VictoriaMetrics: the figures of measure_ingestion where it has an equivalent.
    Active series: vm_cache_entries{type="storage/hour_metric_ids"} (the series written this hour);
    samples per second: vm_rows_inserted_total (vmagent's scrapes and vmalert's results); each group's
    evaluation: vmalert_iteration_duration_seconds (_sum and _count, per group); memory and CPU of
    victoria-metrics, vmagent and vmalert from /proc."""
    pids = [p.pid for _, p in exporters]
    procs = vm.procs
    wait_rounds(vm, args.warmup)

    def iterations():
        m = self_metrics(vm.ports["vmalert"])
        out = {}
        for key, value in m.items():
            g = re.match(r'vmalert_iteration_duration_seconds_(sum|count)\{group="([^"]*)"', key)
            if g:
                out.setdefault(g.group(2), {})[g.group(1)] = value
        return out

    rules, per_rule, intervals, last = {}, {}, {}, iterations()
    rss = {name: [rss_bytes(p.pid)] for name, p in procs.items()}
    rss_sum = [sum(v[0] for v in rss.values())]

    def on_round(groups):
        now = [rss_bytes(p.pid) for p in procs.values()]
        for name, value in zip(procs, now):
            rss[name].append(value)
        rss_sum.append(sum(now))
        it = iterations()
        for group in groups:
            name = group["name"]
            intervals[name] = group["interval"]
            old, new = last.get(name, {"sum": 0, "count": 0}), it.get(name, {"sum": 0, "count": 0})
            if new["count"] > old["count"]:
                # The mean of the evaluations since the last round (one, but for a late poll).
                rules.setdefault(name, []).append((new["sum"] - old["sum"]) / (new["count"] - old["count"]))
                for rule in group["rules"]:
                    per_rule.setdefault(f"{name} / {rule['name']}", []).append(rule["evaluationTime"])
        last.update(it)

    port = vm.ports["victoria-metrics"]
    m0, t0 = self_metrics(port), time.monotonic()
    cpu0 = sum(cpu_seconds(p) for p in pids)
    vcpu0 = {name: cpu_seconds(p.pid) for name, p in procs.items()}
    wait_rounds(vm, args.window, on_round)
    m1, t1 = self_metrics(port), time.monotonic()
    cpu1 = sum(cpu_seconds(p) for p in pids)
    vcpu1 = {name: cpu_seconds(p.pid) for name, p in procs.items()}
    seconds = t1 - t0
    active = total(m1, 'vm_cache_entries{type="storage/hour_metric_ids"}')
    served = vm.scalar("sum(scrape_samples_scraped)")
    return {
        "active_series": active,
        "active_series_per_gpu": active / gpus,
        "active_series_source": 'vm_cache_entries{type="storage/hour_metric_ids"}',
        "served_series": served,
        "served_series_per_gpu": served / gpus,
        "recorded_series": vm.scalar('count({__name__=~".+:.+"})'),
        "alerts": alert_counts(vm),
        "rss_bytes_max": {name: max(v) for name, v in rss.items()},
        "rss_bytes_sum_max": max(rss_sum),
        "samples_per_second": (total(m1, "vm_rows_inserted_total") - total(m0, "vm_rows_inserted_total")) / seconds,
        "exporters_cpu_cores": (cpu1 - cpu0) / seconds,
        "cpu_cores": {name: (vcpu1[name] - vcpu0[name]) / seconds for name in procs},
        "cpu_cores_sum": sum(vcpu1[name] - vcpu0[name] for name in procs) / seconds,
        "window_seconds": seconds,
        **rule_figures(rules, per_rule, intervals),
    }


def backfill(args, prom, work, range_s):
    """Phase 2: the dashboards' series over range_s before now, as blocks in a new data dir."""
    names = dashboard_names(args.dashboards)
    match = '{__name__=~"' + "|".join(re.escape(n) for n in names) + '"}'
    text = get(f"{prom.url}/federate?" + urllib.parse.urlencode({"match[]": match})).decode()
    samples = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        # name{labels} value timestamp_ms
        head, value, _ = line.rsplit(" ", 2)
        samples.append((head, value))
    end = int(time.time()) - INTERVAL
    start = end - range_s - 600
    stamps = range(start - start % args.history_step, end, args.history_step)
    om = work / "history.om"
    with om.open("w") as f:
        for head, value in samples:
            f.writelines(f"{head} {value} {t}\n" for t in stamps)
        f.write("# EOF\n")
    data = work / "data-history"
    data.mkdir()
    t0 = time.monotonic()
    subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(om), str(data)],
                   check=True, stdout=subprocess.DEVNULL)
    took = time.monotonic() - t0
    size = om.stat().st_size
    om.unlink()
    return data, {"metric_names": names, "step_seconds": args.history_step, "series": len(samples), "samples": len(samples) * len(stamps),
                  "openmetrics_bytes": size, "promtool_seconds": took, "start": start, "end": end}


def timed(url, path, params, repeat):
    """Seconds until each of `repeat` answers is read whole (not parsed), and the last answer's
    data (an error answer raises RuntimeError)."""
    full = f"{url}/api/v1/{path}?" + urllib.parse.urlencode(params, doseq=True)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        try:
            body = get(full, timeout=300)
        except urllib.error.HTTPError as e:
            body = e.read()
        times.append(time.perf_counter() - t0)
    answer = json.loads(body)
    if answer.get("status") != "success":
        raise RuntimeError(f"{answer.get('errorType')}: {answer.get('error')}")
    return answer["data"], times


def measure_queries(args, prom):
    """Phase 3: every dashboard query as Grafana issues it, over the default range."""
    out = []
    for path in args.dashboards:
        d = json.loads(Path(path).read_text())
        source = check.load(path)
        range_s = dashboard_range(path)
        end = time.time()
        start = end - range_s
        values = {}
        # The variables in order, as check-dashboards.py (and Grafana without a configured
        # Prometheus version) resolves them: /api/v1/series over the range, "All" selected.
        for v in source.variables:
            query = check.interpolate(v["query"], values, source.variables)
            m = re.fullmatch(r"\s*label_values\((.*),\s*(\w+)\s*\)\s*", query, re.S)
            series, times = timed(prom.url, "series", {"match[]": m.group(1), "start": start, "end": end},
                                  args.repeat)
            v["options"] = sorted({s[m.group(2)] for s in series if m.group(2) in s})
            values[v["name"]] = "$__all"
            out.append({"dashboard": Path(path).name, "panel": f"variable ${v['name']}", "ref": "",
                        "kind": "series", "steps": 0, "seconds": times, "series": len(series),
                        "expr": query})
        variables = source.variables
        for p in check.panels(d):
            for t in p.get("targets", []):
                if t.get("hide") or not t.get("expr"):
                    continue
                builtins, step = grafana_builtins(range_s, p["gridPos"]["w"])
                expr = check.interpolate(t["expr"], values | builtins, variables)
                instant = bool(t.get("instant")) and not t.get("range")
                if instant:
                    call = ("query", {"query": expr, "time": end})
                else:
                    # Grafana aligns the range to the step.
                    call = ("query_range", {"query": expr, "start": start - start % step,
                                            "end": end - end % step, "step": step})
                try:
                    data, times = timed(prom.url, *call, args.repeat)
                    result, error = data["result"], None
                except RuntimeError as err:
                    result, times, error = [], [], str(err)
                out.append({"dashboard": Path(path).name, "panel": p["title"], "ref": t["refId"],
                            "kind": "instant" if instant else "range",
                            "steps": 0 if instant else int(range_s // step) + 1,
                            "seconds": times, "series": len(result), "error": error, "expr": expr})
                print(f"  {out[-1]['seconds'] and max(out[-1]['seconds']):7.3f} s  {Path(path).name}: "
                      f"{p['title']} / {t['refId']}", file=sys.stderr)
    return out


def run_config(args, name, count, extra):
    gpus = count * GPUS_PER_EXPORTER
    work = Path(tempfile.mkdtemp(prefix=f"fleet-{name}-", dir=args.work_dir))
    log = (work / "log").open("w")
    result = {"name": name, "exporters": count, "gpus": gpus, "exporter_args": extra,
              "load_average_start": os.getloadavg()}
    print(f"fleet {name}: {count} exporters, {gpus} GPUs, args {extra}", file=sys.stderr)
    exporters, engines = [], []
    try:
        exporters = start_exporters(args, count, extra, log)
        targets = [f"127.0.0.1:{port}" for port, _ in exporters]
        if "prometheus" in args.engines:
            result["prometheus_started"] = time.time()
            engines.append(Prometheus(work, work / "data", targets, log))
            result["ingestion"] = measure_ingestion(args, engines[-1], exporters, gpus)
            print(f"  ingestion: {json.dumps(result['ingestion'])}", file=sys.stderr)
            if "victoria-metrics" in args.engines:
                # The dashboards over the live data only, as VictoriaMetrics answers them.
                result["queries_live"] = measure_queries(args, engines[-1])
            if args.history:
                range_s = max(dashboard_range(p) for p in args.dashboards)
                data, result["backfill"] = backfill(args, engines[-1], work, range_s)
                engines.pop().stop()
                shutil.rmtree(work / "data")
                print(f"  backfill: {result['backfill']['series']} series, {result['backfill']['samples']}"
                      f" samples in {result['backfill']['promtool_seconds']:.0f} s", file=sys.stderr)
                engines.append(Prometheus(work, data, targets, log))
                wait_rounds(engines[-1], 2)
                result["queries"] = measure_queries(args, engines[-1])
                result["prometheus_rss_bytes_after_queries"] = rss_bytes(engines[-1].proc.pid)
            engines.pop().stop()
            result["prometheus_load_average_end"] = os.getloadavg()
            result["prometheus_seconds"] = time.time() - result.pop("prometheus_started")
        if "victoria-metrics" in args.engines:
            started = time.time()
            vm = {"load_average_start": os.getloadavg()}
            result["victoria_metrics"] = vm
            engines.append(VictoriaMetrics(work, targets, log))
            vm["ingestion"] = measure_vm_ingestion(args, engines[-1], exporters, gpus)
            print(f"  victoria-metrics ingestion: {json.dumps(vm['ingestion'])}", file=sys.stderr)
            vm["queries_live"] = measure_queries(args, engines[-1])
            engines.pop().stop()
            vm["load_average_end"] = os.getloadavg()
            vm["seconds"] = time.time() - started
    finally:
        for engine in engines:
            engine.stop()
        for _, proc in exporters:
            proc.send_signal(signal.SIGTERM)
        for _, proc in exporters:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        log.close()
        result["load_average_end"] = os.getloadavg()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return result


def revision():
    def git(*a):
        return subprocess.run(["git", "-C", str(ROOT), *a], capture_output=True, text=True).stdout.strip()
    return {"checkout": git("rev-parse", "--short", "HEAD")}


def slowest_query(queries):
    q = max((q for q in queries if q["seconds"]), key=lambda q: statistics.median(q["seconds"]))
    return f"{statistics.median(q['seconds']):.3f} ({Path(q['dashboard']).stem}: {q['panel']})"


def engines_markdown(doc):
    """Prometheus beside VictoriaMetrics, for the configurations that ran both."""
    lines = []
    for c in doc["configs"]:
        if "victoria_metrics" not in c or "ingestion" not in c:
            continue
        p, v = c["ingestion"], c["victoria_metrics"]["ingestion"]
        mib = lambda b: f"{b / 2**20:,.0f}"
        each = lambda d, fmt: ", ".join(f"{k} {fmt(x)}" for k, x in d.items())
        lines += ["", f"Prometheus and VictoriaMetrics, {c['gpus']:,} GPUs `{c['name']}`, one after the other"
                  f" on the same exporters ({doc['victoria_metrics']}: vmagent, vmalert):", "",
                  "| | Prometheus | VictoriaMetrics |", "|---|---|---|",
                  f"| active series (per GPU) | {p['head_series']:,.0f} ({p['head_series_per_gpu']:.0f}), head |"
                  f" {v['active_series']:,.0f} ({v['active_series_per_gpu']:.0f}), `{v['active_series_source']}` |",
                  f"| resident memory, MiB (max) | {mib(p['prometheus_rss_bytes_max'])} |"
                  f" {mib(v['rss_bytes_sum_max'])} ({each(v['rss_bytes_max'], mib)}) |",
                  f"| CPU, cores | {p['prometheus_cpu_cores']:.2f} |"
                  f" {v['cpu_cores_sum']:.2f} ({each(v['cpu_cores'], lambda x: f'{x:.2f}')}) |",
                  f"| samples ingested per second | {p['samples_per_second']:,.0f} | {v['samples_per_second']:,.0f} |",
                  f"| rule evaluation, s per {INTERVAL} s (largest share of a group's interval) |"
                  f" {p['rule_seconds_per_interval']:.3f} ({p['rule_group_share_max']:.1%}) |"
                  f" {v['rule_seconds_per_interval']:.3f} ({v['rule_group_share_max']:.1%}) |"]
        for g in sorted(set(p["rule_group_seconds"]) | set(v["rule_group_seconds"])):
            cell = lambda d: (f"{d[g]['mean']:.3f} / {d[g]['max']:.3f} ({d[g]['evaluations']})"
                              if g in d else "")
            lines.append(f"| {g}, s (mean / max (evaluations)) | {cell(p['rule_group_seconds'])} |"
                         f" {cell(v['rule_group_seconds'])} |")
        alerts = lambda d: ", ".join(f"{k} {x:,.0f}" for k, x in sorted(d.items())) or "none"
        lines.append(f"| ALERTS series | {alerts(p['alerts'])} | {alerts(v['alerts'])} |")
        if "queries_live" in c:
            live = lambda qs: (f"{slowest_query(qs)}; failed {sum(1 for q in qs if q.get('error'))}"
                               f" of {len(qs)}")
            lines.append(f"| slowest dashboard query over the live data, s (median) | {live(c['queries_live'])} |"
                         f" {live(c['victoria_metrics']['queries_live'])} |")
        lines.append(f"| load average start / end | {c['load_average_start'][0]:.2f} /"
                     f" {c['prometheus_load_average_end'][0]:.2f} |"
                     f" {c['victoria_metrics']['load_average_start'][0]:.2f} /"
                     f" {c['victoria_metrics']['load_average_end'][0]:.2f} |")
    return lines


def markdown(doc):
    rows = doc["configs"]
    lines = [f"# Fleet benchmark {doc['date']}", "",
             f"Exporter `{doc['exporter']}` ({doc['exporter_revision'] or 'revision not given'}),"
             f" checkout `{doc['revision']['checkout']}`, {doc['prometheus']}, {doc['cpus']} CPUs;"
             f" every process at a {INTERVAL} s interval.", "",
             "| | " + " | ".join(f"{c['gpus']:,} GPUs `{c['name']}`" for c in rows) + " |",
             "|---|" + "---|" * len(rows)]

    def row(label, fn):
        cells = []
        for c in rows:
            try:
                cells.append(fn(c))
            except (KeyError, ValueError, ZeroDivisionError):
                cells.append("")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")

    row("exporter arguments", lambda c: "`" + " ".join(c["exporter_args"]) + "`" if c["exporter_args"] else "default")
    row("active head series", lambda c: f"{c['ingestion']['head_series']:,.0f}")
    row("series per GPU (head / served)", lambda c: f"{c['ingestion']['head_series_per_gpu']:.0f} / "
        f"{c['ingestion']['served_series_per_gpu']:.0f}")
    row("Prometheus RSS MiB (max)", lambda c: f"{c['ingestion']['prometheus_rss_bytes_max'] / 2**20:,.0f}")
    row("samples per second", lambda c: f"{c['ingestion']['samples_per_second']:,.0f}")
    row("MB scraped per interval (plain / gzip)", lambda c: f"{c['ingestion']['body_bytes_per_interval'] / 1e6:.1f}"
        f" / {c['ingestion']['gzip_bytes_per_interval'] / 1e6:.2f}")
    row("exporters' CPU, cores (all together)", lambda c: f"{c['ingestion']['exporters_cpu_cores']:.3f}")
    row("Prometheus CPU, cores", lambda c: f"{c['ingestion']['prometheus_cpu_cores']:.2f}")
    row(f"rule evaluation, s per {INTERVAL} s (all groups)", lambda c: f"{c['ingestion']['rule_seconds_per_interval']:.3f}")
    row("rule groups, largest share of own interval", lambda c: f"{c['ingestion']['rule_group_share_max']:.1%}")
    for group in sorted({g for c in rows for g in c.get("ingestion", {}).get("rule_group_seconds", {})}):
        row(f"  {group}, s (mean / max; every)", lambda c, g=group: f"{c['ingestion']['rule_group_seconds'][g]['mean']:.3f}"
            f" / {c['ingestion']['rule_group_seconds'][g]['max']:.3f}; {c['ingestion']['rule_group_seconds'][g]['interval']:.0f} s")

    def slowest(c, dash):
        qs = [q for q in c["queries"] if q["dashboard"] == dash and q["seconds"]]
        q = max(qs, key=lambda q: statistics.median(q["seconds"]))
        return f"{statistics.median(q['seconds']):.3f} ({q['panel']})"
    for dash in sorted({q["dashboard"] for c in rows for q in c.get("queries", [])}):
        row(f"slowest {dash} query, s (median)", lambda c, d=dash: slowest(c, d))
    row("queries over 1 s / failed", lambda c: f"{sum(1 for q in c['queries'] if q['seconds'] and statistics.median(q['seconds']) >= 1)}"
        f" / {sum(1 for q in c['queries'] if q.get('error'))} of {len(c['queries'])}")
    row("load average start / end", lambda c: f"{c['load_average_start'][0]:.2f} / {c['load_average_end'][0]:.2f}")
    lines += engines_markdown(doc)
    # A column per set of queries: each configuration's over the history, and over the live data
    # from each engine where both ran.
    columns = []
    for c in rows:
        columns.append((c["name"], c.get("queries", [])))
        if "queries_live" in c:
            columns.append((f"{c['name']} live, Prometheus", c["queries_live"]))
        if "victoria_metrics" in c:
            columns.append((f"{c['name']} live, VictoriaMetrics", c["victoria_metrics"]["queries_live"]))
    columns = [(name, qs) for name, qs in columns if qs]
    lines += ["", "Every query, median of the runs in seconds (steps: the range query's points):", "",
              "| dashboard | panel | ref | steps | " + " | ".join(name for name, _ in columns) + " |",
              "|---|---|---|---|" + "---|" * len(columns)]
    keys = []
    for _, qs in columns:
        for q in qs:
            k = (q["dashboard"], q["panel"], q["ref"])
            if k not in keys:
                keys.append(k)
    for k in keys:
        cells, steps = [], ""
        for _, qs in columns:
            q = next((q for q in qs if (q["dashboard"], q["panel"], q["ref"]) == k), None)
            if q and q["steps"]:
                steps = str(q["steps"])
            cells.append("" if not q else ("error" if q.get("error") else f"{statistics.median(q['seconds']):.3f}"))
        lines.append(f"| {k[0]} | {k[1]} | {k[2]} | {steps} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main():
    # A TERM ends the run like an interrupt, through the cleanup that stops every engine and exporter.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--exporter", required=True)
    parser.add_argument("--sim", required=True, help="libnvml_sim.so")
    parser.add_argument("--exporter-revision", default="",
                        help="the commit the exporter was built from, for the report")
    parser.add_argument("--config", action="append", metavar="NAME=EXPORTERS[:ARGS]",
                        help="a fleet of EXPORTERS exporters of 64 GPUs with extra ARGS; {all} in ARGS is"
                             f" --all-args (default: {' '.join(DEFAULT_CONFIGS)})")
    parser.add_argument("--all-args", default=None,
                        help="the exporter arguments that turn every collector group on (default: every"
                             " --collector.NAME its --help lists; none for a build without groups)")
    parser.add_argument("--dashboards", nargs="+", default=[str(p) for p in DASHBOARDS])
    parser.add_argument("--warmup", type=int, default=4, help="rounds of 15 s before measuring")
    parser.add_argument("--window", type=int, default=8,
                        help="rounds of 15 s measured (8: two evaluations of the groups run every minute)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each query")
    parser.add_argument("--history-step", type=int, default=INTERVAL,
                        help="seconds between backfilled samples (default: the scrape interval; more"
                             " keeps the OpenMetrics file and promtool's time down at 10,240 GPUs)")
    parser.add_argument("--engines", default="prometheus,victoria-metrics",
                        help="which engines scrape the fleet, one after the other (prometheus,"
                             " victoria-metrics)")
    parser.add_argument("--no-history", dest="history", action="store_false",
                        help="skip Prometheus's phases 2 and 3 (backfilled history and its queries)")
    parser.add_argument("--work-dir", default=None, help="where the temporary directories go")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directories")
    parser.add_argument("--out", default=f"bench/results/fleet-{time.strftime('%F')}.json")
    args = parser.parse_args()
    args.engines = args.engines.split(",")
    if set(args.engines) - {"prometheus", "victoria-metrics"}:
        parser.error(f"--engines {','.join(args.engines)}: expected prometheus and/or victoria-metrics")
    if "victoria-metrics" in args.engines and not all(shutil.which(c) for c in ("victoria-metrics", "vmagent", "vmalert")):
        sys.exit("fleet: needs victoria-metrics, vmagent and vmalert (Debian package victoria-metrics)")
    if not shutil.which("prometheus") or not shutil.which("promtool"):
        sys.exit("fleet: needs prometheus and promtool (Debian package prometheus)")
    if args.all_args is None:
        usage = subprocess.run([args.exporter, "--help"], capture_output=True, text=True).stdout
        args.all_args = " ".join(sorted(set(re.findall(r"--collector\.[a-z][a-z0-9-]*", usage))
                                        - {"--collector.disable-defaults"}))
    configs = []
    for c in args.config or DEFAULT_CONFIGS:
        m = re.fullmatch(r"([\w.-]+)=(\d+)(?::(.*))?", c)
        if not m:
            parser.error(f"--config {c!r}: expected NAME=EXPORTERS[:ARGS]")
        configs.append((m.group(1), int(m.group(2)), (m.group(3) or "").replace("{all}", args.all_args).split()))
    doc = {
        "date": time.strftime("%F %H:%M UTC", time.gmtime()),
        "exporter": args.exporter, "exporter_revision": args.exporter_revision,
        "revision": revision(),
        "prometheus": subprocess.run(["prometheus", "--version"], capture_output=True, text=True)
        .stdout.splitlines()[0] if shutil.which("prometheus") else "",
        "victoria_metrics": "victoria-metrics " + subprocess.run(
            ["dpkg-query", "-W", "-f", "${Version}", "victoria-metrics"], capture_output=True, text=True)
        .stdout if "victoria-metrics" in args.engines else "",
        "cpus": os.cpu_count(), "interval_seconds": INTERVAL, "command": sys.argv, "configs": [],
    }
    out = Path(args.out)
    for name, count, extra in configs:
        doc["configs"].append(run_config(args, name, count, extra))
        out.write_text(json.dumps(doc, indent=1) + "\n")
        out.with_suffix(".md").write_text(markdown(doc))
    print(f"fleet: {out}, {out.with_suffix('.md')}", file=sys.stderr)


if __name__ == "__main__":
    main()
