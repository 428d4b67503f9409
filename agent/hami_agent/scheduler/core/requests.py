"""A pod's device requests in the shape the extender's fit memo needs (Project-HAMi/HAMi
``pkg/device/nvidia/device.go`` ``GenerateResourceRequests``), after checking
that the pod has the shape the request parser walks.

Thin adapter: ``hami_agent.protocol.requests`` does all of HAMi's request semantics (resource names and
defaults from the ``nvidia:`` config section, limits-before-requests, quantities, memoryFactor,
percentage and core clamping, static MIG resources); this module checks the pod's structure first (the
protocol functions expect lists of container objects and would raise a TypeError on a string) and
keeps only the fields that change the fit, as hashable values (the memo is keyed on them, so container
names must not be part of them).
"""

from __future__ import annotations

from typing import Any

from hami_agent.protocol import ProtocolError
from hami_agent.protocol.requests import container_requests, mig_requests
from hami_agent.scheduler.core.model import ContainerDeviceRequest, PodRequest


class RequestError(ValueError):
    """A pod that cannot be scheduled as given; the message names the field and the fix."""


def _type(v: object) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null",
            int: "a number", float: "a number"}.get(type(v), type(v).__name__)


def _string_map(v: object, path: str, what: str) -> str | None:
    if v is None:
        return None
    if not isinstance(v, dict):
        return f"{path}: must be an object mapping {what}, got {_type(v)}"
    for k, x in v.items():
        if not isinstance(x, str):
            return f"{path}[{k!r}]: must be a string, got {_type(x)}"
    return None


def _container_error(c: object, path: str) -> str | None:
    if not isinstance(c, dict):
        return f"{path}: must be a container object, got {_type(c)}"
    if "name" in c and not isinstance(c["name"], str):
        return f"{path}.name: must be a string, got {_type(c['name'])}"
    res = c.get("resources")
    if res is None:
        return None
    if not isinstance(res, dict):
        return f"{path}.resources: must be an object with limits/requests, got {_type(res)}"
    for section in ("limits", "requests"):
        values = res.get(section)
        if values is not None and not isinstance(values, dict):
            return (f"{path}.resources.{section}: must be an object mapping resource names to quantities "
                    f"(e.g. {{\"nvidia.com/gpu\": \"1\"}}), got {_type(values)}")
    return None


def pod_shape_error(pod: object) -> str | None:
    """The first structural problem of a pod object as ``<field path>: <what it must be>``; None when
    the fields the scheduler reads have the types the Kubernetes API gives them."""
    if not isinstance(pod, dict):
        return f"must be a Pod object, got {_type(pod)}"
    md = pod.get("metadata")
    if md is not None and not isinstance(md, dict):
        return f"metadata: must be an object, got {_type(md)}"
    md = md or {}
    for f in ("name", "namespace", "uid"):
        if md.get(f) is not None and not isinstance(md[f], str):
            return f"metadata.{f}: must be a string, got {_type(md[f])}"
    for f, what in (("annotations", "names to string values"), ("labels", "names to string values")):
        err = _string_map(md.get(f), f"metadata.{f}", what)
        if err:
            return err
    spec = pod.get("spec")
    if spec is not None and not isinstance(spec, dict):
        return f"spec: must be an object, got {_type(spec)}"
    spec = spec or {}
    for f in ("schedulerName", "nodeName"):
        if spec.get(f) is not None and not isinstance(spec[f], str):
            return f"spec.{f}: must be a string, got {_type(spec[f])}"
    for f in ("initContainers", "containers"):
        cs = spec.get(f)
        if cs is None:
            continue
        if not isinstance(cs, list):
            return f"spec.{f}: must be a list of containers, got {_type(cs)}"
        for i, c in enumerate(cs):
            err = _container_error(c, f"spec.{f}[{i}]")
            if err:
                return err
    return None


def pod_request(pod: dict, names: Any = None) -> PodRequest:
    """Requests of every container, init containers first (HAMi ``Resourcereqs``). ``names``: the
    resource settings (``hami_agent.config.NvidiaConfig`` or ``protocol.RequestConfig``; None = the
    HAMi chart defaults). Raises ``RequestError`` naming the field for a malformed pod or a resource
    value HAMi refuses (e.g. ``nvidia.com/gpumem: 1.5``)."""
    err = pod_shape_error(pod)
    if err:
        raise RequestError(err)
    return _checked_pod_request(pod, names)


def _checked_pod_request(pod: dict, names: Any) -> PodRequest:
    """``pod_request`` of a pod whose shape ``pod_shape_error`` accepted."""
    spec = pod.get("spec") or {}
    n_spec_init = len(spec.get("initContainers") or [])
    reqs: list[ContainerDeviceRequest | None] = []
    n_init = 0
    for i, r in enumerate(container_requests(pod, names)):
        if r.error:
            where = f"spec.initContainers[{i}]" if i < n_spec_init else f"spec.containers[{i - n_spec_init}]"
            raise RequestError(f"{where}.resources: {r.error}")
        n_init += r.init
        reqs.append(None if r.nums <= 0 else ContainerDeviceRequest(
            nums=r.nums, type=r.type, memreq=r.memreq, mem_percentage=r.mem_percentage_req,
            coresreq=r.coresreq))
    try:
        mig = mig_requests(pod, names)
    except ProtocolError as exc:
        raise RequestError(f"spec.containers: {exc}") from exc
    return PodRequest(containers=tuple(reqs), n_init=n_init, mig=tuple(sorted(mig.items())))


class RequestMemo:
    """``pod_request`` per pod UID, answered from memory while the pod's containers are equal to those it
    was computed from (issue 31: a scheduled pod sends the extender about six watch events, and none of
    them changes its containers; parsing their resources each time was a sixth of the extender's CPU).

    Only the containers are memoized: the pod's shape is checked on every call (it reads metadata and
    spec fields that do change). The memo keeps references to the containers lists it compared, so pods
    handed to it must not be changed in place (informer objects are read-only, as in client-go's cache).
    Not thread-safe: one informer thread owns it. Bounded: past ``limit`` pods it starts again empty."""

    def __init__(self, names: Any = None, limit: int = 200_000) -> None:
        self.names = names
        self.limit = limit
        self._by_uid: dict[str, tuple[object, object, PodRequest | str]] = {}
        self.hits = 0
        self.misses = 0

    def request(self, uid: str, pod: dict) -> PodRequest:
        err = pod_shape_error(pod)
        if err:
            self._by_uid.pop(uid, None)
            raise RequestError(err)
        spec = pod.get("spec") or {}
        inits, containers = spec.get("initContainers"), spec.get("containers")
        seen = self._by_uid.get(uid)
        if seen is not None and seen[0] == inits and seen[1] == containers:
            self.hits += 1
            result = seen[2]
        else:
            self.misses += 1
            try:
                result = _checked_pod_request(pod, self.names)
            except RequestError as exc:
                result = str(exc)
            if len(self._by_uid) >= self.limit:
                self._by_uid.clear()
            self._by_uid[uid] = (inits, containers, result)
        if isinstance(result, str):
            raise RequestError(result)
        return result

    def forget(self, uid: str) -> None:
        self._by_uid.pop(uid, None)

    def __len__(self) -> int:
        return len(self._by_uid)
