"""``DraDriver``: the NVML snapshot in, published devices and health out, the kubelet plugin served.

One loop thread follows the NVML supervisor (``hami_agent.nvml.NvmlSupervisor``: NVML in a killable child
process, snapshots in memory) and turns every snapshot into the published devices with their effective
health -- Unhealthy at once, Healthy again only after a fresh good probe and ``health_recovery_quiet_s``
without a new failure (the device plugin's ``HealthTracker``). The kubelet's RPCs only read what the loop
left in memory; the ResourceSlices are written by the publisher's own thread; so neither a hung NVML nor a
slow API server reaches the kubelet.

While the MIG apply lock exists (``--mig-apply-lock``, as the device plugin), the NVML supervisor is
stopped (no open NVML handles while GPUs are reconfigured), the last devices stay published with a
``<driver>/reconfiguring`` NoSchedule taint and prepares keep answering from memory.

The loop sleeps until something needs it, as the device plugin's (issue 31): inotify (``fswatch``) on the
sockets' and the MIG lock's directories, a new NVML snapshot, ``stop()``, and every ``IDLE_WAKE_S`` a look
of its own. Without inotify, or while a device waits out its recovery quiet period, it ticks every
``poll_interval_s`` as before.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from hami_agent import known_bad_drivers, log
from hami_agent.deviceplugin.devices import PluginDevice, ResourcePlan
from hami_agent.deviceplugin.health import HealthTracker
from hami_agent.dra.checkpoint import Checkpoint
from hami_agent.dra.claims import ClaimRef, ClaimSource
from hami_agent.dra.devices import DraDevice, build_devices, degrade
from hami_agent.dra.metrics import DraMetrics
from hami_agent.dra.plugin import HealthBoard, KubeletPlugin
from hami_agent.dra.prepare import Preparer
from hami_agent.dra.settings import DraSettings
from hami_agent.fswatch import LoopWaker
from hami_agent.kubeletplugin import DeadlineRunner
from hami_agent.nvml.source import first_snapshot, start_source, stop_source

logger = logging.getLogger(__name__)

GC_INTERVAL_S = 60.0  # how often prepared claims are checked against the API
IDLE_WAKE_S = 5.0  # the event-driven loop's safety net: it looks at sockets and lock by itself this often


def apply_health(tracker: HealthTracker, devices: list[DraDevice], generation: int,
                 probe_ok: bool) -> list[DraDevice]:
    """Effective health through the device plugin's ``HealthTracker`` (keyed by device UUID)."""
    plan = ResourcePlan("dra", "", "dra", tuple(PluginDevice(d.name, d.uuid, d.gpu_index, d.healthy, None,
                                                             d.reason) for d in devices))
    eff = tracker.apply(plan, generation, probe_ok)
    return [replace(d, healthy=p.healthy, reason=p.reason) for d, p in zip(devices, eff.devices, strict=True)]


class DraDriver:
    """Runs the DRA driver until ``stop()``; ``run()`` returns the process exit code."""

    def __init__(self, settings: DraSettings, source_factory: Callable[[], Any], claims: ClaimSource, *,
                 publisher: Any = None, metrics: DraMetrics | None = None,
                 claim_gone: Callable[[ClaimRef], bool] | None = None) -> None:
        settings.validate()
        self.settings = settings
        self.source_factory = source_factory
        self.publisher = publisher
        self.metrics = metrics or DraMetrics()
        self.claim_gone = claim_gone
        self.health = HealthTracker(settings.health_recovery_quiet_s)
        self.board = HealthBoard()
        self.runner = DeadlineRunner(settings.rpc_workers, settings.rpc_deadline_s,
                                     reply_margin_s=settings.rpc_reply_margin_s,
                                     commit_margin_s=settings.commit_margin_s,
                                     api_timeout_s=settings.api_timeout_s)
        self.checkpoint = Checkpoint(settings.checkpoint_path)
        self._devices: Mapping[str, DraDevice] = {}  # replaced whole, never mutated: readers need no lock
        self._published: list[DraDevice] = []
        self.preparer = Preparer(settings, claims, self.devices, self.checkpoint)
        self.plugin = KubeletPlugin(settings, self.preparer, self.board, self.runner, self.metrics)
        self.source: Any = None
        self.paused = False
        self._stop = threading.Event()
        # wake() (any thread, or the SIGTERM handler) ends the pause loop's wait or the source's at once
        self._waker = LoopWaker(lambda: self.source, "dra-fswatch")
        self._fatal: str | None = None
        self._warn_once = log.WarnOnce(logger)
        self._last_gc = time.monotonic()
        self.ready = threading.Event()  # first snapshot applied and the plugin serving

    # ------------------------------------------------------------------------------ access
    def devices(self) -> Mapping[str, DraDevice]:
        return self._devices

    def stop(self) -> None:
        self._stop.set()
        self.wake()

    def wake(self) -> None:
        """Run the loop now: a socket or the MIG lock may have changed (any thread, or a signal handler)."""
        self._waker.wake()

    def _watch_dirs(self) -> list[str]:
        s = self.settings
        dirs = [os.path.dirname(os.path.abspath(s.plugin_socket)),
                os.path.dirname(os.path.abspath(s.registration_socket))]
        if s.mig_apply_lock:
            dirs.append(os.path.dirname(os.path.abspath(s.mig_apply_lock)))
        return dirs

    def _wait_s(self) -> float:
        """How long the loop may sleep before it must look again by itself."""
        if not self._waker.event_driven() or self.health.pending_recoveries():
            return self.settings.poll_interval_s
        if self.claim_gone is None:
            return IDLE_WAKE_S
        return min(IDLE_WAKE_S, max(0.01, self._last_gc + GC_INTERVAL_S - time.monotonic()))

    def healthz(self) -> tuple[bool, str]:
        if self._fatal:
            return False, self._fatal
        problem = self.plugin.self_check(timeout=1.0)
        if problem:
            return False, problem
        if self.plugin.registration_error:
            return False, f"the kubelet refused the registration: {self.plugin.registration_error}"
        if not self.plugin.registered.is_set():
            return False, "not registered with the kubelet yet"
        if self.paused:
            return True, "paused for MIG reconfiguration"
        if self.publisher is not None and self.publisher.last_error:
            return True, f"serving; publishing ResourceSlices failing: {self.publisher.last_error}"
        return True, "ok"

    # ------------------------------------------------------------------------------ inventory
    def apply_snapshot(self, snap: Any) -> None:
        status = getattr(snap, "status", "ok")
        drv = getattr(snap, "driver_version", None)
        bad = known_bad_drivers.lookup(drv)
        if bad is not None:
            self._warn_once(f"driver {drv} is a known-bad build: {bad['reason']} (or later); prepares keep "
                            "answering from memory meanwhile")
        notes: list[str] = []
        devices = build_devices(snap, self.settings.partition,
                                memory_scaling=self.settings.device_memory_scaling,
                                pre_configured_memory_mib=self.settings.pre_configured_device_memory,
                                notes=notes)
        for note in notes:
            self._warn_once(note)
        if status in ("stuck", "error") and not devices and self._published:
            detail = getattr(snap, "stuck_call", None) or getattr(snap, "error", None) or ""
            devices = degrade(self._published, f"nvml-{status} {detail}".strip())
        if status == "starting" and not devices:
            return  # nothing known yet: publish nothing rather than an empty pool
        devices = apply_health(self.health, devices, int(getattr(snap, "generation", 0) or 0), status == "ok")
        self._published = devices
        self._devices = {d.name: d for d in devices}
        self.board.update(devices)
        healthy = sum(1 for d in devices if d.healthy)
        self.metrics.devices.labels("Healthy").set(healthy)
        self.metrics.devices.labels("Unhealthy").set(len(devices) - healthy)
        self.metrics.nvml_stuck.set(1 if status == "stuck" else 0)
        if self.publisher is not None:
            self.publisher.set_devices(devices, paused=self.paused)

    # ------------------------------------------------------------------------------ NVML source
    def _start_source(self) -> Any:
        self.source = start_source(self.source_factory)
        return first_snapshot(self.source, self.settings.first_snapshot_wait_s, self._stop)

    def _stop_source(self) -> None:
        source, self.source = self.source, None
        stop_source(source)

    def _mig_lock_held(self) -> bool:
        lock = self.settings.mig_apply_lock
        return bool(lock and os.path.exists(lock))

    def _pause(self) -> None:
        logger.info("MIG apply lock file detected (%s): releasing NVML and tainting the devices "
                    "'%s/reconfiguring' until it is gone; prepares keep answering from memory",
                    self.settings.mig_apply_lock, self.settings.driver_name)
        self.paused = True
        self.metrics.paused.set(1)
        self._stop_source()
        if self.publisher is not None:
            self.publisher.set_devices(self._published, paused=True)
        while self._mig_lock_held() and not self._stop.is_set():
            self._housekeeping()
            # the lock's removal wakes this; without inotify it is polled
            self._waker.flag.wait(IDLE_WAKE_S if self._waker.watching() else self.settings.poll_interval_s)
        self.paused = False
        self.metrics.paused.set(0)
        if not self._stop.is_set():
            logger.info("MIG apply lock released: reading the GPUs again")
            self.apply_snapshot(self._start_source())

    # ------------------------------------------------------------------------------ housekeeping
    def _housekeeping(self) -> None:
        self.plugin.check_sockets()
        self.metrics.prepared.set(len(self.preparer.prepared))
        now = time.monotonic()
        if self.claim_gone is not None and now - self._last_gc >= GC_INTERVAL_S:
            self._last_gc = now
            self.collect_garbage()

    def collect_garbage(self) -> list[str]:
        """Forget prepared claims the API no longer has (deleted without an unprepare, e.g. the node was
        down): their capacity would otherwise stay taken forever."""
        gone = []
        for uid, claim in self.preparer.snapshot().items():
            ref = ClaimRef(claim.namespace, claim.name, uid)
            try:
                if self.claim_gone is not None and self.claim_gone(ref):
                    gone.append(uid)
            except Exception as exc:  # an API problem: try again next round
                logger.warning("checking prepared claim %s/%s: %s", claim.namespace, claim.name, exc)
        if gone:
            logger.warning("forgetting %d prepared claim(s) that no longer exist: %s", len(gone), gone)
            self.preparer.forget(gone)
        return gone

    # ------------------------------------------------------------------------------ main loop
    def run(self) -> int:
        try:
            # before the first look at the sockets and the lock, so no change between the two is missed
            self._waker.start_watch(self._watch_dirs())
            self.plugin.start()
            gen = -1
            if not self._mig_lock_held():
                snap = self._start_source()
                self.apply_snapshot(snap)
                gen = getattr(snap, "generation", 0)
            self.ready.set()
            while not self._stop.is_set():
                if self._mig_lock_held():
                    self._pause()
                    gen = -1
                    continue
                if self.source is None:
                    snap = self._start_source()
                else:
                    snap = self.source.wait_for_change(gen, self._wait_s())
                gen = getattr(snap, "generation", 0)
                self.apply_snapshot(snap)  # also re-evaluates health recovery every tick
                self._housekeeping()
        except Exception as exc:  # keep the exit path orderly and the cause in the log
            logger.exception("DRA driver loop failed")
            self._fatal = f"DRA driver loop failed: {exc}"
        finally:
            self.shutdown()
        if self._fatal:
            logger.error("%s", self._fatal)
            return 1
        return 0

    def shutdown(self) -> None:
        self._waker.stop_watch()
        self.plugin.stop()
        if self.publisher is not None:
            self.publisher.stop()
        self._stop_source()
        self.runner.shutdown()
