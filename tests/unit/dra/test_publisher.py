"""ResourceSlices against the simulated API server: written only on change, generations, re-created after the
kubelet's wipe, taint timestamps the server fills in, and more slices than one can hold."""

from dataclasses import replace

import pytest

from hami_agent.config import DraPartition
from hami_agent.dra import publisher
from hami_agent.dra.devices import build_devices
from hami_agent.dra.publisher import SlicePublisher, carry_time_added
from hami_agent.k8s.client import KubeClient
from hami_agent.nvml.model import Gpu, Snapshot
from tests.sim.fixtures import api_server  # noqa: F401

pytestmark = pytest.mark.unit

NODE, DRIVER = "gpu-1", "gpu.hami.io"


def devices(n):
    gpus = tuple(
        Gpu(
            index=i,
            uuid=f"GPU-{i:08d}-0000-0000-0000-000000000000",
            name="NVIDIA H100",
            type="NVIDIA H100",
            memory_mib=81559,
            numa=0,
            pci_bus_id=f"00000000:{i % 250:02X}:00.0",
            mig_capable=False,
            mig_enabled=False,
            mig_pending=False,
        )
        for i in range(n)
    )
    return build_devices(Snapshot(status="ok", gpus=gpus), DraPartition(all=True))


@pytest.fixture
def pub(api_server):  # noqa: F811
    node = api_server.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    client = KubeClient.from_kubeconfig(api_server.kubeconfig_path)
    p = SlicePublisher(client, DRIVER, NODE, node_uid=lambda: node["metadata"]["uid"])
    return api_server, p, node["metadata"]["uid"]


def converge(p, limit=5):
    for i in range(limit):
        if p.sync_once():
            return i
    raise AssertionError("publisher did not converge")


def stored(api):
    return sorted(api.list("resourceslices"), key=lambda o: o["metadata"]["name"])


def test_writes_only_on_change_and_bumps_the_pool_generation(pub):
    api, p, node_uid = pub
    assert p.sync_once() is False  # nothing to publish before the driver says what it has
    p.set_devices(devices(2))
    assert converge(p) == 1 and p.writes == 1
    [s] = stored(api)
    assert s["metadata"]["name"] == f"{NODE}-{DRIVER}-0"
    assert s["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": node_uid, "controller": True}
    ]
    assert s["spec"]["pool"] == {"name": NODE, "generation": 0, "resourceSliceCount": 1}
    rv = s["metadata"]["resourceVersion"]
    for _ in range(3):
        p.set_devices(devices(2))
        assert p.sync_once() is True
    assert p.writes == 1 and stored(api)[0]["metadata"]["resourceVersion"] == rv
    bad = devices(2)
    bad[1] = replace(bad[1], healthy=False, reason="xid-79")
    p.set_devices(bad)
    converge(p)
    [s] = stored(api)
    assert s["spec"]["pool"]["generation"] == 1 and p.writes == 2
    assert s["spec"]["devices"][1]["taints"][0]["key"] == f"{DRIVER}/unhealthy"


def test_the_servers_taint_timestamp_does_not_make_us_rewrite_forever(pub):
    api, p, _ = pub
    bad = devices(1)
    bad[0] = replace(bad[0], healthy=False, reason="gpu-lost")
    p.set_devices(bad)
    converge(p)
    added = stored(api)[0]["spec"]["devices"][0]["taints"][0]["timeAdded"]
    writes = p.writes
    for _ in range(3):
        assert p.sync_once() is True
    assert p.writes == writes and stored(api)[0]["spec"]["devices"][0]["taints"][0]["timeAdded"] == added
    assert carry_time_added(p.desired(bad, False, 0)[0], stored(api)[0])["spec"] == stored(api)[0]["spec"]


def test_without_carrying_the_timestamp_over_the_publisher_never_settles(pub, monkeypatch):
    """The failure mode the carry-over prevents: every pass rewrites the slice with a new generation."""
    api, p, _ = pub
    monkeypatch.setattr(publisher, "carry_time_added", lambda desired, _stored: desired)
    bad = devices(1)
    bad[0] = replace(bad[0], healthy=False, reason="gpu-lost")
    p.set_devices(bad)
    with pytest.raises(AssertionError, match="did not converge"):
        converge(p)
    assert p.writes >= 5


def test_slices_deleted_by_the_kubelet_come_back_with_the_same_generation(pub):
    api, p, _ = pub
    p.set_devices(devices(2))
    converge(p)
    p.set_devices(devices(3))
    converge(p)
    gen = stored(api)[0]["spec"]["pool"]["generation"]
    api.delete("resourceslices", None, f"{NODE}-{DRIVER}-0")  # the kubelet's wipe at its start
    converge(p)
    [s] = stored(api)
    assert s["spec"]["pool"]["generation"] == gen and len(s["spec"]["devices"]) == 3


def test_a_pool_larger_than_one_slice(pub):
    api, p, _ = pub
    p.set_devices(devices(70))
    converge(p)
    slices = stored(api)
    assert [len(s["spec"]["devices"]) for s in slices] == [64, 6]
    assert {(s["spec"]["pool"]["generation"], s["spec"]["pool"]["resourceSliceCount"]) for s in slices} == {
        (0, 2)
    }
    p.set_devices(devices(10))
    converge(p)
    [s] = stored(api)
    assert s["spec"]["pool"] == {"name": NODE, "generation": 1, "resourceSliceCount": 1}


def test_an_empty_pool_is_published(pub):
    api, p, _ = pub
    p.set_devices([])
    converge(p)
    [s] = stored(api)
    assert "devices" not in s["spec"] and s["spec"]["pool"]["resourceSliceCount"] == 1
