"""Informer: list+watch cache, selectors, recovery after 410 Expired and after an API server restart."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from hami_agent.k8s import Informer, KubeClient
from tests.integration.k8s.conftest import node, pod
from tests.sim.apiserver import ApiServer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def wait_until(cond: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []
        self.lock = threading.Lock()

    def add(self, o: dict) -> None:
        with self.lock:
            self.events.append(("add", o["metadata"]["name"]))

    def update(self, old: dict, new: dict) -> None:
        with self.lock:
            self.events.append(("update" if old is not new else "resync", new["metadata"]["name"]))

    def delete(self, o: dict) -> None:
        with self.lock:
            self.events.append(("delete", o["metadata"]["name"]))

    def seen(self, ev: tuple[str, str]) -> bool:
        with self.lock:
            return ev in self.events


@pytest.fixture
def informers():
    made: list[Informer] = []
    yield made
    for inf in made:
        inf.stop()


def test_list_watch_and_handlers(api_server: ApiServer, kube: KubeClient, informers: list) -> None:
    api_server.create(node("gpu-1"))
    inf = Informer(kube, kind="nodes", resync_s=0, watch_timeout_s=30)
    rec = Recorder()
    inf.add_handler(rec.add, rec.update, rec.delete)
    informers.append(inf.start())
    assert inf.wait_synced(5)
    assert rec.seen(("add", "gpu-1"))
    api_server.create(node("gpu-2"))
    kube.patch_node_annotations("gpu-1", {"hami.io/node-nvidia-register": "[]"})
    api_server.delete("nodes", None, "gpu-2")
    assert wait_until(lambda: rec.seen(("delete", "gpu-2")))
    assert rec.events == [("add", "gpu-1"), ("add", "gpu-2"), ("update", "gpu-1"), ("delete", "gpu-2")]
    cached = inf.get(None, "gpu-1")
    assert cached is not None
    assert cached["metadata"]["annotations"]["hami.io/node-nvidia-register"] == "[]"
    assert [n["metadata"]["name"] for n in inf.list()] == ["gpu-1"]
    late = Recorder()
    inf.add_handler(on_add=late.add)  # replayed for what is cached
    assert late.events == [("add", "gpu-1")]


def test_own_node_pod_informer_sees_binding_as_add(api_server: ApiServer, kube: KubeClient,
                                                   informers: list) -> None:
    api_server.create(pod("other", node_name="gpu-2"))
    api_server.create(pod("p"))
    inf = Informer(kube, kind="pods", field_selector="spec.nodeName=gpu-1", resync_s=0)
    rec = Recorder()
    inf.add_handler(rec.add, rec.update, rec.delete)
    informers.append(inf.start())
    assert inf.wait_synced(5)
    assert inf.list() == []
    kube.bind_pod("default", "p", "gpu-1")
    assert wait_until(lambda: inf.get("default", "p") is not None)
    assert rec.events[0] == ("add", "p")
    kube.delete("pods", "p", "default")
    assert wait_until(lambda: rec.seen(("delete", "p")))
    assert inf.get("default", "p") is None
    assert all(name == "p" for _e, name in rec.events)


def test_resumes_watch_after_api_server_restart(api_server: ApiServer, kube: KubeClient,
                                                informers: list) -> None:
    api_server.create(node("gpu-1"))
    inf = Informer(kube, kind="nodes", resync_s=0)
    rec = Recorder()
    inf.add_handler(rec.add, rec.update, rec.delete)
    informers.append(inf.start())
    assert inf.wait_synced(5)
    # the watch is open (its own connection, opened after the list) before the server goes away
    assert wait_until(lambda: inf.watch_restarts == 1, 5)
    api_server.stop()
    time.sleep(0.5)  # the informer sees the watch break and retries with backoff
    api_server.create(node("gpu-2"))  # written "while down" (straight into the store)
    api_server.start()
    assert wait_until(lambda: inf.get(None, "gpu-2") is not None, 10)
    assert inf.relists == 1  # resumed from its resourceVersion: no relist needed
    assert inf.watch_restarts >= 2
    assert rec.seen(("add", "gpu-2"))


def test_relists_after_410_expired_and_reports_missed_changes(api_server: ApiServer, kube: KubeClient,
                                                              informers: list) -> None:
    api_server.create(node("gpu-1"))
    api_server.create(node("gpu-2"))
    inf = Informer(kube, kind="nodes", resync_s=0)
    rec = Recorder()
    inf.add_handler(rec.add, rec.update, rec.delete)
    informers.append(inf.start())
    assert inf.wait_synced(5)
    api_server.stop()
    api_server.delete("nodes", None, "gpu-2")
    api_server.create(node("gpu-3"))
    api_server.patch("nodes", None, "gpu-1", {"metadata": {"labels": {"gpu": "on"}}})
    api_server.compact()  # the informer's resourceVersion is now too old
    api_server.start()
    assert wait_until(lambda: rec.seen(("delete", "gpu-2")) and rec.seen(("add", "gpu-3"))
                      and rec.seen(("update", "gpu-1")), 10)
    assert inf.relists == 2
    assert sorted(n["metadata"]["name"] for n in inf.list()) == ["gpu-1", "gpu-3"]
    assert inf.get(None, "gpu-1")["metadata"]["labels"] == {"gpu": "on"}
    # and it keeps watching after the relist
    api_server.create(node("gpu-4"))
    assert wait_until(lambda: inf.get(None, "gpu-4") is not None)


def test_a_pod_recreated_under_its_name_while_unwatched_is_a_delete_and_an_add(
        api_server: ApiServer, kube: KubeClient, informers: list) -> None:
    # A StatefulSet's pod deleted and created again during a watch gap: the relist finds the same name
    # with another UID. A UID-keyed handler (the extender's usage cache) must hear the old pod's delete,
    # or its GPUs stay counted.
    api_server.create(pod("web-0"))
    inf = Informer(kube, kind="pods", resync_s=0)
    seen: list[tuple[str, str]] = []
    inf.add_handler(on_add=lambda o: seen.append(("add", o["metadata"]["uid"])),
                    on_update=lambda _o, n: seen.append(("update", n["metadata"]["uid"])),
                    on_delete=lambda o: seen.append(("delete", o["metadata"]["uid"])))
    informers.append(inf.start())
    assert inf.wait_synced(5)
    first = inf.get("default", "web-0")["metadata"]["uid"]
    api_server.stop()
    api_server.delete("pods", "default", "web-0")
    api_server.create(pod("web-0"))
    api_server.compact()  # the informer must relist
    api_server.start()
    assert wait_until(lambda: inf.relists == 2 and len(seen) >= 3, 10)
    second = inf.get("default", "web-0")["metadata"]["uid"]
    assert second != first
    assert seen == [("add", first), ("delete", first), ("add", second)]


def test_periodic_resync_redelivers_cached_objects(api_server: ApiServer, kube: KubeClient,
                                                   informers: list) -> None:
    api_server.create(node("gpu-1"))
    inf = Informer(kube, kind="nodes", resync_s=0.2)
    rec = Recorder()
    inf.add_handler(rec.add, rec.update, rec.delete)
    informers.append(inf.start())
    assert wait_until(lambda: rec.seen(("resync", "gpu-1")), 3)


def test_wait_synced_times_out_while_api_is_down(api_server: ApiServer, kube: KubeClient,
                                                 informers: list) -> None:
    api_server.stop()
    inf = Informer(kube, kind="pods", resync_s=0)
    informers.append(inf.start())
    t0 = time.monotonic()
    assert not inf.wait_synced(0.5)
    assert time.monotonic() - t0 < 1.5
    assert wait_until(lambda: inf.last_error is not None and "connection refused" in inf.last_error, 5)
    api_server.start()
    assert inf.wait_synced(10)


def test_failing_handler_does_not_stop_delivery(api_server: ApiServer, kube: KubeClient,
                                                informers: list) -> None:
    inf = Informer(kube, kind="nodes", resync_s=0)
    rec = Recorder()

    def explode(_o: dict) -> None:
        raise RuntimeError("handler bug")

    inf.add_handler(on_add=explode)
    inf.add_handler(rec.add, rec.update, rec.delete)
    informers.append(inf.start())
    assert inf.wait_synced(5)
    api_server.create(node("gpu-1"))
    api_server.create(node("gpu-2"))
    assert wait_until(lambda: rec.seen(("add", "gpu-2")))
    assert rec.seen(("add", "gpu-1"))


def test_stop_interrupts_a_blocked_watch_promptly(api_server: ApiServer, kube: KubeClient) -> None:
    inf = Informer(kube, kind="pods", resync_s=0, watch_timeout_s=300)
    inf.start()
    assert inf.wait_synced(5)
    time.sleep(0.2)  # now blocked reading an idle watch stream
    t0 = time.monotonic()
    inf.stop()
    assert time.monotonic() - t0 < 5.0  # not the watch's 300 s (room for a shared machine)
    assert not any(t.name.startswith("informer-pods") for t in threading.enumerate())


def test_a_named_informer_names_its_threads(api_server: ApiServer, kube: KubeClient) -> None:
    """Two informers of one kind (the extender's pending and allocated pods) are told apart in py-spy and
    in per-thread CPU by their names."""
    inf = Informer(kube, kind="pods", resync_s=60, name="pending-pods").start()
    try:
        assert inf.wait_synced(5)
        names = {t.name for t in threading.enumerate()}
        assert {"informer-pending-pods", "informer-pending-pods-resync"} <= names
    finally:
        inf.stop()


def test_relist_lists_now_and_returns_after_the_handlers_saw_it(api_server: ApiServer, kube: KubeClient,
                                                                 informers: list) -> None:
    # A scheduler that just became leader relists before deciding: the list is a fresh read, handed to
    # the handlers before relist() returns, and the watch goes on from the list's resourceVersion.
    api_server.create(pod("p1"))
    rec = Recorder()
    inf = Informer(kube, kind="pods", resync_s=0)
    inf.add_handler(on_add=rec.add, on_update=rec.update, on_delete=rec.delete)
    informers.append(inf.start())
    assert inf.wait_synced(5)
    relists = inf.relists
    t0 = time.monotonic()
    assert inf.relist(5)
    assert inf.relists == relists + 1
    assert time.monotonic() - t0 < 2.0  # the blocked watch was closed on purpose: no backoff
    api_server.create(pod("p2"))  # the watch resumed after the relist
    assert wait_until(lambda: ("add", "p2") in rec.events)
    assert inf.get("default", "p2") is not None
