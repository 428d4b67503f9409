"""Host processes of the sandbox: started detached with a pid file and a log each, stopped by pid.

Pid files (``<run>/pids/<name>.pid``) let ``python -m sandbox down`` from another shell stop what
``up`` started. A pid file stores the pid and the process start time (from /proc) so a recycled pid is
never signalled.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

logger = logging.getLogger("sandbox.procs")


def _start_time(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            # field 22 (starttime); the command name (field 2) may contain spaces: split after ')'
            return fh.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


class ProcessManager:
    def __init__(self, pid_dir: Path, log_dir: Path) -> None:
        self.pid_dir = pid_dir
        self.log_dir = log_dir

    def log_path(self, name: str) -> Path:
        return self.log_dir / f"{name}.log"

    def start(
        self, name: str, argv: Sequence[str], env: dict[str, str] | None = None, cwd: Path | None = None
    ) -> int:
        """Start ``argv`` in its own session (so a Ctrl-C on the demo does not reach it first; the
        demo stops it in order). Replaces a running process of the same name."""
        self.stop(name)
        self.pid_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path(name), "ab")  # noqa: SIM115 - handed to the child
        try:
            proc = subprocess.Popen(
                list(argv),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **(env or {})},
                cwd=cwd,
                start_new_session=True,
            )
        finally:
            log.close()
        (self.pid_dir / f"{name}.pid").write_text(f"{proc.pid} {_start_time(proc.pid) or ''}\n")
        logger.debug("started %s pid %d: %s", name, proc.pid, " ".join(argv))
        return proc.pid

    def pid(self, name: str) -> int | None:
        """The pid of ``name`` if that very process is still alive."""
        try:
            parts = (self.pid_dir / f"{name}.pid").read_text().split()
        except OSError:
            return None
        if not parts:
            return None
        pid = int(parts[0])
        st = _start_time(pid)
        if st is None or (len(parts) > 1 and parts[1] != st):
            return None
        try:
            with open(f"/proc/{pid}/stat") as fh:
                if fh.read().rsplit(")", 1)[1].split()[0] == "Z":
                    _reap(pid)
                    return None
        except OSError:
            return None
        return pid

    def running(self, name: str) -> bool:
        return self.pid(name) is not None

    def names(self) -> list[str]:
        if not self.pid_dir.is_dir():
            return []
        return sorted(p.stem for p in self.pid_dir.glob("*.pid"))

    def stop(self, name: str, timeout_s: float = 8.0) -> bool:
        """SIGTERM the process group, SIGKILL after ``timeout_s``. True if something was stopped."""
        pid = self.pid(name)
        pid_file = self.pid_dir / f"{name}.pid"
        if pid is None:
            pid_file.unlink(missing_ok=True)
            return False
        _signal_group(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.pid(name) is not None:
            _reap(pid)
            time.sleep(0.1)
        if self.pid(name) is not None:
            logger.warning("%s (pid %d) ignored SIGTERM for %.0fs: SIGKILL", name, pid, timeout_s)
            _signal_group(pid, signal.SIGKILL)
            # a process stuck in the kernel may never die; do not wait on it for long (DESIGN §2 rule 2)
            end = time.monotonic() + 3
            while time.monotonic() < end and self.pid(name) is not None:
                _reap(pid)
                time.sleep(0.1)
        pid_file.unlink(missing_ok=True)
        return True

    def stop_all(self, order: Sequence[str] = ()) -> list[str]:
        """Stop ``order`` first (in that order), then everything else with a pid file."""
        stopped = []
        for name in [*order, *(n for n in self.names() if n not in order)]:
            if self.stop(name):
                stopped.append(name)
        return stopped


def _is_child(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[1]) == os.getpid()
    except (OSError, ValueError, IndexError):
        return False


def _reap(pid: int) -> None:
    if _is_child(pid):
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass


def _signal_group(pid: int, sig: int) -> None:
    # each sandbox process leads its own session (start_new_session): signal its whole group, so
    # children such as the NVML worker go too
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        return
    except PermissionError:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
