"""High availability that is safe (issue 16 finding 5, deliverable 3): two extender replicas with leader
election behind one "Service" (the SIMULATED kube-scheduler sends each request to either replica); only
the leader decides and writes, the follower forwards; a leader killed mid-run is replaced; a deposed
leader that has not noticed yet cannot write (fencing). The invariant checker has the last word."""

from __future__ import annotations

import contextlib
import os
import random
import re
import signal
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator

import pytest

from hami_agent.k8s.client import KubeClient
from hami_agent.protocol import keys
from hami_agent.scheduler.serve.app import SchedulerApp
from hami_agent.scheduler.verbs.extender import SchedulerConfig
from hami_agent.scheduler.verbs.leadership import URL_ANNOTATION
from tests.integration.scheduler.cluster import check_cluster, gpu_node, gpu_pod
from tests.integration.scheduler.pki import make_pki
from tests.integration.scheduler.test_trust import create, filter_, wait_for
from tests.sim.kube_scheduler import ExtenderClient, KubeSchedulerSim
from tests.sim.kube_scheduler_allocator import AllocatorStub
from tests.sim.ports import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

# short lease times for the test (production: 15 s / 10 s / 2 s, as kube-scheduler)
LEASE = {"lease_duration_s": 3.0, "renew_deadline_s": 2.0, "retry_period_s": 0.3}
N_NODES = 30


def replica(api, name: str, **leader_kw) -> SchedulerApp:
    client = KubeClient.from_kubeconfig(api.kubeconfig_path)
    app = SchedulerApp(client, SchedulerConfig(event_nodes=5), register_interval_s=0.5, leader_elect=True,
                       lease_namespace="default", audit_interval_s=1.0,
                       leader_kwargs={**LEASE, "identity": name, **leader_kw})
    return app.start()


@contextlib.contextmanager
def replicas(api, n: int = 2, **leader_kw) -> Iterator[list[SchedulerApp]]:
    """``n`` in-process replicas (their caches and gates can be inspected)."""
    apps = [replica(api, f"replica-{i}", **leader_kw) for i in range(n)]
    try:
        assert wait_for(lambda: sum(a.gate.wait_ready(0) for a in apps) == 1, 15), "no leader elected"
        assert all(a.extender.synced.wait(10) for a in apps)
        yield apps
    finally:
        for a in apps:
            a.stop()


def leader_of(apps: list[SchedulerApp]) -> SchedulerApp | None:
    return next((a for a in apps if a.gate.wait_ready(0)), None)


# the test's own probes do not verify the replicas' certificates (the followers do)
PROBE_TLS = ssl.create_default_context()
PROBE_TLS.check_hostname = False
PROBE_TLS.verify_mode = ssl.CERT_NONE


def ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/readyz", timeout=2, context=PROBE_TLS) as r:
            return r.status == 200
    except OSError:
        return False


@contextlib.contextmanager
def replica_processes(api, tmp_path, n: int = 2) -> Iterator[dict[str, subprocess.Popen]]:
    """``n`` ``hami-agent scheduler --leader-elect`` processes (a leader can be killed with SIGKILL, as a
    crash would: connections reset, Lease not released). Yields {url: process}. The replicas serve TLS
    with one CA; a follower forwards only to a leader whose certificate that CA verifies and names the
    Lease holder (the advertise URL's host, 127.0.0.1: an IP SAN of the test certificate)."""
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    procs: dict[str, subprocess.Popen] = {}
    logs = []
    (tmp_path / "pki").mkdir(exist_ok=True)
    pki = make_pki(tmp_path / "pki")
    try:
        for i in range(n):
            port = free_port()
            url = f"https://127.0.0.1:{port}"
            log = open(tmp_path / f"replica-{i}.log", "w")  # noqa: SIM115 - closed in finally
            logs.append(log)
            procs[url] = subprocess.Popen(
                [sys.executable, "-m", "hami_agent", "scheduler", "--kubeconfig", api.kubeconfig_path,
                 "--cert-file", pki.server.cert, "--key-file", pki.server.key,
                 "--forward-ca-file", pki.ca.cert,
                 "--bind-address", f"127.0.0.1:{port}", "--metrics-bind", "", "--register-interval", "1s",
                 "--leader-elect", "--leader-elect-namespace", "default",
                 "--leader-elect-lease-duration", f"{LEASE['lease_duration_s']}s",
                 "--leader-elect-renew-deadline", f"{LEASE['renew_deadline_s']}s",
                 "--leader-elect-retry-period", f"{LEASE['retry_period_s']}s", "--advertise-url", url],
                stdout=log, stderr=subprocess.STDOUT, env=env)
        assert wait_for(lambda: all(ready(u) for u in procs), 30), "replicas never became ready"
        yield procs
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs.values():
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        for log in logs:
            log.close()


def lease_holder_url(api) -> str | None:
    lease = api.get("Lease", "default", "hami-scheduler") or {}
    if not (lease.get("spec") or {}).get("holderIdentity"):
        return None
    return (lease.get("metadata", {}).get("annotations") or {}).get(URL_ANNOTATION)


def test_two_replicas_with_a_leader_killed_mid_run_never_over_commit(api_server, tmp_path):
    rng = random.Random(11)
    for i in range(N_NODES):  # 240 slots, 6,000 cores: about half the pods fit
        api_server.create(gpu_node(f"node-{i:02d}", gpus=2, mem=8192, split=4))
    shapes = [dict(mem=1024, cores=10), dict(mem=2048, cores=25), dict(mem=4096, cores=0),
              dict(mem=1024, cores=100), dict(gpus=2, mem=1024, cores=20), dict(mem=3000, cores=50)]
    n_pods = 300
    with replica_processes(api_server, tmp_path) as procs:
        kube = KubeClient.from_kubeconfig(api_server.kubeconfig_path)
        stub = AllocatorStub(kube).start()
        sim = KubeSchedulerSim(kube, list(procs), workers=4, initial_backoff_s=0.2, max_backoff_s=1.6).start()
        try:
            t0 = time.monotonic()
            for j in range(n_pods):
                create(api_server, gpu_pod(f"pod-{j:03d}", **rng.choice(shapes)))
            assert wait_for(lambda: len(sim.bound) >= 40, 60), f"only {len(sim.bound)} bound before the kill"
            old_url = lease_holder_url(api_server)
            killed_at, bound_at_kill = time.monotonic(), len(sim.bound)
            procs[old_url].kill()  # SIGKILL mid-run: requests in flight, Lease not released
            assert wait_for(lambda: lease_holder_url(api_server) not in (None, old_url), 30), "no failover"
            failover_s = time.monotonic() - killed_at
            last, still = -1, 0  # run until no pod is bound for 6 s: the rest does not fit
            while time.monotonic() - t0 < 150:
                n = len(sim.bound)
                still = still + 1 if n == last else 0
                last = n
                if still >= 60:
                    break
                time.sleep(0.1)
            elapsed = time.monotonic() - t0
            survivor_url = next(u for u in procs if u != old_url)
            with urllib.request.urlopen(survivor_url + "/metrics", timeout=5, context=PROBE_TLS) as r:
                metrics = r.read().decode()
        finally:
            sim.stop()
            stub.stop()
        # checked once kube-scheduler has stopped: a pod still backing off can be bound after a quiet 6 s,
        # and the count below is compared with the pods listed after this point
        report = check_cluster(api_server, timeout_s=20)
        survivor_log = next(open(tmp_path / f"replica-{i}.log").read() for i, u in enumerate(procs)
                            if u != old_url)
    pods = api_server.list("Pod", "default")
    bound = [p for p in pods if p["spec"].get("nodeName")]
    pending = [p for p in pods if not p["spec"].get("nodeName")]
    # every pending pod was cleanly refused: its last scheduling failure is a fit reason, and nothing
    # of a decision is left on it
    last_failure = {}
    for key, msg in sim.failures:
        last_failure[key] = msg
    reasons: Counter = Counter()
    for p in pending:
        msg = last_failure.get(f"default/{p['metadata']['name']}", "")
        assert msg.startswith(f"0/{N_NODES} nodes are available"), (p["metadata"]["name"], msg)
        reasons.update(set(re.findall(r"[A-Z][A-Za-z]+", msg.split(": ", 1)[1])))
        assert keys.VGPU_NODE not in (p["metadata"].get("annotations") or {}), p["metadata"]["name"]
    assert len(bound) + len(pending) == n_pods and len(bound) == report.counts["bound"]
    assert len(bound) >= 100, f"only {len(bound)} pods bound"
    assert "successfully acquired lease" in survivor_log
    assert "REFUSING to forward" not in survivor_log  # the leader's certificate verified and named it
    forwarded = sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                    if line.startswith("hami_scheduler_requests_total{") and 'result="forwarded"' in line)
    assert forwarded > 0, "the follower never forwarded: the Service split did not happen"
    print(f"\n{n_pods} pods, 2 replica processes, leader SIGKILLed after {bound_at_kill} bindings: "
          f"{len(bound)} bound, {len(pending)} cleanly refused ({dict(reasons)}); failover "
          f"{failover_s:.1f}s (lease {LEASE['lease_duration_s']}s); {forwarded:.0f} requests forwarded by "
          f"the follower; {elapsed:.1f}s in all; "
          f"{report.summary()}")


def test_deposed_leader_that_has_not_noticed_does_not_write(api_server):
    # Finding 5: a leader whose elector is stuck (a GC pause, a starved thread) still believes it leads
    # while the other replica has taken over. Its fence (renew deadline < lease duration, monotonic
    # clock) stops its writes before the new leader can start.
    api_server.create(gpu_node("gpu-1", gpus=1, mem=8000))
    with replicas(api_server) as apps:
        old = leader_of(apps)
        new = next(a for a in apps if a is not old)
        stuck = threading.Event()

        def frozen() -> bool:  # the elector thread hangs inside its renew
            stuck.wait(60)
            return False

        old.elector._try_acquire_or_renew = frozen
        try:
            assert wait_for(lambda: new.gate.wait_ready(0), 15), "the other replica did not take over"
            assert old.elector.is_leader(), "the stuck leader has not noticed (the situation under test)"
            p = create(api_server, gpu_pod("p", mem=1000))
            before = len(api_server.requests)
            ext = ExtenderClient(old.url)
            try:
                res = filter_(ext, p)
            finally:
                ext.close()
            assert "not the leader or could not renew its lease in time" in res["Error"], res
            writes = [r for r in list(api_server.requests)[before:]
                      if r.method != "GET" and "/pods/" in r.path]
            assert writes == [], writes
            assert old.cache.pods == {}  # its reservation was rolled back to the API's truth
            ext = ExtenderClient(new.url)
            try:
                assert filter_(ext, p)["NodeNames"] == ["gpu-1"]
            finally:
                ext.close()
            check_cluster(api_server, [new])
        finally:
            stuck.set()
