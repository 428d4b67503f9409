"""200 admissions while every API call of the device plugin is delayed 0.3-1.5 s (issue 16 finding 1):
each admission either succeeds within the deadline with consistent annotations, or fails with
``bind-phase`` not ``success`` and nothing consumed; no success write starts after the kubelet's answer.

Twenty nodes run side by side, each with its own plugin (real gRPC server, real Kubernetes client and
informers against the simulated API server) and its own SIMULATED kubelet, ten pods each, so the run
takes about as long as one node's ten admissions (parallel instead of fewer admissions: the same 200
outcomes are checked). A node's calls (GET/PATCH of its Node and of the pods in its namespace) are all
delayed by the node's delay; the informers' list and watch are not. Every other pod is admitted while
the plugin's caches "have not seen" it or its lock yet (an informer lagging behind the scheduler's bind:
GetPreferredAllocation and Allocate must read both from the API within their budgets); the others once
the caches show them, so only the success write and the background writes go to the API. One group of
nodes runs with a 1.5 s deadline, so that every success write times out in the client while the server
still applies it: the late path must undo it.
"""

from __future__ import annotations

import collections
import copy
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field

import pytest

from hami_agent.deviceplugin.manager import DevicePluginManager
from hami_agent.deviceplugin.podsource import K8sPodSource
from hami_agent.deviceplugin.settings import PluginSettings
from hami_agent.k8s.client import KubeClient
from hami_agent.k8s.informer import Informer
from hami_agent.protocol import keys
from tests.sim.apiserver import ApiServer
from tests.sim.kubelet import SimulatedKubelet
from tests.unit.deviceplugin.fakes import (
    FakeSnapshot,
    FakeSource,
    ctr,
    full_gpus,
    gpu_uuid,
    hami_pod,
    node_register,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
GPU = "nvidia.com/gpu"
# (API delay in s, --rpc-deadline in s, nodes); 20 nodes x 10 pods = 200 admissions
GROUPS = [(0.3, 2.0, 6), (0.6, 2.0, 6), (0.9, 2.0, 6), (1.2, 2.0, 6), (1.5, 2.0, 8), (1.5, 1.5, 8)]
PODS_PER_NODE = 5


@dataclass
class Write:
    uid: str
    changes: dict
    started: float
    error: str = ""


class RecordingSource(K8sPodSource):
    """The real pod source, recording when each pod write started (to check the commit rule); its caches
    can be made to lag: ``hidden`` pods and, with ``hide_lock``, the node lock are not in them yet."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.writes: list[Write] = []
        self.hidden: set[str] = set()
        self.hide_lock = False

    def pods_on_node(self):
        return [p for p in super().pods_on_node() if p["metadata"]["name"] not in self.hidden]

    def cached_node(self):
        node = super().cached_node()
        if node is not None and self.hide_lock:
            node = copy.deepcopy(node)
            node["metadata"]["annotations"].pop(keys.NODE_LOCK, None)
        return node

    def patch_pod_if(self, ref, expect, changes, timeout_s):
        w = Write(ref.uid, dict(changes), time.monotonic())
        self.writes.append(w)
        try:
            super().patch_pod_if(ref, expect, changes, timeout_s)
        except Exception as exc:
            w.error = str(exc)
            raise


@dataclass
class Node:
    name: str
    ns: str
    delay: float
    deadline: float
    sock_dir: str
    pods: RecordingSource
    manager: DevicePluginManager
    thread: threading.Thread
    kubelet: SimulatedKubelet
    informers: list
    results: list = field(default_factory=list)  # (pod dict, AdmissionResult, answered_at)


def wait(pred, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.02)
    return bool(pred())


def start_node(api, k: int, delay: float, deadline: float, tmp_path) -> Node:
    name, ns = f"gpu-{k}", f"ns-{k}"
    api.create({"apiVersion": "v1", "kind": "Node", "metadata": {
        "name": name, "annotations": {keys.NODE_REGISTER: node_register(2, count=10)}}})
    client = KubeClient.from_kubeconfig(api.kubeconfig_path, timeout_s=5)
    s = PluginSettings(node_name=name, device_plugin_dir=tempfile.mkdtemp(prefix=f"dp{k}-", dir="/tmp"),
                       hook_path=str(tmp_path / name / "hook"), vgpu_lock_dir=str(tmp_path / name / "lock"),
                       mig_apply_lock=str(tmp_path / name / "mig.lock"), device_split_count=10,
                       rpc_deadline_s=deadline, api_timeout_s=1.0, poll_interval_s=0.1)
    pod_inf = Informer(client, "pods", field_selector=f"spec.nodeName={name}").start()
    node_inf = Informer(client, "nodes", field_selector=f"metadata.name={name}").start()
    assert pod_inf.wait_synced(10) and node_inf.wait_synced(10)
    fast = client.with_options(timeout_s=s.api_timeout_s, attempts=1)
    pods = RecordingSource(name, fast, pod_inf, node_inf)
    kubelet = SimulatedKubelet(s.device_plugin_dir, verbosity=2).start()
    manager = DevicePluginManager(s, lambda: FakeSource(FakeSnapshot(gpus=full_gpus(2))), pods)
    thread = threading.Thread(target=manager.run, daemon=True)
    thread.start()
    assert kubelet.wait_registered(GPU, 10, min_devices=20)
    for path in (f"^/api/v1/nodes/{name}$", f"^/api/v1/namespaces/{ns}/pods/[^/]+$"):
        api.inject_fault(None, path_regex=path, delay_s=delay, times=10**6)
    return Node(name, ns, delay, deadline, s.device_plugin_dir, pods, manager, thread, kubelet,
                [pod_inf, node_inf])


def run_node(api, node: Node) -> None:
    pod_inf, node_inf = node.informers

    def cached(name: str, lock: str) -> bool:
        cached_lock = ((node_inf.get(None, node.name) or {}).get("metadata") or {}).get("annotations") or {}
        return pod_inf.get(node.ns, name) is not None and cached_lock.get(keys.NODE_LOCK) == lock

    def settled(name: str) -> bool:
        return (pod_inf.get(node.ns, name) or {}).get("status", {}).get("phase") != "Pending"

    for i in range(PODS_PER_NODE):
        name = f"p{i}"
        pod = hami_pod(name, node.name, [ctr("c", 1)], f"{gpu_uuid(i % 2)},NVIDIA,1000,10:;", ns=node.ns)
        pod["metadata"]["uid"] = f"uid-{node.name}-{i}"
        pod["metadata"]["annotations"][keys.BIND_TIME] = str(int(time.time()))
        lock = f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())},{node.ns},{name}"
        # the scheduler's /bind: lock the node, annotate, bind (it takes over a lock left by a failed pod
        # at once here, where a real scheduler waits for the lock's expiry: the plugin must not care)
        api.patch("nodes", None, node.name, {"metadata": {"annotations": {keys.NODE_LOCK: lock}}})
        api.create(pod)
        assert wait(lambda name=name, lock=lock: cached(name, lock), 10)
        lagging = i % 2 == 0
        if lagging:
            node.pods.hidden, node.pods.hide_lock = {name}, True
        try:
            res = node.kubelet.admit(api.get("pods", node.ns, name), timeout=60)
            answered = time.monotonic()
        finally:
            node.pods.hidden, node.pods.hide_lock = set(), False
        assert res is not None, f"{node.name}/{name} blocked in admission"
        node.results.append((pod, res, answered, lagging))
        # the kubelet's status write after admission (tests/sim/kubelet.py writes none)
        status = {"phase": "Running"} if res.admitted else {
            "phase": "Failed", "reason": "UnexpectedAdmissionError", "message": res.message}
        api.patch("pods", node.ns, name, {"status": status}, subresource="status")
        assert wait(lambda name=name: settled(name), 10)


@pytest.fixture
def api():
    with ApiServer(history_limit=100_000) as server:  # the whole history: late writes are counted in it
        yield server


@pytest.fixture
def nodes():
    started: list[Node] = []
    yield started
    for n in started:
        n.manager.stop()
    for n in started:
        n.thread.join(10)
        n.kubelet.close()
        for inf in n.informers:
            inf.stop()
        shutil.rmtree(n.sock_dir, ignore_errors=True)


def test_200_admissions_with_api_delays_are_consistent_and_nothing_writes_success_after_the_answer(
        api, nodes, tmp_path):
    specs = [(delay, deadline) for delay, deadline, count in GROUPS for _ in range(count)]
    slots: list[Node | None] = [None] * len(specs)

    def setup(k: int) -> None:
        slots[k] = start_node(api, k, *specs[k], tmp_path)

    starters = [threading.Thread(target=setup, args=(k,)) for k in range(len(specs))]
    for t in starters:
        t.start()
    for t in starters:
        t.join(60)
    nodes.extend(n for n in slots if n is not None)
    assert len(nodes) == 40
    errors: list[BaseException] = []

    def runner(n: Node) -> None:
        try:
            run_node(api, n)
        except BaseException as exc:  # reported below with the node's name
            errors.append(AssertionError(f"{n.name}: {exc!r}"))

    t0 = time.monotonic()
    threads = [threading.Thread(target=runner, args=(n,)) for n in nodes]
    for t in threads:
        t.start()
    for t in threads:
        t.join(240)
    assert not errors, errors
    for n in nodes:  # background writes (lock releases, failure records) land, then check the truth
        assert n.manager.allocator.writer.wait_idle(60), n.name
    time.sleep(1.6)  # a success write still sleeping in the server (<= 1.5 s) has arrived by now
    api.clear_faults()
    elapsed = time.monotonic() - t0

    table: dict[tuple[float, float], collections.Counter] = collections.defaultdict(collections.Counter)
    for n in nodes:
        lock = (api.get("nodes", None, n.name)["metadata"].get("annotations") or {}).get(keys.NODE_LOCK)
        for pod, res, answered, lagging in n.results:
            md = pod["metadata"]
            want = md["annotations"][keys.DEVICES_ALLOCATED]
            now = api.get("pods", n.ns, md["name"])["metadata"]["annotations"]
            assert now[keys.DEVICES_ALLOCATED] == want
            assert res.duration_s < 2 * n.deadline + 2.0, (n.name, md["name"], res.duration_s)  # never blocks
            writes = [w for w in n.pods.writes if w.uid == md["uid"]]
            success_writes = [w for w in writes if w.changes.get(keys.BIND_PHASE) == "success"]
            row = table[(n.delay, n.deadline)]
            cache = "cache miss" if lagging else "cache hit"
            if res.admitted:
                row[f"admitted ({cache})"] += 1
                assert now[keys.BIND_PHASE] == "success", (n.name, now)
                assert now[keys.DEVICES_TO_ALLOCATE] == ";", (n.name, now)
                envs = res.allocations["c"][GPU]["envs"]
                uuid = want.split(",")[0]
                assert envs["NVIDIA_VISIBLE_DEVICES"] == uuid
                assert envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "1000m"
                assert all(d.startswith(uuid) for d in res.allocations["c"][GPU]["devices"])
                assert lock is None or not lock.endswith(f",{n.ns},{md['name']}")
            else:
                row[f"failed ({cache})"] += 1
                assert now.get(keys.BIND_PHASE) != "success", (n.name, md["name"], res.message, now)
                assert now[keys.DEVICES_TO_ALLOCATE] == want, (n.name, md["name"], res.message, now)
                # the commit rule: a success write may have been *started* only before the answer
                assert all(w.started < answered for w in success_writes), (n.name, md["name"])
                if success_writes:
                    row["failed after a success write was sent"] += 1
                elif not writes:
                    row["failed with nothing written"] += 1
                if lock is not None and lock.endswith(f",{n.ns},{md['name']}"):
                    row["last pod's lock left to expire"] += 1
    # success writes the server applied after the client had given up, later undone by the failure record
    with api.store.condition:
        history = api.store.entries_after(0)
    undone = sum(1 for e in history if e.plural == "pods" and e.type == "MODIFIED"
                 and (e.new["metadata"].get("annotations") or {}).get(keys.BIND_PHASE) == "failed"
                 and (e.old["metadata"].get("annotations") or {}).get(keys.BIND_PHASE) == "success")
    lines = [f"{d:.1f}s delay, {dl:.1f}s deadline: " + ", ".join(f"{v} {k}" for k, v in sorted(c.items()))
             for (d, dl), c in sorted(table.items())]
    print(f"\n200 admissions under API delays in {elapsed:.1f}s:\n  " + "\n  ".join(lines)
          + f"\n  success writes that landed late and were undone: {undone}")
    total = collections.Counter()
    for c in table.values():
        total.update(c)
    admitted = sum(v for k, v in total.items() if k.startswith("admitted"))
    failed = sum(v for k, v in total.items() if k.startswith("failed ("))
    assert admitted + failed == 200
    assert admitted > 0 and failed > 0 and undone > 0  # success, failure and the late path all happened
    assert not any(k.startswith("admitted") for k in table[(1.5, 1.5)])  # each write outlived the budget
