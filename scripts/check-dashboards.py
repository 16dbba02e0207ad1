#!/usr/bin/env python3
"""Checks Grafana dashboards (and plain query files) against nvml-exporter.

    check-dashboards.py static [--promtool PROMTOOL] DASHBOARD.json...
    check-dashboards.py live --prometheus URL [--range SECONDS] FILE...

`static` (fast, no server), one PASS/FAIL line per check:
  1. structure: the JSON parses; schemaVersion >= 39, uid, title; the `datasource` (type datasource,
     query prometheus), `node`, `instance`, `gpu` and `namespace` variables; every panel has a type of
     timeseries/stat/table/heatmap, a unit, a description, the datasource and targets with an expr;
  2. PromQL: every expr and variable query, Grafana variables given concrete values, passes
     `promtool check rules`;
  3. names: every metric name used is one the exporter serves (tests/golden/h100x8.prom plus the
     families docs/metrics.md lists) or one the shipped recording rules record
     (deploy/prometheus/alerts.yaml);
  4. per-pod usage (workloads.json): the per-pod memory and utilization panels, run by `promtool
     test rules` with the shipped rules they read on a made-up node, give each pod of a shared GPU
     its own usage where per-pod series exist and the GPU's value elsewhere;
  5. grouping (workloads.json): the controller and queue panels, run the same way, group pods by
     the controller and queue labels of nvidia_gpu_pod_info, a pod without them by its namespace;
  6. waste (waste.json): the funnel stats and the per-pod columns, run the same way, count and
     measure a made-up node's GPUs as their descriptions say, and the right-sizing table's MIG
     profile mappings name the smallest 80 GB profile that holds each peak;
  7. health (gpu-fleet.json, gpu-node.json): the failed and degraded stats, the unhealthy GPUs by
     action and the node's GPU health table, run the same way, count and list a made-up node's
     verdicts as their descriptions say, and the table names each state in words;
  and first, a self-test: a broken dashboard (typo in a metric name, unparsable expr, panel
  without a unit) must fail each of the three, so the checks themselves cannot silently pass.

`live` resolves each file's variables against a running Prometheus the way Grafana does (each
variable's query over the range, "All" where the variable offers it, else the first value, in
order so chained variables see the earlier ones) and runs every target: a range query over the
last --range seconds at 1 s steps, or an instant query for `instant: true` targets. Each must
return at least one series; --expect pins the value of an instant (stat) target. FILE is a dashboard JSON or a query file: one PromQL expression a line,
`#` comments; a `label_values(METRIC, LABEL)` line defines the variable `$LABEL` (multi, All), as
in dcgm-exporter's dashboard, where each variable is named after its label. A comment right
before a query is its title, and a title ending in `(instant)` makes it an instant query
(scripts/extract-dcgm-release.py writes dcgm-exporter's dashboard so).
"""

import argparse
import copy
import json
import re
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PANEL_TYPES = {"timeseries", "stat", "table", "heatmap"}
REQUIRED_VARIABLES = ["datasource", "node", "instance", "gpu", "namespace"]

# Grafana's built-in variables, as Grafana sets them for a 1-minute range on a Prometheus data
# source whose scrape interval is 1 s: $__interval is the step (range / max data points, at
# least the scrape interval), $__rate_interval max(4 x scrape interval, $__interval + scrape).
def builtins(range_s, step_s=1):
    rate_s = max(4 * step_s, step_s + step_s)
    return {
        "__interval": f"{step_s}s",
        "__interval_ms": str(step_s * 1000),
        "__rate_interval": f"{rate_s}s",
        "__rate_interval_ms": str(rate_s * 1000),
        "__range": f"{range_s}s",
        "__range_s": str(range_s),
        "__range_ms": str(range_s * 1000),
    }


# ---------------------------------------------------------------------------------------------
# Reading dashboards and query files


class Source:
    """A dashboard or query file: its variables (in order) and its targets."""

    def __init__(self, path, variables, targets):
        self.path = path
        self.name = Path(path).name
        self.variables = variables  # [{"name", "query", "all", "all_value"}]
        self.targets = targets  # [{"title", "ref", "expr", "instant"}]


def variable_query(var):
    q = var.get("query")
    if isinstance(q, dict):
        q = q.get("query", "")
    return q or var.get("definition", "")


def load(path):
    """A Source from a dashboard JSON (.json) or a query file (anything else)."""
    text = Path(path).read_text()
    if str(path).endswith(".json"):
        d = json.loads(text)
        variables = [
            {
                "name": v["name"],
                "query": variable_query(v),
                "all": bool(v.get("includeAll")),
                "multi": bool(v.get("multi")) or bool(v.get("includeAll")),
                "all_value": v.get("allValue") or None,
            }
            for v in d.get("templating", {}).get("list", [])
            if v.get("type") == "query"
        ]
        targets = [
            {
                "title": p.get("title", f"panel {p.get('id')}"),
                "ref": t.get("refId", "?"),
                "expr": t.get("expr", ""),
                "instant": bool(t.get("instant")) and not t.get("range"),
                "description": p.get("description", ""),
            }
            for p in panels(d)
            for t in p.get("targets", [])
            if not t.get("hide")
        ]
        return Source(path, variables, targets)
    variables, targets = [], []
    title = None  # the comment right before the current line
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if line.startswith("#"):
            title = line.lstrip("#").strip() or None
            continue
        comment, title = title, None
        if not line:
            continue
        m = re.fullmatch(r"label_values\((.*),\s*(\w+)\s*\)", line)
        if m:
            variables.append({"name": m.group(2), "query": line, "all": True, "multi": True,
                              "all_value": None})
        else:
            instant = bool(comment) and comment.endswith("(instant)")
            if instant:
                comment = comment[: -len("(instant)")].strip()
            targets.append({"title": comment or f"line {n}", "ref": "A", "expr": line,
                            "instant": instant, "description": ""})
    return Source(path, variables, targets)


def panels(d):
    """Every panel, those inside collapsed rows included."""
    for p in d.get("panels", []):
        yield p
        yield from p.get("panels", [])


# ---------------------------------------------------------------------------------------------
# Grafana variable interpolation (Prometheus data source rules)

VAR_RE = re.compile(r"\$\{(\w+)(?::[^}]*)?\}|\[\[(\w+)\]\]|\$(\w+)")


def regex_escape(value):
    return re.sub(r"([\\^$*+?.()|{}\[\]])", r"\\\\\1", value)


def format_value(var, value):
    """How Grafana writes a variable's value into a Prometheus query."""
    if value == "$__all":
        if var.get("all_value"):
            return var["all_value"]
        value = var["options"]
    if isinstance(value, list):
        if len(value) == 1:
            return regex_escape(value[0])
        return "(" + "|".join(regex_escape(v) for v in value) + ")"
    if var.get("multi"):
        return regex_escape(value)
    return value.replace("\\", "\\\\").replace("'", "\\'")


def interpolate(expr, values, variables):
    """Replaces $name, ${name}, ${name:fmt} and [[name]]; unknown names are left alone."""
    by_name = {v["name"]: v for v in variables}

    def sub(m):
        name = m.group(1) or m.group(2) or m.group(3)
        if name in values and name in by_name:
            return format_value(by_name[name], values[name])
        if name in values:
            return values[name]
        return m.group(0)

    return VAR_RE.sub(sub, expr)


def static_values(source, range_s):
    """Values for parsing without a server: every variable "All" (`.*` where none is declared)."""
    values = builtins(range_s)
    for v in source.variables:
        values[v["name"]] = v["all_value"] or ".*"
    return values


def variable_promql(query):
    """The PromQL inside a variable query (label_values(expr, label), query_result(expr)), or None."""
    m = re.fullmatch(r"\s*label_values\((.*),\s*\w+\s*\)\s*", query, re.S)
    if m:
        return m.group(1)
    m = re.fullmatch(r"\s*query_result\((.*)\)\s*", query, re.S)
    if m:
        return m.group(1)
    return None


# ---------------------------------------------------------------------------------------------
# Static checks


def structure_errors(path):
    """Check 1 for one dashboard: a list of problems (empty when fine)."""
    try:
        d = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        return [f"does not parse: {e}"]
    errors = []
    if not isinstance(d.get("schemaVersion"), int) or d["schemaVersion"] < 39:
        errors.append(f"schemaVersion {d.get('schemaVersion')!r}, need >= 39")
    for key in ("uid", "title"):
        if not d.get(key):
            errors.append(f"no {key}")
    variables = {v.get("name"): v for v in d.get("templating", {}).get("list", [])}
    for name in REQUIRED_VARIABLES:
        v = variables.get(name)
        if v is None:
            errors.append(f"no ${name} variable")
        elif name == "datasource":
            if v.get("type") != "datasource" or v.get("query") != "prometheus":
                errors.append("$datasource is not a prometheus datasource variable")
        elif v.get("type") != "query" or not variable_query(v).startswith("label_values("):
            errors.append(f"${name} is not a label_values query variable")
    ids = set()
    for p in panels(d):
        title = p.get("title") or f"panel {p.get('id')}"
        if p.get("type") == "row":
            continue
        if p.get("id") in ids:
            errors.append(f"{title}: duplicate panel id {p.get('id')}")
        ids.add(p.get("id"))
        if p.get("type") not in PANEL_TYPES:
            errors.append(f"{title}: type {p.get('type')!r} not one of {sorted(PANEL_TYPES)}")
        if not p.get("fieldConfig", {}).get("defaults", {}).get("unit"):
            errors.append(f"{title}: no unit")
        if not (p.get("description") or "").strip():
            errors.append(f"{title}: no description")
        if (p.get("datasource") or {}).get("uid") != "${datasource}":
            errors.append(f"{title}: datasource is not ${{datasource}}")
        if not p.get("targets"):
            errors.append(f"{title}: no targets")
        for t in p.get("targets", []):
            if not (t.get("expr") or "").strip():
                errors.append(f"{title} {t.get('refId')}: empty expr")
            if (t.get("datasource") or {}).get("uid") not in (None, "${datasource}"):
                errors.append(f"{title} {t.get('refId')}: target datasource is not ${{datasource}}")
    return errors


def all_exprs(source, range_s=60):
    """(where, PromQL) for every target and variable query, variables substituted."""
    values = static_values(source, range_s)
    out = []
    for v in source.variables:
        promql = variable_promql(v["query"])
        if promql is None:
            out.append((f"{source.name} / variable ${v['name']}", None))
        else:
            out.append((f"{source.name} / variable ${v['name']}",
                        interpolate(promql, values, source.variables)))
    for t in source.targets:
        out.append((f"{source.name} / {t['title']} / {t['ref']}",
                    interpolate(t["expr"], values, source.variables)))
    return out


def promql_errors(promtool, exprs):
    """Check 2: a list of problems from `promtool check rules` over one group per expression."""
    errors = [f"{where}: not a label_values()/query_result() query" for where, e in exprs if e is None]
    exprs = [(where, e) for where, e in exprs if e is not None]
    if not exprs:
        return errors
    rules = {"groups": [
        {"name": f"{i}: {where}", "rules": [{"record": "dashboard_expr", "expr": e}]}
        for i, (where, e) in enumerate(exprs)
    ]}
    with tempfile.NamedTemporaryFile("w", suffix=".yml") as f:
        json.dump(rules, f)  # JSON is YAML
        f.flush()
        run = subprocess.run([promtool, "check", "rules", f.name], capture_output=True, text=True)
    if run.returncode != 0:
        lines = [ln.strip() for ln in (run.stdout + run.stderr).splitlines()]
        errors += [ln for ln in lines if "could not parse" in ln or "parse error" in ln] or lines
    return errors


def served_names():
    """Metric names the exporter serves (the golden file's plus docs/metrics.md's families) and the
    series the shipped recording rules record (deploy/prometheus/alerts.yaml)."""
    names = set(re.findall(r"^# TYPE (\S+)", (ROOT / "tests/golden/h100x8.prom").read_text(), re.M))
    names.update(re.findall(r"^\s*- record: (\S+)", (ROOT / "deploy/prometheus/alerts.yaml").read_text(), re.M))
    for name, kind in re.findall(r"^\| `(\w+)` \| (\w+) \|", (ROOT / "docs/metrics.md").read_text(), re.M):
        names.add(name)
        if kind == "histogram":
            names.update(f"{name}_{suffix}" for suffix in ("bucket", "sum", "count"))
    return names


def opt_in_groups():
    """The collector group of each family that is off by default, from docs/metrics.md."""
    rows = re.findall(r"^\| `(\w+)` \| \w+ \| [^|]* \| `([a-z0-9-]+)` \(off\) \|",
                      (ROOT / "docs/metrics.md").read_text(), re.M)
    return dict(rows)


def opt_in_needs(target, opt_in):
    """The opt-in groups a target's families belong to, each as its --collector.NAME flag."""
    return sorted({f"--collector.{opt_in[n]}" for n in metric_names(target["expr"]) if n in opt_in})


def undeclared_opt_in(source, opt_in):
    """Targets using a family of a group that is off by default whose panel's description does not
    say which --collector.NAME it needs: with the default groups such a panel stays empty."""
    errors = []
    for t in source.targets:
        for flag in opt_in_needs(t, opt_in):
            if flag not in t["description"]:
                errors.append(f"{t['title']} / {t['ref']}: uses a family of an opt-in group; its"
                              f" description must say it needs {flag}")
    return errors


PROMQL_WORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless",
    "offset", "inf", "nan", "atan2",
}


def metric_names(expr):
    """Metric names in a PromQL expression: identifiers that are not functions, keywords, label
    names (in {...} and in by/on/... lists), durations or numbers."""
    s = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', expr)  # strings
    s = re.sub(r"\{[^}]*\}", " ", s)  # label matchers
    s = re.sub(r"\[[^\]]*\]", " ", s)  # range and subquery durations
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)
    s = re.sub(r"\b\d+(\.\d+)?(e[+-]?\d+)?(ms|s|m|h|d|w|y)?\b", " ", s)  # numbers, durations
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", s):
        word, rest = m.group(0), s[m.end():]
        if word.lower() in PROMQL_WORDS or re.match(r"\s*\(", rest):
            continue  # keyword, function or aggregation
        names.add(word)
    return names


def unknown_names(exprs, known):
    errors = []
    for where, e in exprs:
        for name in sorted(metric_names(e or "") - known):
            errors.append(f"{where}: {name} is not a metric the exporter serves")
    return errors


def self_test(promtool, known):
    """Each check must reject a dashboard broken in the way it looks for."""
    good = json.loads((ROOT / "dashboards/gpu-node.json").read_text())
    problems = []
    with tempfile.TemporaryDirectory() as tmp:
        def variant(name, mutate):
            d = copy.deepcopy(good)
            mutate(d)
            path = Path(tmp) / name
            path.write_text(json.dumps(d))
            return path

        def first_target(d):
            return next(p for p in d["panels"] if p["targets"])["targets"][0]

        typo = variant("typo.json", lambda d: first_target(d).update(
            expr=first_target(d)["expr"].replace("nvidia_gpu_", "nvidia_gpuu_", 1)))
        if not unknown_names(all_exprs(load(typo)), known):
            problems.append("a misspelt metric name passed the names check")
        broken = variant("broken.json", lambda d: first_target(d).update(
            expr="sum(" + first_target(d)["expr"]))
        if not promql_errors(promtool, all_exprs(load(broken))):
            problems.append("an unparsable expr passed the PromQL check")
        no_unit = variant("no-unit.json", lambda d: d["panels"][0]["fieldConfig"]["defaults"].pop("unit"))
        if not structure_errors(no_unit):
            problems.append("a panel without a unit passed the structure check")

        def silent_opt_in(d):
            for p in d["panels"]:
                if "--collector.clocks" in p.get("description", ""):
                    p["description"] = p["description"].replace("--collector.clocks", "")
        unsaid = variant("unsaid.json", silent_opt_in)
        if not undeclared_opt_in(load(unsaid), opt_in_groups()):
            problems.append("a panel of an opt-in group that does not say so passed the groups check")
    sample = 'sum by (gpu) (rate(nvidia_gpu_x_total{a="b"}[5m])) * on (gpu) group_left () y offset 1h > 1e9'
    if metric_names(sample) != {"nvidia_gpu_x_total", "y"}:
        problems.append("metric_names() does not find exactly the metric names")
    return problems


# The per-pod panels of workloads.json and what they must give on the node of POD_USAGE_SERIES.
POD_USAGE_PANELS = {
    "Device memory per pod": {"a": 40, "b": 5, "c": 30, "d": 7, "e": 0, "f": 20, "g": 8},
    "Utilization vs SM activity per pod": {"a": 0.5, "b": 0.125, "c": 0.75, "d": 0.375, "e": 0},
}
# GPU 0 is shared by pods a and b and has per-pod series (their own usage counts, not the GPU's
# 16 GiB, which includes a host process); GPU 1 has none (pod c, and pod a too, get its whole
# value); GPU 2 has per-pod series for d only (e is assigned it but runs nothing there: 0). Pod a
# sums (memory) or averages (utilization) its own share of GPU 0 and GPU 1's whole value.
# GPU 3 is in MIG mode: pod f holds GPU instance 1, pod g instance 2. Each gets its instance's
# memory, not the GPU's 50 nor the other instance's; f's per-pod series, which on a MIG GPU carry no
# gpu_instance, must not add to it; neither has a utilization line (NVML gives none for MIG
# instances: unknown, not 0), nor does f's per-pod utilization on the GPU make one.
POD_USAGE_SERIES = [
    ("nvidia_gpu_pod_info", "0", "a", "1"), ("nvidia_gpu_pod_info", "0", "b", "1"),
    ("nvidia_gpu_pod_info", "1", "c", "1"), ("nvidia_gpu_pod_info", "1", "a", "1"),
    ("nvidia_gpu_pod_info", "2", "d", "1"), ("nvidia_gpu_pod_info", "2", "e", "1"),
    ("nvidia_gpu_pod_memory_used_bytes", "0", "a", "10"), ("nvidia_gpu_pod_memory_used_bytes", "0", "b", "5"),
    ("nvidia_gpu_pod_memory_used_bytes", "2", "d", "7"),
    ("nvidia_gpu_pod_sm_utilization_ratio", "0", "a", "0.25"),
    ("nvidia_gpu_pod_sm_utilization_ratio", "0", "b", "0.125"),
    ("nvidia_gpu_pod_sm_utilization_ratio", "2", "d", "0.375"),
    ("nvidia_gpu_memory_used_bytes", "0", None, "16"), ("nvidia_gpu_memory_used_bytes", "1", None, "30"),
    ("nvidia_gpu_memory_used_bytes", "2", None, "7"),
    ("nvidia_gpu_utilization_ratio", "0", None, "0.6"), ("nvidia_gpu_utilization_ratio", "1", None, "0.75"),
    ("nvidia_gpu_utilization_ratio", "2", None, "0.4"),
    ("nvidia_gpu_pod_info", "3", "f", "1", "1"), ("nvidia_gpu_pod_info", "3", "g", "1", "2"),
    ("nvidia_gpu_memory_used_bytes", "3", None, "50"),
    ("nvidia_gpu_memory_used_bytes", "3", None, "20", "1"),
    ("nvidia_gpu_memory_used_bytes", "3", None, "8", "2"),
    ("nvidia_gpu_pod_memory_used_bytes", "3", "f", "19"),
    ("nvidia_gpu_pod_sm_utilization_ratio", "3", "f", "0.3"),
]


def all_panel_exprs(source, keys, step, key=lambda t: (t["title"], t["ref"])):
    """The targets of `source` whose `key` is in `keys`, interpolated with every variable "All"
    (`.*`, which also matches a missing label) and Grafana's built-ins for a `step`-second step."""
    variables = [dict(v, all_value=v["all_value"] or ".*") for v in source.variables]
    values = builtins(step) | {v["name"]: "$__all" for v in variables}
    return {key(t): interpolate(t["expr"], values, variables) for t in source.targets if key(t) in keys}


def promtool_errors(promtool, exprs, input_series, eval_time, want):
    """`exprs` (key: PromQL) as recording rules next to the shipped ones
    (deploy/prometheus/alerts.yaml, loaded first so that the panels' group sees the rules they
    read), on `input_series`, under `promtool test rules`: each must give the samples `want[key]`
    ((labels, value) pairs) at `eval_time`. Returns promtool's complaints."""
    names = {key: f"panel_{i}" for i, key in enumerate(exprs)}
    rules = {"groups": [{"name": "panels", "rules": [
        {"record": names[k], "expr": e} for k, e in exprs.items()]}]}
    tests = {"rule_files": [str(ROOT / "deploy/prometheus/alerts.yaml"), "rules.yml"],
             "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": input_series,
        "promql_expr_test": [
            {"expr": names[k], "eval_time": eval_time, "exp_samples": [
                {"labels": f"{names[k]}{{{labels}}}", "value": v} for labels, v in samples]}
            for k, samples in want.items()],
    }]}
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "rules.yml").write_text(json.dumps(rules))  # JSON is YAML
        (Path(tmp) / "test.yml").write_text(json.dumps(tests))
        run = subprocess.run([promtool, "test", "rules", "test.yml"], cwd=tmp, capture_output=True, text=True)
    if run.returncode != 0:
        return [ln.strip() for ln in (run.stdout + run.stderr).splitlines() if ln.strip()]
    return []


def pod_usage_errors(promtool, source):
    """Check 4: the per-pod panels' first targets, as recording rules next to the shipped ones
    (deploy/prometheus/alerts.yaml, which they read), under `promtool test rules`."""
    exprs = all_panel_exprs(source, POD_USAGE_PANELS, 60,
                            key=lambda t: t["title"] if t["ref"] == "A" else None)
    missing = sorted(set(POD_USAGE_PANELS) - set(exprs))
    if missing:
        return [f"no panel titled {t!r}" for t in missing]

    def series(metric, gpu, pod, value, gpu_instance=None):
        labels = f'job="j",instance="i",gpu="{gpu}",uuid="GPU-{gpu}"'
        if gpu_instance:
            labels += f',gpu_instance="{gpu_instance}",mig_profile="1g.10gb"'
        if pod:
            labels += f',namespace="ml",pod="{pod}",container="main"'
        return {"series": f"{metric}{{{labels}}}", "values": f"{value}+0x5"}

    want = {t: [(f'namespace="ml",pod="{pod}"', v) for pod, v in sorted(by_pod.items())]
            for t, by_pod in POD_USAGE_PANELS.items()}
    return promtool_errors(promtool, exprs, [series(*s) for s in POD_USAGE_SERIES], "2m", want)


# The controller and queue panels of workloads.json (title, refId) and what they must give on the
# node of GROUPING_PODS (the controller table's first column counts pods). Pod web-1 of Deployment web holds GPUs 0 and 1 through two DRA claims,
# web-2 GPU 2: the Deployment holds 3 GPUs, 1 idle (GPU 1). Job train's pod holds GPU 3, idle. A
# pod with no controller and no queue (what every pod looks like without the kubelet's pod list)
# holds GPU 4 and is grouped by its namespace alone, and by the empty queue.
GROUPING_PANELS = {
    ("Workloads: GPUs and GPU-hours by controller", "A"): [
        ('namespace="ml",controller_kind="Deployment",controller_name="web"', 2),
        ('namespace="ml",controller_kind="Job",controller_name="train"', 1),
        ('namespace="ml"', 1),
    ],
    ("GPUs held per controller", "A"): [
        ('namespace="ml",controller_kind="Deployment",controller_name="web"', 3),
        ('namespace="ml",controller_kind="Job",controller_name="train"', 1),
        ('namespace="ml"', 1),
    ],
    ("GPUs held and idle per queue", "A"): [
        ('label_kueue_x_k8s_io_queue_name="team-a"', 3),
        ('annotation_scheduling_volcano_sh_queue_name="batch"', 1),
        ("", 1),
    ],
    ("GPUs held and idle per queue", "B"): [
        ('label_kueue_x_k8s_io_queue_name="team-a"', 1),
        ('annotation_scheduling_volcano_sh_queue_name="batch"', 1),
    ],
}
# (pod, GPU, claim, controller kind and name, queue label pair, SM activity of the GPU).
GROUPING_PODS = [
    ("web-1", "0", "c1", "Deployment", "web", 'label_kueue_x_k8s_io_queue_name="team-a"', "0.5"),
    ("web-1", "1", "c2", "Deployment", "web", 'label_kueue_x_k8s_io_queue_name="team-a"', "0.01"),
    ("web-2", "2", "", "Deployment", "web", 'label_kueue_x_k8s_io_queue_name="team-a"', "0.9"),
    ("train-x", "3", "", "Job", "train", 'annotation_scheduling_volcano_sh_queue_name="batch"', "0"),
    ("bare", "4", "", "", "", "", "0.3"),
]


def grouping_errors(promtool, source):
    """Check 5: the controller and queue panels, as recording rules next to the shipped ones, group
    the pods of GROUPING_PODS by the labels nvidia_gpu_pod_info carries (`promtool test rules`)."""
    exprs = all_panel_exprs(source, GROUPING_PANELS, 60)
    missing = sorted(set(GROUPING_PANELS) - set(exprs))
    if missing:
        return [f"no target {t!r}" for t in missing]
    input_series = []
    for pod, gpu, claim, kind, name, queue, sm in GROUPING_PODS:
        gpu_labels = f'job="j",instance="i",gpu="{gpu}",uuid="GPU-{gpu}"'
        labels = [gpu_labels, f'namespace="ml",pod="{pod}",container="main"']
        labels += [f'claim="{claim}"'] if claim else []
        labels += [f'controller_kind="{kind}",controller_name="{name}"'] if kind else []
        labels += [queue] if queue else []
        input_series.append({"series": f"nvidia_gpu_pod_info{{{','.join(labels)}}}", "values": "1+0x5"})
        input_series.append({"series": f"nvidia_gpu_sm_active_ratio{{{gpu_labels}}}", "values": f"{sm}+0x5"})
    return promtool_errors(promtool, exprs, input_series, "2m", GROUPING_PANELS)


GIB = 2**30
# The waste panels (title, refId) and what they must give on the node of WASTE_GPUS: GPU 0 is
# nobody's, busy (0.9) but not allocated; pod train holds GPUs 1-4, one of them idle (1 idle of 4:
# partially idle), two at SM activity 0.5 or more (the threshold counts); pod bare holds GPU 5, on
# which no GPM answers (utilization 0.8: active, never saturated, no mean SM activity).
WASTE_PANELS = {
    ("GPUs present", "A"): [("", 6)],
    ("GPUs allocated", "A"): [("", 5)],
    ("GPUs active", "A"): [("", 4)],
    ("GPUs saturated", "A"): [("", 2)],
    ("Top partially idle workloads", "A"): [('namespace="ml",pod="train"', 4)],
    ("Top partially idle workloads", "B"): [('namespace="ml",pod="train"', 1)],
    ("Right-sizing per workload", "A"): [('namespace="ml",pod="bare"', 1), ('namespace="ml",pod="train"', 4)],
    ("Right-sizing per workload", "C"): [('namespace="ml",pod="train"', 0.375)],
    ("Right-sizing per workload", "D"): [('namespace="ml",pod="bare"', 3 * GIB),
                                        ('namespace="ml",pod="train"', 26 * GIB)],
}
# (GPU, pod, SM activity or None without GPM, utilization, memory used: promtool series values).
# The panels cover the last three minutes (a $__range of 180 s at 10m). Pod train's memory is 16 GiB
# but at 8m, when GPU 4 holds 10 GiB more: its peak is 26 GiB, not what it holds at the end.
WASTE_GPUS = [
    ("0", "", "0.9", "1", "0+0x10"),
    ("1", "train", "0.25", "1", f"{4 * GIB}+0x10"),
    ("2", "train", "0.5", "1", f"{4 * GIB}+0x10"),
    ("3", "train", "0.75", "1", f"{8 * GIB}+0x10"),
    ("4", "train", "0", "0", f"0+0x7 {10 * GIB}+0x0 0+0x2"),
    ("5", "bare", None, "0.8", f"{3 * GIB}+0x10"),
]
# Peak memory and the profile the right-sizing table must name for it (A100/H100 80GB).
MIG_PROFILE_CASES = [
    (0, "1g.10gb"), (9.5 * GIB, "1g.10gb"), (9.5 * GIB + 1, "1g.20gb"), (19.5 * GIB, "1g.20gb"),
    (20 * GIB, "3g.40gb"), (39.25 * GIB, "3g.40gb"), (40 * GIB, "7g.80gb"),
    (79.25 * GIB, "7g.80gb"), (80 * GIB, "none: more than a whole GPU"),
]


def grafana_mapping(mappings, value):
    """The text Grafana shows for `value` under range value mappings: the first that matches,
    both ends included (getValueMappingResult in @grafana/data)."""
    for m in mappings:
        o = m["options"]
        if m["type"] == "range" and o.get("from", float("-inf")) <= value <= o.get("to", float("inf")):
            return o["result"]["text"]
    return None


def waste_errors(promtool, source):
    """Check 6: the waste panels of WASTE_PANELS, as recording rules next to the shipped ones, on the
    node of WASTE_GPUS (`promtool test rules`), and the MIG profile column's value mappings."""
    errors = []
    d = json.loads(Path(source.path).read_text())
    table = next((p for p in d["panels"] if p.get("title") == "Right-sizing per workload"), None)
    mappings = [prop["value"] for o in (table or {}).get("fieldConfig", {}).get("overrides", [])
                for prop in o["properties"] if prop["id"] == "mappings"]
    if len(mappings) != 1:
        errors.append("Right-sizing per workload: expected one column with value mappings")
    else:
        for peak, want in MIG_PROFILE_CASES:
            got = grafana_mapping(mappings[0], peak)
            if got != want:
                errors.append(f"MIG profile for a peak of {peak / GIB:g} GiB: {got!r}, expected {want!r}")
    exprs = all_panel_exprs(source, WASTE_PANELS, 180)
    missing = sorted(set(WASTE_PANELS) - set(exprs))
    if missing:
        return errors + [f"no target {t!r}" for t in missing]
    input_series = []
    for gpu, pod, sm, util, memory in WASTE_GPUS:
        labels = f'job="j",instance="i",gpu="{gpu}",uuid="GPU-{gpu}"'
        series = {"nvidia_gpu_up": "1+0x10", "nvidia_gpu_utilization_ratio": f"{util}+0x10",
                  "nvidia_gpu_memory_used_bytes": memory}
        if sm is not None:
            series["nvidia_gpu_sm_active_ratio"] = f"{sm}+0x10"
        input_series += [{"series": f"{m}{{{labels}}}", "values": v} for m, v in series.items()]
        if pod:
            pod_labels = f'{labels},namespace="ml",pod="{pod}",container="main"'
            input_series.append({"series": f"nvidia_gpu_pod_info{{{pod_labels}}}", "values": "1+0x10"})
    # The exporter's own count of the GPUs it discovered, lost ones included.
    input_series.append({"series": 'nvml_exporter_gpus{job="j",instance="i"}',
                         "values": f"{len(WASTE_GPUS)}+0x10"})
    return errors + promtool_errors(promtool, exprs, input_series, "10m", WASTE_PANELS)


# The health panels on a made-up node: GPU 0 healthy; GPU 1 failed on XID 79 with an
# uncorrectable ECC count too (two actions); GPU 2 degraded by two reasons asking for one action
# (counted once for it); GPU 3 degraded by a thermal slowdown (action none).
HEALTH_GPUS = [
    ("0", 0, []),
    ("1", 2, [("xid_79", "reboot_node"), ("ecc_uncorrectable", "reset_gpu")]),
    ("2", 1, [("ecc_uncorrectable", "reset_gpu"), ("row_remap_pending", "reset_gpu")]),
    ("3", 1, [("thermal_slowdown", "none")]),
]
HEALTH_PANELS = {
    "gpu-fleet.json": {
        ("GPUs failed", "A"): [("", 1)],
        ("GPUs degraded", "A"): [("", 2)],
        ("Unhealthy GPUs by action", "A"): [
            ('action="none"', 1), ('action="reboot_node"', 1), ('action="reset_gpu"', 2)],
    },
    "gpu-node.json": {
        ("GPU health", "A"): [('instance="i",gpu="0"', 0)] + [
            (f'instance="i",gpu="{gpu}",reason="{reason}",action="{action}"', state)
            for gpu, state, reasons in HEALTH_GPUS for reason, action in reasons],
    },
}
# What the node dashboard's state column must show for each value: text as well as colour.
HEALTH_STATES = {0: ("healthy", "green"), 1: ("degraded", "orange"), 2: ("failed", "red")}


def health_errors(promtool, source):
    """Check 7: the health panels of HEALTH_PANELS, as recording rules, on the node of HEALTH_GPUS
    (`promtool test rules`), and the node table's state column naming each state in words."""
    errors = []
    if source.name == "gpu-node.json":
        d = json.loads(Path(source.path).read_text())
        table = next((p for p in d["panels"] if p.get("title") == "GPU health"), {})
        mappings = [prop["value"] for o in table.get("fieldConfig", {}).get("overrides", [])
                    if o["matcher"]["options"] == "state"
                    for prop in o["properties"] if prop["id"] == "mappings"]
        options = mappings[0][0]["options"] if len(mappings) == 1 and mappings[0] else {}
        for value, (text, colour) in HEALTH_STATES.items():
            got = options.get(str(value), {})
            if (got.get("text"), got.get("color")) != (text, colour):
                errors.append(f"GPU health: state {value} shows {got.get('text')!r} in"
                              f" {got.get('color')!r}, expected {text!r} in {colour!r}")
    want = HEALTH_PANELS[source.name]
    exprs = all_panel_exprs(source, want, 60)
    missing = sorted(set(want) - set(exprs))
    if missing:
        return errors + [f"no target {t!r}" for t in missing]
    input_series = []
    for gpu, state, reasons in HEALTH_GPUS:
        labels = f'job="j",instance="i",gpu="{gpu}",uuid="GPU-{gpu}"'
        input_series.append({"series": f"nvidia_gpu_health_state{{{labels}}}", "values": f"{state}+0x10"})
        input_series += [
            {"series": f'nvidia_gpu_health_reason{{{labels},reason="{reason}",action="{action}"}}',
             "values": "1+0x10"}
            for reason, action in reasons]
    return errors + promtool_errors(promtool, exprs, input_series, "10m", want)


def run_static(args):
    failed = 0

    def report(name, errors):
        nonlocal failed
        print(f"{'FAIL' if errors else 'PASS'}  {name}")
        for e in errors:
            print(f"      {e}")
        failed += bool(errors)

    known = served_names()
    opt_in = opt_in_groups()
    report("self-test: each check rejects a broken dashboard", self_test(args.promtool, known))
    sources = []
    for path in args.files:
        errors = structure_errors(path)
        report(f"{Path(path).name}: structure", errors)
        if not errors:
            sources.append(load(path))
    uids = [json.loads(Path(s.path).read_text())["uid"] for s in sources]
    report("dashboard uids are unique", [f"uid {u} repeated" for u in set(uids) if uids.count(u) > 1])
    for s in sources:
        exprs = all_exprs(s)
        report(f"{s.name}: {len(exprs)} queries parse as PromQL (promtool)", promql_errors(args.promtool, exprs))
        report(f"{s.name}: every metric name is served by the exporter", unknown_names(exprs, known))
        report(f"{s.name}: panels that need an opt-in collector group say so",
               undeclared_opt_in(s, opt_in))
        if s.name == "workloads.json":
            report(f"{s.name}: per-pod panels give each pod its own usage (promtool test rules)",
                   pod_usage_errors(args.promtool, s))
            report(f"{s.name}: controller and queue panels group pods by their labels (promtool"
                   " test rules)", grouping_errors(args.promtool, s))
        if s.name == "waste.json":
            report(f"{s.name}: funnel and per-pod panels count a made-up node as they say, MIG"
                   " profiles by peak memory (promtool test rules)", waste_errors(args.promtool, s))
        if s.name in HEALTH_PANELS:
            report(f"{s.name}: health panels count and list a made-up node's verdicts as they say"
                   " (promtool test rules)", health_errors(args.promtool, s))
    return 1 if failed else 0


# ---------------------------------------------------------------------------------------------
# Live check


class Prometheus:
    def __init__(self, base):
        self.base = base.rstrip("/")

    def api(self, path, **params):
        url = f"{self.base}/api/v1/{path}?" + urllib.parse.urlencode(params, doseq=True)
        try:
            with urllib.request.urlopen(url, timeout=30) as r:
                answer = json.load(r)
        except urllib.error.HTTPError as e:
            answer = json.load(e)
        if answer.get("status") != "success":
            raise RuntimeError(f"{answer.get('errorType')}: {answer.get('error')}")
        return answer["data"]


def resolve(prom, source, start, end, values):
    """Sets values[name] for each variable in order, as Grafana does on dashboard load."""
    for v in source.variables:
        query = interpolate(v["query"], values, source.variables)
        m = re.fullmatch(r"\s*label_values\((.*),\s*(\w+)\s*\)\s*", query, re.S)
        if m:
            series = prom.api("series", **{"match[]": m.group(1), "start": start, "end": end})
            options = sorted({s[m.group(2)] for s in series if m.group(2) in s})
        else:
            promql = variable_promql(query)
            result = prom.api("query", query=promql, time=end)["result"]
            options = sorted({json.dumps(r["metric"], sort_keys=True) for r in result})
        v["options"] = options
        if v["all"]:
            values[v["name"]] = "$__all"
        else:
            values[v["name"]] = options[0] if options else ""
        shown = "All" if v["all"] else values[v["name"]]
        print(f"      ${v['name']} = {shown} ({len(options)} values: {', '.join(options[:10])})")


def wait_for_data(prom, targets, seconds):
    """Waits until `targets` exporters have each been scraped `seconds` times (at 1 s)."""
    query = f"count(count_over_time(nvml_exporter_gpus[10m]) >= {seconds})"
    deadline = time.monotonic() + seconds + 60
    while True:
        try:
            result = prom.api("query", query=query)["result"]
            if result and float(result[0]["value"][1]) >= targets:
                return True
        except (OSError, RuntimeError):
            pass  # not up yet
        if time.monotonic() > deadline:
            print(f"FAIL  timed out waiting for {seconds} s of data from {targets} exporters")
            return False
        time.sleep(1)


def run_live(args):
    prom = Prometheus(args.prometheus)
    if args.wait_for and not wait_for_data(prom, args.wait_for, args.range):
        return 1
    end = time.time()
    start = end - args.range
    failed = total = skipped = skipped_total = 0
    opt_in = opt_in_groups()
    expected, expected_ok = len(args.expect), 0
    for path in args.files:
        source = load(path)
        print(f"--- {source.name}")
        values = builtins(args.range)
        try:
            resolve(prom, source, start, end, values)
        except RuntimeError as e:
            print(f"FAIL  {source.name}: variables: {e}")
            failed += 1
            total += 1
            continue
        ok = 0
        for t in source.targets:
            total += 1
            expr = interpolate(t["expr"], values, source.variables)
            try:
                if t["instant"]:
                    series = prom.api("query", query=expr, time=end)["result"]
                else:
                    series = prom.api("query_range", query=expr, start=start, end=end, step=1)["result"]
                problem = None if series else "no data"
            except RuntimeError as e:
                problem = str(e)
            want = args.expect.pop((source.name, t["title"]), None)
            if not problem and want is not None:
                got = [float(r["value"][1]) for r in series] if t["instant"] else None
                if got != [want]:
                    problem = f"{got}, expected [{want:g}] (an instant query with one series)"
                else:
                    expected_ok += 1
            needs = opt_in_needs(t, opt_in)
            if problem == "no data" and needs and all(f in t["description"] for f in needs):
                # The exporters run with the default groups: a query of an opt-in group's family
                # has no data, as the panel's description says.
                skipped += 1
                skipped_total += 1
                print(f"SKIP  {t['title']} / {t['ref']}: needs {' '.join(needs)}")
            elif problem:
                failed += 1
                print(f"FAIL  {t['title']} / {t['ref']}: {problem}\n      {expr}")
            else:
                ok += 1
        print(f"{'PASS' if ok + skipped == len(source.targets) else 'FAIL'}  {source.name}: "
              f"{ok}/{len(source.targets)} queries return data")
        skipped = 0
    for (name, title), want in args.expect.items():
        print(f"FAIL  {name}: no target titled {title!r} to expect {want:g} of")
        failed += 1
        total += 1
    if expected:
        print(f"{'PASS' if expected_ok == expected else 'FAIL'}  {expected_ok}/{expected} stat values"
              " as expected")
    print(f"live: {total - failed - skipped_total}/{total} queries return data, {skipped_total} of"
          " opt-in collector groups have none as their panels say" if total else "live: no queries")
    return 1 if failed else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    static = sub.add_parser("static", help="structure, PromQL and metric names")
    static.add_argument("--promtool", default="promtool")
    static.add_argument("files", nargs="+")
    live = sub.add_parser("live", help="every query returns data from a running Prometheus")
    live.add_argument("--prometheus", required=True, help="base URL, e.g. http://127.0.0.1:9090")
    live.add_argument("--range", type=int, default=60, help="seconds of data to query (default 60)")
    live.add_argument("--wait-for", type=int, metavar="N", default=0,
                      help="first wait until N exporters have been scraped for --range seconds")
    live.add_argument("--expect", action="append", default=[], metavar="FILE:TITLE=VALUE",
                      help="the instant target of panel TITLE in FILE (a base name) must return"
                           " exactly one series of VALUE")
    live.add_argument("files", nargs="+")
    args = parser.parse_args()
    if args.command == "live":
        expect = {}
        for e in args.expect:
            m = re.fullmatch(r"([^:]+):(.+)=([-+.\deE]+)", e)
            if not m:
                parser.error(f"--expect {e!r}: expected FILE:TITLE=VALUE")
            expect[(m.group(1), m.group(2))] = float(m.group(3))
        args.expect = expect
    return run_static(args) if args.command == "static" else run_live(args)


if __name__ == "__main__":
    sys.exit(main())
