"""Effective device health: Unhealthy at once, Healthy again only after a quiet period.

NVIDIA's plugin never recovers a device it marked Unhealthy; HAMi inherits that ("FIXME"). We do recover,
but conservatively: a device that went bad must be reported healthy by a *fresh* NVML probe (a snapshot
generation newer than the last bad one, with status ok) *and* stay clean for ``quiet_s`` seconds, so a
flapping GPU does not bounce in and out of the kubelet's allocatable count.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from hami_agent.deviceplugin.devices import PluginDevice, ResourcePlan

logger = logging.getLogger(__name__)


@dataclass
class _Bad:
    last_bad_at: float
    bad_generation: int
    reason: str | None


class HealthTracker:
    def __init__(self, quiet_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.quiet_s = quiet_s
        self._clock = clock
        self._bad: dict[str, _Bad] = {}

    def apply(self, plan: ResourcePlan, generation: int, probe_ok: bool) -> ResourcePlan:
        """Return ``plan`` with effective health. ``probe_ok``: the snapshot came from a successful probe."""
        now = self._clock()
        out: list[PluginDevice] = []
        for dev in plan.devices:
            key = dev.physical_uuid
            bad = self._bad.get(key)
            if not dev.healthy:
                if bad is None:
                    logger.warning("device %s is Unhealthy: %s", key, dev.reason or "reported by NVML")
                    bad = self._bad[key] = _Bad(now, generation, dev.reason)
                else:  # still bad: the quiet period restarts from this observation
                    bad.last_bad_at, bad.bad_generation = now, generation
                    bad.reason = dev.reason or bad.reason
                out.append(dev)
                continue
            if bad is None:
                out.append(dev)
                continue
            if probe_ok and generation > bad.bad_generation and now - bad.last_bad_at >= self.quiet_s:
                logger.info("device %s recovered: healthy for %.1fs after '%s'", key, now - bad.last_bad_at,
                            bad.reason or "unhealthy")
                del self._bad[key]
                out.append(dev)
            else:
                out.append(replace(dev, healthy=False, reason=f"recovering (quiet period {self.quiet_s:g}s) "
                                                             f"after: {bad.reason or 'unhealthy'}"))
        return ResourcePlan(plan.resource_name, plan.endpoint, plan.kind, tuple(out))

    def pending_recoveries(self) -> int:
        return len(self._bad)
