"""hami.node.hami_node against the simulated API server (tests/sim/apiserver.py), real kubernetes client."""

from __future__ import annotations

import datetime

import pytest

from tests.integration.plugins.ansible_runner import ansible_env, run_playbook

pytestmark = pytest.mark.integration

REGISTER = (
    '[{"id":"GPU-4695a002-ab2d-092d-6db9-44e9ae3cb5a6","index":3,"count":10,"devmem":97871,'
    '"devcore":100,"type":"NVIDIA-NVIDIA H20","mode":"hami-core","health":true},'
    '{"id":"GPU-39862681-62c1-28f7-0244-5563c070a260","index":4,"count":10,"devmem":97871,'
    '"devcore":100,"type":"NVIDIA-NVIDIA H20","mode":"hami-core","health":true}]'
)


def rfc3339(delta_s: float) -> str:
    when = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=delta_s)
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def node(name: str, annotations: dict) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "annotations": annotations},
        "status": {"allocatable": {"nvidia.com/gpu": "20"}},
    }


@pytest.mark.timeout(240)
def test_hami_node_operations(tmp_path, api_server):
    old_hs = (datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(seconds=120)).strftime(
        "%Y-%m-%d %H:%M:%S"
    )
    api_server.create(
        node(
            "gpu-1",
            {
                "hami.io/node-nvidia-register": REGISTER,
                "hami.io/node-handshake": "Requesting_" + old_hs,
                "hami.io/mutex.lock": rfc3339(-600) + ",default,train-0",
            },
        )
    )
    api_server.create(node("gpu-2", {"hami.io/mutex.lock": rfc3339(-10) + ",default,train-1"}))
    kc = api_server.kubeconfig_path
    book = f"""
- name: HAMi node repairs from the runbooks
  hosts: localhost
  gather_facts: false
  module_defaults:
    hami.node.hami_node:
      kubeconfig: "{kc}"
      api_timeout: 5
  tasks:
    - name: Info
      hami.node.hami_node:
        name: gpu-1
      register: info
    - name: Decoded
      ansible.builtin.assert:
        that:
          - info is not changed
          - info.node.devices | length == 2 and info.node.devices[0].index == 3
          - info.node.handshake.state == 'requesting' and info.node.handshake.age_s >= 100
          - info.node.lock.stale and info.node.lock.pod == 'train-0'
          - info.node.allocatable_gpus == '20'
    - name: Clear the stale lock, check mode
      hami.node.hami_node: {{name: gpu-1, action: clear_lock}}
      check_mode: true
      diff: true
      register: planned
    - name: Clear the stale lock
      hami.node.hami_node: {{name: gpu-1, action: clear_lock}}
      register: cleared
    - name: Again
      hami.node.hami_node: {{name: gpu-1, action: clear_lock}}
      register: cleared_again
    - name: A fresh lock is refused
      hami.node.hami_node: {{name: gpu-2, action: clear_lock}}
      register: refused
      ignore_errors: true
    - name: Unless forced
      hami.node.hami_node: {{name: gpu-2, action: clear_lock, force: true}}
      register: forced
    - name: Cordon a GPU
      hami.node.hami_node:
        name: gpu-1
        action: cordon
        devices: [GPU-4695a002-ab2d-092d-6db9-44e9ae3cb5a6]
      register: cordoned
    - name: Cordon again
      hami.node.hami_node:
        name: gpu-1
        action: cordon
        devices: [GPU-4695a002-ab2d-092d-6db9-44e9ae3cb5a6]
      register: cordoned_again
    - name: Reset the handshake
      hami.node.hami_node: {{name: gpu-1, action: reset_handshake}}
      register: reset
    - name: Missing node
      hami.node.hami_node: {{name: nope}}
      register: missing
      ignore_errors: true
    - name: Results
      ansible.builtin.assert:
        that:
          - planned is changed and 'hami.io/mutex.lock' in planned.diff.before
          - "'hami.io/mutex.lock' not in planned.diff.after"
          - cleared is changed and cleared.node.lock is none
          - cleared_again is not changed
          - refused is failed and 'it is not stale' in refused.msg and 'default/train-1' in refused.msg
          - forced is changed
          - cordoned is changed
          - cordoned.node.cordoned_devices == ['GPU-4695a002-ab2d-092d-6db9-44e9ae3cb5a6']
          - cordoned_again is not changed
          - reset is changed and reset.node.handshake.state == 'absent'
          - missing is failed and '404' in missing.msg
"""
    proc = run_playbook(tmp_path, book, ansible_env(tmp_path, None, stubs=False))
    assert proc.returncode == 0
    ann = api_server.get("Node", None, "gpu-1")["metadata"]["annotations"]
    assert "hami.io/mutex.lock" not in ann and "hami.io/node-handshake" not in ann
    assert ann["hami.io/device-cordon"] == "GPU-4695a002-ab2d-092d-6db9-44e9ae3cb5a6"
    assert ann["hami.io/node-nvidia-register"] == REGISTER
    assert "hami.io/mutex.lock" not in api_server.get("Node", None, "gpu-2")["metadata"]["annotations"]


@pytest.mark.timeout(60)
def test_clear_lock_conflict_is_reported_not_overwritten(api_server, monkeypatch):
    """Someone changes the node between our read and our patch: the API's 409 surfaces, nothing is lost."""
    from ansible_collections.hami.node.plugins.modules import hami_node

    from tests.unit.plugins.moduletest import run_module

    api_server.create(node("gpu-3", {"hami.io/mutex.lock": rfc3339(-900) + ",ns,old"}))
    real_get = hami_node.HamiNode.get

    def racing_get(self):
        seen = real_get(self)
        # The scheduler re-locks the node for another pod right after our read.
        api_server.patch(
            "Node",
            None,
            "gpu-3",
            {"metadata": {"annotations": {"hami.io/mutex.lock": rfc3339(0) + ",ns,new"}}},
        )
        return seen

    monkeypatch.setattr(hami_node.HamiNode, "get", racing_get)
    res = run_module(
        hami_node.main,
        {"name": "gpu-3", "action": "clear_lock", "kubeconfig": api_server.kubeconfig_path},
        monkeypatch,
    )
    assert res["failed"] and "409" in res["msg"] and "resourceVersion conflict" in res["msg"]
    assert api_server.get("Node", None, "gpu-3")["metadata"]["annotations"]["hami.io/mutex.lock"].endswith(
        ",ns,new"
    )
