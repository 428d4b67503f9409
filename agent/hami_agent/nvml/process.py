"""Parent side of the NVML worker: spawn it, send it requests, read its JSON lines, kill it when stuck.

A call is in flight from its ``begin`` line to its ``end`` line or, inside a batch, while the worker's
call slot (``hami_agent.nvml.callslot``, shared memory) names it; deadlines are checked against both.
Abandoned (killed, not yet exited) workers are tracked by ``hami_agent.nvml.reaper``."""

from __future__ import annotations

import json
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hami_agent import log
from hami_agent.nvml.callslot import CallSlot

logger = logging.getLogger(__name__)

# nvmlEventSetWait's timeout per call, as NVIDIA's k8s-device-plugin waits (internal/rm/health.go:
# eventSet.Wait(5000)): an event ends the wait at once, so the timeout only sets how often an idle
# node's worker wakes (and tells its supervisor about the call).
EVENT_WAIT_MS = 5000
_WAKE: dict[str, Any] = {"t": "wake"}  # put by wake(); never a worker's message

# The package root (…/agent) so the worker can import hami_agent even from a source checkout.
_PKG_ROOT = str(Path(__file__).resolve().parents[2])


@dataclass
class InFlight:
    fn: str
    started: float  # time.monotonic()
    limit: float


@dataclass
class OpenBatch:
    k: int
    limit: float  # the longest the parent sleeps while it sees no call in the slot


@dataclass
class WorkerProcess:
    """One worker process. Not thread-safe: owned by one supervisor thread (or one caller)."""

    mode: str = "serve"  # serve: answers requests on stdin; watch: pushes inventories and XID events
    lib_path: str | None = None
    refresh_s: float = 30.0
    call_limit_s: float = 5.0
    events: bool = False
    event_wait_ms: int = EVENT_WAIT_MS
    proc: subprocess.Popen[bytes] | None = None
    messages: queue.Queue[dict[str, Any] | None] = field(default_factory=queue.Queue)
    inflight: dict[int, InFlight] = field(default_factory=dict)
    last_fn: str | None = None
    durations: dict[str, float] = field(default_factory=dict)
    slot: CallSlot | None = None
    batch: OpenBatch | None = None

    def start(self) -> None:
        cmd = [sys.executable, "-m", "hami_agent.nvml.worker", "--mode", self.mode,
               "--refresh", str(self.refresh_s), "--call-limit", str(self.call_limit_s),
               "--events", "1" if self.events else "0", "--event-wait-ms", str(self.event_wait_ms)]
        if self.lib_path:
            cmd += ["--lib", self.lib_path]
        created = CallSlot.create()
        pass_fds: tuple[int, ...] = ()
        if created is not None:
            self.slot, fd = created
            cmd += ["--slot-fd", str(fd)]
            pass_fds = (fd,)
        env = dict(os.environ)
        env["PYTHONPATH"] = _PKG_ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        # fork+exec of a fresh interpreter (never a bare fork of our threaded process); own session so
        # a terminal's Ctrl-C goes to us, and we decide the worker's fate.
        try:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=None,
                                         env=env, close_fds=True, pass_fds=pass_fds, start_new_session=True)
        finally:
            for fd in pass_fds:
                os.close(fd)  # the worker has its copy; our mapping stays
        log.v(logger, 4, "started NVML worker pid %d (%s)", self.proc.pid, self.mode)
        threading.Thread(target=self._read, args=(self.proc,), daemon=True,
                         name=f"nvml-worker-{self.proc.pid}").start()

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def _read(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            try:
                msg = json.loads(raw)
            except ValueError:
                logger.warning("NVML worker %d wrote a line that is not JSON: %r", proc.pid, raw[:200])
                continue
            self.messages.put(msg)
        self.messages.put(None)  # EOF: the worker exited (or closed stdout)

    def next_message(self, timeout: float) -> tuple[bool, dict[str, Any] | None]:
        """(got, msg): got=False on timeout or ``wake()``; msg=None means the worker's output ended."""
        try:
            msg = self.messages.get(timeout=max(0.0, timeout))
        except queue.Empty:
            return False, None
        if msg is _WAKE:
            return False, None
        if msg is not None:
            self._track(msg)
        return True, msg

    def _track(self, msg: dict[str, Any]) -> None:
        t = msg.get("t")
        if t == "begin":
            self.inflight[int(msg["k"])] = InFlight(str(msg["fn"]), time.monotonic(), float(msg["limit"]))
            self.last_fn = str(msg["fn"])
        elif t == "end":
            self.inflight.pop(int(msg["k"]), None)
            self.durations[str(msg["fn"])] = float(msg.get("s", 0.0))
        elif t == "batch":
            self.batch = OpenBatch(int(msg.get("k", 0)), float(msg.get("limit", self.call_limit_s)))
        elif t == "batch-end":
            self.batch = None
            for fn, secs in batch_calls(msg):
                self.durations[fn] = secs
                self.last_fn = fn

    def _slot_call(self) -> InFlight | None:
        """The call the worker's slot names while a batch is open (None: between calls, or no batch)."""
        if self.batch is None or self.slot is None:
            return None
        c = self.slot.read()
        return None if c is None else InFlight(c.fn, c.started, c.limit)

    def _in_flight(self) -> list[InFlight]:
        c = self._slot_call()
        return [*self.inflight.values(), c] if c is not None else list(self.inflight.values())

    def overdue(self, now: float | None = None) -> InFlight | None:
        """The first in-flight call past its deadline, if any."""
        now = time.monotonic() if now is None else now
        for call in self.inflight.values():
            if now - call.started > call.limit:
                return call
        c = self._slot_call()
        if c is not None and now - c.started > c.limit:
            again = self._slot_call()  # a stuck call's record is stable: never judge one read alone
            if again is not None and again.started == c.started and again.fn == c.fn:
                return c
        return None

    def wake(self) -> None:
        """End a reader's ``next_message`` wait now (its owner is stopping)."""
        self.messages.put(_WAKE)

    def until_next_deadline(self, now: float | None = None) -> float | None:
        """Seconds until the first in-flight call passes its deadline (<= 0: passed); None when idle.
        Readers wait at most this long for the next message, so a call that overruns a deadline shorter
        than their polling period is still caught while it is in flight (a 1 ms deadline included)."""
        now = time.monotonic() if now is None else now
        due = min((c.started + c.limit - now for c in self._in_flight()), default=None)
        if self.batch is not None:
            # a call may start in the slot at any moment: look again within one limit, so no call
            # runs past its deadline unseen (the next look then waits for that call's own deadline)
            due = self.batch.limit if due is None else min(due, self.batch.limit)
        return due

    def oldest_inflight(self) -> InFlight | None:
        return min(self._in_flight(), key=lambda c: c.started, default=None)

    def send(self, msg: dict[str, Any]) -> None:
        """One request line on the worker's stdin. Raises OSError (BrokenPipeError) if it is gone."""
        if not self.proc or not self.proc.stdin:
            raise BrokenPipeError("the NVML worker is not running")
        self.proc.stdin.write((json.dumps(msg, separators=(",", ":")) + "\n").encode())
        self.proc.stdin.flush()

    def exit_code(self) -> int | None:
        return self.proc.poll() if self.proc else None

    def kill(self) -> None:
        """SIGKILL and forget: a process stuck in the driver may never die, so never wait for it."""
        if not self.proc or self.proc.poll() is not None:
            return
        try:
            os.kill(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if self.proc.stdin:
            try:
                self.proc.stdin.close()
            except OSError:
                pass

    def stop(self, grace_s: float = 1.0) -> None:
        """Ask politely (stdin EOF), then SIGKILL after ``grace_s``; waits at most ``grace_s``."""
        if not self.proc or self.proc.poll() is not None:
            return
        if self.proc.stdin:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
        try:
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self.kill()

    def reaped(self) -> bool:
        """Non-blocking reap (waitpid WNOHANG); True once the process is gone."""
        return self.proc is None or self.proc.poll() is not None


def batch_calls(msg: dict[str, Any]) -> list[tuple[str, float]]:
    """The (NVML function, seconds) pairs of a ``batch-end`` line; malformed entries are skipped."""
    out = []
    calls = msg.get("calls")
    for entry in calls if isinstance(calls, list) else ():
        try:
            fn, secs = entry
            out.append((str(fn), float(secs)))
        except (TypeError, ValueError):
            continue
    return out
