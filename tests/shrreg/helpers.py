"""Test helpers around the ``mkregion`` C helper (tests/shrreg/mkregion.c).

The helper writes region files with its own C struct definitions and real pshared semaphores, so
tests compare the Python reader against bytes produced the way HAMi-core produces them.
"""

from __future__ import annotations

import os
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
MKREGION = HERE / "build" / "mkregion"
LAYOUT_NAMES = ("v0b", "v1.1", "v1.1-transient", "v1.2")
SIZES = {"v0b": 1197896, "v1.1": 2008952, "v1.1-transient": 2008984, "v1.2": 2008952}
MIB = 1 << 20

_build_lock = threading.Lock()


def build() -> Path:
    """``make -C tests/shrreg`` once per session (cheap when up to date)."""
    with _build_lock:
        subprocess.run(["make", "-s", "-C", str(HERE)], check=True, capture_output=True, timeout=120)
    return MKREGION


def uuid_for(index: int) -> str:
    """The UUID mkregion writes for device ``index``."""
    return "GPU-%08x-0000-4000-8000-%012x" % (0xABC00000 + index, index)


def dead_pid() -> int:
    """A PID that existed and is now reaped (not reused within a test's lifetime in practice)."""
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return pid


@dataclass
class Mk:
    """Drive mkregion for one region file."""

    path: Path
    layout: str

    def run(self, *args: str | int, check: bool = True) -> str:
        cp = subprocess.run(
            [str(MKREGION), args[0], str(self.path), self.layout, *map(str, args[1:])],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if check and cp.returncode != 0:
            raise AssertionError(f"mkregion {args} failed rc={cp.returncode}: {cp.stderr}")
        return cp.stdout

    def create(self, ndev: int = 2, limit_mib: int = 16384, sm_limit: int = 50) -> Mk:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.run("create", ndev, limit_mib, sm_limit)
        return self

    def slot(self, pid: int, hostpid: int, status: int, *used_bytes: int) -> int:
        return int(self.run("slot", pid, hostpid, status, *(used_bytes or (0,))).strip())

    def halfslot(self, pid: int) -> None:
        self.run("halfslot", pid)

    def oddseq(self, index: int) -> None:
        self.run("oddseq", index)

    def lock(self, owner: int) -> None:
        self.run("lock", owner)

    def semval(self) -> dict[str, str]:
        out = self.run("semval").split()
        return dict(kv.split("=", 1) for kv in out)

    def spawn(self, *args: str | int, used_bytes: int = 0) -> subprocess.Popen:
        """Start a long-running mkregion command (live/writer); waits for its READY line."""
        env = dict(os.environ, MKREGION_BYTES=str(used_bytes))
        proc = subprocess.Popen(
            [str(MKREGION), str(args[0]), str(self.path), self.layout, *map(str, args[1:])],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        line = proc.stdout.readline() if proc.stdout else ""
        if not line.startswith("READY"):
            proc.kill()
            proc.wait(5)
            raise AssertionError(
                f"mkregion {args} did not start: {line!r} {proc.stderr.read() if proc.stderr else ''}"
            )
        proc.ready_pid = int(line.split()[1])  # type: ignore[attr-defined]
        return proc


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(10)
    for f in (proc.stdout, proc.stderr):
        if f:
            f.close()
