"""Allocate's capacity check decodes the node register annotation and the other pods' allocations once
per distinct text (issue 31: the decode was a fifth of an Allocate's CPU); the answers are the same as
decoding afresh, and a text that does not decode is refused every time."""

import pytest

from hami_agent.deviceplugin import capacity
from hami_agent.deviceplugin.errors import AllocationError
from hami_agent.protocol import NodeDevice, encode_node_devices, keys
from hami_agent.protocol.devices import ContainerDevice, encode_pod_devices

pytestmark = pytest.mark.unit

REGISTER = encode_node_devices([NodeDevice(id="GPU-a", count=10, devmem=8192, devcore=100, type="NVIDIA-T4",
                                           health=True, mode="hami-core")])


def pod(uid: str, mem: int) -> dict:
    devs = encode_pod_devices([[ContainerDevice(uuid="GPU-a", type="NVIDIA", usedmem=mem,
                                                usedcores=10)]])
    return {"metadata": {"uid": uid, "annotations": {keys.DEVICES_ALLOCATED: devs, keys.VGPU_NODE: "n1",
                                                    keys.BIND_PHASE: keys.BIND_PHASE_SUCCESS}},
            "spec": {"containers": [{"name": "c"}]}}


def test_same_texts_are_decoded_once_with_the_same_answers():
    capacity._node_devices.cache_clear()  # noqa: SLF001
    capacity._pod_devices.cache_clear()  # noqa: SLF001
    node = {"metadata": {"annotations": {keys.NODE_REGISTER: REGISTER}}}
    first = capacity.registered_devices(node, "n1")
    pods = [pod("a", 1024), pod("b", 2048), pod("c", 1024)]
    held = capacity.held_by_others(pods, "n1", exclude_uid="c")
    for _ in range(3):
        assert capacity.registered_devices(node, "n1") == first
        assert capacity.held_by_others(pods, "n1", exclude_uid="c") == held
    assert held["GPU-a"].mem == 3072 and held["GPU-a"].slots == 2
    assert capacity._node_devices.cache_info().misses == 1  # noqa: SLF001
    assert capacity._pod_devices.cache_info().misses == 2  # noqa: SLF001 - "a" and "b": two texts


def test_a_bad_register_annotation_is_refused_every_time():
    node = {"metadata": {"annotations": {keys.NODE_REGISTER: "not-a-register-list"}}}
    for _ in range(2):
        with pytest.raises(AllocationError, match="cannot decode"):
            capacity.registered_devices(node, "n1")
