"""What the soak knows about processes, read from ``/proc`` (never from the agents' own reports): the NVML
worker processes of every agent, and the agent processes it started (start, stop the way systemd does,
notice an exit nobody asked for).

Every process of a run carries ``HAMI_CHAOS_RUN=<run id>`` in its environment (NVML workers inherit it),
so the soak finds and counts only its own processes, and the final clean-up (and the test's teardown)
can kill every one of them even when the harness itself died.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

RUN_ENV = "HAMI_CHAOS_RUN"
STOP_TIMEOUT_S = 20.0  # TimeoutStopSec of the roles' units (hami-device-plugin/-monitor/-scheduler.service)
WORKER_MARK = b"hami_agent.nvml.worker"
SIGKILL_BIT = 1 << (signal.SIGKILL - 1)


@dataclass(frozen=True)
class WorkerInfo:
    """One NVML worker process (``python -m hami_agent.nvml.worker``) of this run."""

    pid: int
    ppid: int
    state: str  # /proc/<pid>/stat letter: D = uninterruptible sleep, Z = zombie
    sigkill_pending: bool  # killed, and still alive (the signal cannot be delivered: state D)
    mode: str  # "watch" (device plugin supervisor) or "serve" (monitor, one-shot probes)
    node: str  # from the worker's GPUSIM_STATE (<workdir>/<node>/gpusim.json)
    start_time: str

    @property
    def alive(self) -> bool:
        return self.state not in ("Z", "X")

    @property
    def role(self) -> str:
        return "device-plugin" if self.mode == "watch" else "monitor"


def _read(path: str, limit: int = 1 << 16) -> bytes:
    with open(path, "rb") as fh:
        return fh.read(limit)


def _stat(pid: int) -> tuple[str, int, str] | None:
    """(state, ppid, start time) of ``pid``, None when it is gone."""
    try:
        raw = _read(f"/proc/{pid}/stat").decode("ascii", "replace")
    except OSError:
        return None
    rest = raw[raw.rfind(")") + 2:].split()
    try:
        return rest[0], int(rest[1]), rest[19]
    except (IndexError, ValueError):
        return None


def start_time(pid: int) -> str | None:
    st = _stat(pid)
    return st[2] if st else None


def _sigkill_pending(pid: int) -> bool:
    try:
        for line in _read(f"/proc/{pid}/status").decode("ascii", "replace").splitlines():
            if line.startswith(("SigPnd:", "ShdPnd:")) and int(line.split()[1], 16) & SIGKILL_BIT:
                return True
    except (OSError, ValueError, IndexError):
        pass
    return False


class ProcScanner:
    """Finds this run's processes in /proc. Identity facts (run, mode, node) are read once per process
    (pid + start time) and cached; state and pending signals are read on every scan."""

    def __init__(self, run_id: str) -> None:
        self.marker = f"{RUN_ENV}={run_id}".encode()
        self._ident: dict[tuple[int, str], tuple[str, str] | None] = {}  # (pid, start) -> (mode, node)
        # the watcher samples and the fault thread looks for a stopped agent's workers at the same time
        self._lock = threading.Lock()

    def _identify(self, pid: int) -> tuple[str, str] | None:
        try:
            args = _read(f"/proc/{pid}/cmdline", 4096).split(b"\0")
            if WORKER_MARK not in args:  # the module name as an argument: python -m hami_agent.nvml.worker
                return None
            env = _read(f"/proc/{pid}/environ").split(b"\0")
        except OSError:
            return None
        if self.marker not in env:
            return None
        mode = args[args.index(b"--mode") + 1].decode() if b"--mode" in args else "serve"
        node = next((Path(e.split(b"=", 1)[1].decode()).parent.name for e in env
                     if e.startswith(b"GPUSIM_STATE=")), "?")
        return mode, node

    def workers(self) -> list[WorkerInfo]:
        with self._lock:
            return self._workers_locked()

    def _workers_locked(self) -> list[WorkerInfo]:
        out: list[WorkerInfo] = []
        try:
            pids = [int(n) for n in os.listdir("/proc") if n.isdigit()]
        except OSError:
            return out
        seen: set[tuple[int, str]] = set()
        for pid in pids:
            st = _stat(pid)
            if st is None:
                continue
            key = (pid, st[2])
            if key not in self._ident:
                self._ident[key] = self._identify(pid)
            ident = self._ident[key]
            seen.add(key)
            if ident is None:
                continue
            out.append(WorkerInfo(pid, st[1], st[0], _sigkill_pending(pid), ident[0], ident[1], st[2]))
        self._ident = {k: v for k, v in self._ident.items() if k in seen}
        return out

    def all_run_pids(self) -> list[int]:
        """Every live process of this run (agents, workers), for the final clean-up."""
        out = []
        for name in os.listdir("/proc"):
            if not name.isdigit() or int(name) == os.getpid():
                continue
            try:
                if self.marker in _read(f"/proc/{name}/environ").split(b"\0"):
                    out.append(int(name))
            except OSError:
                continue
        return out


def kill_run(run_id: str) -> int:
    """SIGKILL every process of run ``run_id`` (the last-resort clean-up); returns how many."""
    pids = ProcScanner(run_id).all_run_pids()
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return len(pids)


@dataclass
class Exit:
    at: float  # time.monotonic()
    rc: int | None
    expected: bool
    forced: bool = False  # asked to stop (SIGTERM) and did not within the timeout: SIGKILLed
    sig: int | None = None  # the signal it was asked to stop with
    took_s: float = 0.0  # from the signal to the exit


@dataclass
class AgentProcess:
    """One agent process (device plugin, monitor, extender replica) as a systemd unit would run it:
    ``stop()`` is SIGTERM to the main process, then SIGKILL to the NVML workers it leaves behind
    (``KillMode=mixed``: the unit's whole cgroup; the workers run in their own sessions, so a process
    group kill would miss them). An exit the soak did not ask for is a crash; ``supervise()`` restarts
    the process a second later (``Restart=always``, ``RestartSec=1``)."""

    name: str
    role: str
    node: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    scanner: ProcScanner
    proc: subprocess.Popen | None = None
    exits: list[Exit] = field(default_factory=list)
    starts: int = 0
    _expected: bool = False
    _down_since: float | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        with self._lock:
            if self.running():
                return
            with open(self.log_path, "ab") as log:
                log.write(f"---- chaos: start #{self.starts + 1} at {time.time():.3f}\n".encode())
                log.flush()
                self.proc = subprocess.Popen(self.argv, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL)
            self.starts += 1
            self._expected = False
            self._down_since = None

    def _workers(self) -> list[WorkerInfo]:
        pid = self.pid
        return [w for w in self.scanner.workers() if w.ppid == pid] if pid else []

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = STOP_TIMEOUT_S) -> int | None:
        """Stop on purpose (not a crash). Returns the exit code (None if it was not running)."""
        with self._lock:
            proc = self.proc
            if proc is None:
                return None
            if proc.poll() is not None:  # exited on its own before anyone noticed: that was a crash
                if not self._expected and self._down_since is None:
                    self.exits.append(Exit(time.monotonic(), proc.returncode, False))
                self._expected, self._down_since = True, self._down_since or time.monotonic()
                return None
            self._expected = True
            workers = self._workers()
            try:
                proc.send_signal(sig)
            except OSError:
                pass
            forced = False
            asked = time.monotonic()
            try:
                rc = proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                rc = proc.wait(10)
                forced = True
            self.exits.append(Exit(time.monotonic(), rc, True, forced, sig, time.monotonic() - asked))
            self._down_since = time.monotonic()
        for w in workers:  # KillMode=mixed: what is left of the unit gets SIGKILL
            if start_time(w.pid) == w.start_time:
                try:
                    os.kill(w.pid, signal.SIGKILL)
                except OSError:
                    pass
        return rc

    def supervise(self, restart_after_s: float = 1.0) -> Exit | None:
        """Notice an exit nobody asked for (a crash: recorded) and restart after ``restart_after_s``.
        Returns the crash's exit record when one is found now."""
        if not self._lock.acquire(blocking=False):
            return None  # being stopped or started right now
        try:
            proc = self.proc
            if proc is None or self._expected:
                return None
            rc = proc.poll()
            if rc is None:
                return None
            crash = None
            if self._down_since is None:
                crash = Exit(time.monotonic(), rc, False)
                self.exits.append(crash)
                self._down_since = time.monotonic()
            due = time.monotonic() - self._down_since >= restart_after_s
        finally:
            self._lock.release()
        if due:
            self.start()
        return crash

    def crashes(self) -> list[Exit]:
        return [e for e in self.exits if not e.expected]

    def unclean_stops(self) -> list[Exit]:
        """SIGTERM stops that did not end with exit code 0 (or by the SIGTERM itself, which systemd also
        counts as a clean stop: a process still importing has no handler yet) within the units'
        ``TimeoutStopSec``."""
        return [e for e in self.exits if e.expected and e.sig == signal.SIGTERM
                and (e.forced or e.rc not in (0, -signal.SIGTERM))]
