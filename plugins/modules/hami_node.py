#!/usr/bin/python
# SPDX-License-Identifier: Apache-2.0
# Copyright: hami.node contributors

from __future__ import annotations

DOCUMENTATION = r"""
module: hami_node
short_description: Inspect and repair HAMi's node annotations (register, handshake, lock, device cordon)
version_added: 0.1.0
author:
  - hami.node developers
description:
  - The node operations from the HAMi debugging guides (seeds 000 and 001), done safely through the
    Kubernetes API.
  - V(info) shows the node's C(hami.io/*) annotations. It decodes the registered devices (JSON, or the
    legacy text of HAMi 2.7 and older) and shows the handshake state and age, the node lock holder and
    age, and the cordoned GPUs.
  - V(clear_lock) removes a stale C(hami.io/mutex.lock), one older than O(lock_expiry) seconds (HAMi's
    default is 5 minutes). It refuses a fresh lock unless O(force=true). The removal is a JSON
    merge-patch that carries the node's C(resourceVersion), so a concurrent change makes it fail and
    nothing is overwritten.
  - V(reset_handshake) deletes C(hami.io/node-handshake). The scheduler then writes C(Requesting_<time>)
    again and re-reads the node's devices, which re-triggers registration.
  - V(cordon) and V(uncordon) add GPU UUIDs to, or remove them from, C(hami.io/device-cordon). HAMi 2.10+
    then keeps new pods off those GPUs. V(uncordon) with no O(devices) clears the list.
  - Runs where the Python C(kubernetes) client is installed, usually the controller
    (C(delegate_to=localhost)) or a node with a kubeconfig.
requirements:
  - kubernetes (Python client) >= 24.2
options:
  name:
    description: Node name.
    type: str
    required: true
  action:
    description: What to do.
    type: str
    choices: [info, clear_lock, reset_handshake, cordon, uncordon]
    default: info
  devices:
    description: GPU UUIDs for V(cordon) and V(uncordon).
    type: list
    elements: str
    default: []
  force:
    description:
      - With V(clear_lock), remove the lock even when it is not stale.
      - Only do this when its owner pod is gone.
    type: bool
    default: false
  lock_expiry:
    description:
      - Seconds after which a node lock counts as stale.
      - This matches the scheduler's C(--node-lock-timeout).
    type: int
    default: 300
extends_documentation_fragment:
  - hami.node.attributes
  - hami.node.k8s
attributes:
  check_mode:
    support: full
    details: Decides and reports the change, but sends no patch.
  diff_mode:
    support: full
    details: Shows the node's C(hami.io/*) annotations before and after.
"""

EXAMPLES = r"""
- name: Show what HAMi sees on a node
  hami.node.hami_node:
    name: gpu-node-1
  delegate_to: localhost
  register: hami

- name: Print the decoded devices and the handshake age
  ansible.builtin.debug:
    msg: "{{ hami.node.devices | map(attribute='id') | list }} handshake {{ hami.node.handshake }}"

- name: Clear a stale node lock (pods stuck binding with "node lock contention")
  hami.node.hami_node:
    name: gpu-node-1
    action: clear_lock
  delegate_to: localhost

- name: Keep new pods off a failing GPU
  hami.node.hami_node:
    name: gpu-node-1
    action: cordon
    devices: [GPU-4695a002-ab2d-092d-6db9-44e9ae3cb5a6]
    kubeconfig: /etc/kubernetes/admin.conf
"""

RETURN = r"""
node:
  description: The node's HAMi state after the task, decoded.
  returned: success
  type: dict
  contains:
    name: {description: Node name., type: str}
    annotations: {description: All C(hami.io/*) annotations as stored., type: dict}
    devices:
      description: Registered GPUs decoded from C(hami.io/node-nvidia-register).
      type: list
      elements: dict
      sample: [{id: GPU-4695a002-ab2d-092d-6db9-44e9ae3cb5a6, index: 3, count: 10, devmem: 97871,
                devcore: 100,
                type: NVIDIA-NVIDIA H20, numa: 0, mode: hami-core, health: true, mig_profiles: []}]
    register_error: {description: Why the register annotation could not be decoded, or null., type: str}
    handshake:
      description: State (requesting, reported, deleted, unknown, absent), time (UTC) and age in seconds.
      type: dict
      sample: {state: requesting, time: "2026-11-21T10:30:00Z", age_s: 12.0}
    lock:
      description: Null, or the node lock's time, namespace, pod, age_s and stale.
      type: dict
    cordoned_devices: {description: UUIDs in C(hami.io/device-cordon)., type: list, elements: str}
    allocatable_gpus: {description: The node's allocatable C(nvidia.com/gpu)., type: str}
    unschedulable: {description: The node is cordoned in Kubernetes., type: bool}
actions:
  description: The changes made, or planned in check mode.
  returned: always
  type: list
  elements: str
"""

import datetime  # noqa: E402
import json  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.hami.node.plugins.module_utils import _hami, _k8s  # noqa: E402
from ansible_collections.hami.node.plugins.module_utils._k8s import ApiException  # noqa: E402


class HamiNode:
    def __init__(self, module):
        self.module = module
        self.p = module.params
        self.core = _k8s.k8s_client.CoreV1Api(_k8s.api_client(module))
        self.actions = []

    def _err(self, verb, exc):
        reason = getattr(exc, "reason", "") or ""
        status = getattr(exc, "status", None)
        msg = "%s node error: %s %s on node %s" % (verb, status or "", reason, self.p["name"])
        if status == 409:
            msg += ": the node changed meanwhile (resourceVersion conflict); re-run the task"
        elif status == 404:
            msg += ": no such node"
        elif status in (401, 403):
            msg += ": check the kubeconfig's credentials and RBAC (get/patch nodes)"
        self.module.fail_json(msg=msg, status=status, actions=self.actions)

    def get(self):
        try:
            resp = self.core.read_node(
                self.p["name"], _preload_content=False, _request_timeout=self.p["api_timeout"]
            )
            return json.loads(resp.data)
        except ApiException as exc:
            self._err("get", exc)
        except Exception as exc:  # urllib3 errors: connection refused, timeouts
            self.module.fail_json(
                msg="get node error: cannot reach the API server for node %s: %s" % (self.p["name"], exc),
                actions=self.actions,
            )

    def patch(self, annotations, resource_version):
        body = {"metadata": {"annotations": annotations, "resourceVersion": resource_version}}
        try:
            resp = self.core.patch_node(
                self.p["name"],
                body,
                _content_type="application/merge-patch+json",
                _preload_content=False,
                _request_timeout=self.p["api_timeout"],
            )
            return json.loads(resp.data)
        except ApiException as exc:
            self._err("patch", exc)
        except Exception as exc:
            self.module.fail_json(
                msg="patch node error: cannot reach the API server for node %s: %s" % (self.p["name"], exc),
                actions=self.actions,
            )

    def run(self):
        now = datetime.datetime.now(_hami.UTC)
        node = self.get()
        summary = _hami.summarize(node, now, self.p["lock_expiry"])
        ann = (node.get("metadata") or {}).get("annotations") or {}
        patch = self.plan(summary, ann)
        result = {"changed": bool(patch), "actions": self.actions, "node": summary}
        before = dict(summary["annotations"])
        after = dict(before)
        for k, v in (patch or {}).items():
            if v is None:
                after.pop(k, None)
            else:
                after[k] = v
        if self.module._diff:
            result["diff"] = {"before": before, "after": after}
        if patch and not self.module.check_mode:
            node = self.patch(patch, summary["resource_version"])
            result["node"] = _hami.summarize(node, now, self.p["lock_expiry"])
        elif patch:
            result["node"] = dict(
                summary,
                annotations=after,
                cordoned_devices=_hami.decode_cordon(after.get(_hami.DEVICE_CORDON)),
            )
        return result

    def plan(self, summary, ann):
        action = self.p["action"]
        if action == "info":
            return None
        if action == "clear_lock":
            if _hami.NODE_LOCK not in ann:
                return None
            lock = summary["lock"]
            if lock is not None and not lock["stale"] and not self.p["force"]:
                self.module.fail_json(
                    msg="node lock on %s is held by %s/%s since %s (%ds ago, expiry %ds): it is not stale. "
                    "Wait for the bind to finish or the lock to expire; use force=true only if that pod "
                    "is gone."
                    % (
                        self.p["name"],
                        lock["namespace"],
                        lock["pod"],
                        lock["time"],
                        lock["age_s"],
                        self.p["lock_expiry"],
                    ),
                    node=summary,
                )
            self.actions.append("remove %s=%s" % (_hami.NODE_LOCK, ann[_hami.NODE_LOCK]))
            return {_hami.NODE_LOCK: None}
        if action == "reset_handshake":
            if _hami.NODE_HANDSHAKE not in ann:
                return None
            self.actions.append("remove %s=%s" % (_hami.NODE_HANDSHAKE, ann[_hami.NODE_HANDSHAKE]))
            return {_hami.NODE_HANDSHAKE: None}
        current = summary["cordoned_devices"]
        known = {d["id"] for d in summary["devices"]}
        if action == "cordon":
            if not self.p["devices"]:
                self.module.fail_json(msg="action=cordon needs devices (GPU UUIDs, see action=info)")
            unknown = [u for u in self.p["devices"] if known and u not in known]
            if unknown:
                self.module.warn(
                    "devices %s are not registered on node %s (registered: %s)"
                    % (unknown, self.p["name"], sorted(known))
                )
            wanted = current + [u for u in self.p["devices"] if u not in current]
        else:
            wanted = [u for u in current if self.p["devices"] and u not in self.p["devices"]]
        if wanted == current:
            return None
        self.actions.append("set %s=%s" % (_hami.DEVICE_CORDON, ",".join(wanted)))
        return {_hami.DEVICE_CORDON: _hami.encode_cordon(wanted)}


def main():
    module = AnsibleModule(
        argument_spec=dict(
            name=dict(type="str", required=True),
            action=dict(
                type="str",
                default="info",
                choices=["info", "clear_lock", "reset_handshake", "cordon", "uncordon"],
            ),
            devices=dict(type="list", elements="str", default=[]),
            force=dict(type="bool", default=False),
            lock_expiry=dict(type="int", default=_hami.LOCK_EXPIRY_S),
            **_k8s.CONNECTION_ARGS,
        ),
        supports_check_mode=True,
    )
    _k8s.require_client(module)
    module.exit_json(**HamiNode(module).run())


if __name__ == "__main__":
    main()
