"""A node name longer than a label value (issue 21 item 4): the pod still schedules, the annotation
carries the full name, the ``hami.io/vgpu-node`` label a valid short form, and the extender's own pod
informer (which selects on that label) counts the allocation."""

from __future__ import annotations

import time

import pytest

from hami_agent.protocol import keys
from hami_agent.protocol.labels import vgpu_node_label
from tests.integration.scheduler.cluster import gpu_node, gpu_pod, stack

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

NODE = "gpu-node-pool-a100-80gb-europe-west4-b.compute.internal.example-0001"  # 69 characters


def _bound(api, name: str, timeout: float = 15.0) -> dict | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pod = api.get("Pod", "default", name)
        if pod and pod["spec"].get("nodeName"):
            return pod
        time.sleep(0.05)
    return None


def test_pod_on_a_node_whose_name_is_no_label_value_schedules_and_is_counted(api_server):
    api_server.create(gpu_node(NODE, gpus=1, mem=16384))
    with stack(api_server):
        api_server.create(gpu_pod("p1", mem=12000))
        pod = _bound(api_server, "p1")
    assert pod is not None, "the assignment patch was refused (label value over 63 characters?)"
    assert pod["spec"]["nodeName"] == NODE
    assert pod["metadata"]["annotations"][keys.VGPU_NODE] == NODE
    label = pod["metadata"]["labels"][keys.VGPU_NODE]
    assert label == vgpu_node_label(NODE) and len(label) <= 63
    # A fresh extender knows p1 only through its pod informer, which selects on the label: a second pod
    # that would over-commit the GPU must not be placed there.
    with stack(api_server):
        api_server.create(gpu_pod("p2", mem=12000))
        assert _bound(api_server, "p2", timeout=3.0) is None
        api_server.create(gpu_pod("p3", mem=4000))  # what is left still schedules
        assert _bound(api_server, "p3") is not None
