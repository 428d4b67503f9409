"""Device plugin lifecycle: serve, register, follow the inventory, re-register, pause, give up.

One loop thread does everything that changes state (so there are no races between, say, a kubelet
restart and a MIG pause); registration runs in one thread per resource so a missing kubelet never
stalls the loop.

The loop sleeps until something needs it (issue 31: an idle node's CPU): inotify on the kubelet's
device-plugin directory and the MIG lock's directory (``fswatch``; a re-created ``kubelet.sock``, a
deleted socket of ours, the lock appearing), a new NVML snapshot, a lost ListAndWatch stream, a signal,
every ``SELF_CHECK_EVERY_S`` a self-check of each server that answered no RPC in that time, and at
least every ``HOUSEKEEPING_EVERY_S`` a look at everything in case an event was lost. The NVML gauges
are brought up to date when /metrics is read (``PluginMetrics.before_collect``) and when the snapshot
changes, not on a timer. Each wake re-checks the real state with ``stat()``, so an event
only decides *when* to look. Where inotify is unavailable,
and while something is time-based (a device's recovery quiet period, a failed server start, a stream
loss waiting out its backoff), the loop ticks every ``poll_interval_s`` (250 ms) as before.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hami_agent import known_bad_drivers, log
from hami_agent.deviceplugin.allocator import Allocator
from hami_agent.deviceplugin.devices import PlanError, ResourcePlan, degrade, plan_resources
from hami_agent.deviceplugin.health import HealthTracker
from hami_agent.deviceplugin.metrics import PluginMetrics
from hami_agent.deviceplugin.podsource import PodSource
from hami_agent.deviceplugin.registrar import Registrar
from hami_agent.deviceplugin.server import DeviceState, PluginServer
from hami_agent.deviceplugin.settings import PluginSettings
from hami_agent.fswatch import LoopWaker
from hami_agent.kubeletplugin import DeadlineRunner
from hami_agent.miglock import MigApplyLock
from hami_agent.nvml.source import first_snapshot, start_source, stop_source

logger = logging.getLogger(__name__)

CRASH_MESSAGE = "GRPC server has repeatedly crashed"
# A server that answered no unary RPC (the kubelet's or our own probe's) for this long answers a
# GetDevicePluginOptions over its socket, or restarts as hung. Not shorter (issue 31): each probe wakes
# grpc's event_engine pool, whose workers then poll with a backoff that restarts at 15 ms
# (work_stealing_thread_pool.cc), and a 5 s probe cost an idle node ~1.2 ms of CPU a second of its
# ~2 (docs/performance.md). A hung server is also seen at once by /healthz, which always probes.
SELF_CHECK_EVERY_S = 60.0
# With inotify the loop looks at the sockets and the MIG lock (while paused) at least this often, in case an
# event was lost: the safety net only (NVIDIA's and HAMi's plugins rely on fsnotify alone). It was 5 s, with
# the NVML gauges on the same timer: 0.2 wakeups a second of an idle node for nothing (issue 31).
HOUSEKEEPING_EVERY_S = 30.0


@dataclass(frozen=True)
class _NoSnapshot:
    """What ``current_snapshot()`` returns while no NVML supervisor runs (paused or not started)."""

    status: str = "starting"
    gpus: tuple = ()
    driver_version: str | None = None
    cuda_driver_version: int | None = None
    error: str | None = None
    stuck_call: str | None = None
    taken_at: float = 0.0
    generation: int = 0


@dataclass
class _StreamLosses:
    """Backoff for registering again after lost streams: 0 s, then 0.5 s doubling up to 30 s; a resource
    whose last loss is a minute old starts over."""

    count: int = 0
    last: float = float("-inf")

    def due(self, now: float) -> bool:
        if now - self.last > 60.0:
            self.count = 0
        return self.count == 0 or now - self.last >= min(30.0, 0.5 * 2 ** (self.count - 1))

    def record(self, now: float) -> None:
        self.count += 1
        self.last = now


class DevicePluginManager:
    """Runs the device plugin until ``stop()``; ``run()`` returns the process exit code."""

    def __init__(self, settings: PluginSettings, source_factory: Callable[[], Any], pods: PodSource,
                 metrics: PluginMetrics | None = None, mig: Any = None) -> None:
        """``mig``: a ``dynmig.DynamicMig`` in operatingmode mig."""
        settings.validate()
        self.settings = settings
        self.source_factory = source_factory
        self.metrics = metrics or PluginMetrics()
        self.mig = mig
        self.allocator = Allocator(settings, pods, mig=mig)
        self.runner = DeadlineRunner(settings.rpc_workers, settings.rpc_deadline_s,
                                     reply_margin_s=settings.rpc_reply_margin_s,
                                     commit_margin_s=settings.commit_margin_s,
                                     api_timeout_s=settings.api_timeout_s)
        self.health = HealthTracker(settings.health_recovery_quiet_s)
        self.source: Any = None
        self.states: dict[str, DeviceState] = {}
        self.servers: dict[str, PluginServer] = {}
        self.registrars: dict[str, Registrar] = {}
        self._raw: dict[str, ResourcePlan] = {}
        self._last_plan_error: str | None = None
        self._kubelet_ident: tuple[int, int] | None = None
        self._stop = threading.Event()
        self._pause_requested = threading.Event()
        self._crashes: collections.deque[float] = collections.deque()
        self._fatal: str | None = None
        self.paused = False
        self.reregistrations = 0
        self._last_self_check = 0.0
        self._warn_once = log.WarnOnce(logger)
        self._stream_losses: dict[str, _StreamLosses] = {}
        # the pause loop sleeps on its flag; the main loop sleeps in the source
        self._waker = LoopWaker(lambda: self.source, "deviceplugin-fswatch")
        # shared with the node register loop (cmd.py): one file, one trust rule
        self.mig_lock = MigApplyLock(settings.mig_apply_lock, settings.mig_apply_lock_permissive,
                                     component="device plugin")
        self.metrics.before_collect.hook = self._refresh_nvml_metrics

    # ------------------------------------------------------------------------------ control
    def current_snapshot(self) -> Any:
        """The supervisor's latest snapshot (never blocks); a 'starting' one while paused."""
        source = self.source
        if source is None or self.paused:
            return _NoSnapshot()
        return source.snapshot()

    def stop(self) -> None:
        self._stop.set()
        self.wake()

    def toggle_pause(self) -> None:
        """SIGUSR1: pause (stop serving, release NVML) or resume."""
        if self._pause_requested.is_set():
            self._pause_requested.clear()
        else:
            self._pause_requested.set()
        self.wake()

    def fatal(self, message: str) -> None:
        self._fatal = message
        self._stop.set()
        self.wake()

    def wake(self) -> None:
        """Run the loop now: something it checks may have changed (any thread, or a signal handler)."""
        self._waker.wake()

    def _wait_s(self) -> float:
        """How long the loop may sleep before it must look again by itself."""
        s = self.settings
        if not self._waker.event_driven() or self.health.pending_recoveries() or self._busy():
            return s.poll_interval_s
        now = time.monotonic()
        return min(HOUSEKEEPING_EVERY_S, max(0.01, self._last_self_check + SELF_CHECK_EVERY_S - now))

    def _busy(self) -> bool:
        """Time-based work pending: a server whose start failed, a lost stream waiting out its backoff."""
        return (any(name not in self.servers for name in self._raw)
                or any(server.stream_lost.is_set() for server in self.servers.values()))

    def _watch_dirs(self) -> list[str]:
        s = self.settings
        dirs = [s.device_plugin_dir, os.path.dirname(s.kubelet_socket)]
        if s.mig_apply_lock:
            dirs.append(os.path.dirname(os.path.abspath(s.mig_apply_lock)))
        return dirs

    def _watched_entry(self, name: str) -> bool:
        """The entries of the watched directories the loop looks at: sockets (the kubelet's, ours) and the
        MIG apply lock. Not the kubelet's checkpoint, rewritten at every Allocate."""
        s = self.settings
        return (name.endswith(".sock") or name == os.path.basename(s.kubelet_socket)
                or bool(s.mig_apply_lock) and name == os.path.basename(s.mig_apply_lock))

    def wait_registered(self, timeout: float) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            regs = list(self.registrars.values())
            if regs and all(r.registered.is_set() for r in regs):
                return True
            time.sleep(0.02)
        return False

    # ------------------------------------------------------------------------------ health
    def healthz(self) -> tuple[bool, str]:
        if self._fatal:
            return False, self._fatal
        if self.paused:
            return True, "paused for MIG reconfiguration"
        if not self.servers:
            return False, "no GRPC server running"
        for name, server in list(self.servers.items()):
            problem = server.self_check(timeout=1.0)
            if problem:
                return False, f"'{name}': {problem}"
            reg = self.registrars.get(name)
            if reg is not None and not reg.registered.is_set():
                return False, f"'{name}': not registered with the kubelet yet"
        return True, "ok"

    # ------------------------------------------------------------------------------ inventory
    def _apply_snapshot(self, snap: Any) -> None:
        status = getattr(snap, "status", "ok")
        driver = getattr(snap, "driver_version", None)
        bad = known_bad_drivers.lookup(driver)
        if bad is not None:
            self._warn_once(f"driver {driver} is a known-bad build: {bad['reason']} (or later). This plugin "
                            "keeps answering the kubelet from its last snapshot meanwhile")
        notes: list[str] = []
        try:
            raw = plan_resources(snap, self.settings, notes)
            self._last_plan_error = None
            for note in notes:
                self._warn_once(note)
        except PlanError as exc:
            if str(exc) != self._last_plan_error:
                logger.error("%s", exc)
                self._last_plan_error = str(exc)
            raw = dict(self._raw)
        if status in ("stuck", "error"):
            detail = getattr(snap, "stuck_call", None) or getattr(snap, "error", None) or ""
            reason = f"nvml {status}: {detail}"
            for name, old in self._raw.items():
                if name not in raw or (not raw[name].devices and old.devices):
                    raw[name] = degrade(old, reason)  # keep advertising last-known devices, Unhealthy
        self._raw = raw
        gen = int(getattr(snap, "generation", 0) or 0)
        for name, plan in raw.items():
            eff = self.health.apply(plan, gen, status == "ok")
            state = self.states.get(name)
            if state is None:
                self.states[name] = DeviceState(eff)
            elif state.update(eff):
                healthy = sum(1 for d in eff.devices if d.healthy)
                log.v(logger, 2 if healthy == len(eff.devices) else 0,
                      "'%s': %d devices, %d healthy; pushing ListAndWatch update", name, len(eff.devices),
                      healthy)
        for health in ("Healthy", "Unhealthy"):
            for name, state in self.states.items():
                plan = state.current()[0]
                n = sum(1 for d in plan.devices if d.healthy == (health == "Healthy"))
                self.metrics.devices.labels(name, health).set(n if name in raw else 0)
        self._update_nvml_metrics(snap)

    def _refresh_nvml_metrics(self) -> None:
        """On a scrape (any thread): the gauges as of now; while paused they keep their last values."""
        source = self.source
        if source is not None and not self.paused:
            self._update_nvml_metrics(source.snapshot())

    def _update_nvml_metrics(self, snap: Any) -> None:
        status = getattr(snap, "status", "ok")
        self.metrics.nvml_stuck.set(1 if status == "stuck" else 0)
        for s in ("starting", "ok", "stuck", "error"):
            self.metrics.nvml_status.labels(s).set(1 if s == status else 0)
        taken = getattr(snap, "taken_at", None)
        if isinstance(taken, (int, float)) and taken > 0:
            now = time.time() if taken > 1e9 else time.monotonic()
            self.metrics.nvml_snapshot_age.set(max(0.0, now - taken))
        timings = getattr(self.source, "call_durations", None)
        if callable(timings):
            try:
                for call, secs in dict(timings()).items():
                    self.metrics.nvml_call_duration.labels(call).set(secs)
            except Exception:  # optional supervisor feature; never fatal
                log.v(logger, 5, "supervisor call_durations() failed")

    # ------------------------------------------------------------------------------ servers
    def _record_crash(self, name: str, exc: BaseException) -> None:
        now = time.monotonic()
        self._crashes.append(now)
        while self._crashes and now - self._crashes[0] > self.settings.restart_window_s:
            self._crashes.popleft()
        self.metrics.server_restarts.labels(name).inc()
        logger.error("GRPC server for '%s' failed: %s", name, exc)
        if len(self._crashes) > self.settings.max_server_restarts:
            self.fatal(f"{CRASH_MESSAGE} ({len(self._crashes)} failures within "
                       f"{self.settings.restart_window_s:g}s); last: {exc}")

    def _start_server(self, name: str) -> None:
        server = PluginServer(self.states[name], self.allocator, self.settings, self.metrics, self.runner,
                              on_stream_lost=self.wake)
        try:
            server.start()
        except Exception as exc:
            self._record_crash(name, exc)
            return
        self.servers[name] = server
        reg = self.registrars.get(name)
        if reg is None or reg.server is not server:
            if reg is not None:
                reg.stop()
            reg = self.registrars[name] = Registrar(server, self.settings, self.metrics, self.fatal)
        reg.trigger()

    def _stop_server(self, name: str) -> None:
        reg = self.registrars.pop(name, None)
        if reg is not None:
            reg.stop()
        server = self.servers.pop(name, None)
        if server is not None:
            server.stop()

    def _restart_server(self, name: str, cause: str) -> None:
        self.reregistrations += 1
        self.metrics.reregistrations.labels(name, cause).inc()
        self._stop_server(name)
        self._start_server(name)

    def _sync_servers(self) -> None:
        for name in list(self.servers):
            if name not in self._raw:
                logger.info("resource '%s' is gone from the inventory; stopping its GRPC server", name)
                self._stop_server(name)
                self.states.pop(name, None)
        for name in self._raw:
            if name not in self.servers and not self._stop.is_set():
                self._start_server(name)

    def _kubelet_socket_ident(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.settings.kubelet_socket)
        except OSError:
            return None
        return (st.st_ino, st.st_ctime_ns)

    def _check_sockets(self) -> None:
        ident = self._kubelet_socket_ident()
        watch_kubelet = self.settings.registration_mode == "kubelet"
        if watch_kubelet and ident is not None and ident != self._kubelet_ident:
            if self._kubelet_ident is not None:
                logger.info("%s was re-created (kubelet restarted): restarting GRPC servers and "
                            "re-registering", self.settings.kubelet_socket)
                for name in list(self.servers):
                    self._restart_server(name, "kubelet-restart")
            self._kubelet_ident = ident
        elif ident is None and self._kubelet_ident is not None:
            self._kubelet_ident = None  # kubelet down; re-register when its socket comes back
        for name, server in list(self.servers.items()):
            if not server.socket_ok():
                logger.info("plugin socket %s was deleted: restarting GRPC server for '%s' and "
                            "re-registering", server.path, name)
                self._restart_server(name, "socket-deleted")
        now = time.monotonic()
        if now - self._last_self_check >= SELF_CHECK_EVERY_S:
            self._last_self_check = now
            for name, server in list(self.servers.items()):
                if server.quiet_for(now) < SELF_CHECK_EVERY_S:
                    continue  # it answered the kubelet lately: alive without a probe
                problem = server.self_check(timeout=1.0)
                if problem:
                    self._record_crash(name, RuntimeError(problem))
                    if not self._stop.is_set():
                        self._restart_server(name, "unresponsive")

    def _check_streams(self) -> None:
        """Register again when the kubelet ended a server's ListAndWatch stream (see
        ``DevicePluginServicer.ListAndWatch``): the first time at once, then with backoff, so a kubelet
        that keeps dropping us costs one Register per backoff period, not a loop."""
        now = time.monotonic()
        for name, server in list(self.servers.items()):
            if not server.stream_lost.is_set():
                continue
            losses = self._stream_losses.setdefault(name, _StreamLosses())
            if not losses.due(now):
                continue
            server.stream_lost.clear()
            losses.record(now)
            logger.warning("the kubelet ended the ListAndWatch stream of '%s' while it is still served (it "
                           "now counts its devices as Unhealthy): registering again", name)
            self.reregistrations += 1
            self.metrics.reregistrations.labels(name, "stream-lost").inc()
            reg = self.registrars.get(name)
            if reg is not None and reg.server is server:
                reg.trigger()

    # ------------------------------------------------------------------------------ NVML source
    def _start_source(self) -> Any:
        self.source = start_source(self.source_factory)
        return first_snapshot(self.source, self.settings.first_snapshot_wait_s, self._stop)

    def _stop_source(self) -> None:
        source, self.source = self.source, None
        stop_source(source)

    # ------------------------------------------------------------------------------ pause
    def _should_pause(self) -> bool:
        if self._pause_requested.is_set():
            return True
        held = self.mig_lock.held()  # an untrusted lock is ignored, logged and counted
        self.metrics.mig_lock_untrusted.set(1 if self.mig_lock.untrusted else 0)
        return held

    def _pause(self) -> None:
        why = "SIGUSR1" if self._pause_requested.is_set() else self.settings.mig_apply_lock
        logger.info("MIG apply lock file detected (%s): pausing device plugin, stopping GRPC servers and "
                    "releasing NVML", why)
        self.paused = True
        self.metrics.paused.set(1)
        for name in list(self.servers):
            self._stop_server(name)
        self._stop_source()
        while self._should_pause() and not self._stop.is_set():
            # the lock's removal and SIGUSR1 wake this; without inotify it is polled
            watched = self._waker.watching()
            self._waker.flag.wait(HOUSEKEEPING_EVERY_S if watched else self.settings.poll_interval_s)
        self.paused = False
        self.metrics.paused.set(0)
        if self._stop.is_set():
            return
        logger.info("MIG apply lock released: resuming device plugin")
        snap = self._start_source()
        self._apply_snapshot(snap)
        self._sync_servers()

    # ------------------------------------------------------------------------------ main loop
    def run(self) -> int:
        try:
            # before the first look at the sockets and the lock, so no change between the two is missed
            self._waker.start_watch(self._watch_dirs(), self._watched_entry)
            self._kubelet_ident = self._kubelet_socket_ident()
            gen = -1
            if not self._should_pause():  # a MIG reconfiguration in progress: do not even touch NVML
                snap = self._start_source()
                self._apply_snapshot(snap)
                self._sync_servers()
                gen = getattr(snap, "generation", 0)
            while not self._stop.is_set():
                if self._should_pause():
                    self._pause()
                    gen = -1
                    continue
                snap = self.source.wait_for_change(gen, self._wait_s())
                changed = getattr(snap, "generation", 0) != gen
                gen = getattr(snap, "generation", 0)
                # A wake costs only the socket checks: the plan is rebuilt when NVML's inventory changed
                # (a new generation) or while a device waits out its recovery quiet period (time-based).
                if changed or self.health.pending_recoveries():
                    self._apply_snapshot(snap)
                self._sync_servers()  # also retries a server whose start failed
                self._check_sockets()
                self._check_streams()
        except Exception as exc:  # keep the exit path orderly and the cause in the log
            logger.exception("device plugin loop failed")
            self._fatal = self._fatal or f"device plugin loop failed: {exc}"
        finally:
            self.shutdown()
        if self._fatal:
            logger.error("%s", self._fatal)
            return 1
        return 0

    def shutdown(self) -> None:
        self._waker.stop_watch()
        for name in list(self.servers):
            self._stop_server(name)
        for reg in list(self.registrars.values()):
            reg.stop()
        self.registrars.clear()
        self._stop_source()
        self.runner.shutdown()
        self.allocator.close()  # lets queued lock releases / failure records land (bounded)
