"""Registration loop against the simulated API server over real HTTP with the real kubernetes client:
patches only on change, survives an API outage and re-registers, overwrites malformed annotations."""

from __future__ import annotations

import threading
import time

import pytest

from hami_agent.config import build_config
from hami_agent.deviceplugin.node_register import RESULT_ERROR, NodeRegistrar
from hami_agent.k8s.client import KubeClient, RetryPolicy
from hami_agent.nvml.model import Gpu, Snapshot
from hami_agent.protocol import decode_node_devices, keys

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]
NODE = "gpu-1"
NODE_PATH = rf"/api/v1/nodes/{NODE}$"


def gpu(index, healthy=True):
    return Gpu(index=index, uuid=f"GPU-{index:08x}-0000-0000-0000-000000000000", name="NVIDIA H20",
               type="NVIDIA H20", memory_mib=97871, numa=index // 4, pci_bus_id=f"00000000:{index:02X}:00.0",
               mig_capable=True, mig_enabled=False, mig_pending=False, healthy=healthy)


class Source:
    """A stand-in for NvmlSupervisor.snapshot() whose inventory the test changes."""

    def __init__(self, *gpus):
        self.value = Snapshot(status="ok", gpus=tuple(gpus))

    def snapshot(self):
        return self.value


def wait_for(cond, timeout=10.0, step=0.02):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(step)
    return False


def node_obj(annotations=None):
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": NODE, "annotations": dict(annotations or {}), "labels": {"gpu": "on"}},
            "status": {"allocatable": {"nvidia.com/gpu": "80"}}}


def registered(api):
    node = api.get("Node", None, NODE)
    return ((node or {}).get("metadata", {}).get("annotations") or {}).get(keys.NODE_REGISTER)


@pytest.fixture
def client(api_server):
    c = KubeClient.from_kubeconfig(api_server.kubeconfig_path, timeout_s=1.0,
                                   retry=RetryPolicy(attempts=2, base_s=0.02, cap_s=0.1))
    yield c
    c.close()


def start(registrar):
    stop = threading.Event()
    thread = registrar.start(stop)
    return stop, thread


def cfg(tmp_path):
    return build_config([{"agent": {"migApplyLockPath": str(tmp_path / "mig.lock")}}], NODE)


def test_patches_only_when_the_inventory_changes(api_server, client, tmp_path):
    api_server.create(node_obj())
    source = Source(gpu(0), gpu(1))
    r = NodeRegistrar(client, NODE, source, cfg(tmp_path), interval_s=0.05, retry_s=0.05)
    stop, thread = start(r)
    try:
        assert wait_for(lambda: registered(api_server) is not None)
        gets_before = len(api_server.requests_matching("GET", NODE_PATH))
        assert wait_for(lambda: len(api_server.requests_matching("GET", NODE_PATH)) >= gets_before + 5)
        assert len(api_server.requests_matching("PATCH", NODE_PATH)) == 1  # 5+ checks, one patch
        devices = decode_node_devices(registered(api_server))
        assert [(d.index, d.count, d.devmem, d.type, d.health) for d in devices] == [
            (0, 10, 97871, "NVIDIA H20", True), (1, 10, 97871, "NVIDIA H20", True)]
        source.value = Snapshot(status="ok", gpus=(gpu(0), gpu(1, healthy=False)))
        assert wait_for(lambda: len(api_server.requests_matching("PATCH", NODE_PATH)) == 2)
        assert [d.health for d in decode_node_devices(registered(api_server))] == [True, False]
        time.sleep(0.3)
        assert len(api_server.requests_matching("PATCH", NODE_PATH)) == 2
        # other annotations and labels are untouched by the merge-patch
        assert api_server.get("Node", None, NODE)["metadata"]["labels"] == {"gpu": "on"}
    finally:
        stop.set()
        thread.join(timeout=5)
    assert not thread.is_alive()


def test_survives_api_outage_and_reregisters(api_server, client, tmp_path):
    api_server.create(node_obj())
    source = Source(gpu(0), gpu(1))
    r = NodeRegistrar(client, NODE, source, cfg(tmp_path), interval_s=0.1, retry_s=0.1)
    stop, thread = start(r)
    try:
        assert wait_for(lambda: registered(api_server) is not None)
        api_server.stop()
        # while the API is down the GPU inventory changes (a GPU falls off the bus)
        source.value = Snapshot(status="ok", gpus=(gpu(0),))
        assert wait_for(lambda: r.last_result == RESULT_ERROR, timeout=10)
        assert "get node error" in (r.last_error or "")
        time.sleep(1.5)  # several failed rounds, each retried after retry_s
        assert thread.is_alive()
        api_server.start()
        assert wait_for(lambda: registered(api_server) is not None
                        and len(decode_node_devices(registered(api_server))) == 1, timeout=15)
        assert wait_for(lambda: r.last_error is None and r.last_result == "patched")
    finally:
        stop.set()
        thread.join(timeout=5)


def test_malformed_existing_annotation_is_overwritten(api_server, client, tmp_path):
    api_server.create(node_obj({keys.NODE_REGISTER: "GPU-x,this is,not:valid", "keep": "me"}))
    r = NodeRegistrar(client, NODE, Source(gpu(0)), cfg(tmp_path))
    assert r.register_once()
    node = api_server.get("Node", None, NODE)
    assert [d.index for d in decode_node_devices(node["metadata"]["annotations"][keys.NODE_REGISTER])] == [0]
    assert node["metadata"]["annotations"]["keep"] == "me"


def test_missing_node_is_reported_and_retried(api_server, client, tmp_path):
    r = NodeRegistrar(client, NODE, Source(gpu(0)), cfg(tmp_path))
    assert not r.register_once()
    assert r.last_error.startswith("get node error: 404 Not Found on node gpu-1")
    api_server.create(node_obj())
    assert r.register_once() and registered(api_server) is not None


def test_idle_node_sends_no_request_and_a_removed_annotation_is_restored_at_once(api_server, client,
                                                                                 tmp_path):
    """The register loop reads its node from the plugin's node watch: after the first patch an idle node
    sends nothing (it used to GET the node every 30 s), and an annotation someone removes is put back
    when the watch shows it, not at the next 30 s check."""
    from hami_agent.k8s.informer import Informer

    api_server.create(node_obj())
    inf = Informer(client, "nodes", field_selector=f"metadata.name={NODE}", resync_s=0).start()
    assert inf.wait_synced(5)
    r = NodeRegistrar(client, NODE, Source(gpu(0), gpu(1)), cfg(tmp_path), interval_s=0.05, retry_s=0.05,
                      node_source=lambda: inf.get(None, NODE))
    inf.add_handler(on_update=lambda _o, n: r.node_changed(n))
    stop, thread = start(r)
    try:
        assert wait_for(lambda: registered(api_server) is not None)
        time.sleep(0.3)  # ~6 more checks of the (unchanged) inventory
        api_server.accounting.reset()
        time.sleep(0.5)  # ~10 checks: all answered from the watch cache
        verbs = {v: t.requests for v, t in api_server.accounting.by().items() if v != "watch"}
        assert verbs == {} and r.gets == 0 and r.patches == 1
        # someone removes the annotation: restored from the watch event, well before a 30 s interval
        r.interval_s = 30.0
        time.sleep(0.1)  # the loop is now in its 30 s wait
        api_server.patch("Node", None, NODE, {"metadata": {"annotations": {keys.NODE_REGISTER: None}}})
        assert wait_for(lambda: registered(api_server) is not None, timeout=5)
        # the server applies the patch before the registrar has its answer and counts it
        assert wait_for(lambda: r.patches == 2, timeout=5)
        # the node lock or status changing does not wake the loop
        api_server.patch("Node", None, NODE, {"metadata": {"annotations": {keys.NODE_LOCK: "x"}}})
        time.sleep(0.3)
        assert r.patches == 2
    finally:
        stop.set()
        thread.join(5)
        inf.stop()
