"""The register loop's pass after a node event checks that node alone; the pass over every node runs on
its interval (issue 31: a pass over the whole cluster on each node-lock write made the extender's CPU per
pod grow with the node count)."""

from __future__ import annotations

import copy
import threading
from datetime import datetime

import pytest

from hami_agent.protocol import NodeDevice, encode_node_devices, keys
from hami_agent.scheduler.state.cache import UsageCache
from hami_agent.scheduler.state.sync import ClusterSync

pytestmark = pytest.mark.unit

NOW = datetime(2026, 11, 27, 21, 0, 0)
REGISTER = encode_node_devices([NodeDevice(id="GPU-a", count=10, devmem=8192, devcore=100, type="NVIDIA-T4",
                                           health=True, mode="hami-core")])


def gpu_node(name: str) -> dict:
    return {"metadata": {"name": name, "annotations": {keys.NODE_REGISTER: REGISTER}},
            "status": {"allocatable": {"nvidia.com/gpu": "10"}}}


class Nodes:
    """The node informer's read side; counts whole-cluster lists."""

    def __init__(self, nodes: list[dict]) -> None:
        self.by_name = {n["metadata"]["name"]: n for n in nodes}
        self.lists = 0

    def list(self) -> list[dict]:
        self.lists += 1
        return list(self.by_name.values())

    def get(self, _ns: str | None, name: str) -> dict | None:
        return self.by_name.get(name)


class Client:
    def __init__(self) -> None:
        self.patched: list[str] = []
        self.done = threading.Event()

    def patch_node_annotations(self, name: str, ann: dict) -> dict:
        self.patched.append(name)
        self.done.set()
        return {}


def make(n: int, interval_s: float) -> tuple[ClusterSync, Nodes, Client]:
    client = Client()
    sync = ClusterSync(client, UsageCache(), interval_s=interval_s, now=lambda: NOW)
    sync.node_informer = Nodes([gpu_node(f"n{i}") for i in range(n)])
    return sync, sync.node_informer, client


def test_check_of_named_nodes_reads_and_writes_only_those():
    sync, nodes, client = make(5, 15.0)
    sync.check_nodes({"n3", "gone"})  # a node deleted meanwhile is skipped
    assert client.patched == ["n3"]  # its handshake request, HAMi's "Requesting_<time>"
    assert nodes.lists == 0
    sync.check_nodes()
    assert sorted(client.patched) == ["n0", "n1", "n2", "n3", "n3", "n4"] and nodes.lists == 1


def test_a_node_event_wakes_the_loop_for_that_node_only():
    sync, nodes, client = make(5, 3600.0)
    thread = threading.Thread(target=sync._loop, daemon=True)  # noqa: SLF001 - the loop itself
    thread.start()
    try:
        assert client.done.wait(5)  # the first pass: every node
        deadline = threading.Event()
        for _ in range(500):
            if len(client.patched) == 5:
                break
            deadline.wait(0.01)
        assert sorted(client.patched) == [f"n{i}" for i in range(5)] and nodes.lists == 1
        client.done.clear()
        changed = copy.deepcopy(nodes.by_name["n2"])
        changed["metadata"]["annotations"][keys.NODE_HANDSHAKE] = "Deleted_2026.11.27 20:00:00"
        nodes.by_name["n2"] = changed
        sync.on_node(changed)
        assert client.done.wait(5)
        assert client.patched[5:] == ["n2"] and nodes.lists == 1  # no second pass over every node
    finally:
        sync._stop.set()  # noqa: SLF001
        sync._wake.set()  # noqa: SLF001
        thread.join(5)


def test_a_burst_of_node_events_costs_one_pass():
    """A bind locks and releases its node: two events within milliseconds. The loop waits ``coalesce_s``
    after the first, so both land in one pass (issue 31: one wake per node event)."""
    sync, _nodes, client = make(5, 3600.0)
    sync.coalesce_s = 2.0  # generous: a loaded machine may stall this thread between the events
    passes: list[set[str] | None] = []
    real = sync.check_nodes

    def counted(only: set[str] | None = None) -> None:
        passes.append(None if only is None else set(only))
        real(only)

    sync.check_nodes = counted  # type: ignore[method-assign]
    thread = threading.Thread(target=sync._loop, daemon=True)  # noqa: SLF001 - the loop itself
    thread.start()
    try:
        assert client.done.wait(5)
        for _ in range(500):
            if len(client.patched) == 5:
                break
            threading.Event().wait(0.01)
        for name in ("n1", "n2", "n1", "n4"):  # 40 ms apart: within the window, far apart for a thread
            sync.on_node(sync.node_informer.by_name[name])
            threading.Event().wait(0.04)
        for _ in range(500):
            if len(passes) >= 2:
                break
            threading.Event().wait(0.01)
        threading.Event().wait(0.5)  # a second, needless pass would have run by now
        assert passes == [None, {"n1", "n2", "n4"}]
    finally:
        sync._stop.set()  # noqa: SLF001
        sync._wake.set()  # noqa: SLF001
        thread.join(5)
