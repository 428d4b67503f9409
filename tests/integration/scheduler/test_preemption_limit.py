"""Issue 29: what kube-scheduler's preemption does for a vGPU pod today (Project-HAMi/HAMi#1494).

These tests REPRODUCE TODAY'S LIMIT and pass by asserting it: a high-priority vGPU pod whose GPU memory is
held by lower-priority vGPU pods stays Pending, with our extender configured as HAMi's chart configures
it (no ``preemptVerb``) and with an extender that adds a naive ``preemptVerb``. kube-scheduler's dry run
(``SelectVictimsOnNode``) runs the framework's filters only; GPU memory is ``ignoredByScheduler``, so every
lower-priority pod is reprieved and the node ends with ``expected at least one victim pod on node``; the
extender's ``/preempt`` is never asked (docs/scheduler.md "Preemption"). Issue 29 item 3 (preemption done
by the extender) is meant to flip the first two tests: the preemptor should then be bound after its
victims terminate.

The last test is the control: where a framework resource (cpu) is short as well, the dry run finds a
victim, the naive ``/preempt`` is called with upstream's ``ExtenderPreemptionArgs`` and kube-scheduler
preempts."""

from __future__ import annotations

import contextlib
import json
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from hami_agent.k8s.client import KubeClient
from hami_agent.scheduler.serve.app import SchedulerApp
from hami_agent.scheduler.verbs.extender import SchedulerConfig
from tests.integration.scheduler.cluster import gpu_node, gpu_pod
from tests.sim.kube_scheduler import KubeSchedulerSim
from tests.sim.kube_scheduler_allocator import AllocatorStub

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


class NaivePreemptExtender:
    """Our extender behind a proxy that adds a naive ``preemptVerb``: ``/preempt`` echoes kube-scheduler's
    ``NodeNameToMetaVictims`` (what coldzerofear/vgpu-manager answers on an internal error); ``/filter`` and
    ``/bind`` go to the real extender."""

    def __init__(self, target: str) -> None:
        self.target = target.rstrip("/")
        self.preempt_args: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.path == "/preempt":
                    args = json.loads(body)
                    outer.preempt_args.append(args)
                    out = json.dumps({"NodeNameToMetaVictims": args.get("NodeNameToMetaVictims")}).encode()
                    status = 200
                else:
                    req = urllib.request.Request(outer.target + self.path, body,
                                                 {"Content-Type": "application/json"})
                    with urllib.request.urlopen(req, timeout=30) as resp:  # noqa: S310 - a local test URL
                        out, status = resp.read(), resp.status
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *_a: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@contextlib.contextmanager
def cluster(api, naive_preempt: bool) -> Iterator[tuple[KubeSchedulerSim, NaivePreemptExtender | None]]:
    client = KubeClient.from_kubeconfig(api.kubeconfig_path)
    app = SchedulerApp(client, SchedulerConfig(), register_interval_s=0.2).start()
    assert app.extender.synced.wait(10), "scheduler caches did not sync"
    stub = AllocatorStub(client).start()
    proxy = NaivePreemptExtender(app.url) if naive_preempt else None
    sim = KubeSchedulerSim(client, proxy.url if proxy else app.url, initial_backoff_s=0.05, max_backoff_s=0.4,
                           preempt_verb="preempt" if naive_preempt else None).start()
    try:
        yield sim, proxy
    finally:
        sim.stop()
        if proxy is not None:
            proxy.close()
        stub.stop()
        app.stop()


def vgpu_pod(name: str, mem: int, prio: int, cpu: str | None = None, grace: int | None = None) -> dict:
    p = gpu_pod(name, gpus=1, mem=mem)
    p["spec"]["priority"] = prio
    if cpu is not None:
        p["spec"]["containers"][0]["resources"]["requests"] = {"cpu": cpu}
    if grace is not None:
        p["spec"]["terminationGracePeriodSeconds"] = grace
    return p


def _wait(fn, timeout: float = 10.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if fn():
            return True
        time.sleep(0.02)
    return bool(fn())


def _fill_gpu(api, sim, prio: int) -> None:
    """Two vGPU pods of priority ``prio`` hold 12 GiB of the node's one 16 GiB GPU."""
    api.create(gpu_node("gpu-0", gpus=1, mem=16384))
    for name in ("low-a", "low-b"):
        api.create(vgpu_pod(name, mem=6144, prio=prio))
    assert sim.wait_idle(15, expect_bound=2)


def _assert_still_pending(api, sim, key: str, reason: str) -> None:
    assert _wait(lambda: any(k == key and reason in m for k, m in sim.failures)), sim.failures
    time.sleep(1.0)  # a few more cycles' worth: nothing changes
    high = api.get("Pod", "default", key.split("/")[1])
    assert not high["spec"].get("nodeName") and not high["status"].get("nominatedNodeName")
    for name in ("low-a", "low-b"):
        low = api.get("Pod", "default", name)
        assert low is not None and not low["metadata"].get("deletionTimestamp"), f"{name} was preempted"


@pytest.mark.parametrize("naive_preempt", [False, True], ids=["hami-chart", "naive-preemptVerb"])
def test_hami_1494_reproduced_high_priority_vgpu_pod_stays_pending(api_server, naive_preempt):
    """TODAY'S LIMIT (issue 29 item 3 will flip it): lower-priority pods hold the GPU memory; kube-scheduler
    reprieves them all and finds no victim."""
    with cluster(api_server, naive_preempt) as (sim, proxy):
        _fill_gpu(api_server, sim, prio=0)
        api_server.create(vgpu_pod("high", mem=8192, prio=1000))
        expected = ('0/1 nodes are available: 1 1/1 CardInsufficientMemory. '
                    'preemption: expected at least one victim pod on node "gpu-0"')
        _assert_still_pending(api_server, sim, "default/high", expected)
        assert ("default/high", 'expected at least one victim pod on node "gpu-0"') in sim.preemption.log
        assert sim.preemption.preempt_calls == []  # callExtenders is never reached
        if proxy is not None:
            assert proxy.preempt_args == []


def test_hami_1494_no_lower_priority_pod_no_victims_found(api_server):
    with cluster(api_server, naive_preempt=False) as (sim, _proxy):
        _fill_gpu(api_server, sim, prio=1000)
        api_server.create(vgpu_pod("high", mem=8192, prio=1000))
        _assert_still_pending(api_server, sim, "default/high",
                              "0/1 nodes are available: 1 1/1 CardInsufficientMemory. preemption: 0/1 nodes "
                              "are available: 1 No preemption victims found for incoming pod.")


def test_control_a_cpu_shortage_too_reaches_the_naive_preempt_verb_and_preempts(api_server):
    """Where cpu is short as well, the framework's dry run finds a victim, ``/preempt`` is asked (Go field
    names, ``NodeNameToMetaVictims`` with UIDs since ``nodeCacheCapable``), and the victim is deleted with
    its own grace period; the preemptor then gets the node it was nominated to."""
    api_server.policy.graceful_deletion = True
    api_server.policy.finalize_expired = True
    node = gpu_node("gpu-0", gpus=1, mem=16384)
    node["status"]["allocatable"]["cpu"] = "4"
    api_server.create(node)
    with cluster(api_server, naive_preempt=True) as (sim, proxy):
        api_server.create(vgpu_pod("low", mem=12288, prio=0, cpu="3", grace=1))
        assert sim.wait_idle(15, expect_bound=1)
        low_uid = api_server.get("Pod", "default", "low")["metadata"]["uid"]
        api_server.create(vgpu_pod("high", mem=8192, prio=1000, cpu="2"))
        assert _wait(lambda: proxy.preempt_args)
        args = proxy.preempt_args[0]
        assert args["Pod"]["metadata"]["name"] == "high" and args["NodeNameToVictims"] is None
        assert args["NodeNameToMetaVictims"] == {"gpu-0": {"Pods": [{"UID": low_uid}], "NumPDBViolations": 0}}
        assert _wait(lambda: sim.bound.get("default/high") == "gpu-0", 20), sim.failures
        assert api_server.get("Pod", "default", "low") is None
