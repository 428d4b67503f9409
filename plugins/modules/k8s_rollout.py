#!/usr/bin/python
# SPDX-License-Identifier: Apache-2.0
# Copyright: hami.node contributors

from __future__ import annotations

DOCUMENTATION = r"""
module: k8s_rollout
short_description: Read a GPU fleet's state in one LIST, plan a roll's batches, admit a batch
version_added: 0.2.0
author:
  - hami.node developers
description:
  - The controller side of C(playbooks/site.yml)'s roll over many GPU nodes (docs/rollouts.md). Run it
    once per play on the controller (C(delegate_to=localhost), C(run_once)); its API reads are LISTs, so
    its cost does not grow with one request per node.
  - V(status) lists the nodes once and returns, for each, whether it is cordoned and by whom, Ready, our
    maintenance annotations, its GPUs and (with O(domain_label)) its failure domain.
  - V(plan) lists nodes, pods and PodDisruptionBudgets once and splits O(nodes) into batches bounded by
    O(serial), O(max_unavailable) (GPUs out of service at once, counting those already out),
    O(max_per_domain) (nodes of one failure domain out at once) and the budgets' allowed disruptions
    (a batch's nodes never hold more pods of one budget than it allows now, but for a node that alone
    holds more). Nodes that fit no batch now are returned in C(deferred) with the reason.
  - V(admit) applies the same rule to one batch against the cluster as it is when the batch starts, and
    also checks what each member's drain would refuse (pods no controller manages, emptyDir data). It
    writes nothing. Members that do not fit wait, up to O(wait) seconds, polling with backoff.
requirements:
  - kubernetes (Python client) >= 24.2
options:
  state:
    description: What to do.
    type: str
    choices: [status, plan, admit]
    default: status
  nodes:
    description:
      - The nodes of the roll, in the order to roll them (V(plan), V(admit)), or to report on (V(status);
        all nodes when empty).
      - Each item is a node name, or a dict with C(name), C(resume) (an earlier run of ours left it
        cordoned), C(domain) (its failure domain; else the value of O(domain_label)), C(pods)
        (V(gpu) or V(all), which of its pods the window evicts) and C(host) (its inventory name, in which
        the results are also given as C(hosts)).
    type: list
    elements: raw
    default: []
  serial:
    description: Nodes per batch, a count or a percentage of O(nodes).
    type: raw
    default: 1
  max_unavailable:
    description:
      - GPUs out of service at once, a count or a percentage of the fleet's GPUs.
      - 0 or empty means no bound.
    type: raw
  max_per_domain:
    description: Nodes of one failure domain out of service at once. 0 or empty means no bound.
    type: raw
  domain_label:
    description: Node label whose value is a node's failure domain (e.g. C(topology.kubernetes.io/zone)).
    type: str
    default: ""
  canary:
    description: A first batch of one node.
    type: bool
    default: false
  order:
    description:
      - With V(plan), the order batches fill in. V(spread) keeps the first node of O(nodes) as the canary,
        then takes first the nodes of the failure domain or budget that needs the most batches still
        (its nodes left over what one batch may hold of them), and among a domain's nodes those whose
        budgets the previous batch did not use up. V(inventory) fills first-fit in the order of O(nodes).
    type: str
    choices: [spread, inventory]
    default: spread
  leave_last:
    description:
      - With V(plan), this many of the plan's last batches (never all of them) are returned in C(deferred)
        instead, to be planned again in the roll's next pass together with the members that V(admit) held
        back (site.yml's pass 1 leaves 2).
    type: int
    default: 0
  resource:
    description:
      - The extended resource whose capacity counts a node's GPUs when the HAMi register annotation is absent.
    type: str
    default: nvidia.com/gpu
  gpu_resources:
    description: Resource name prefixes that make a pod a GPU pod.
    type: list
    elements: str
    default: [nvidia.com/]
  force:
    description: With V(admit), pods no controller manages may be evicted (as the drain's O(force)).
    type: bool
    default: false
  delete_emptydir_data:
    description: With V(admit), pods with emptyDir data may be evicted.
    type: bool
    default: true
  wait:
    description:
      - With V(admit), seconds to wait before answering while no member fits, or while members that wait
        would fit once replacement pods already placed for evicted pods of their budgets are Ready.
    type: int
    default: 0
extends_documentation_fragment:
  - hami.node.attributes
  - hami.node.attributes.read_only
  - hami.node.k8s
notes:
  - The kubeconfig needs list on nodes, pods and poddisruptionbudgets.
seealso:
  - module: hami.node.k8s_node_maintenance
"""

EXAMPLES = r"""
- name: Plan a driver roll over the nodes that need it, at most 10% of the fleet's GPUs out at once
  hami.node.k8s_rollout:
    state: plan
    nodes: [{name: gpu-1, domain: rack-a}, {name: gpu-2, domain: rack-a}, gpu-3]
    serial: 10%
    max_unavailable: 10%
    max_per_domain: 1
  delegate_to: localhost
  run_once: true
  register: roll
"""

RETURN = r"""
nodes:
  description: With V(status), each node's state.
  returned: when state is status
  type: dict
  sample: {gpu-1: {unschedulable: true, cordoned_by: hami.node, ready: true, failed_gate: nvml, gpus: 8,
                   domain: rack-a}}
missing:
  description: With V(status), requested nodes the API does not know.
  returned: when state is status
  type: list
plan:
  description:
    - With V(plan), C(batches) (lists of node names), C(sizes), C(order), C(deferred) (node -> why) and
      C(notes) per batch.
  returned: when state is plan
  type: dict
fleet:
  description:
    - What the decision saw, C(gpus) in the fleet, C(out_gpus) already out, C(out_nodes), C(budgets)
      (allowed disruptions).
  returned: when state is plan or admit
  type: dict
bounds:
  description: The bounds as numbers.
  returned: when state is plan or admit
  type: dict
go:
  description: With V(admit), the members that may start now.
  returned: when state is admit
  type: list
wait:
  description: With V(admit), members that must wait, with the reason.
  returned: when state is admit
  type: dict
refused:
  description: With V(admit), members whose drain would refuse, with the reason (nothing was written).
  returned: when state is admit
  type: dict
requests:
  description: API requests made.
  returned: always
  type: int
"""

import time  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.hami.node.plugins.module_utils import _hami, _k8s, _maintenance, _rollout  # noqa: E402


def _items(module):
    out = []
    for raw in module.params["nodes"]:
        item = {"name": raw} if isinstance(raw, str) else raw
        if not isinstance(item, dict) or not item.get("name"):
            module.fail_json(msg="nodes: each item must be a node name or a dict with a name, not %r" % raw)
        out.append(item)
    return out


def gpus_of(node, resource):
    """Physical GPUs: the HAMi register annotation lists each one; else the advertised capacity."""
    ann = (node.get("metadata") or {}).get("annotations") or {}
    try:
        devices = _hami.decode_register(ann.get(_hami.NODE_REGISTER))
    except _hami.DecodeError:
        devices = []
    return len(devices) or _rollout.node_gpus(node, resource)


def status(api, module):
    wanted = [i["name"] for i in _items(module)]
    p = module.params
    out = {}
    for node in api.list_nodes():
        md = node.get("metadata") or {}
        name = md.get("name")
        if wanted and name not in wanted:
            continue
        ann = md.get("annotations") or {}
        summary = _maintenance.summarize(node)
        labels = md.get("labels") or {}
        summary.update(gpus=gpus_of(node, p["resource"]), failed_gate=ann.get(_maintenance.FAILED_GATE),
                       runbook=ann.get(_maintenance.RUNBOOK),
                       domain=labels.get(p["domain_label"]) if p["domain_label"] else None)
        out[name] = summary
    return {"nodes": out, "missing": [n for n in wanted if n not in out]}


class Snapshot:
    """One reading of the cluster: nodes, pods, budgets (three LISTs)."""

    def __init__(self, api, module):
        p = module.params
        self.nodes = {(n.get("metadata") or {}).get("name"): n for n in api.list_nodes()}
        self.pdbs = api.list_pdbs()
        self.pods = {}
        for pod in api.list_pods():
            self.pods.setdefault((pod.get("spec") or {}).get("nodeName") or "", []).append(pod)
        self.resource = p["resource"]
        self.domain_label = p["domain_label"]
        self.gpu_prefixes = p["gpu_resources"]

    def _domain(self, node, item=None):
        if item and item.get("domain"):
            return str(item["domain"])
        labels = (node.get("metadata") or {}).get("labels") or {}
        return labels.get(self.domain_label) if self.domain_label else None

    def to_evict(self, name, mode):
        evict, _skipped = _maintenance.classify(self.pods.get(name, []), mode, self.gpu_prefixes)
        return evict

    def fleet(self, items):
        """Every GPU node of the cluster as a _rollout.Node; the roll's own nodes with their budgets."""
        by_name = {i["name"]: i for i in items}
        nodes = []
        for name, node in self.nodes.items():
            item = by_name.get(name)
            gpus = gpus_of(node, self.resource)
            if not gpus and item is None:
                continue  # not a GPU node: out of the GPU budget's arithmetic
            budgets = {}
            if item is not None:
                for pod in self.to_evict(name, item.get("pods") or "gpu"):
                    for key in _rollout.budgets_of(pod, self.pdbs):
                        budgets[key] = budgets.get(key, 0) + 1
            _cordoned, by = _maintenance.cordon_state(node)
            nodes.append(_rollout.Node(
                name, gpus=gpus, domain=self._domain(node, item), out=_rollout.node_out(node),
                keeps_out=by == "operator", resume=bool(item and item.get("resume")), budgets=budgets))
        recovering = {}
        for pods in self.pods.values():
            for pod in pods:
                if _rollout.pod_recovering(pod):
                    for key in _rollout.budgets_of(pod, self.pdbs):
                        recovering[key] = recovering.get(key, 0) + 1
        return _rollout.Fleet(nodes, _rollout.allowed_disruptions(self.pdbs), recovering)

    def refusal(self, item, force, delete_emptydir_data):
        """Why this member's drain would refuse now (nothing written), or None."""
        evict = self.to_evict(item["name"], item.get("pods") or "gpu")
        problems = _maintenance.refusals(evict, force, delete_emptydir_data)
        for pod in evict:
            keys = _rollout.budgets_of(pod, self.pdbs)
            if len(keys) > 1:
                problems.append("pod %s is covered by more than one PodDisruptionBudget (%s): the Eviction "
                                "API refuses to evict it; fix the budgets' selectors"
                                % (_maintenance.pod_key(pod), ", ".join(keys)))
        return "; ".join(problems) or None


def _fleet_summary(fleet):
    out = [n for n in fleet.nodes.values() if n.out]
    return {"gpus": fleet.total_gpus, "out_gpus": sum(n.gpus for n in out),
            "out_nodes": sorted(n.name for n in out), "budgets": fleet.allowed}


def _bounds(module, items, fleet):
    p = module.params
    try:
        return _rollout.Bounds.read(p["serial"], p["max_unavailable"], p["max_per_domain"], p["canary"],
                                    len(items), fleet)
    except _rollout.BoundError as exc:
        module.fail_json(msg=str(exc))


def plan(api, module):
    items = _items(module)
    missing = [i["name"] for i in items]
    snap = Snapshot(api, module)
    missing = [n for n in missing if n not in snap.nodes]
    if missing:
        module.fail_json(msg="nodes %s are not in the cluster (kubectl get nodes): check "
                         "node_maintenance_node_name" % ", ".join(missing))
    fleet = snap.fleet(items)
    bounds = _bounds(module, items, fleet)
    roll = [fleet.nodes[i["name"]] for i in items]
    try:
        result = _rollout.plan(roll, bounds, fleet, order=module.params["order"],
                               leave_last=module.params["leave_last"])
    except _rollout.BoundError as exc:
        module.fail_json(msg=str(exc))
    doc = result.as_dict()
    # the same in inventory host names (an item's ``host``), for the playbook's groups
    host = {i["name"]: i.get("host") or i["name"] for i in items}
    doc["hosts"] = {"order": [host[n] for n in result.order],
                    "deferred": {host[n]: why for n, why in result.deferred.items()}}
    return {"plan": doc, "fleet": _fleet_summary(fleet), "bounds": bounds.as_dict()}


def admit(api, module):
    p = module.params
    items = _items(module)
    deadline = time.monotonic() + max(0, p["wait"])
    delay = 2.0
    while True:
        snap = Snapshot(api, module)
        refused = {}
        for item in items:
            why = ("the node is not in the cluster" if item["name"] not in snap.nodes
                   else snap.refusal(item, p["force"], p["delete_emptydir_data"]))
            if why:
                refused[item["name"]] = why
        candidates = [i for i in items if i["name"] not in refused]
        fleet = snap.fleet(candidates)
        bounds = _bounds(module, items, fleet)
        members = [fleet.nodes[i["name"]] for i in candidates]
        go, wait = _rollout.admit(members, bounds, fleet)
        # wait only while waiting may let more go: nobody fits, or budgets have replacements on their way
        soon = _rollout.admit_soon(members, bounds, fleet) if go and wait else []
        if not wait or (go and not soon) or time.monotonic() + delay > deadline:
            host = {i["name"]: i.get("host") or i["name"] for i in items}
            return {"go": go, "wait": wait, "refused": refused, "fleet": _fleet_summary(fleet),
                    "bounds": bounds.as_dict(),
                    "hosts": {"go": [host[n] for n in go], "wait": {host[n]: w for n, w in wait.items()},
                              "refused": {host[n]: r for n, r in refused.items()}}}
        time.sleep(delay)
        delay = min(delay * 2, 30.0)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            state=dict(type="str", default="status", choices=["status", "plan", "admit"]),
            nodes=dict(type="list", elements="raw", default=[]),
            serial=dict(type="raw", default=1),
            max_unavailable=dict(type="raw"),
            max_per_domain=dict(type="raw"),
            domain_label=dict(type="str", default=""),
            canary=dict(type="bool", default=False),
            order=dict(type="str", default="spread", choices=list(_rollout.ORDERS)),
            leave_last=dict(type="int", default=0),
            resource=dict(type="str", default="nvidia.com/gpu"),
            gpu_resources=dict(type="list", elements="str", default=["nvidia.com/"]),
            force=dict(type="bool", default=False),
            delete_emptydir_data=dict(type="bool", default=True),
            wait=dict(type="int", default=0),
            **_k8s.CONNECTION_ARGS,
        ),
        supports_check_mode=True,
    )
    _k8s.require_client(module)
    api = _k8s.Api(module, hint_var="kubeconfig (node_maintenance_kubeconfig)")
    try:
        result = {"status": status, "plan": plan, "admit": admit}[module.params["state"]](api, module)
    except _k8s.ApiError as exc:
        hint = ""
        if exc.status in (401, 403):
            hint = ": check the kubeconfig's credentials and RBAC (list nodes, pods, poddisruptionbudgets)"
        module.fail_json(msg="API error %s %s%s" % (exc.status, exc.message, hint), status=exc.status,
                         requests=api.requests)
    module.exit_json(changed=False, requests=api.requests, **result)


if __name__ == "__main__":
    main()
