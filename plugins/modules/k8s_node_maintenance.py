#!/usr/bin/python
# SPDX-License-Identifier: Apache-2.0
# Copyright: hami.node contributors

from __future__ import annotations

DOCUMENTATION = r"""
module: k8s_node_maintenance
short_description: Cordon a GPU node, evict its GPU pods under PodDisruptionBudgets, verify it, uncordon it
version_added: 0.1.0
author:
  - hami.node developers
description:
  - The Kubernetes side of a node's maintenance window during a rollout (docs/rollouts.md). Run it on
    the controller (C(delegate_to=localhost)) with a kubeconfig.
  - V(drain) cordons the node and evicts its GPU pods (O(pods=gpu), like the GPU Operator's upgrade
    controller) or every pod (O(pods=all), like C(kubectl drain)) through the Eviction API, so
    PodDisruptionBudgets hold. An eviction the budget refuses (HTTP 429) is retried with exponential
    backoff until O(timeout), which also bounds the wait until the evicted pods are gone.
    C(kubernetes.core.k8s_drain) fails at the first 429 instead.
  - Every pod is classified before anything is written. Pods without a controller (lost for good when
    evicted) and pods with emptyDir data are refused unless O(force) or O(delete_emptydir_data) allow
    them, and a refusal changes nothing. DaemonSet pods, mirror pods and finished pods are left alone.
  - The cordon is written in the same patch as the annotation C(hami.io/maintenance-cordoned-by=hami.node),
    with the node's resourceVersion. A re-run after a crash therefore knows the cordon is ours. A node that
    an operator had cordoned stays cordoned, because V(uncordon) only lifts a cordon of ours. V(uncordon)
    also clears our annotations.
  - V(verify) polls the API-side gates until they pass or O(timeout) runs out. It returns them and does
    not fail. C(node_ready) means the Ready condition is True. C(device_plugin) means the kubelet
    advertises O(resource) and, with O(expect_gpus), that C(hami.io/node-nvidia-register) lists every
    expected GPU as healthy.
  - V(park) records a failed gate. The node stays cordoned (it is cordoned again if someone lifted the
    cordon). It gets the annotations C(hami.io/maintenance-failed-gate) and C(hami.io/maintenance-runbook)
    and a Warning event C(HamiMaintenanceGateFailed) that names the gate and the runbook.
  - V(status) only reads. It returns the cordon owner, readiness and our maintenance annotations.
requirements:
  - kubernetes (Python client) >= 24.2
options:
  name:
    description: Node name.
    type: str
    required: true
  state:
    description: What to do.
    type: str
    choices: [status, cordon, drain, uncordon, verify, park]
    default: status
  reason:
    description: Why the node is cordoned. It is written to C(hami.io/maintenance-reason).
    type: str
    default: hami.node maintenance
  pods:
    description: With V(drain), evict the GPU pods only (V(gpu)) or every pod (V(all)).
    type: str
    choices: [gpu, all]
    default: gpu
  gpu_resources:
    description: Resource name prefixes that make a pod a GPU pod (requests or limits of any container).
    type: list
    elements: str
    default: [nvidia.com/]
  force:
    description: Also evict pods that no controller manages (they are not recreated).
    type: bool
    default: false
  delete_emptydir_data:
    description: Also evict pods with emptyDir volumes (their data is lost).
    type: bool
    default: true
  grace_period:
    description: C(gracePeriodSeconds) for the evicted pods. When not set, each pod's own period applies.
    type: int
  timeout:
    description:
      - Seconds for the whole V(drain) (evictions, budget retries and the wait until the pods are gone)
        or for V(verify).
    type: int
    default: 600
  backoff_initial:
    description: Seconds before the first retry of a refused eviction; doubles up to O(backoff_max).
    type: float
    default: 1
  backoff_max:
    description: Longest wait between eviction retries (a server's C(retryAfterSeconds) is honoured up to it).
    type: float
    default: 30
  expect_gpus:
    description:
      - With V(verify), GPU UUIDs that C(hami.io/node-nvidia-register) must list as healthy.
      - When not set, only the advertised O(resource) is checked.
    type: list
    elements: str
  resource:
    description: With V(verify), the extended resource the device plugin advertises.
    type: str
    default: nvidia.com/gpu
  gate:
    description: With V(park), the gate that failed.
    type: str
  runbook:
    description: With V(park), where the runbook for that gate is.
    type: str
  message:
    description: With V(park), what the gate saw.
    type: str
    default: ""
extends_documentation_fragment:
  - hami.node.attributes
  - hami.node.k8s
attributes:
  check_mode:
    support: full
    details: Classifies the pods, reports the cordon and the evictions it would make, and writes nothing.
  diff_mode:
    support: none
notes:
  - The kubeconfig needs get/patch on nodes, list on pods, create on pods/eviction and create on events.
seealso:
  - name: Safely drain a node
    description: Kubernetes' eviction and PodDisruptionBudget semantics this module relies on.
    link: https://kubernetes.io/docs/tasks/administer-cluster/safely-drain-node/
"""

EXAMPLES = r"""
- name: Cordon and evict the GPU pods, waiting out PodDisruptionBudgets for up to 15 minutes
  hami.node.k8s_node_maintenance:
    name: gpu-node-1
    state: drain
    reason: "nvidia_driver: 570.172.08 -> 570.195.03"
    timeout: 900
  delegate_to: localhost

- name: Wait for the node to come back with its GPUs registered
  hami.node.k8s_node_maintenance:
    name: gpu-node-1
    state: verify
    expect_gpus: [GPU-4695a002-ab2d-092d-6db9-44e9ae3cb5a6]
    timeout: 300
  delegate_to: localhost
  register: api_gates

- name: Uncordon (only if this rollout cordoned it)
  hami.node.k8s_node_maintenance:
    name: gpu-node-1
    state: uncordon
  delegate_to: localhost
"""

RETURN = r"""
node:
  description: The node after the task.
  returned: success
  type: dict
  contains:
    name: {description: Node name., type: str}
    unschedulable: {description: The node is cordoned., type: bool}
    cordoned_by: {description: "C(hami.node), C(operator) or null.", type: str}
    ready: {description: The Ready condition is True., type: bool}
    maintenance: {description: "Our C(hami.io/maintenance-*) annotations.", type: dict}
cordoned_by:
  description: With V(drain) or V(cordon), who holds the cordon (C(hami.node) or C(operator)).
  returned: when state is drain or cordon
  type: str
evicted:
  description: Pods evicted (or, in check mode, that would be), as C(namespace/name).
  returned: when state is drain
  type: list
  elements: str
skipped:
  description: Pods on the node left alone, with the reason.
  returned: when state is drain
  type: dict
budget_refusals:
  description: How many evictions a PodDisruptionBudget refused (HTTP 429) before they went through.
  returned: when state is drain
  type: int
budget_wait_s:
  description: Seconds spent waiting for budgets.
  returned: when state is drain
  type: float
uncordoned:
  description: With V(uncordon), the cordon was ours and was lifted.
  returned: when state is uncordon
  type: bool
gates:
  description: With V(verify), each API-side gate with C(ok) and C(detail).
  returned: when state is verify
  type: dict
  sample: {node_ready: {ok: true, detail: Ready condition True}, device_plugin: {ok: false, detail: "..."}}
actions:
  description: The changes made, or planned in check mode.
  returned: always
  type: list
  elements: str
"""

import json  # noqa: E402
import time  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.hami.node.plugins.module_utils import _hami, _k8s, _maintenance  # noqa: E402


def run(module, api):
    p = module.params
    m = _maintenance.Maintenance(api, p["name"], time.monotonic, time.sleep, module.check_mode,
                                 log=module.debug)
    state = p["state"]
    result = {"changed": False}
    if state == "cordon":
        by, changed = m.cordon(p["reason"])
        result.update(changed=changed, cordoned_by=by)
    elif state == "drain":
        out = m.drain(p["reason"], p["pods"], p["gpu_resources"], p["force"], p["delete_emptydir_data"],
                      p["timeout"], p["grace_period"], p["backoff_initial"], p["backoff_max"])
        result.update(out, changed=bool(out["cordoned"] or out["evicted"]))
        result.pop("cordoned", None)
    elif state == "uncordon":
        uncordoned, changed = m.uncordon()
        result.update(changed=changed, uncordoned=uncordoned)
    elif state == "park":
        if not p["gate"] or not p["runbook"]:
            module.fail_json(msg="state=park needs gate and runbook")
        result["changed"] = m.park(p["gate"], p["runbook"], p["message"])
    elif state == "verify":
        gates = m.verify(p["expect_gpus"], p["resource"], p["timeout"], _hami.decode_register)
        result["gates"] = {k: {"ok": ok, "detail": detail} for k, (ok, detail) in gates.items()}
    result["node"] = _maintenance.summarize(api.get_node(p["name"]))
    result["actions"] = m.actions
    return result


def main():
    module = AnsibleModule(
        argument_spec=dict(
            name=dict(type="str", required=True),
            state=dict(type="str", default="status",
                       choices=["status", "cordon", "drain", "uncordon", "verify", "park"]),
            reason=dict(type="str", default="hami.node maintenance"),
            pods=dict(type="str", default="gpu", choices=["gpu", "all"]),
            gpu_resources=dict(type="list", elements="str", default=["nvidia.com/"]),
            force=dict(type="bool", default=False),
            delete_emptydir_data=dict(type="bool", default=True),
            grace_period=dict(type="int"),
            timeout=dict(type="int", default=600),
            backoff_initial=dict(type="float", default=1),
            backoff_max=dict(type="float", default=30),
            expect_gpus=dict(type="list", elements="str"),
            resource=dict(type="str", default="nvidia.com/gpu"),
            gate=dict(type="str"),
            runbook=dict(type="str"),
            message=dict(type="str", default=""),
            **_k8s.CONNECTION_ARGS,
        ),
        supports_check_mode=True,
    )
    _k8s.require_client(module)
    api = _k8s.Api(module, hint_var="kubeconfig (node_maintenance_kubeconfig)")
    try:
        module.exit_json(**run(module, api))
    except _maintenance.MaintenanceError as exc:
        module.fail_json(msg=exc.msg, **exc.result)
    except _k8s.ApiError as exc:
        hint = ""
        if exc.status in (401, 403):
            hint = ": check the kubeconfig's credentials and RBAC (get/patch nodes, list pods, create " \
                   "pods/eviction and events)"
        elif exc.status == 404:
            hint = ": no such node %s" % module.params["name"]
        module.fail_json(
            msg="node %s: API error %s %s%s" % (module.params["name"], exc.status, exc.message, hint),
            status=exc.status, body=json.dumps(exc.body)[:1000])


if __name__ == "__main__":
    main()
