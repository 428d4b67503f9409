"""Is a PID recorded in a region (a *container* PID) still alive? Answered from /proc, provably.

``procs[].pid`` and ``owner_pid`` are PIDs in the container's PID namespace; a host-side tool cannot
look them up directly (HAMi-core's ``proc_alive`` runs in the caller's namespace). Instead we find
every process that has the region file mapped (``/proc/<pid>/maps`` lists the file's device and
inode) and read the innermost PID of each from the ``NSpid:`` line of ``/proc/<pid>/status``.
A process that holds the region's lock or owns a slot must have the region mapped (HAMi-core maps
it on first use and never unmaps it), so:

* some attached process has innermost PID == P (and is not a zombie)  -> ALIVE
* no attached process has it, and the whole /proc was readable        -> DEAD (verified)
* anything we could not read, or we run in a child PID namespace      -> UNKNOWN (refuse to repair)
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

ALIVE = "alive"
DEAD = "dead"
UNKNOWN = "unknown"


class State(str, Enum):
    ALIVE = ALIVE
    DEAD = DEAD
    UNKNOWN = UNKNOWN


@dataclass(frozen=True)
class HostProcess:
    pid: int  # PID as seen by this tool
    nspids: tuple[int, ...]  # NSpid line: outermost .. innermost
    state: str  # /proc/<pid>/stat state letter

    @property
    def inner_pid(self) -> int:
        return self.nspids[-1] if self.nspids else self.pid

    @property
    def dead(self) -> bool:
        return self.state in ("Z", "X", "x")


@dataclass(frozen=True)
class Verdict:
    state: State
    reason: str
    host_pids: tuple[int, ...] = ()


@dataclass
class Attachment:
    """Processes that have one region file mapped, as seen from this tool's PID namespace."""

    path: str
    processes: list[HostProcess] = field(default_factory=list)
    unreadable: list[HostProcess] = field(default_factory=list)  # maps unreadable (pid, NSpid known)
    child_namespace: bool = False  # this tool is not in the root PID namespace
    assume_complete: bool = False

    def verdict(self, container_pid: int) -> Verdict:
        if container_pid <= 0:
            return Verdict(State.DEAD, f"pid {container_pid} is not a process (slot marked exited)")
        matches = [p for p in self.processes if p.inner_pid == container_pid and not p.dead]
        if matches:
            hp = tuple(p.pid for p in matches)
            return Verdict(
                State.ALIVE,
                f"PID {container_pid} is alive (host PID {', '.join(map(str, hp))} has the region mapped)",
                hp,
            )
        # A process whose maps we cannot read could be the one we look for only if its innermost
        # PID is the same number; any other unreadable process cannot be it.
        hidden = [p for p in self.unreadable if p.inner_pid == container_pid and not p.dead]
        if hidden:
            return Verdict(
                State.UNKNOWN,
                "cannot verify PID %d: /proc/%d/maps is unreadable and that process has the same PID in "
                "its namespace; run as root with the host PID "
                "namespace" % (container_pid, hidden[0].pid),
            )
        if self.child_namespace and not self.assume_complete:
            return Verdict(
                State.UNKNOWN,
                f"cannot verify PID {container_pid}: this tool runs in a child PID namespace and cannot "
                "see every process (run it with hostPID, or inside the workload container with "
                "--in-container)",
            )
        return Verdict(
            State.DEAD,
            f"PID {container_pid} is dead (no live process in the container's PID namespace has the "
            "region mapped)",
        )

    def others(self) -> list[HostProcess]:
        return [p for p in self.processes if not p.dead]


def _read_nspids(proc: Path) -> tuple[int, ...]:
    try:
        with open(proc / "status", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("NSpid:"):
                    return tuple(int(x) for x in line.split()[1:])
    except (OSError, ValueError):
        pass
    return ()


def _read_state(proc: Path) -> str:
    try:
        data = (proc / "stat").read_text(errors="replace")
    except OSError:
        return "X"
    # "pid (comm) S ...": comm may contain spaces and parentheses; the state follows the last ')'.
    rp = data.rfind(")")
    rest = data[rp + 2 :] if rp >= 0 else ""
    return rest[:1] or "?"


def own_namespace_depth(proc_root: str = "/proc") -> int:
    n = _read_nspids(Path(proc_root) / "self")
    return max(1, len(n))


def _maps_files(maps: str) -> tuple[set[tuple[int, int, int]], set[tuple[int, str]]]:
    """(major, minor, inode) and (inode, basename) of every file mapping in a /proc/<pid>/maps text."""
    by_dev: set[tuple[int, int, int]] = set()
    by_name: set[tuple[int, str]] = set()
    for line in maps.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 5 or parts[4] == "0":
            continue
        try:
            ino = int(parts[4])
            major_s, minor_s = parts[3].split(":")
            by_dev.add((int(major_s, 16), int(minor_s, 16), ino))
        except ValueError:
            continue
        if len(parts) == 6:
            by_name.add((ino, os.path.basename(parts[5].rstrip().removesuffix(" (deleted)"))))
    return by_dev, by_name


def scan_attachments(
    paths: list[str], *, proc_root: str = "/proc", assume_complete: bool = False, exclude_self: bool = True
) -> dict[str, Attachment]:
    """One pass over /proc: every process with one of ``paths`` mapped. Vanishing processes are skipped.

    Paths that cannot be stat'ed get an Attachment with no processes (their file is gone).
    """
    child_ns = own_namespace_depth(proc_root) > 1
    result: dict[str, Attachment] = {}
    keys: dict[int, list[tuple[tuple[int, int], str, Attachment]]] = {}
    for raw in paths:
        p = os.fspath(raw)
        att = Attachment(path=p, child_namespace=child_ns, assume_complete=assume_complete)
        result[p] = att
        try:
            st = os.stat(p)
        except OSError:
            continue
        keys.setdefault(st.st_ino, []).append(
            ((os.major(st.st_dev), os.minor(st.st_dev)), os.path.basename(p), att)
        )
    me = os.getpid()
    for entry in Path(proc_root).iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        if exclude_self and pid == me:
            continue
        try:
            maps = (entry / "maps").read_text(errors="replace")
        except PermissionError:
            hidden = HostProcess(pid=pid, nspids=_read_nspids(entry) or (pid,), state=_read_state(entry))
            for att in result.values():
                att.unreadable.append(hidden)
            continue
        except OSError:
            # ENOENT/ESRCH: the process exited while we looked
            continue
        if not maps:
            continue
        by_dev, by_name = _maps_files(maps)
        hp: HostProcess | None = None
        for ino, candidates in keys.items():
            for dev, name, att in candidates:
                # overlay/bind mounts can show another device number for the same file: accept the
                # same inode under the same file name too (the cache file keeps its name in the container).
                if (dev[0], dev[1], ino) in by_dev or (ino, name) in by_name:
                    if hp is None:
                        hp = HostProcess(
                            pid=pid, nspids=_read_nspids(entry) or (pid,), state=_read_state(entry)
                        )
                    att.processes.append(hp)
    return result


def scan_attachment(
    path: str | os.PathLike[str],
    *,
    proc_root: str = "/proc",
    assume_complete: bool = False,
    exclude_self: bool = True,
) -> Attachment:
    """Every process with ``path`` mapped (see scan_attachments)."""
    p = os.fspath(path)
    os.stat(p)  # a vanished file is an error for a single-file scan
    return scan_attachments(
        [p], proc_root=proc_root, assume_complete=assume_complete, exclude_self=exclude_self
    )[p]
