#!/usr/bin/env python3
"""Extracts what the tests need from one dcgm-exporter release into tests/fixtures/dcgm-exporter/.

    scripts/extract-dcgm-release.py RELEASE COUNTERS.csv DASHBOARD.json [--out DIR]

RELEASE is the version --dcgm-compat-version names (e.g. 4.8.2); COUNTERS.csv is the release's
`etc/default-counters.csv` and DASHBOARD.json its `grafana/dcgm-exporter-dashboard.json`, both
read from a checkout of https://github.com/NVIDIA/dcgm-exporter at the release's tag. Writes, in
DIR/RELEASE (DIR defaults to tests/fixtures/dcgm-exporter):

  fields.txt       one line per active (uncommented) row of the counter file: `FIELD TYPE`, in the
                   file's order (the order of its `label` fields is the order of the labels), and
                   nothing else;
  dashboard.promql the dashboard's queries in the query-file format of scripts/check-dashboards.py:
                   each panel target's `expr` on one line (hidden targets left out) after a
                   `# PANEL TITLE` comment, `(instant)` appended to the title of an instant
                   target; then each query variable as its `label_values(SELECTOR, LABEL)` line.

Only facts are kept: no help texts, no panel layout. The script refuses (exit 1) a dashboard the
query-file format cannot represent faithfully: a variable that is not a `label_values` query of
the label it is named after, or not multi-value with "All" and no custom all value, or a query
that spans lines. Record the release's tag and commit in tests/fixtures/dcgm-exporter/README.md.
"""

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TYPES = {"gauge", "counter", "label"}


def fields(csv_text, path):
    """(FIELD, TYPE) of each active row: `FIELD, TYPE, HELP`, `#` lines are comments."""
    rows = []
    for n, line in enumerate(csv_text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = [p.strip() for p in line.split(",", 2)]
        if len(parts) < 2 or not re.fullmatch(r"DCGM_\w+", parts[0]) or parts[1] not in TYPES:
            sys.exit(f"{path}:{n}: not FIELD, TYPE, HELP with a type of {sorted(TYPES)}: {line}")
        rows.append((parts[0], parts[1]))
    if not rows:
        sys.exit(f"{path}: no active fields")
    return rows


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
    parser.add_argument("release", help="e.g. 4.8.2")
    parser.add_argument("counters", help="the release's etc/default-counters.csv")
    parser.add_argument("dashboard", help="the release's grafana/dcgm-exporter-dashboard.json")
    parser.add_argument("--out", default=str(ROOT / "tests/fixtures/dcgm-exporter"))
    args = parser.parse_args()
    rows = fields(Path(args.counters).read_text(), args.counters)
    queries = dashboard_lines(json.loads(Path(args.dashboard).read_text()), args.dashboard)
    out = Path(args.out) / args.release
    out.mkdir(parents=True, exist_ok=True)
    (out / "fields.txt").write_text("".join(f"{f} {t}\n" for f, t in rows))
    (out / "dashboard.promql").write_text("\n".join(queries) + "\n")
    print(f"{out}: {len(rows)} fields, {sum(not q.startswith('#') for q in queries)} queries")
    return 0


if __name__ == "__main__":
    sys.exit(main())
