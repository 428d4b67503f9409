"""Issue 29: what kube-scheduler's preemption does for a vGPU pod (Project-HAMi/HAMi#1494), with our
extender's ``--preemption off`` (the default) and ``extender``.

With ``off`` these tests REPRODUCE HAMi's LIMIT and pass by asserting it: a high-priority vGPU pod whose GPU
memory is held by lower-priority vGPU pods stays Pending, with our extender configured as HAMi's chart
configures it (no ``preemptVerb``) and with an extender that adds a naive ``preemptVerb``. kube-scheduler's
dry run (``SelectVictimsOnNode``) runs the framework's filters only; GPU memory is ``ignoredByScheduler``,
so every lower-priority pod is reprieved and the node ends with ``expected at least one victim pod on
node``; the extender's ``/preempt`` is never asked (docs/scheduler.md "Preemption"). With ``--preemption
extender`` (issue 29 item 3) the same case ends with the preemptor bound after its victim terminates
(``test_extender_preemption_*``).

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
def cluster(api, naive_preempt: bool, preemption: str = "off", preempt_verb: bool = False,
            apps: list[SchedulerApp] | None = None) -> Iterator[tuple[KubeSchedulerSim,
                                                                    NaivePreemptExtender | None]]:
    """``preempt_verb``: kube-scheduler configured with our own /preempt (what the role writes when
    preemption is not off). ``apps``: the extender is appended to it (to read its metrics)."""
    client = KubeClient.from_kubeconfig(api.kubeconfig_path)
    app = SchedulerApp(client, SchedulerConfig(preemption=preemption), register_interval_s=0.2).start()
    if apps is not None:
        apps.append(app)
    assert app.extender.synced.wait(10), "scheduler caches did not sync"
    stub = AllocatorStub(client).start()
    proxy = NaivePreemptExtender(app.url) if naive_preempt else None
    sim = KubeSchedulerSim(client, proxy.url if proxy else app.url, initial_backoff_s=0.05, max_backoff_s=0.4,
                           preempt_verb="preempt" if naive_preempt or preempt_verb else None).start()
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


# ------------------------------------------------------------------------------ --preemption extender
class Sampler:
    """Samples the GPU memory assigned on gpu-0 by every pod that still exists (terminating ones included:
    their containers may still run) every 10 ms, on its own thread."""

    def __init__(self, api) -> None:
        self.api = api
        self.peak = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        from hami_agent.protocol import decode_pod_devices, keys

        while not self._stop.is_set():
            used = 0
            for p in self.api.list("Pod", "default"):
                ann = p["metadata"].get("annotations") or {}
                if ann.get(keys.VGPU_NODE) == "gpu-0" and p["spec"].get("nodeName"):
                    used += sum(d.usedmem for c in decode_pod_devices(ann[keys.DEVICES_ALLOCATED]) for d in c)
            self.peak = max(self.peak, used)
            self.samples += 1
            self._stop.wait(0.01)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


def _graceful(api) -> None:
    api.policy.graceful_deletion = True  # a deleted pod terminates for its grace period (kubelet stand-in)
    api.policy.finalize_expired = True


def test_extender_preemption_runs_the_preemptor_after_one_victim_terminates(api_server):
    """ISSUE 29 ITEM 3: the HAMi#1494 case with ``--preemption extender``. /filter finds the fewest victims
    by HAMi's fit (one 6 GiB pod frees room for 8 GiB), holds the capacity, nominates the pod, marks the
    victim DisruptionTarget and deletes it with its own grace period; the preemptor is bound to gpu-0 once
    the victim is gone, and the GPU is never over-committed."""
    _graceful(api_server)
    with cluster(api_server, naive_preempt=False, preemption="extender") as (sim, _proxy), \
            Sampler(api_server) as sampler:
        api_server.create(gpu_node("gpu-0", gpus=1, mem=16384))
        for name in ("low-a", "low-b"):
            api_server.create(vgpu_pod(name, mem=6144, prio=0, grace=3))
        assert sim.wait_idle(15, expect_bound=2)
        api_server.create(vgpu_pod("high", mem=8192, prio=1000))

        def terminating() -> list[dict]:
            pods = [api_server.get("Pod", "default", n) for n in ("low-a", "low-b")]
            return [p for p in pods if p is not None and p["metadata"].get("deletionTimestamp")]

        assert _wait(lambda: terminating() or sim.bound.get("default/high"), 10)
        (victim,) = terminating()  # while it terminates: marked as kube-scheduler marks its victims
        cond = [c for c in victim["status"]["conditions"] if c["type"] == "DisruptionTarget"]
        assert cond[0]["reason"] == "PreemptionByScheduler" and cond[0]["status"] == "True"
        hold = json.loads(api_server.get("Pod", "default", "high")["metadata"]["annotations"][
            "hami.io/preemption-hold"])
        assert hold["node"] == "gpu-0" and hold["victims"] == [victim["metadata"]["uid"]]
        assert _wait(lambda: sim.bound.get("default/high") == "gpu-0", 30), sim.failures
        want = {("Preempted", victim["metadata"]["name"]), ("Preempting", "high")}
        assert _wait(lambda: want <= {(e["reason"], e["involvedObject"]["name"])
                                      for e in api_server.list("Event", "default")})
        gone = [n for n in ("low-a", "low-b") if api_server.get("Pod", "default", n) is None]
        assert len(gone) == 1, gone  # the fewest victims: one
        high = api_server.get("Pod", "default", "high")
        assert "hami.io/preemption-hold" not in high["metadata"]["annotations"]  # the assignment removed it
        assert high["status"].get("nominatedNodeName") == "gpu-0"
        assert sim.preemption.preempt_calls == []  # kube-scheduler itself still preempts nothing
    assert sampler.samples > 10 and sampler.peak <= 16384, (sampler.samples, sampler.peak)


def test_extender_preemption_holds_the_capacity_against_a_lower_priority_rival(api_server):
    """While high's victim terminates, a rival of priority 500 asking 8 GiB arrives: the hold counts against
    it, so it may not take what high's preemption frees; it preempts the remaining priority-0 pod for room of
    its own. Both run in the end; at no sample does the GPU hold more than 16 GiB."""
    _graceful(api_server)
    with cluster(api_server, naive_preempt=False, preemption="extender") as (sim, _proxy), \
            Sampler(api_server) as sampler:
        api_server.create(gpu_node("gpu-0", gpus=1, mem=16384))
        for name in ("low-a", "low-b"):
            api_server.create(vgpu_pod(name, mem=6144, prio=0, grace=2))
        assert sim.wait_idle(15, expect_bound=2)
        api_server.create(vgpu_pod("high", mem=8192, prio=1000))
        assert _wait(lambda: (api_server.get("Pod", "default", "high")["status"].get("nominatedNodeName")
                              == "gpu-0"), 10)
        api_server.create(vgpu_pod("rival", mem=8192, prio=500))
        assert _wait(lambda: sim.bound.get("default/high") == "gpu-0", 30), sim.failures
        assert _wait(lambda: sim.bound.get("default/rival") == "gpu-0", 30), sim.failures
        assert [api_server.get("Pod", "default", n) for n in ("low-a", "low-b")] == [None, None]
    assert sampler.samples > 10 and sampler.peak <= 16384, (sampler.samples, sampler.peak)


def test_extender_preemption_never_takes_equal_priority_or_never_policy(api_server):
    """Equal priority: no victim (the pod stays Pending, as kube-scheduler's own rule); preemptionPolicy
    Never: nothing preempted."""
    with cluster(api_server, naive_preempt=False, preemption="extender") as (sim, _proxy):
        _fill_gpu(api_server, sim, prio=1000)
        api_server.create(vgpu_pod("same", mem=8192, prio=1000))
        polite = vgpu_pod("polite", mem=8192, prio=5000)
        polite["spec"]["preemptionPolicy"] = "Never"
        api_server.create(polite)
        assert _wait(lambda: {k for k, _m in sim.failures} >= {"default/same", "default/polite"})
        time.sleep(1.0)  # a few more cycles' worth: nothing changes
        for name in ("same", "polite"):
            pod = api_server.get("Pod", "default", name)
            assert not pod["spec"].get("nodeName") and not pod["status"].get("nominatedNodeName")
        for name in ("low-a", "low-b"):
            assert not api_server.get("Pod", "default", name)["metadata"].get("deletionTimestamp")


def test_a_cpu_shortage_too_reaches_our_preempt_verb_which_adds_the_gpu_victim(api_server):
    """Where cpu is short as well, the node fails kube-scheduler's own filters (no /filter), its dry run finds
    the cpu victim only and calls our /preempt, which adds the GPU victim HAMi's fit needs: kube-scheduler
    deletes both and the preemptor runs. (With the naive preemptVerb only the cpu victim would go and the
    preemptor would still not fit the GPU.)"""
    _graceful(api_server)
    node = gpu_node("gpu-0", gpus=1, mem=16384)
    node["status"]["allocatable"]["cpu"] = "4"
    api_server.create(node)
    with cluster(api_server, naive_preempt=False, preemption="extender", preempt_verb=True) as (sim, _p):
        api_server.create(vgpu_pod("low-cpu", mem=2048, prio=0, cpu="3", grace=1))
        api_server.create(vgpu_pod("low-gpu", mem=12288, prio=0, cpu="500m", grace=1))
        assert sim.wait_idle(15, expect_bound=2)
        api_server.create(vgpu_pod("high", mem=8192, prio=1000, cpu="2"))
        assert _wait(lambda: sim.bound.get("default/high") == "gpu-0", 30), sim.failures
        assert [api_server.get("Pod", "default", n) for n in ("low-cpu", "low-gpu")] == [None, None]
        args = sim.preemption.preempt_calls[0]
        low_cpu = args["NodeNameToMetaVictims"]["gpu-0"]["Pods"]
        assert len(low_cpu) == 1  # kube-scheduler's own dry run: the cpu victim alone
        log = sim.preemption.log
        assert any(m.startswith("preempted 2 pod(s) on gpu-0") for _k, m in log), log


def test_extender_preemption_spares_the_pod_a_disruption_budget_protects(api_server):
    """Two GPUs, each held by one priority-0 pod of 12 GiB; the one on the second GPU is protected by a
    PodDisruptionBudget with ``disruptionsAllowed`` 0. An 8 GiB preemptor needs one of them gone: the dry run
    counts the budget (``filterPodsWithPDBViolation``) and prefers the set that violates none, so the
    unprotected pod is the victim and the protected one keeps running. Its wait from the hold to the binding
    is one sample of ``hami_scheduler_preemption_wait_seconds``."""
    _graceful(api_server)
    apps: list[SchedulerApp] = []
    with cluster(api_server, naive_preempt=False, preemption="extender", apps=apps) as (sim, _proxy):
        api_server.create({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                           "metadata": {"name": "guard", "namespace": "default"},
                           "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}}})
        api_server.create(gpu_node("gpu-0", gpus=2, mem=16384))
        for name, app in (("free", "batch"), ("guarded", "guarded")):
            pod = vgpu_pod(name, mem=12288, prio=0, grace=1)
            pod["metadata"]["labels"] = {"app": app}
            api_server.create(pod)
            assert sim.wait_idle(15, expect_bound=1 if name == "free" else 2)
        pdb = api_server.get("PodDisruptionBudget", "default", "guard")
        assert _wait(lambda: "observedGeneration" in (api_server.get(
            "PodDisruptionBudget", "default", "guard").get("status") or {})), pdb
        assert api_server.get("PodDisruptionBudget", "default", "guard")["status"]["disruptionsAllowed"] == 0
        api_server.create(vgpu_pod("high", mem=8192, prio=1000))
        assert _wait(lambda: sim.bound.get("default/high") == "gpu-0", 30), sim.failures
        assert api_server.get("Pod", "default", "free") is None
        guarded = api_server.get("Pod", "default", "guarded")
        assert guarded is not None and not guarded["metadata"].get("deletionTimestamp")
        registry = apps[0].metrics.registry
        assert registry.get_sample_value("hami_scheduler_preemption_wait_seconds_count") == 1


def test_extender_preemption_under_a_namespace_gpu_quota(api_server):
    """Namespace ``team`` may use 16 GiB of GPU memory (``limits.nvidia.com/gpumem``) and holds 12 GiB with a
    priority-0 pod; a priority-0 pod of namespace ``other`` uses 6 GiB of the second GPU, which keeps 10 GiB
    free. team's 8 GiB priority-1000 pod fits the node but not its quota (``ResourceQuotaNotFit``): only
    team's own pod frees quota, so it is the one victim, and other's pod keeps running. A priority-1000 pod
    of team arriving next, with no lower-priority pod of team left, preempts nothing (other's pod would
    free room, not quota) and stays Pending: it asks 10 GiB, the second GPU has room for it, team's quota
    has 8 GiB left."""
    _graceful(api_server)
    with cluster(api_server, naive_preempt=False, preemption="extender") as (sim, _proxy):
        api_server.create({"apiVersion": "v1", "kind": "ResourceQuota",
                           "metadata": {"name": "gpu", "namespace": "team"},
                           "spec": {"hard": {"limits.nvidia.com/gpumem": "16384"}}})
        api_server.create(gpu_node("gpu-0", gpus=2, mem=16384))
        for name, ns, mem in (("low-team", "team", 12288), ("low-other", "other", 6144)):
            pod = vgpu_pod(name, mem=mem, prio=0, grace=1)
            pod["metadata"]["namespace"] = ns
            api_server.create(pod)
        assert sim.wait_idle(15, expect_bound=2)
        high = vgpu_pod("high", mem=8192, prio=1000)
        high["metadata"]["namespace"] = "team"
        api_server.create(high)
        assert _wait(lambda: sim.bound.get("team/high") == "gpu-0", 30), sim.failures
        assert api_server.get("Pod", "team", "low-team") is None
        other = api_server.get("Pod", "other", "low-other")
        assert other is not None and not other["metadata"].get("deletionTimestamp")
        second = vgpu_pod("second", mem=10240, prio=1000)
        second["metadata"]["namespace"] = "team"
        api_server.create(second)
        assert _wait(lambda: any(k == "team/second" and "ResourceQuotaNotFit" in m for k, m in sim.failures),
                     10), sim.failures
        time.sleep(1.0)  # a few more cycles' worth: nothing changes
        pod = api_server.get("Pod", "team", "second")
        assert not pod["spec"].get("nodeName") and not pod["status"].get("nominatedNodeName")
        other = api_server.get("Pod", "other", "low-other")
        assert other is not None and not other["metadata"].get("deletionTimestamp")
