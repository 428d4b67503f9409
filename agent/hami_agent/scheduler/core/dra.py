"""GPUs the DRA driver manages are not the extender's to hand out.

A node's GPUs can be split between the device plugin (``nvidia.com/gpu`` + HAMi annotations, scheduled by
this extender) and ``hami-agent dra`` (ResourceSlices, allocated by kube-scheduler's DRA plugin). The
device plugin already leaves DRA-managed GPUs out of ``hami.io/node-nvidia-register``; this filter is the
extender's own check against the same ``dra:`` config section, so a node whose device plugin runs with a
stale config (or an older agent) still cannot make the extender allocate a GPU DRA also allocates.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from hami_agent import log

logger = logging.getLogger(__name__)


def without_dra_managed(node_name: str, devices: Sequence[Any] | None, dra: Any) -> list[Any] | None:
    """``devices`` (``DeviceUsage`` from the register annotation) minus the GPUs that ``dra``
    (``hami_agent.config.DraConfig``) assigns to the DRA driver on ``node_name``."""
    if devices is None or dra is None:
        return None if devices is None else list(devices)
    part = dra.partition_for(node_name)
    if part.empty:
        return list(devices)
    kept = [d for d in devices if not part.manages(d.id, d.index)]
    if len(kept) != len(devices):
        log.v(logger, 3, "node %s: ignoring %d registered GPU(s) assigned to the DRA driver (%s)", node_name,
              len(devices) - len(kept), part.describe())
    return kept
