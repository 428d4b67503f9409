"""A node lock left behind by a refused Allocate heals: the device plugin refuses writing nothing (here:
an ambiguous admission, a pod bound to the node by hand wants the same resource), so the lock it would
have released stays; the kubelet marks the lock's owner Failed; the extender's leader audit releases the
lock at its next round, and the node takes GPU pods again.

The scheduler app and the device plugin's real ``Allocator`` (``K8sPodSource`` on informers) run against
the SIMULATED API server; the "kubelet" is ``test_allocate_loop.Kubelet``. The audit runs every 0.5 s here
(60 s in production, ``scheduler/serve/app.py`` ``AUDIT_INTERVAL_S``): the worst case documented in
docs/device-plugin.md is that interval plus one API round trip."""

from __future__ import annotations

import logging
import time

import pytest

from hami_agent.protocol import keys
from hami_agent.scheduler.verbs.extender import SchedulerConfig
from tests.integration.scheduler.cluster import check_cluster, gpu_pod
from tests.integration.scheduler.test_allocate_loop import NODE, plugin  # noqa: F401 - the fixture
from tests.integration.scheduler.test_trust import bind, create, extender, filter_, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

AUDIT_S = 0.5


def lock_of(api) -> str | None:
    return (api.get("Node", None, NODE)["metadata"].get("annotations") or {}).get(keys.NODE_LOCK)


def test_lock_of_a_refused_pod_is_released_by_the_audit_once_the_kubelet_fails_it(
        api_server, plugin, caplog):  # noqa: F811
    kubelet = plugin
    owner = create(api_server, gpu_pod("owner", mem=1000, cores=10))
    # a tenant's pod bound to the node by hand, asking for a GPU: the plugin cannot tell which one the
    # kubelet is admitting
    rival = gpu_pod("rival", mem=1000, cores=10)
    rival["spec"]["nodeName"] = NODE
    rival["spec"]["schedulerName"] = "default-scheduler"
    create(api_server, rival)
    with caplog.at_level(logging.INFO, logger="hami_agent"), \
            extender(api_server, SchedulerConfig(), audit_interval_s=AUDIT_S) as (app, ext):
        assert filter_(ext, owner, (NODE,))["NodeNames"] == [NODE]
        assert bind(ext, owner)["Error"] == ""
        held = lock_of(api_server)
        assert held and held.endswith(",default,owner")

        writes_before = len(api_server.requests)
        kubelet.admit_bound()  # the owner first (binding order), then the rival: both refused
        uid = api_server.get("Pod", "default", "owner")["metadata"]["uid"]
        assert "ambiguous admission" in kubelet.failures[uid]
        assert not kubelet.allocations
        time.sleep(4 * AUDIT_S)  # the audit runs meanwhile: a pending, bound, allocating owner keeps its lock
        assert lock_of(api_server) == held
        plugin_writes = [r for r in list(api_server.requests)[writes_before:]
                         if r.method != "GET" and ("/pods/" in r.path or keys.NODE_LOCK in str(r.body))]
        assert plugin_writes == []  # the refusal wrote nothing, and the audit left a live lock alone
        owner_now = api_server.get("Pod", "default", "owner")
        assert owner_now["metadata"]["annotations"][keys.BIND_PHASE] == keys.BIND_PHASE_ALLOCATING

        # what the kubelet does with a pod whose admission failed
        failed_at = time.monotonic()
        for name in ("owner", "rival"):
            api_server.patch("Pod", "default", name, {"status": {
                "phase": "Failed", "reason": "UnexpectedAdmissionError",
                "message": "Allocate failed due to ..., which is unexpected"}}, subresource="status")
        assert wait_for(lambda: lock_of(api_server) is None, 15), "the audit did not release the lock"
        healed_s = time.monotonic() - failed_at
        # generous for a shared machine; the point is "the next audit", not the 5 min expiry
        assert healed_s < 10 * AUDIT_S + 5, healed_s
        # the audit logs after its write has landed: wait for the line rather than race its thread
        assert wait_for(lambda: "node lock of gpu-1 released: default/owner no longer needs it (owner pod "
                                "Failed)" in caplog.text, 5), caplog.text

        # healed: the next GPU pod is scheduled, bound and allocated on the node
        nxt = create(api_server, gpu_pod("next", mem=1000, cores=10))
        assert filter_(ext, nxt, (NODE,))["NodeNames"] == [NODE]
        assert bind(ext, nxt)["Error"] == ""
        kubelet.admit_bound()
        nxt_uid = api_server.get("Pod", "default", "next")["metadata"]["uid"]
        assert nxt_uid in kubelet.allocations, kubelet.failures
        assert wait_for(lambda: lock_of(api_server) is None, 10)  # released by the plugin after Allocate
        check_cluster(api_server, [app], allocations=kubelet.allocations)


def test_a_pod_bound_to_one_node_gives_up_its_lock_on_another_at_once(api_server, caplog):
    """A leader took a pod's lock on gpu-2 and died before binding; its successor filtered the pod again
    and bound it to gpu-1. The lock on gpu-2 is stale the moment the binding lands: the binder releases
    it then, not at the audit's next round (an hour here, so only the bind can have released it). A lock
    of another pod is left alone."""
    from datetime import datetime, timezone

    from hami_agent.protocol.nodelock import format_lock_value
    from tests.integration.scheduler.cluster import gpu_node

    for name in ("gpu-1", "gpu-2", "gpu-3"):
        api_server.create(gpu_node(name))
    pod = create(api_server, gpu_pod("moved", mem=1000, cores=10))
    now = datetime.now(timezone.utc)
    dead_leaders = format_lock_value(now, "default", "moved")
    others = format_lock_value(now, "default", "someone-else")
    api_server.patch("Node", None, "gpu-2", {"metadata": {"annotations": {keys.NODE_LOCK: dead_leaders}}})
    api_server.patch("Node", None, "gpu-3", {"metadata": {"annotations": {keys.NODE_LOCK: others}}})

    def lock(node: str) -> str | None:
        return (api_server.get("Node", None, node)["metadata"].get("annotations") or {}).get(keys.NODE_LOCK)

    with caplog.at_level(logging.INFO, logger="hami_agent"), \
            extender(api_server, SchedulerConfig(), audit_interval_s=3600) as (_app, ext):
        assert wait_for(lambda: _app.extender.node_locks.value("gpu-2") == dead_leaders, 5)
        assert filter_(ext, pod, ("gpu-1",))["NodeNames"] == ["gpu-1"]
        assert bind(ext, pod, "gpu-1")["Error"] == ""
        assert wait_for(lambda: lock("gpu-2") is None, 10), "the stale lock on gpu-2 stayed"
        assert lock("gpu-1").endswith(",default,moved")  # bound, not allocated yet: Allocate releases it
        assert lock("gpu-3") == others
        assert "pod default/moved is bound to gpu-1: releasing its lock on node gpu-2" in caplog.text
