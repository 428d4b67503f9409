"""Abandoned NVML workers: killed, never waited for, and at most ``limit`` of them alive per process.

A worker whose NVML call misses its deadline is SIGKILLed and abandoned. When the hang is a thread inside
the driver in uninterruptible sleep (state ``D``), SIGKILL stays pending and the process lives on, holding
its ``/dev/nvidia*`` handles and memory, until the driver returns (possibly never). Starting a fresh worker
after every hang would pile such processes up, so every NVML user of one agent process shares one
``WorkerReaper``: while ``limit`` abandoned workers are alive, no new worker starts
(``NvmlStuckUnkillable``), and work resumes as soon as one of them exits.

Reaping never blocks: ``Popen.poll()`` is ``waitpid(pid, WNOHANG)``. Callers poll (every 0.1 s at most)
while they are blocked; nothing ever waits on a stuck child.

The kill goes through ``terminate`` (default: SIGKILL and close the worker's stdin). It is the test seam
for the "unkillable" fault on machines that cannot produce a real D state: a no-op ``terminate`` leaves
the hung worker really alive, as the driver would (docs/nvml.md, "The D-state model").
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from hami_agent.nvml.errors import NvmlStuckUnkillable
from hami_agent.nvml.process import WorkerProcess

logger = logging.getLogger(__name__)

DEFAULT_LIMIT = 2
LIMIT_ENV = "HAMI_NVML_MAX_ABANDONED_WORKERS"
SIGKILL_MASK = 1 << 8  # bit of SIGKILL (9) in /proc/<pid>/status SigPnd/ShdPnd

Terminate = Callable[[WorkerProcess], None]


def kill_worker(worker: WorkerProcess) -> None:
    """The real kill: SIGKILL, and close its stdin (a worker that can still run exits on EOF too)."""
    worker.kill()


@dataclass(frozen=True)
class ProcInfo:
    """What /proc says about a process; None where unreadable (gone, hidepid, another namespace)."""

    pid: int
    state: str | None  # /proc/<pid>/stat state letter: D = uninterruptible sleep (in the kernel)
    wchan: str | None  # /proc/<pid>/wchan: the kernel function it sleeps in
    sigkill_pending: bool | None

    def describe(self) -> str:
        parts = [f"state {self.state or '?'}"]
        if self.wchan:
            parts.append(f"wchan {self.wchan}")
        if self.sigkill_pending:
            parts.append("SIGKILL pending")
        return ", ".join(parts)


def read_proc_info(pid: int, proc_root: str = "/proc") -> ProcInfo:
    base = os.path.join(proc_root, str(pid))
    state = wchan = None
    pending = None
    try:
        with open(os.path.join(base, "stat"), encoding="ascii", errors="replace") as fh:
            stat = fh.read()
        # "pid (comm) S ...": comm may hold spaces and parentheses; the state follows the last ')'
        state = stat[stat.rfind(")") + 2:][:1] or None
    except OSError:
        pass
    try:
        with open(os.path.join(base, "wchan"), encoding="ascii", errors="replace") as fh:
            wchan = fh.read(256).strip() or None
        if wchan == "0":
            wchan = None  # running, or the kernel hides it
    except OSError:
        pass
    try:
        with open(os.path.join(base, "status"), encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith(("SigPnd:", "ShdPnd:")):
                    pending = bool(pending) or bool(int(line.split()[1], 16) & SIGKILL_MASK)
    except (OSError, ValueError):
        pass
    return ProcInfo(pid, state, wchan, pending)


@dataclass(frozen=True)
class WorkerProc:
    """An NVML worker process found in /proc (any agent's)."""

    info: ProcInfo
    ppid: int | None


WORKER_MARK = b"hami_agent.nvml.worker"


def find_workers(proc_root: str = "/proc") -> list[WorkerProc]:
    """Every ``python -m hami_agent.nvml.worker`` process visible under ``proc_root``, by pid."""
    out: list[WorkerProc] = []
    try:
        entries = sorted((n for n in os.listdir(proc_root) if n.isdigit()), key=int)
    except OSError:
        return out
    for name in entries:
        base = os.path.join(proc_root, name)
        try:
            with open(os.path.join(base, "cmdline"), "rb") as fh:
                if WORKER_MARK not in fh.read(4096):
                    continue
            with open(os.path.join(base, "stat"), encoding="ascii", errors="replace") as fh:
                ppid: int | None = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile, or not ours to read
        out.append(WorkerProc(read_proc_info(int(name), proc_root), ppid))
    return out


def _start_time(pid: int, proc_root: str) -> str | None:
    """Field 22 of /proc/<pid>/stat (start time in clock ticks): a PID reused by another process differs."""
    try:
        with open(os.path.join(proc_root, str(pid), "stat"), encoding="ascii", errors="replace") as fh:
            stat = fh.read()
        return stat[stat.rfind(")") + 2:].split()[19]
    except (OSError, IndexError):
        return None


@dataclass(eq=False)  # identity: two records are never "the same" abandoned worker
class Abandoned:
    pid: int
    call: str  # the NVML call it was stuck in
    since: float  # time.monotonic() of the kill (or of adoption)
    worker: WorkerProcess | None = None  # None: left behind by an earlier agent process (not our child)
    start_time: str | None = None  # for adopted ones: notices the PID being reused

    def exited(self, proc_root: str) -> bool:
        if self.worker is not None:
            return self.worker.reaped()  # waitpid(WNOHANG)
        return _start_time(self.pid, proc_root) != self.start_time  # gone (None), or someone else now


class WorkerReaper:
    """Abandoned workers of one agent process; thread-safe."""

    def __init__(self, limit: int | None = None, *, terminate: Terminate = kill_worker,
                 proc_root: str = "/proc") -> None:
        if limit is None:
            limit = limit_from_env()
        if limit < 1:
            raise ValueError(f"the abandoned NVML worker limit must be >= 1, got {limit}")
        self.limit = limit
        self.terminate = terminate
        self.proc_root = proc_root
        self._lock = threading.Lock()
        self._items: list[Abandoned] = []

    def abandon(self, worker: WorkerProcess, call: str, *, kill: bool = True) -> None:
        """Kill ``worker`` (through ``terminate``) and keep it until it exits. Never waits for it."""
        if worker.proc is None:
            return
        with self._lock:
            if any(a.worker is worker for a in self._items):
                return  # already abandoned (a stop racing the supervisor's own shutdown)
            self._items.append(Abandoned(worker.pid or 0, call, time.monotonic(), worker))
            alive = len(self._items)
        if kill:
            self.terminate(worker)
        logger.warning("abandoned NVML worker pid %s stuck in %s (%d abandoned worker(s) alive, limit %d)",
                       worker.pid, call, alive, self.limit)

    def pending(self) -> bool:
        """True while an abandoned worker is still kept (someone must keep reaping)."""
        with self._lock:
            return bool(self._items)

    def reap(self) -> int:
        """Forget workers that exited (``waitpid(WNOHANG)``); the number still alive."""
        with self._lock:
            items = list(self._items)
        gone = [a for a in items if a.exited(self.proc_root)]
        with self._lock:
            self._items = [a for a in self._items if not any(a is g for g in gone)]
            alive = len(self._items)
        for a in gone:
            logger.info("abandoned NVML worker pid %d (stuck in %s) exited after %.1fs", a.pid, a.call,
                        time.monotonic() - a.since)
        return alive

    def adopt_orphans(self) -> int:
        """Count NVML workers an earlier agent process left stuck in the driver (killed, SIGKILL pending,
        reparented to init): after a restart of the agent they still hold the driver, so they count
        against the limit here too. Polled through /proc (they are not our children). Returns how many."""
        found = [Abandoned(w.info.pid, "an earlier agent process's call", time.monotonic(), None,
                           _start_time(w.info.pid, self.proc_root))
                 for w in find_workers(self.proc_root)
                 if w.ppid == 1 and w.info.sigkill_pending and w.info.state not in (None, "Z", "X")]
        with self._lock:
            known = {a.pid for a in self._items}
            new = [a for a in found if a.pid not in known]
            self._items.extend(new)
        for a in new:
            logger.warning("NVML worker pid %d was left stuck in the driver by an earlier agent process "
                           "(%s); it counts against the limit of %d abandoned workers",
                           a.pid, read_proc_info(a.pid, self.proc_root).describe(), self.limit)
        return len(new)

    def can_spawn(self) -> bool:
        return self.reap() < self.limit

    def abandoned(self) -> list[Abandoned]:
        self.reap()
        with self._lock:
            return list(self._items)

    def pids(self) -> list[int]:
        return [a.pid for a in self.abandoned()]

    def details(self) -> list[str]:
        """One line per abandoned worker with its /proc state (for logs and doctor)."""
        return [f"pid {a.pid} stuck in {a.call} for {time.monotonic() - a.since:.0f}s "
                f"({read_proc_info(a.pid, self.proc_root).describe()})" for a in self.abandoned()]

    def blocked_error(self) -> NvmlStuckUnkillable:
        # stable text (no /proc state, no ages): it becomes the snapshot error, which must not churn
        return NvmlStuckUnkillable([f"pid {a.pid} in {a.call}" for a in self.abandoned()], self.limit)

    def wait_for_slot(self, timeout_s: float, stop: threading.Event | None = None,
                      poll_s: float = 0.1) -> bool:
        """Poll (never a blocking wait on a child) until a worker may start; False on timeout/stop."""
        deadline = time.monotonic() + max(0.0, timeout_s)
        while True:
            if self.can_spawn():
                return True
            left = deadline - time.monotonic()
            if left <= 0 or (stop is not None and stop.is_set()):
                return False
            if stop is not None:
                stop.wait(min(poll_s, left))
            else:
                time.sleep(min(poll_s, left))


def limit_from_env(env: dict[str, str] | None = None) -> int:
    raw = (os.environ if env is None else env).get(LIMIT_ENV, "").strip()
    if not raw:
        return DEFAULT_LIMIT
    why = f"{LIMIT_ENV}={raw!r}: expected a whole number >= 1 (default {DEFAULT_LIMIT})"
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(why) from None
    if value < 1:
        raise ValueError(why)
    return value


_default: WorkerReaper | None = None
_default_lock = threading.Lock()


def default_reaper() -> WorkerReaper:
    """This process's reaper. Process-wide on purpose: the bound is on processes this agent leaves
    behind, whoever started them (a supervisor, its successor after a MIG pause, the monitor's client,
    a one-shot CLI probe). Created with the stuck workers an earlier agent process left behind."""
    global _default
    with _default_lock:
        if _default is None:
            _default = WorkerReaper()
            _default.adopt_orphans()
        return _default
