"""Doctor's verdicts for the device plugin's Allocate refusals, from log fixtures of a real run
(``tests/integration/doctor/test_allocate_refusals.py`` produces them and checks they still match), and
the refusal patterns against the messages the plugin's code builds today (a reworded message must not
silently turn a verdict into "no problem found")."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from hami_agent.cli import main as agent_main
from hami_agent.doctor import logscan

pytestmark = pytest.mark.unit

LOGS = Path(__file__).resolve().parents[2] / "fixtures" / "logs"
EXPECTED = {"ALLOCATE_NO_NODE_LOCK", "ALLOCATE_LOCK_NAMES_OTHER_POD", "ALLOCATE_AMBIGUOUS_ADMISSION",
            "ALLOCATE_OVERCOMMIT_REFUSED", "ALLOCATE_KUBELET_CHOSE_OTHER_DEVICES"}


def doctor_codes(capsys, *argv: str) -> tuple[int, set[str]]:
    import json
    import logging

    root = logging.getLogger("hami_agent")
    saved = (list(root.handlers), root.level, root.propagate)
    try:
        rc = agent_main(["doctor", "logs", *argv, "--json"])
    finally:
        root.handlers[:], root.level, root.propagate = saved
    return rc, {v["code"] for v in json.loads(capsys.readouterr().out)["verdicts"]}


def test_plugin_log_names_every_refusal(capsys):
    rc, codes = doctor_codes(capsys, "--plugin", str(LOGS / "allocate_refusals_plugin.log"))
    assert rc == 1 and codes == EXPECTED  # and not the generic ALLOCATE_POD_NOT_FOUND


def test_kubelet_log_names_the_refusals_it_saw(capsys):
    rc, codes = doctor_codes(capsys, "--kubelet", str(LOGS / "allocate_refusals_kubelet.log"))
    assert rc == 1 and codes == EXPECTED - {"ALLOCATE_KUBELET_CHOSE_OTHER_DEVICES"}


def test_hamis_bare_message_and_api_timeouts_stay_allocate_pod_not_found(capsys, tmp_path):
    log = tmp_path / "plugin.log"
    log.write_text(
        "E1121 10:30:15.123456    1234 util.go:88] no binding pod found on node gpu-1\n"  # HAMi's plugin
        "E1121 10:30:16.123456    1234 server.py:169] failed to get pending pod: get node gpu-1: the RPC "
        "deadline budget is spent\n")
    rc, codes = doctor_codes(capsys, "--plugin", str(log))
    assert rc == 1 and codes == {"ALLOCATE_POD_NOT_FOUND"}


def _messages() -> dict[str, str]:
    """The refusal texts as the device plugin's code builds them now (its f-strings, called for real)."""
    from hami_agent.deviceplugin.allocator import Allocator
    from hami_agent.deviceplugin.budget import RpcBudget
    from hami_agent.deviceplugin.capacity import check_capacity, registered_devices
    from hami_agent.deviceplugin.errors import AllocationError
    from hami_agent.deviceplugin.owner import find_lock_owner
    from hami_agent.deviceplugin.podsource import MemoryPodSource
    from hami_agent.deviceplugin.settings import PluginSettings
    from hami_agent.protocol import keys
    from tests.unit.deviceplugin.fakes import ctr, gpu_uuid, hami_pod, lock_value, node_register

    out: dict[str, str] = {}

    def budget() -> RpcBudget:
        return RpcBudget("Allocate", 2.0)

    pods = MemoryPodSource("gpu-1")
    with pytest.raises(AllocationError) as e:
        find_lock_owner(pods, "gpu-1", budget(), lambda p: p)
    out["refused_no_lock"] = str(e.value)
    pods.node_annotations[keys.NODE_LOCK] = lock_value("ghost")
    with pytest.raises(AllocationError) as e:
        find_lock_owner(pods, "gpu-1", budget(), lambda p: p)
    out["refused_lock_other"] = str(e.value)
    owner = hami_pod("owner", "gpu-1", [ctr("c", 1)], f"{gpu_uuid(0)},NVIDIA,1000,10:;")
    rival = {"metadata": {"name": "rival", "namespace": "t", "uid": "u-r"},
             "spec": {"nodeName": "gpu-1", "containers": [ctr("c", 1)]}, "status": {"phase": "Pending"}}
    pods.add_pod(owner)
    pods.add_pod(rival)
    pods.node_annotations[keys.NODE_LOCK] = lock_value("owner")
    allocator = Allocator(PluginSettings(node_name="gpu-1"), pods)
    try:
        with pytest.raises(AllocationError) as e:
            allocator._owner(SimpleNamespace(resource_name="nvidia.com/gpu"), budget())
        out["refused_ambiguous"] = str(e.value)
    finally:
        allocator.close()
    node = {"metadata": {"annotations": {keys.NODE_REGISTER: node_register(1, devmem=1000)}}}
    big = hami_pod("big", "gpu-1", [ctr("c", 1)], f"{gpu_uuid(0)},NVIDIA,2000,10:;")
    with pytest.raises(AllocationError) as e:
        check_capacity(big, registered_devices(node, "gpu-1"), {}, "gpu-1")
    out["refused_overcommit"] = str(e.value)
    with pytest.raises(AllocationError) as e:
        check_capacity(hami_pod("x", "gpu-1", [ctr("c", 1)], f"{gpu_uuid(5)},NVIDIA,1,1:;"),
                       registered_devices(node, "gpu-1"), {}, "gpu-1")
    out["refused_overcommit (unregistered GPU)"] = str(e.value)
    from hami_agent.protocol.devices import ContainerDevice

    with pytest.raises(AllocationError) as e:
        Allocator._check_kubelet_choice("default/p", {"name": "c"}, [f"{gpu_uuid(1)}-0"],
                                        [ContainerDevice(gpu_uuid(0), "NVIDIA", 1000, 10)], frozenset())
    out["refused_kubelet_choice"] = str(e.value)
    return out


def test_patterns_match_the_messages_the_plugin_builds_today():
    table = logscan.ALLOCATE_REFUSAL_PATTERNS
    for key, message in _messages().items():
        want = key.split(" ")[0]
        hits = sorted(k for k in table if logscan._rx(table[k]).search(message))
        assert hits == [want], (key, hits, message)
        # as the kubelet reports it (its log and the pod's event)
        wrapped = f"Allocate failed due to rpc error: code = Unknown desc = {message}, which is unexpected"
        assert logscan._rx(table[want]).search(wrapped)
    assert {k.split(" ")[0] for k in _messages()} == set(table)  # every pattern checked
