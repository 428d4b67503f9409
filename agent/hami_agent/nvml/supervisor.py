"""NvmlSupervisor: keeps an always-answerable inventory snapshot while NVML lives in a child process.

DESIGN rule 2: calls have deadlines; a call past its deadline marks the worker stuck (metric + log +
every GPU unhealthy with reason ``nvml-stuck``), the worker is SIGKILLed and abandoned to the process's
``WorkerReaper`` (reaped later without blocking), and a new worker is tried with exponential backoff (1 s
doubling to 60 s, cut short when the loaded kernel module changes: ``loaded.py``). While the reaper's limit
of abandoned workers is alive (killed, but stuck in the driver in D state), no worker starts: the snapshot
says ``nvml-stuck-unkillable`` and the supervisor resumes as soon as one of them exits. When a worker
succeeds the snapshot recovers. ``snapshot()`` never blocks.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from hami_agent import log
from hami_agent.nvml.errors import NvmlTimeout
from hami_agent.nvml.health import XidPolicy
from hami_agent.nvml.inventory import build_snapshot, resolve_lib_path, warn_memory_not_supported
from hami_agent.nvml.loaded import LoadedDriver
from hami_agent.nvml.model import (
    REASON_NVML_ERROR,
    REASON_STUCK,
    REASON_STUCK_UNKILLABLE,
    Gpu,
    Snapshot,
    xid_reason,
)
from hami_agent.nvml.process import EVENT_WAIT_MS, InFlight, WorkerProcess, batch_calls
from hami_agent.nvml.reaper import WorkerReaper, default_reaper

logger = logging.getLogger(__name__)

STARTUP_GRACE_S = 10.0  # extra time a fresh interpreter gets to import pynvml before its first call
UNKILLABLE_GRACE_S = 1.0  # a just-killed worker gets this long to exit before we call it unkillable
REAP_EVERY_S = 1.0
IDLE_WAKE_S = 1.0  # the worker loop's longest sleep while it reaps or waits for the worker's first word
# ... and once the worker answers with nothing to reap: every call in flight has its own deadline to wake
# the loop, so this only bounds a sleep with none (issue 31: a 1 s tick was ~0.15 ms/s of an idle node)
QUIET_WAKE_S = 30.0


class _Metrics:
    def __init__(self, registry: Any) -> None:
        from prometheus_client import Counter, Gauge, Histogram

        self.latency = Histogram(
            "hami_nvml_call_duration_seconds", "Duration of NVML calls made by the NVML worker",
            ["function"], registry=registry,
            buckets=(0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0))
        self.stuck = Gauge("hami_nvml_stuck", "1 while an NVML call is stuck past its deadline",
                           registry=registry)
        self.restarts = Counter("hami_nvml_worker_restarts", "NVML worker processes started after the first",
                                registry=registry)
        self.abandoned = Gauge("hami_nvml_abandoned_workers",
                               "NVML workers killed after a hang that have not exited yet (this process)",
                               registry=registry)
        self.unkillable = Gauge("hami_nvml_stuck_unkillable",
                                "1 while no NVML worker may start: the limit of abandoned workers is alive "
                                "(stuck in the driver, SIGKILL cannot end them)", registry=registry)


class NvmlSupervisor:
    def __init__(self, lib_path: str | os.PathLike[str] | None = None, call_timeout_s: float = 5.0,
                 refresh_interval_s: float = 30.0, *, registry: Any = None, watch_events: bool = True,
                 event_wait_ms: int = EVENT_WAIT_MS, backoff_initial_s: float = 1.0,
                 backoff_max_s: float = 60.0,
                 xid_policy: XidPolicy | None = None, env: Mapping[str, str] | None = None,
                 reaper: WorkerReaper | None = None, driver: LoadedDriver | None = None) -> None:
        if call_timeout_s <= 0 or refresh_interval_s <= 0:
            raise ValueError("call_timeout_s and refresh_interval_s must be > 0")
        self.lib_path = resolve_lib_path(lib_path)
        self.call_timeout_s = call_timeout_s
        self.refresh_interval_s = refresh_interval_s
        self.watch_events = watch_events
        self.event_wait_ms = event_wait_ms
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.xid_policy = xid_policy or XidPolicy.from_env(os.environ if env is None else env)
        self.restarts = 0
        self.reaper = reaper or default_reaper()
        self.driver = driver or LoadedDriver()  # a retry starts at once when the module changes (loaded.py)
        self._metrics = _Metrics(registry) if registry is not None else None
        self._cond = threading.Condition()
        self._snap = Snapshot(status="starting", taken_at=time.time(), generation=0)
        self._last_ok: Snapshot | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._worker: WorkerProcess | None = None
        self._last_reap = 0.0
        self._xid_marks: dict[str, str] = {}
        self._mem_warned: set[int] = set()
        self._durations: dict[str, float] = {}
        self._woken = False

    # ------------------------------------------------------------------ public API
    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="nvml-supervisor", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        w = self._worker
        if w is not None:
            w.wake()
        if self._thread is not None:
            self._thread.join(timeout)
        w = self._worker
        if w is not None and not w.reaped():
            w.kill()
            if not w.reaped():
                self.reaper.abandon(w, "shutdown", kill=False)  # never waited for; the reaper keeps count

    def snapshot(self) -> Snapshot:
        with self._cond:  # held only to swap/read a reference: never across NVML or I/O
            return self._snap

    def wait_for_change(self, generation: int, timeout: float) -> Snapshot:
        """The snapshot once its generation differs from ``generation``, ``timeout`` passed, or ``wake()``
        was called (since the last return)."""
        deadline = time.monotonic() + max(0.0, timeout)
        with self._cond:
            while self._snap.generation == generation and not self._stop.is_set() and not self._woken:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            self._woken = False
            return self._snap

    def wake(self) -> None:
        """Ends the current (or the next) ``wait_for_change()`` at once: its caller has other work, e.g. a
        socket changed (issue 31: the device plugin's loop sleeps here instead of ticking). Safe from a
        signal handler: ``_cond`` is reentrant."""
        with self._cond:
            self._woken = True
            self._cond.notify_all()

    def call_durations(self) -> dict[str, float]:
        """Last observed duration (s) per NVML function."""
        with self._cond:
            return dict(self._durations)

    @property
    def zombies(self) -> int:
        """Abandoned workers of this process not yet exited (stuck in the driver, or not yet collected)."""
        return self._reap()

    # ------------------------------------------------------------------ internals
    def _publish(self, snap: Snapshot) -> Snapshot:
        with self._cond:
            cur = self._snap
            if snap.same_content(cur):
                new = replace(cur, taken_at=snap.taken_at)
            else:
                new = replace(snap, generation=cur.generation + 1)
            self._snap = new
            self._cond.notify_all()
            return new

    def _reap(self) -> int:
        alive = self.reaper.reap()
        self._last_reap = time.monotonic()
        if self._metrics:
            self._metrics.abandoned.set(alive)
        return alive

    def _wait_for_spawn_slot(self) -> bool:
        """Poll until the reaper allows a new worker; while it does not, say nvml-stuck-unkillable.
        False when stopped."""
        self._reap()
        if self.reaper.wait_for_slot(UNKILLABLE_GRACE_S, self._stop):
            return True
        if self._stop.is_set():
            return False
        self._mark_unkillable()
        while not self.reaper.wait_for_slot(REAP_EVERY_S, self._stop):
            self._reap()
            if self._stop.is_set():
                return False
        self._reap()
        if self._metrics:
            self._metrics.unkillable.set(0)
        logger.info("an abandoned NVML worker exited; starting a new NVML worker")
        return True

    def _run(self) -> None:
        backoff = self.backoff_initial_s
        first = True
        while not self._stop.is_set():
            if not self._wait_for_spawn_slot():
                break
            if not first:
                self.restarts += 1
                if self._metrics:
                    self._metrics.restarts.inc()
            first = False
            module = self.driver.read()
            got_inventory = self._run_worker()
            self._reap()
            if self._stop.is_set():
                break
            if got_inventory:
                backoff = self.backoff_initial_s
            logger.info("restarting the NVML worker in %gs", backoff)
            if self.driver.wait_changed(module, backoff, self._stop):
                logger.info("the loaded NVIDIA module changed (%s -> %s): starting the NVML worker now",
                            module or "none", self.driver.read() or "none")
                backoff = self.backoff_initial_s
            else:
                backoff = min(backoff * 2, self.backoff_max_s)
        if self._worker is not None:
            self._worker.stop(grace_s=1.0)

    def _run_worker(self) -> bool:
        w = WorkerProcess(mode="watch", lib_path=self.lib_path, refresh_s=self.refresh_interval_s,
                          call_limit_s=self.call_timeout_s, events=self.watch_events,
                          event_wait_ms=self.event_wait_ms)
        try:
            w.start()
        except OSError as exc:
            self._publish_error(f"nvml Init err: cannot start the NVML worker: {exc}")
            return False
        self._worker = w
        started = time.monotonic()
        got_any = got_inventory = False
        while not self._stop.is_set():
            due = w.until_next_deadline()
            # sleep until the next call's deadline (a 1 ms deadline included), at most IDLE_WAKE_S while
            # something is time-based (the startup limit, an abandoned worker to reap); stop() wakes us
            wait = IDLE_WAKE_S if not got_any or self.reaper.pending() else QUIET_WAKE_S
            if due is not None:
                wait = min(wait, max(due, 0.0) + 0.0002)
            got, msg = w.next_message(wait)
            if time.monotonic() - self._last_reap >= REAP_EVERY_S:
                self._reap()
            overdue = w.overdue()
            startup_limit = self.call_timeout_s + STARTUP_GRACE_S
            if overdue is None and not got_any and time.monotonic() - started > startup_limit:
                overdue = InFlight("worker startup", started, self.call_timeout_s + STARTUP_GRACE_S)
            if overdue is not None:
                self._mark_stuck(str(overdue.fn), w)
                return got_inventory
            if not got:
                continue
            got_any = True
            if msg is None:
                code = None
                try:
                    code = w.proc.wait(timeout=1.0) if w.proc else None
                except Exception:  # TimeoutExpired: it closed stdout but lives on; abandon it
                    self.reaper.abandon(w, "exit")
                if self._snap.status != "error":
                    self._publish_error(f"nvml worker exited unexpectedly (code {code})")
                self._worker = None
                return got_inventory
            self._handle(msg)
            if msg.get("t") == "inventory":
                got_inventory = True
        w.stop(grace_s=1.0)
        if not w.reaped():
            self.reaper.abandon(w, "shutdown", kill=False)  # stop() already sent SIGKILL
        self._worker = None
        return got_inventory

    def _handle(self, msg: dict[str, Any]) -> None:
        t = msg.get("t")
        if t in ("end", "batch-end"):
            calls = [(str(msg.get("fn")), float(msg.get("s", 0.0)))] if t == "end" else batch_calls(msg)
            with self._cond:
                self._durations.update(calls)
            if self._metrics:
                for fn, secs in calls:
                    self._metrics.latency.labels(fn).observe(secs)
        elif t == "inventory":
            previous = self._last_ok
            snap = build_snapshot(msg["data"], previous=previous, xid_marks=self._xid_marks)
            warn_memory_not_supported(snap, self._mem_warned)
            if self._snap.status in ("stuck", "error"):
                logger.info("NVML answers again: %d GPUs, driver %s", len(snap.gpus), snap.driver_version)
            self._last_ok = snap
            if self._metrics:
                self._metrics.stuck.set(0)
            published = self._publish(snap)
            log.v(logger, 4, "NVML inventory: %d GPUs (generation %d)", len(snap.gpus), published.generation)
        elif t == "event":
            self._on_xid(msg)
        elif t == "error":
            if msg.get("fatal"):
                logger.error("%s", msg.get("msg"))
                self._publish_error(str(msg.get("msg")))
            else:
                logger.warning("%s", msg.get("msg"))

    def _on_xid(self, msg: dict[str, Any]) -> None:
        xid, uuid = int(msg.get("xid", 0)), msg.get("uuid")
        where = f"GPU {msg.get('index')} ({uuid})"
        if msg.get("gi") is not None:
            where += f" MIG gi={msg.get('gi')} ci={msg.get('ci')}"
        if not self.xid_policy.is_critical(xid):
            log.v(logger, 3, "XidCriticalError: Xid=%d on %s, the error will be ignored", xid, where)
            return
        if not uuid:
            logger.error("XidCriticalError: Xid=%d on an unknown device; marking all GPUs unhealthy", xid)
            targets = [g.uuid for g in self._snap.gpus]
        else:
            targets = [uuid]
        logger.error("XidCriticalError: Xid=%d on %s, marking device unhealthy", xid, where)
        for u in targets:
            self._xid_marks.setdefault(u, xid_reason(xid))
        cur = self.snapshot()
        gpus = tuple(g.with_health(False, self._xid_marks[g.uuid]) if g.uuid in targets and g.healthy else g
                     for g in cur.gpus)
        self._publish(replace(cur, gpus=gpus, taken_at=time.time()))
        if self._last_ok is not None:
            self._last_ok = replace(self._last_ok, gpus=tuple(
                g.with_health(False, self._xid_marks[g.uuid]) if g.uuid in targets and g.healthy else g
                for g in self._last_ok.gpus))

    def _unhealthy_gpus(self, reason: str) -> tuple[Gpu, ...]:
        base = self._last_ok.gpus if self._last_ok else self._snap.gpus
        return tuple(g.with_health(False, reason) for g in base)

    def _mark_stuck(self, fn: str, w: WorkerProcess) -> None:
        err = NvmlTimeout(fn, self.call_timeout_s)  # no pid: the snapshot must not change per retry
        gpus = self._unhealthy_gpus(REASON_STUCK)
        logger.error("%s; abandoning NVML worker pid %s, marking %d GPUs unhealthy (%s)", err, w.pid,
                     len(gpus), REASON_STUCK)
        self._worker = None
        self.reaper.abandon(w, fn)
        self._reap()
        if self._metrics:
            self._metrics.stuck.set(1)
        prev = self._snap
        self._publish(Snapshot(status="stuck", gpus=gpus, driver_version=prev.driver_version,
                               cuda_driver_version=prev.cuda_driver_version, error=str(err),
                               stuck_call=fn, taken_at=time.time()))

    def _mark_unkillable(self) -> None:
        err = self.reaper.blocked_error()
        gpus = self._unhealthy_gpus(REASON_STUCK_UNKILLABLE)
        logger.error("%s; marking %d GPUs unhealthy (%s); %s", err, len(gpus), REASON_STUCK_UNKILLABLE,
                     "; ".join(self.reaper.details()))
        if self._metrics:
            self._metrics.stuck.set(1)
            self._metrics.unkillable.set(1)
        prev = self._snap
        self._publish(Snapshot(status="stuck", gpus=gpus, driver_version=prev.driver_version,
                               cuda_driver_version=prev.cuda_driver_version, error=str(err),
                               stuck_call=prev.stuck_call or err.REASON, taken_at=time.time()))

    def _publish_error(self, message: str) -> None:
        prev = self._snap
        self._publish(Snapshot(status="error", gpus=self._unhealthy_gpus(REASON_NVML_ERROR),
                               driver_version=prev.driver_version,
                               cuda_driver_version=prev.cuda_driver_version,
                               error=message, taken_at=time.time()))
