"""A pod's device requests in the shape the extender's fit memo needs (reference §3.1).

Thin adapter: ``hami_agent.protocol.requests`` does all of HAMi's request semantics (resource names and
defaults from the ``nvidia:`` config section, limits-before-requests, quantities, memoryFactor,
percentage and core clamping, static MIG resources); this module only keeps the fields that change
the fit, as hashable values (the memo is keyed on them, so container names must not be part of them).
"""

from __future__ import annotations

from typing import Any

from hami_agent.protocol import ProtocolError
from hami_agent.protocol.requests import container_requests, mig_requests
from hami_agent.scheduler.model import ContainerDeviceRequest, PodRequest


class RequestError(ValueError):
    """A HAMi resource value that cannot be used; the message names the container and field."""


def pod_request(pod: dict, names: Any = None) -> PodRequest:
    """Requests of every container, init containers first (HAMi ``Resourcereqs``). ``names``: the
    resource settings (``hami_agent.config.NvidiaConfig`` or ``protocol.RequestConfig``; None = the
    HAMi chart defaults)."""
    reqs: list[ContainerDeviceRequest | None] = []
    n_init = 0
    for r in container_requests(pod, names):
        if r.error:
            raise RequestError(r.error)
        n_init += r.init
        reqs.append(None if r.nums <= 0 else ContainerDeviceRequest(
            nums=r.nums, type=r.type, memreq=r.memreq, mem_percentage=r.mem_percentage_req,
            coresreq=r.coresreq))
    try:
        mig = mig_requests(pod, names)
    except ProtocolError as exc:
        raise RequestError(str(exc)) from exc
    return PodRequest(containers=tuple(reqs), n_init=n_init, mig=tuple(sorted(mig.items())))

