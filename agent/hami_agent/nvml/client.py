"""NvmlClient: one long-lived NVML worker answering requests (usage, inventory), reused for every call.

The monitor keeps one for its host metrics, so a sample every few seconds costs one request, not one new
process. Each request has a deadline for the whole exchange (worker start-up included on the first one)
and each NVML call its own ``call_timeout_s``. A request past either deadline raises ``NvmlTimeout``
naming the call; the worker is handed to the process's ``WorkerReaper`` (killed, never waited for) and
the next request starts a new worker after a backoff (1 s doubling to 60 s), and only while fewer than
the reaper's limit of abandoned workers are alive; otherwise it raises ``NvmlStuckUnkillable``.

The one-shot ``collect_inventory`` / ``collect_usage`` (CLI commands, doctor) are a client used once.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from typing import Any

from hami_agent.nvml.errors import NvmlError, NvmlTimeout
from hami_agent.nvml.inventory import (
    build_snapshot,
    check_lib_path,
    resolve_lib_path,
    warn_memory_not_supported,
)
from hami_agent.nvml.loaded import LoadedDriver
from hami_agent.nvml.model import Snapshot
from hami_agent.nvml.process import WorkerProcess
from hami_agent.nvml.reaper import WorkerReaper, default_reaper
from hami_agent.nvml.usage import Usage, build_usage

logger = logging.getLogger(__name__)

STOP_GRACE_S = 1.0  # a healthy worker exits on stdin EOF at once; past this it is killed and abandoned
UNKILLABLE_GRACE_S = 0.5  # a just-killed worker needs a moment to exit before it counts as unkillable


class NvmlClient:
    """Thread-safe; one request at a time (NVML calls are serialised in the worker anyway)."""

    def __init__(self, lib_path: str | os.PathLike[str] | None = None, call_timeout_s: float = 10.0, *,
                 reaper: WorkerReaper | None = None, backoff_initial_s: float = 1.0,
                 backoff_max_s: float = 60.0, driver: LoadedDriver | None = None) -> None:
        if call_timeout_s <= 0:
            raise ValueError("call_timeout_s must be > 0")
        self.lib_path = resolve_lib_path(lib_path)
        self.call_timeout_s = call_timeout_s
        self.reaper = reaper or default_reaper()
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.driver = driver or LoadedDriver()  # a changed kernel module ends the backoff (loaded.py)
        self.workers_started = 0
        self._lock = threading.Lock()
        self._worker: WorkerProcess | None = None
        self._ids = itertools.count(1)
        self._failures = 0
        self._retry_at = 0.0
        self._last_error: NvmlError | None = None
        self._module: str | None = None  # the loaded module when the last worker started

    def __enter__(self) -> NvmlClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def worker_pid(self) -> int | None:
        w = self._worker
        return w.pid if w is not None else None

    # ------------------------------------------------------------------------------------ requests
    def usage(self, timeout_s: float | None = None) -> Usage:
        return build_usage(self.request("usage", timeout_s))

    def inventory(self, timeout_s: float | None = None) -> Snapshot:
        snap = build_snapshot(self.request("inventory", timeout_s), generation=1)
        warn_memory_not_supported(snap)
        return snap

    def request(self, op: str, timeout_s: float | None = None,
                args: dict[str, Any] | None = None) -> dict[str, Any]:
        """The worker's ``data`` for ``op`` (``args``: the op's arguments, for the MIG ops). Raises
        NvmlError, NvmlTimeout or NvmlStuckUnkillable."""
        timeout = self.call_timeout_s if timeout_s is None else timeout_s
        if timeout <= 0:
            raise ValueError("timeout_s must be > 0")
        with self._lock:
            deadline = time.monotonic() + timeout
            worker = self._ensure_worker(deadline)
            try:
                data = self._exchange(worker, op, timeout, deadline, args)
            except NvmlError as exc:
                self._failed(exc)
                raise
            self._failures = 0
            self._last_error = None
            return data

    def close(self) -> None:
        """Stop the worker (stdin EOF); one that does not exit within a second is killed and abandoned."""
        with self._lock:
            w, self._worker = self._worker, None
        if w is None:
            return
        w.stop(grace_s=STOP_GRACE_S)
        if not w.reaped():
            self.reaper.abandon(w, "shutdown", kill=False)  # stop() already sent SIGKILL

    # ------------------------------------------------------------------------------------ internals
    def _backoff_s(self) -> float:
        return min(self.backoff_initial_s * 2 ** max(0, self._failures - 1), self.backoff_max_s)

    def _failed(self, exc: NvmlError) -> None:
        self._failures += 1
        self._last_error = exc
        self._retry_at = time.monotonic() + self._backoff_s()

    def _ensure_worker(self, deadline: float) -> WorkerProcess:
        w = self._worker
        if w is not None and w.exit_code() is None:
            return w
        self._worker = None
        if (time.monotonic() < self._retry_at and self._last_error is not None
                and not self.driver.changed_since(self._module)):
            # stable text (the monitor logs a message once per change): no countdown in it
            raise NvmlError(f"{self._last_error} (backing off: the next NVML worker starts at most "
                            f"{self._backoff_s():g}s after the failure)",
                            call=self._last_error.call, code=self._last_error.code)
        if not self.reaper.can_spawn():
            # a worker killed a moment ago may still be exiting: give it a short, bounded chance
            self.reaper.wait_for_slot(min(UNKILLABLE_GRACE_S, max(0.0, deadline - time.monotonic())))
            if not self.reaper.can_spawn():
                err = self.reaper.blocked_error()
                logger.error("%s; %s", err, "; ".join(self.reaper.details()))
                raise err
        self._module = self.driver.read()  # before anything can fail: the backoff compares against it
        check_lib_path(self.lib_path)
        w = WorkerProcess(mode="serve", lib_path=self.lib_path, call_limit_s=self.call_timeout_s)
        try:
            w.start()
        except OSError as exc:
            raise NvmlError(f"nvml Init err: cannot start the NVML worker: {exc}", call="nvmlInit") from exc
        self.workers_started += 1
        self._worker = w
        return w

    def _abandon(self, w: WorkerProcess, call: str) -> None:
        self._worker = None
        self.reaper.abandon(w, call)

    def _exchange(self, w: WorkerProcess, op: str, timeout: float, deadline: float,
                  args: dict[str, Any] | None = None) -> dict[str, Any]:
        rid = next(self._ids)
        msg_out: dict[str, Any] = {"op": op, "id": rid}
        if args is not None:
            msg_out["args"] = args
        try:
            w.send(msg_out)
        except OSError:
            pass  # it died already: its output ends below and says why
        while True:
            now = time.monotonic()
            overdue = w.overdue(now)
            if overdue is not None or now >= deadline:
                call = overdue or w.oldest_inflight()
                fn = call.fn if call else "nvmlInit"
                limit = overdue.limit if overdue is not None else timeout
                self._abandon(w, fn)
                raise NvmlTimeout(fn, limit, w.pid)
            wait = min(deadline - now, 0.1)
            due = w.until_next_deadline(now)
            if due is not None:
                wait = min(wait, max(due, 0.0) + 0.0002)  # wake just past an in-flight call's deadline
            got, msg = w.next_message(wait)
            if not got:
                continue
            if msg is None:
                code = w.exit_code()
                if code is None:  # closed its output but lives on: not ours to wait for
                    self._abandon(w, "exit")
                self._worker = None
                raise NvmlError(f"nvml worker exited (code {code}) before reporting the {op}")
            t = msg.get("t")
            if t == "error" and msg.get("fatal"):
                self._worker = None
                w.stop(grace_s=STOP_GRACE_S)  # it exits by itself after a fatal error
                if not w.reaped():
                    self.reaper.abandon(w, str(msg.get("fn") or op), kill=False)
                raise NvmlError(str(msg.get("msg")), call=msg.get("fn"), code=msg.get("code"))
            if t == "error":
                logger.warning("%s", msg.get("msg"))
            elif t == op and msg.get("id") == rid:
                return dict(msg["data"])


def collect_inventory(lib_path: str | os.PathLike[str] | None = None, timeout_s: float = 10.0) -> Snapshot:
    """One-shot inventory. Raises ``NvmlError`` (worded like HAMi's logs), ``NvmlTimeout`` naming the NVML
    call that did not return within ``timeout_s`` (the worker is killed and abandoned, never waited for),
    or ``NvmlStuckUnkillable`` when this process already left its limit of unkillable workers behind."""
    if timeout_s <= 0:
        raise ValueError("timeout_s must be > 0")
    with NvmlClient(lib_path, call_timeout_s=timeout_s) as client:
        return client.inventory(timeout_s)


def collect_usage(lib_path: str | os.PathLike[str] | None = None, timeout_s: float = 10.0) -> Usage:
    """One-shot usage (library: ``lib_path``, else ``$HAMI_NVML_LIBRARY``, else the system's); errors as
    ``collect_inventory``."""
    if timeout_s <= 0:
        raise ValueError("timeout_s must be > 0")
    with NvmlClient(lib_path, call_timeout_s=timeout_s) as client:
        return client.usage(timeout_s)
