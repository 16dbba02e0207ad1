#!/usr/bin/env python3
"""Evaluates the node-condition writer's ValidatingAdmissionPolicies against the requests the
exporter makes, and against the ones they must refuse; used by check-manifests.sh and
check-helm.py.

    scripts/check-admission-policy.py RENDERED.yaml

RENDERED.yaml holds the policies, their bindings and the DaemonSet (`kubectl kustomize
deploy/kubernetes/health`, or the chart with nodeCondition.enabled). The policies' CEL is run by
cel-python (celpy), as the API server runs it: the requests' resources are matched against
matchConstraints, then matchConditions, variables and validations are evaluated on the admission
request of a PATCH of a node's status and of an Event's creation, from the exporter's
ServiceAccount (the DaemonSet's) with a token bound to a pod on node gpu-node-1. Its own node is
allowed; another node, an Event about anything else, and a token without a node name are
refused; another user (the kubelet) is left alone. Exits 1 with one line per problem.
"""

import sys

import celpy
import yaml

NODE_NAME_KEY = "authentication.kubernetes.io/node-name"
NODE = "gpu-node-1"


def user(name: str, node: str | None) -> dict:
    return {"username": name, "uid": "0b8e-uid", "groups": ["system:serviceaccounts", "system:authenticated"],
            "extra": {NODE_NAME_KEY: [node]} if node else {}}


def status_patch(who: dict, node: str) -> dict:
    """A PATCH of /api/v1/nodes/NODE/status, as admission sees it."""
    request = {"kind": {"group": "", "version": "v1", "kind": "Node"},
               "resource": {"group": "", "version": "v1", "resource": "nodes"}, "subResource": "status",
               "name": node, "namespace": "", "operation": "UPDATE", "userInfo": who}
    node_object = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node},
                   "status": {"conditions": [{"type": "NvidiaGpuHealthy", "status": "True", "reason": "GpusHealthy"}]}}
    return {"request": request, "object": node_object}


def event(who: dict, kind: str, name: str) -> dict:
    """The exporter's Event (src/kubernetes/node_condition.rs), regarding KIND NAME."""
    request = {"kind": {"group": "events.k8s.io", "version": "v1", "kind": "Event"},
               "resource": {"group": "events.k8s.io", "version": "v1", "resource": "events"}, "subResource": "",
               "name": "", "namespace": "default", "operation": "CREATE", "userInfo": who}
    body = {"apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"generateName": f"nvml-exporter-{name}-", "namespace": "default"},
            "eventTime": "2026-01-01T00:00:00.000000Z", "reportingController": "nvml-exporter",
            "reportingInstance": f"nvml-exporter-{name}", "action": "reboot_node", "reason": "GpuFailed",
            "type": "Warning", "regarding": {"apiVersion": "v1", "kind": kind, "name": name, "uid": name},
            "note": "GPU 2 (GPU-…) failed: xid_79 (reboot_node)"}
    return {"request": request, "object": body}


def matches(rule: dict, request: dict) -> bool:
    resource = request["resource"]
    full = resource["resource"] + (f"/{request['subResource']}" if request["subResource"] else "")
    return (any(g in ("*", resource["group"]) for g in rule.get("apiGroups", []))
            and any(v in ("*", resource["version"]) for v in rule.get("apiVersions", []))
            and any(o in ("*", request["operation"]) for o in rule.get("operations", []))
            and any(r in ("*", full) for r in rule.get("resources", [])))


class Policy:
    def __init__(self, obj: dict):
        self.name = obj["metadata"]["name"]
        self.spec = obj["spec"]
        self.env = celpy.Environment()

    def eval(self, expression: str, activation: dict):
        return self.env.program(self.env.compile(expression)).evaluate(activation)

    def admit(self, review: dict) -> str | None:
        """None when the policy lets the request through (or does not apply), else its message."""
        request = review["request"]
        if not any(matches(r, request) for r in self.spec["matchConstraints"]["resourceRules"]):
            return None
        activation = {"request": celpy.json_to_cel(request), "object": celpy.json_to_cel(review["object"])}
        if not all(bool(self.eval(c["expression"], activation)) for c in self.spec.get("matchConditions", [])):
            return None
        variables = {}
        for v in self.spec.get("variables", []):
            activation["variables"] = celpy.json_to_cel(variables)
            variables[v["name"]] = self.eval(v["expression"], activation)
        activation["variables"] = celpy.json_to_cel({k: str(v) for k, v in variables.items()})
        for v in self.spec["validations"]:
            if not bool(self.eval(v["expression"], activation)):
                return str(self.eval(v["messageExpression"], activation)) if "messageExpression" in v else v["message"]
        return None


def check(objects: list[dict], report=lambda line: None) -> list[str]:
    """The problems of the policies in OBJECTS; empty when they behave. Each verdict as
    expected goes to REPORT."""
    problems = []
    policies = {o["metadata"]["name"]: Policy(o) for o in objects if o["kind"] == "ValidatingAdmissionPolicy"}
    bound = {o["spec"]["policyName"] for o in objects if o["kind"] == "ValidatingAdmissionPolicyBinding"
             and "Deny" in o["spec"].get("validationActions", []) and not o["spec"].get("matchResources")}
    if not policies:
        return ["no ValidatingAdmissionPolicy"]
    for name in sorted(set(policies) - bound):
        problems.append(f"ValidatingAdmissionPolicy {name}: no binding denies what it refuses")
    ds = next(o for o in objects if o["kind"] == "DaemonSet")
    account = f"system:serviceaccount:{ds['metadata'].get('namespace', '')}:{ds['spec']['template']['spec']['serviceAccountName']}"
    exporter, unbound = user(account, NODE), user(account, None)
    kubelet = {"username": "system:node:gpu-node-2", "groups": ["system:nodes"], "extra": {}}
    cases = [
        ("the exporter patches its own node's status", status_patch(exporter, NODE), True),
        ("the exporter creates an Event about its own node", event(exporter, "Node", NODE), True),
        ("the kubelet patches its node's status", status_patch(kubelet, "gpu-node-2"), True),
        ("the exporter patches another node's status", status_patch(exporter, "gpu-node-2"), False),
        ("the exporter creates an Event about another node", event(exporter, "Node", "gpu-node-2"), False),
        ("the exporter creates an Event about a Pod", event(exporter, "Pod", NODE), False),
        ("a token without a node name patches a node's status", status_patch(unbound, NODE), False),
        ("a token without a node name creates an Event", event(unbound, "Node", NODE), False),
    ]
    for what, review, allowed in cases:
        refusals = [f"{p.name}: {m}" for p in policies.values() for m in [p.admit(review)] if m is not None]
        if allowed and refusals:
            problems.append(f"{what}: refused ({'; '.join(refusals)})")
        elif not allowed and not refusals:
            problems.append(f"{what}: allowed")
        else:
            report(f"{'allowed' if allowed else 'refused'}: {what}{': ' + refusals[0] if refusals else ''}")
    return problems


def main() -> int:
    with open(sys.argv[1]) as f:
        objects = [o for o in yaml.safe_load_all(f) if o]
    problems = check(objects, print)
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
