#!/usr/bin/env python3
"""Writes deploy/kubernetes/prometheusrule.yaml: deploy/prometheus/alerts.yaml as a PrometheusRule.

    scripts/gen-prometheusrule.py [--out FILE]

alerts.yaml is the one source of the rules (promtool tests it, docs/alerts.md explains it); the
PrometheusRule is derived from it and never edited by hand. scripts/check-manifests.sh regenerates
it into a temporary file and fails when the committed copy differs.

The rules are copied as text, indented under `spec:`, rather than loaded and dumped: that keeps
their comments and block scalars exactly as reviewed in alerts.yaml. The output is then parsed
back and compared with alerts.yaml, so a text copy that changed the meaning fails here.
"""

import argparse
import pathlib
import sys

import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
SOURCE = ROOT / "deploy/prometheus/alerts.yaml"
TARGET = ROOT / "deploy/kubernetes/prometheusrule.yaml"

HEADER = """\
# GENERATED from deploy/prometheus/alerts.yaml by scripts/gen-prometheusrule.py: do not edit.
# Change alerts.yaml, then run scripts/gen-prometheusrule.py (scripts/check-manifests.sh fails
# while the two differ).
#
# The alert and recording rules of nvml-exporter for the Prometheus operator. Meaning, thresholds
# and runbooks: docs/alerts.md. The Prometheus resource must select this object: kube-prometheus-
# stack's default ruleSelector wants the label `release: <its release name>` (add it in an
# overlay; docs/kubernetes.md).
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: nvml-exporter
  labels:
    app.kubernetes.io/name: nvml-exporter
spec:
"""


def render(source_text: str) -> str:
    """The PrometheusRule for the rules file `source_text`."""
    lines = source_text.splitlines()
    # The file's leading comment is about loading it into a plain Prometheus; the rules start at
    # the top-level `groups:` key.
    try:
        start = next(i for i, line in enumerate(lines) if line.startswith("groups:"))
    except StopIteration:
        raise SystemExit(f"{SOURCE}: no top-level `groups:` key") from None
    body = [("  " + line) if line.strip() else "" for line in lines[start:]]
    text = HEADER + "\n".join(body) + "\n"

    expected = yaml.safe_load(source_text)
    spec = yaml.safe_load(text)["spec"]
    if spec != expected:
        raise SystemExit(f"{SOURCE}: indenting the rules under `spec:` changed their meaning")
    return text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, default=TARGET, help=f"default: {TARGET}")
    args = parser.parse_args()
    args.out.write_text(render(SOURCE.read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
