"""Node registration loop: device list rules (Project-HAMi/HAMi
pkg/device-plugin/nvidiadevice/nvinternal/plugin/register.go) and the loop's behaviour
against a fake API client (the HTTP version is in tests/integration/register)."""

from __future__ import annotations

import json
import logging
import threading

import pytest

from hami_agent.config import build_config
from hami_agent.deviceplugin.node_register import (
    RESULT_ERROR,
    RESULT_PATCHED,
    RESULT_PAUSED,
    RESULT_UNCHANGED,
    RESULT_WAITING,
    NodeRegistrar,
    build_node_devices,
    device_type,
    mig_profiles_from_names,
)
from hami_agent.k8s.errors import KubeError
from hami_agent.nvml.model import Gpu, Snapshot
from hami_agent.protocol import NodeDevice, decode_node_devices, keys

pytestmark = pytest.mark.unit
REG = keys.NODE_REGISTER


def gpu(index=0, *, uuid=None, name="NVIDIA A100-SXM4-80GB", memory_mib=81920, numa=0, mig_enabled=False,
        healthy=True):
    return Gpu(index=index, uuid=uuid or f"GPU-{index:08d}", name=name, type="", memory_mib=memory_mib,
               numa=numa, pci_bus_id=f"00000000:{index:02X}:00.0", mig_capable=True, mig_enabled=mig_enabled,
               mig_pending=False, healthy=healthy, unhealthy_reason=None if healthy else "xid-79")


def snap(*gpus, status="ok", error=None):
    return Snapshot(status=status, gpus=tuple(gpus), error=error)


def cfg(nvidia=None, node=None, agent=None, node_name="gpu-1"):
    agent_doc = {"migApplyLockPath": "/nonexistent/hami-mig.lock", **(agent or {})}
    doc = {"nvidia": nvidia or {}, "agent": agent_doc}
    if node is not None:
        doc["nodeconfig"] = [{"name": node_name, **node}]
    return build_config([doc], node_name)


class FakeClient:
    """Records calls; keeps one node's annotations like the API would (merge-patch, None deletes)."""

    def __init__(self, annotations=None):
        self.annotations = dict(annotations or {})
        self.gets = 0
        self.patches: list[dict] = []
        self.fail_get: Exception | None = None
        self.fail_patch: Exception | None = None

    def get_node(self, name):
        self.gets += 1
        if self.fail_get:
            raise self.fail_get
        return {"metadata": {"name": name, "annotations": dict(self.annotations)}}

    def patch_node_annotations(self, name, annotations, resource_version=None):
        if self.fail_patch:
            raise self.fail_patch
        self.patches.append(dict(annotations))
        for k, v in annotations.items():
            if v is None:
                self.annotations.pop(k, None)
            else:
                self.annotations[k] = v
        return {}


# ---------------------------------------------------------------- device list rules

def test_type_prefix_matches_hami_register_output():
    # HAMi registers e.g. "NVIDIA-NVIDIA L40S" / "NVIDIA-NVIDIA GeForce RTX 3070" (names get the prefix)
    # HAMi v2.10 register.go: prefix only when the NVML name does not start with "NVIDIA".
    assert device_type("NVIDIA A100-SXM4-80GB") == "NVIDIA A100-SXM4-80GB"
    assert device_type("Tesla V100-PCIE-32GB") == "NVIDIA-Tesla V100-PCIE-32GB"
    assert device_type("NVIDIA-A100") == "NVIDIA-A100"


def test_hami_core_fields_with_scaling():
    c = cfg(nvidia={"deviceSplitCount": 4, "deviceMemoryScaling": 1.5, "deviceCoreScaling": 2})
    devices, skipped = build_node_devices(snap(gpu(0, numa=-1), gpu(1, numa=None), gpu(2, numa=1)), c)
    assert skipped == []
    assert devices[0] == NodeDevice(id="GPU-00000000", index=0, count=4, devmem=122880, devcore=200,
                                    type="NVIDIA A100-SXM4-80GB", numa=0, mode="hami-core",
                                    health=True)
    assert [d.numa for d in devices] == [0, 0, 1]


def test_filterdevices_by_uuid_and_index():
    c = cfg(node={"filterdevices": {"uuid": ["GPU-00000001"], "index": [2]}})
    devices, skipped = build_node_devices(snap(gpu(0), gpu(1), gpu(2), gpu(3)), c)
    assert [d.index for d in devices] == [0, 3]
    assert {s.index for s in skipped} == {1, 2}


def test_memory_not_supported_uses_preconfigured_else_skips():
    unified = gpu(0, name="NVIDIA GB10", memory_mib=None)
    devices, skipped = build_node_devices(snap(unified), cfg())
    assert devices == [] and "GetMemoryInfo not supported" in skipped[0].reason
    devices, _ = build_node_devices(snap(unified), cfg(nvidia={"preConfiguredDeviceMemory": 120000,
                                                               "deviceMemoryScaling": 2}))
    assert devices[0].devmem == 240000


def test_unhealthy_gpu_and_stuck_nvml_register_health_false():
    devices, _ = build_node_devices(snap(gpu(0), gpu(1, healthy=False)), cfg())
    assert [d.health for d in devices] == [True, False]
    devices, _ = build_node_devices(snap(gpu(0), status="stuck"), cfg())
    assert devices[0].health is False


def test_mig_enabled_gpus_not_shared_in_hami_core_mode():
    # seed 003's node: GPUs 0-2 in MIG mode, the rest full GPUs
    gpus = [gpu(i, name="NVIDIA H20", memory_mib=97871, mig_enabled=i < 3) for i in range(8)]
    devices, skipped = build_node_devices(snap(*gpus), cfg())
    assert [d.index for d in devices] == [3, 4, 5, 6, 7]
    assert [s.index for s in skipped] == [0, 1, 2] and "MIG mode is enabled" in skipped[0].reason


def test_mig_mode_profiles_count_devcore_and_no_scaling():
    c = cfg(nvidia={"deviceMemoryScaling": 2, "migProfileAllowlist": [
        {"models": ["H20"], "profiles": ["1g.12gb", "1g.24gb", "2g.24gb", "3g.48gb", "7g.96gb"]}]},
        node={"operatingmode": "mig"})
    devices, skipped = build_node_devices(snap(gpu(0, name="NVIDIA H20", memory_mib=97871),
                                               gpu(1, name="NVIDIA L40S", memory_mib=46068)), c)
    assert [s.index for s in skipped] == [1] and "migProfileAllowlist" in skipped[0].reason
    (d,) = devices
    assert (d.mode, d.devmem, d.devcore, d.count) == ("mig", 97871, 100, 7)
    by_name = {p.name: p for p in d.mig_profiles}
    assert [pl.start for pl in by_name["1g.12gb"].placements] == [0, 1, 2, 3, 4, 5, 6]
    assert [pl.start for pl in by_name["1g.24gb"].placements] == [0, 2, 4, 6]
    assert [pl.start for pl in by_name["2g.24gb"].placements] == [0, 2, 4]
    assert [(pl.start, pl.size) for pl in by_name["3g.48gb"].placements] == [(0, 4), (4, 4)]
    assert [(pl.start, pl.size) for pl in by_name["7g.96gb"].placements] == [(0, 8)]
    p3 = by_name["3g.48gb"]
    assert (p3.core, p3.memory_mb, p3.slice_count) == (43, 49152, 3)


def test_mig_profiles_from_names_ignores_unparsable():
    assert mig_profiles_from_names(["bogus", "1g.5gb"], 40960)[0].name == "1g.5gb"
    assert len(mig_profiles_from_names(["bogus"], 40960)) == 0


# ---------------------------------------------------------------- register_once

def make(client, snapshot, c=None, **kw):
    holder = {"snap": snapshot}
    r = NodeRegistrar(client, "gpu-1", lambda: holder["snap"], c or cfg(), **kw)
    return r, holder


def test_patches_first_time_then_only_on_change():
    client = FakeClient()
    r, holder = make(client, snap(gpu(0), gpu(1)))
    assert r.register_once() and r.last_result == RESULT_PATCHED
    assert len(client.patches) == 1
    assert [d.id for d in decode_node_devices(client.annotations[REG])] == ["GPU-00000000", "GPU-00000001"]
    assert r.register_once() and r.last_result == RESULT_UNCHANGED
    assert r.register_once() and len(client.patches) == 1
    holder["snap"] = snap(gpu(0), gpu(1, healthy=False))
    assert r.register_once() and r.last_result == RESULT_PATCHED and len(client.patches) == 2
    assert [d.health for d in decode_node_devices(client.annotations[REG])] == [True, False]


def test_externally_deleted_annotation_is_restored():
    client = FakeClient()
    r, _ = make(client, snap(gpu(0)))
    r.register_once()
    client.annotations.pop(REG)
    assert r.register_once() and r.last_result == RESULT_PATCHED
    assert REG in client.annotations


@pytest.mark.parametrize("garbage", ["{{{", "GPU-a,1,2", "[{\"id\": 5}]", "null-ish:"])
def test_malformed_existing_annotation_is_overwritten(garbage, caplog):
    client = FakeClient({REG: garbage})
    r, _ = make(client, snap(gpu(0)))
    with caplog.at_level(logging.WARNING, logger="hami_agent"):
        assert r.register_once()
    assert decode_node_devices(client.annotations[REG])[0].id == "GPU-00000000"
    assert "malformed, overwriting" in caplog.text


def test_get_and_patch_errors_are_reported_in_the_seed_words(caplog):
    client = FakeClient()
    client.fail_get = KubeError(0, "connection refused", "boom", "get", "node", "gpu-1")
    r, _ = make(client, snap(gpu(0)))
    with caplog.at_level(logging.ERROR, logger="hami_agent"):
        assert not r.register_once()
    assert r.last_result == RESULT_ERROR and r.last_error.startswith("get node error")
    client.fail_get = None
    client.fail_patch = KubeError(403, "Forbidden", "nodes is forbidden", "patch", "node", "gpu-1")
    assert not r.register_once()
    assert "patch node error: 403 Forbidden on node gpu-1" in caplog.text
    client.fail_patch = RuntimeError("socket closed")
    assert not r.register_once()
    assert "patch node error: socket closed" in caplog.text


def test_mig_apply_lock_pauses_registration(tmp_path, caplog):
    lock = tmp_path / "hami-mig-apply.lock"
    lock.write_text("")
    client = FakeClient()
    r, _ = make(client, snap(gpu(0)), cfg(agent={"migApplyLockPath": str(lock)}))
    with caplog.at_level(logging.INFO, logger="hami_agent"):
        assert not r.register_once()
        assert not r.register_once()
    assert r.last_result == RESULT_PAUSED and client.gets == 0 and client.patches == []
    assert caplog.text.count("MIG apply lock file detected") == 1
    lock.unlink()
    assert r.register_once() and len(client.patches) == 1


def test_waits_for_first_inventory_and_keeps_annotation_when_nvml_fails():
    client = FakeClient({REG: "previous"})
    r, holder = make(client, snap(status="starting"))
    assert not r.register_once() and r.last_result == RESULT_WAITING and client.gets == 0
    holder["snap"] = snap(status="error", error="nvml Init err: Driver Not Loaded")
    assert not r.register_once() and r.last_result == RESULT_ERROR
    assert "nvml Init err" in r.last_error
    assert client.annotations[REG] == "previous"  # nothing known: leave the last registration alone


def test_snapshot_source_object_with_snapshot_method():
    class Supervisor:
        def snapshot(self):
            return snap(gpu(0))

    client = FakeClient()
    r = NodeRegistrar(client, "gpu-1", Supervisor(), cfg())
    assert r.register_once() and json.loads(client.annotations[REG])[0]["id"] == "GPU-00000000"


def test_empty_node_name_is_a_clear_error():
    with pytest.raises(ValueError, match="NODE_NAME"):
        NodeRegistrar(FakeClient(), "", snap, cfg())


def test_seed_log_lines_verbatim(caplog):
    client = FakeClient()
    r, _ = make(client, snap(gpu(0, name="NVIDIA A100", numa=0)), interval_s=30, retry_s=5)
    stop = threading.Event()
    orig = client.patch_node_annotations

    def patch_and_stop(*a, **kw):
        stop.set()  # one iteration is enough; run() logs the heartbeat line before waiting
        return orig(*a, **kw)

    client.patch_node_annotations = patch_and_stop
    with caplog.at_level(logging.INFO, logger="hami_agent"):
        r.run(stop)
    text = caplog.text
    assert "Starting WatchAndRegister" in text
    assert "start working on the devices" in text
    assert "nvml registered device id=0, memory=81920, type=NVIDIA A100, numa=0" in text
    assert "patch node with the following annos map[hami.io/node-nvidia-register:[{" in text
    assert "Successfully registered annotation. Next check in 30s seconds..." in text


def test_retry_log_line_and_loop_survives_errors(caplog):
    client = FakeClient()
    calls = {"n": 0}
    stop = threading.Event()

    def failing_get(name):
        calls["n"] += 1
        if calls["n"] >= 3:
            stop.set()
        raise KubeError(503, "ServiceUnavailable", "down", "get", "node", name)

    client.get_node = failing_get
    r, _ = make(client, snap(gpu(0)), interval_s=30, retry_s=0.01)
    with caplog.at_level(logging.INFO, logger="hami_agent"):
        r.run(stop)
    assert calls["n"] == 3
    assert "get node error: 503 Service Unavailable on node gpu-1" in caplog.text
    assert "Retrying in 10ms seconds..." in caplog.text
    r5, _ = make(FakeClient(), snap(gpu(0)), retry_s=5)
    assert r5.retry_s == 5.0


def test_mode_override_follows_the_plugin_not_the_config():
    c = cfg(node={"operatingmode": "mig"})
    client = FakeClient()
    r = NodeRegistrar(client, "gpu-1", lambda: snap(gpu(0)), c, mode="hami-core")
    assert r.register_once()
    (d,) = decode_node_devices(client.annotations[REG])
    assert (d.mode, d.count) == ("hami-core", 10)
