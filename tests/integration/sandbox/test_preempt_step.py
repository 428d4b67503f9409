"""``sandbox/preempt_step.py`` (the demo's GPU preemption step) against an in-process cluster: the simulated
API server with graceful deletion, the real extender with ``--preemption extender``, the simulated
kube-scheduler, and a kubelet stand-in that reports bound pods Running. A GPU of the A100 node already
holds another pod, as after the demo's earlier steps."""

from __future__ import annotations

import contextlib
import copy
import threading
import time
from collections.abc import Iterator

import pytest

from hami_agent.k8s.client import KubeClient
from hami_agent.scheduler.serve.app import SchedulerApp
from hami_agent.scheduler.verbs.extender import SchedulerConfig
from sandbox import preempt_step
from tests.integration.scheduler.cluster import gpu_node, gpu_pod
from tests.sim.apiserver import ApiServer
from tests.sim.kube_scheduler import KubeSchedulerSim
from tests.sim.kube_scheduler_allocator import AllocatorStub

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@contextlib.contextmanager
def kubelet(api: ApiServer) -> Iterator[None]:
    """Bound pods become Running (what the sandbox's simulated kubelet reports after admission)."""
    stop = threading.Event()

    def run() -> None:
        while not stop.is_set():
            for p in api.list("Pod"):
                if (p["spec"].get("nodeName") and not p["metadata"].get("deletionTimestamp")
                        and (p.get("status") or {}).get("phase") != "Running"):
                    with contextlib.suppress(Exception):  # deleted meanwhile
                        api.patch("Pod", p["metadata"].get("namespace"), p["metadata"]["name"],
                                  {"status": {"phase": "Running"}}, subresource="status")
            stop.wait(0.05)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join(5)


def test_the_preemption_step_passes_and_leaves_nothing_behind():
    with ApiServer() as api:
        api.policy.graceful_deletion = True
        api.policy.finalize_expired = True
        client = KubeClient.from_kubeconfig(api.kubeconfig_path)
        app = SchedulerApp(client, SchedulerConfig(preemption="extender"), register_interval_s=0.2).start()
        stub = AllocatorStub(client).start()
        sim = KubeSchedulerSim(client, app.url, initial_backoff_s=0.05, max_backoff_s=0.4,
                               preempt_verb="preempt").start()
        try:
            assert app.extender.synced.wait(10)
            # two nodes with the SAME GPU UUIDs, as gpusim gives the sandbox's A100 nodes (the first full
            # demo run put the inference pod on the other node): the step pins the node too
            a100 = gpu_node("gpu-a100", gpus=3, mem=81920, type_="NVIDIA A100-SXM4-80GB")
            other = copy.deepcopy(a100)
            other["metadata"]["name"] = "gpu-other"
            for n in (a100, other):
                n["metadata"]["labels"]["kubernetes.io/hostname"] = n["metadata"]["name"]
                api.create(n)
            with kubelet(api):
                # an earlier step's pod holding 50 GiB of the node's first GPU: too little left for the
                # inference pod there, so the batch leaves that GPU alone
                earlier = gpu_pod("earlier", mem=51200)
                earlier["metadata"]["annotations"]["nvidia.com/use-gpuuuid"] = "GPU-gpu-a100-0"
                earlier["spec"]["nodeSelector"] = {"kubernetes.io/hostname": "gpu-a100"}
                api.create(earlier)
                assert sim.wait_idle(15, expect_bound=1)
                end = time.monotonic() + 10  # the allocation annotation follows the binding (device plugin)
                while time.monotonic() < end and "hami.io/vgpu-devices-allocated" not in api.get(
                        "Pod", "default", "earlier")["metadata"]["annotations"]:
                    time.sleep(0.05)
                lines: list[str] = []
                result = preempt_step.run(client, "gpu-a100", say=lines.append, timeout_s=60, grace_s=1)
            assert result.ok, "\n".join([*(f"{n}: {ok} {d}" for n, ok, d in result.checks), *lines])
            assert [n for n, _ok, _d in result.checks] == [
                "gpu-a100 has GPUs the batch can fill",
                "the low-priority batch runs on gpu-a100 and fills its GPUs",
                "the high-priority inference pod runs",
                "one batch pod preempted, on the GPU the inference pod got",
                "the victim was told who preempted it (event Preempted)",
                "no GPU was promised more memory than it has while the victim terminated",
            ]
            assert len(result.victims) == 1 and result.gpu in ("GPU-gpu-a100-1", "GPU-gpu-a100-2")
            assert result.seconds is not None
            assert any(ln.startswith("  victims: batch-") for ln in lines), lines
            assert sim.preemption.preempt_calls == []  # the extender preempted, not kube-scheduler
            assert sim.wait_idle(15)
            left = [p["metadata"]["name"] for p in api.list("Pod") if not p["metadata"].get(
                "deletionTimestamp")]
            assert left == ["earlier"], left
        finally:
            sim.stop()
            stub.stop()
            app.stop()
            client.close()
