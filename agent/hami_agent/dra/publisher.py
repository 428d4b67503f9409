"""ResourceSlices of this node's pool: written only when they change, re-created when someone deletes them.

The pool is the node name; its slices are named ``<node>-<driver>-<i>`` (deterministic, so RBAC can name
them and a restarted driver finds its own), at most 64 devices each (the API's limit once any device
carries a taint). A pool's slices share ``spec.pool.generation`` and ``resourceSliceCount``; consumers use
only the highest generation (resource.k8s.io/v1 ``ResourcePool``), so every change of content writes every
slice with the generation bumped past the highest one stored, and slices that are no longer needed are
deleted. Nothing is written when the stored slices already say what we would write: the API server fills
in ``timeAdded`` of taints, which is carried over from the stored slice before comparing.

The kubelet deletes all slices of its node when it starts and those of a driver that stayed unregistered
for a while (kubernetes ``pkg/kubelet/cm/dra/plugin/dra_plugin_manager.go`` ``wipeResourceSlices``); an
informer on our own slices notices and the next sync writes them again. Failures are retried with
exponential backoff (1 s doubling to ``publish_retry_max_s``), each call bounded by the client's timeout.
"""

from __future__ import annotations

import copy
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from hami_agent import log
from hami_agent.dra.devices import DraDevice, slice_device
from hami_agent.k8s.backoff import Backoff
from hami_agent.k8s.errors import ConflictError, KubeError, NotFoundError

logger = logging.getLogger(__name__)

Obj = dict[str, Any]
MAX_DEVICES_PER_SLICE = 64
MAX_SLICES = 4  # 256 devices: far more than any node has; RBAC names exactly these slices


def slice_names(node: str, driver: str) -> list[str]:
    return [f"{node}-{driver}-{i}" for i in range(MAX_SLICES)]


def _taint_key(t: Obj) -> tuple:
    return (t.get("key"), t.get("value"), t.get("effect"))


def carry_time_added(desired: Obj, stored: Obj | None) -> Obj:
    """``desired`` with the stored ``timeAdded`` of every unchanged taint (the server set it)."""
    if not stored:
        return desired
    old = {(d.get("name"), _taint_key(t)): t.get("timeAdded")
           for d in (stored.get("spec") or {}).get("devices") or [] for t in d.get("taints") or []}
    out = copy.deepcopy(desired)
    for d in out["spec"].get("devices") or []:
        for t in d.get("taints") or []:
            added = old.get((d.get("name"), _taint_key(t)))
            if added and not t.get("timeAdded"):
                t["timeAdded"] = added
    return out


class SlicePublisher:
    """Keeps this node's ResourceSlices equal to the published devices. ``set_devices`` from the driver
    loop; the writes happen on the publisher's own thread (an API outage never stalls the loop)."""

    def __init__(self, client: Any, driver: str, node: str, *, node_uid: Callable[[], str | None],
                 unhealthy_effect: str = "NoSchedule", retry_max_s: float = 30.0,
                 informer: Any = None) -> None:
        self.client = client
        self.driver = driver
        self.node = node
        self.node_uid = node_uid
        self.unhealthy_effect = unhealthy_effect
        self.retry_max_s = retry_max_s
        self.informer = informer  # our own slices (fieldSelector spec.nodeName + spec.driver)
        self._devices: tuple[DraDevice, ...] | None = None
        self._paused = False
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.generation = -1  # highest generation we wrote or saw
        self.writes = 0
        self.synced = threading.Event()  # the API holds what the devices say (set after each good sync)
        self.last_error: str | None = None
        self.on_write: Callable[[str], None] | None = None  # metrics hook: "create"/"update"/"delete"

    # ---------------------------------------------------------------------------------- control
    def set_devices(self, devices: Sequence[DraDevice], paused: bool = False) -> None:
        with self._lock:
            new = tuple(devices)
            if new == self._devices and paused == self._paused:
                return
            self._devices, self._paused = new, paused
            self.synced.clear()
        self._wake.set()

    def kick(self) -> None:
        """Re-check the stored slices now (an informer event: someone changed or deleted ours)."""
        self._wake.set()

    def start(self) -> SlicePublisher:
        if self.informer is not None:
            self.informer.add_handler(on_add=lambda _o: self.kick(), on_update=lambda _o, _n: self.kick(),
                                      on_delete=lambda _o: self.kick())
        self._thread = threading.Thread(target=self._run, name="dra-slice-publisher", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(5.0)

    # ---------------------------------------------------------------------------------- desired
    def desired(self, devices: Sequence[DraDevice], paused: bool, generation: int) -> list[Obj]:
        entries = [slice_device(d, self.driver, self.unhealthy_effect, paused) for d in devices]
        chunks = [entries[i:i + MAX_DEVICES_PER_SLICE] for i in range(0, len(entries), MAX_DEVICES_PER_SLICE)]
        chunks = chunks or [[]]  # an empty pool is published too: "this node has no devices of ours"
        if len(chunks) > MAX_SLICES:
            raise ValueError(f"{len(entries)} devices need more than {MAX_SLICES} ResourceSlices")
        uid = self.node_uid()
        owner = [{"apiVersion": "v1", "kind": "Node", "name": self.node, "uid": uid, "controller": True}] \
            if uid else None
        out = []
        for i, chunk in enumerate(chunks):
            meta: Obj = {"name": slice_names(self.node, self.driver)[i]}
            if owner:
                meta["ownerReferences"] = owner
            pool = {"name": self.node, "generation": generation, "resourceSliceCount": len(chunks)}
            spec: Obj = {"driver": self.driver, "nodeName": self.node, "pool": pool}
            if chunk:
                spec["devices"] = chunk
            out.append({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": meta,
                        "spec": spec})
        return out

    # ------------------------------------------------------------------------------------- sync
    def _stored(self) -> dict[str, Obj]:
        if self.informer is not None and self.informer.synced:
            items = self.informer.list()
        else:
            items, _rv = self.client.list("resourceslices",
                                          field_selector=f"spec.nodeName={self.node},spec.driver={self.driver}")
        return {o["metadata"]["name"]: o for o in items
                if (o.get("spec") or {}).get("driver") == self.driver
                and (o.get("spec") or {}).get("nodeName") == self.node}

    def sync_once(self) -> bool:
        """One reconciliation; True when the API already holds exactly the desired slices."""
        with self._lock:
            devices, paused = self._devices, self._paused
        if devices is None:
            return False  # the driver has not told us its devices yet: write nothing
        stored = self._stored()
        gens = {_generation(o) for o in stored.values()}
        top = max([self.generation, *gens, 0])

        def build(generation: int) -> dict[str, Obj]:
            return {o["metadata"]["name"]: carry_time_added(o, stored.get(o["metadata"]["name"]))
                    for o in self.desired(devices, paused, generation)}

        want = build(top)
        if set(want) == set(stored) and all(want[n]["spec"] == stored[n]["spec"]
                                            and _owner(want[n]) == _owner(stored[n]) for n in want):
            self.generation = top
            return True
        # new content, a slice too many, or a pool split across generations: consumers must see a new
        # generation; slices that were only deleted (the kubelet's wipe) come back with the same one
        differs = any(not _content_equal(want[n]["spec"], stored[n]["spec"]) for n in want if n in stored)
        changed = len(gens) > 1 or bool(set(stored) - set(want)) or differs
        generation = top + 1 if changed else top
        if changed:
            want = build(generation)
        for name, obj in want.items():
            old = stored.get(name)
            if old is None:
                self.client.create("resourceslices", obj)
                self._wrote("create", name, generation)
            elif obj["spec"] != old["spec"] or _owner(obj) != _owner(old):
                update = copy.deepcopy(obj)
                update["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
                self.client.replace("resourceslices", update)
                self._wrote("update", name, generation)
        for name in sorted(set(stored) - set(want)):
            try:
                self.client.delete("resourceslices", name,
                                   resource_version=stored[name]["metadata"]["resourceVersion"])
                self._wrote("delete", name, generation)
            except NotFoundError:
                pass
        self.generation = generation
        return False  # wrote something: the next pass confirms it from the API

    def _wrote(self, what: str, name: str, generation: int) -> None:
        self.writes += 1
        log.v(logger, 2, "ResourceSlice %s: %s (pool %s generation %d)", name, what, self.node, generation)
        if self.on_write is not None:
            self.on_write(what)

    def _run(self) -> None:
        backoff = Backoff(1.0, 2.0, 0.2, 0, self.retry_max_s)
        while not self._stop.is_set():
            self._wake.clear()
            try:
                done = self.sync_once()
                self.last_error = None
                backoff.reset()
                if done:
                    self.synced.set()
                    self._wake.wait(5.0)  # level-triggered safety net besides informer events
                continue
            except (ConflictError, KubeError, OSError, ValueError) as exc:
                self.last_error = str(exc)
                delay = backoff.next()
                if isinstance(exc, ConflictError):
                    delay = min(delay, 0.2)  # someone wrote meanwhile: look again soon
                logger.warning("publishing ResourceSlices of node %s failed: %s; retrying in %.1fs",
                               self.node, exc, delay)
                self._stop.wait(delay)


def _owner(obj: Obj) -> Any:
    return (obj.get("metadata") or {}).get("ownerReferences")


def _generation(obj: Obj) -> int:
    return int(((obj.get("spec") or {}).get("pool") or {}).get("generation") or 0)


def _without_generation(spec: Obj) -> Obj:
    return {**spec, "pool": {k: v for k, v in (spec.get("pool") or {}).items() if k != "generation"}}


def _content_equal(a: Obj, b: Obj) -> bool:
    """Equal apart from the pool's generation (the devices and the pool's shape)."""
    return _without_generation(a) == _without_generation(b)
