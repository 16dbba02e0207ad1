#!/usr/bin/env python3
"""Extracts what the tests need from one dcgm-exporter release into tests/fixtures/dcgm-exporter/.

    scripts/extract-dcgm-release.py RELEASE COUNTERS.csv [--dashboard DASHBOARD.json]
        [--helm METRICS-CONFIGMAP.yaml] [--out DIR]

RELEASE is the version --dcgm-compat-version names (e.g. 4.8.3); COUNTERS.csv is the release's
`etc/default-counters.csv`, DASHBOARD.json its `grafana/dcgm-exporter-dashboard.json` and
METRICS-CONFIGMAP.yaml its Helm chart's `deployment/templates/metrics-configmap.yaml`, each read
from https://github.com/NVIDIA/dcgm-exporter at the release's commit (the last two where that
commit has them). Writes, in DIR/RELEASE (DIR defaults to tests/fixtures/dcgm-exporter):

  fields.txt       one line per active (uncommented) row of the counter file, in the file's order
                   (the order of its `label` fields is the order of the labels): `FIELD TYPE HELP`,
                   HELP being the `# HELP` text dcgm-exporter serves for it;
  optional.txt     `FIELD TYPE` for each commented-out row of the counter file (the fields the
                   release offers to turn on), in its order, a field active above left out;
  helm-fields.txt  with --helm: `FIELD TYPE` for each active row of the chart's default metrics
                   ConfigMap (what a Helm install collects);
  dashboard.promql with --dashboard: the dashboard's queries in the query-file format of
                   scripts/check-dashboards.py: each panel target's `expr` on one line (hidden
                   targets left out) after a `# PANEL TITLE` comment, `(instant)` appended to the
                   title of an instant target; then each query variable as its
                   `label_values(SELECTOR, LABEL)` line.

Only those facts are kept: no comments, no help texts of rows that are off, no panel layout.
The script refuses (exit 1) a counter row it cannot read, and a dashboard the query-file format
cannot represent faithfully: a variable that is not a `label_values` query of the label it is
named after, or not multi-value with "All" and no custom all value, or a query that spans lines.
Record the release's tag and commit in tests/fixtures/dcgm-exporter/README.md.
"""

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TYPES = {"gauge", "counter", "label"}
# A row turned off: `# FIELD, TYPE, HELP` (other comments are prose).
COMMENTED_ROW = re.compile(r"#\s*(DCGM_\w+)\s*,\s*(\w+)\s*,")


def counter_rows(csv_text, path):
    """The active rows `(FIELD, TYPE, HELP)` and the commented-out rows `(FIELD, TYPE)`."""
    active, commented = [], []
    for n, line in enumerate(csv_text.splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        if line.startswith("#"):
            m = COMMENTED_ROW.match(line)
            if m and m.group(2) in TYPES:
                commented.append((m.group(1), m.group(2)))
            continue
        parts = [p.strip() for p in line.split(",", 2)]
        if len(parts) < 3 or not re.fullmatch(r"DCGM_\w+", parts[0]) or parts[1] not in TYPES:
            sys.exit(f"{path}:{n}: not FIELD, TYPE, HELP with a type of {sorted(TYPES)}: {line}")
        active.append((parts[0], parts[1], parts[2]))
    if not active:
        sys.exit(f"{path}: no active fields")
    on = {f for f, _, _ in active}
    seen = set()
    optional = []
    for f, t in commented:
        if f not in on and f not in seen:
            seen.add(f)
            optional.append((f, t))
    return active, optional


def configmap_counters(yaml_text, path):
    """The counter file inside the chart's metrics ConfigMap template: the `metrics: |` block of
    its default branch (after `{{- else }}`, up to `{{- end }}`), dedented."""
    lines = yaml_text.splitlines()
    try:
        start = next(i for i, l in enumerate(lines) if l.strip() == "{{- else }}")
        start = next(i for i in range(start, len(lines)) if lines[i].strip() == "metrics: |")
        end = next(i for i in range(start, len(lines)) if lines[i].strip() == "{{- end }}")
    except StopIteration:
        sys.exit(f"{path}: no default `metrics: |` block between `{{{{- else }}}}` and `{{{{- end }}}}`")
    return "\n".join(l.strip() for l in lines[start + 1:end])


def panels(d):
    """Every panel, those inside rows included, in the dashboard's order."""
    for p in d.get("panels", []):
        yield p
        yield from panels(p)


def one_line(query, what):
    query = query.strip()
    if not query or "\n" in query:
        sys.exit(f"{what}: a query that is empty or spans lines: {query!r}")
    return query


def dashboard_lines(d, path):
    lines = []
    for p in panels(d):
        for t in p.get("targets", []):
            if t.get("hide"):
                continue
            title = p.get("title") or f"panel {p.get('id')}"
            instant = bool(t.get("instant")) and not t.get("range")
            lines.append(f"# {title}{' (instant)' if instant else ''}")
            lines.append(one_line(t.get("expr", ""), f"{path}: panel {title!r}"))
    for v in d.get("templating", {}).get("list", []):
        if v.get("type") != "query":
            continue
        q = v.get("query")
        if isinstance(q, dict):
            q = q.get("query", "")
        q = one_line(q or v.get("definition", ""), f"{path}: variable {v['name']}")
        m = re.fullmatch(r"label_values\((.*),\s*(\w+)\s*\)", q)
        if not m or m.group(2) != v["name"]:
            sys.exit(f"{path}: variable {v['name']}: not label_values(SELECTOR, {v['name']}): {q}")
        if not v.get("includeAll") or v.get("allValue"):
            sys.exit(f"{path}: variable {v['name']}: not \"All\" without a custom all value")
        lines.append(f"# variable ${v['name']}")
        lines.append(q)
    if not lines:
        sys.exit(f"{path}: no queries")
    return lines


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("release", help="e.g. 4.8.3")
    parser.add_argument("counters", help="the release's etc/default-counters.csv")
    parser.add_argument("--dashboard", help="the release's grafana/dcgm-exporter-dashboard.json")
    parser.add_argument("--helm", help="the release's deployment/templates/metrics-configmap.yaml")
    parser.add_argument("--out", default=str(ROOT / "tests/fixtures/dcgm-exporter"))
    args = parser.parse_args()
    active, optional = counter_rows(Path(args.counters).read_text(), args.counters)
    out = Path(args.out) / args.release
    out.mkdir(parents=True, exist_ok=True)
    (out / "fields.txt").write_text("".join(f"{f} {t} {h}\n" for f, t, h in active))
    (out / "optional.txt").write_text("".join(f"{f} {t}\n" for f, t in optional))
    said = [f"{len(active)} fields, {len(optional)} optional"]
    if args.helm:
        helm, _ = counter_rows(configmap_counters(Path(args.helm).read_text(), args.helm), args.helm)
        (out / "helm-fields.txt").write_text("".join(f"{f} {t}\n" for f, t, _ in helm))
        said.append(f"{len(helm)} in the Helm ConfigMap")
    if args.dashboard:
        queries = dashboard_lines(json.loads(Path(args.dashboard).read_text()), args.dashboard)
        (out / "dashboard.promql").write_text("\n".join(queries) + "\n")
        said.append(f"{sum(not q.startswith('#') for q in queries)} queries")
    print(f"{out}: {', '.join(said)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
