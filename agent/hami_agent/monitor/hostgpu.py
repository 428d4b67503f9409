"""Per-GPU host metrics for the monitor: one long-lived NVML worker, paused while MIG is reconfigured.

Every sample is one request to the same worker (``NvmlClient``), not a new process: a hung NVML costs at
most the process's limit of abandoned workers, however long it lasts (docs/nvml.md). While the MIG apply
lock file exists (written by the ``nvidia_mig`` role around a reconfiguration, the same file the device
plugin and its register loop pause on), the monitor does not call NVML at all and stops its worker, so the
reconfiguration does not find the GPUs held open by us.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from hami_agent.miglock import MigApplyLock
from hami_agent.monitor.collector import HostGpuSample
from hami_agent.nvml.client import NvmlClient
from hami_agent.nvml.errors import NvmlError, NvmlStuckUnkillable

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class HostNvmlStatus:
    paused: bool  # the MIG apply lock is held: NVML is not called
    abandoned: int  # killed NVML workers of this process that have not exited
    unkillable: bool  # no new worker may start until one of them exits
    lock_untrusted: str = ""  # why a MIG apply lock file present is ignored ("" when none is)


class HostGpuSource:
    def __init__(self, client: NvmlClient, mig_apply_lock: str | None, timeout_s: float,
                 permissive: bool = False) -> None:
        self.client = client
        self.mig_apply_lock = mig_apply_lock
        self.lock = MigApplyLock(mig_apply_lock, permissive, component="monitor")
        self.timeout_s = timeout_s
        self.paused = False
        self._unkillable = False

    def mig_locked(self) -> bool:
        return self.lock.held()  # the device plugin's trust rule (hami_agent.miglock)

    def pause_changed(self) -> bool:
        """The MIG apply lock appeared or went away since the last sample: the next one must act on it."""
        return self.mig_locked() != self.paused

    def __call__(self) -> list[HostGpuSample] | None:
        """The GPUs' usage, or None while paused. Raises NvmlError (the caller logs it once)."""
        if self.mig_locked():
            if not self.paused:
                logger.info("MIG apply lock file detected (%s): pausing NVML host metrics and releasing NVML",
                            self.mig_apply_lock)
                self.paused = True
                self.client.close()
            return None
        if self.paused:
            logger.info("MIG apply lock released: resuming NVML host metrics")
            self.paused = False
        try:
            usage = self.client.usage(self.timeout_s)
        except NvmlStuckUnkillable:
            self._unkillable = True
            raise
        except NvmlError:
            self._unkillable = False
            raise
        self._unkillable = False
        if usage.problems:
            raise NvmlError("nvml usage incomplete: " + "; ".join(usage.problems))
        # HAMi labels the type "NVIDIA-" + the NVML name
        return [HostGpuSample(g.index, g.uuid, "NVIDIA-" + g.name, g.memory_used_bytes, g.utilization)
                for g in usage.gpus]

    def status(self) -> HostNvmlStatus:
        return HostNvmlStatus(self.paused, self.client.reaper.reap(), self._unkillable, self.lock.untrusted)

    def close(self) -> None:
        self.client.close()
