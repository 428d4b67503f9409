"""The MIG apply lock file: while it exists, the device plugin, its register loop and the monitor leave
NVML alone (a MIG reconfiguration by the ``nvidia_mig`` role is under way). Shared by all three so they
honour the same file by the same rule.

HAMi pauses while ``/tmp/hami/hami-mig-apply.lock`` exists, whoever created it (HAMi
``pkg/device-plugin/nvidiadevice/nvinternal/plugin/register.go``, ``WatchAndRegister``). Inside HAMi's
device-plugin container ``/tmp`` is private. For an agent running as a systemd unit it is the host's
shared ``/tmp``: any local user could create the file and pause NVML on the node (devices unhealthy, no
registration) — a denial of service. So by default a lock is honoured only when it is *trusted*:

* the file is a regular file (not a symlink, FIFO, ...) and its directory a real directory;
* both are owned by root (or by the agent's own user, for an agent that does not run as root);
* neither is writable by group or others (a sticky world-writable ``/tmp/hami`` made by someone else
  fails: anyone can create files in it).

An untrusted lock is ignored, with a warning in the log (once per change) and the ``untrusted`` reason
exposed for a metric. ``permissive=True`` keeps HAMi's rule (any file at the path) for containerised
deployments whose ``/tmp`` is private. The roles put the lock in a root-owned directory
(``/run/hami/mig-apply.lock``, directory 0755 root).
"""

from __future__ import annotations

import logging
import os
import stat
import threading
from dataclasses import dataclass

logger = logging.getLogger(__name__)

UNSAFE_BITS = stat.S_IWGRP | stat.S_IWOTH


@dataclass(frozen=True)
class LockCheck:
    """``present``: a file exists at the path. ``trusted``: it may pause NVML. ``reason``: why not."""

    present: bool
    trusted: bool = False
    reason: str = ""

    @property
    def held(self) -> bool:
        return self.present and self.trusted


def _owner_problem(st: os.stat_result, what: str, path: str, owners: frozenset[int]) -> str:
    if st.st_uid not in owners:
        return f"{what} {path} is owned by uid {st.st_uid}, not by root"
    if st.st_mode & UNSAFE_BITS:
        return (f"{what} {path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o}), so "
                "any local user could create or replace the lock")
    return ""


def check_lock_file(path: str | None, permissive: bool = False) -> LockCheck:
    """Is there a MIG apply lock at ``path``, and may it be honoured?"""
    if not path:
        return LockCheck(False)
    if permissive:
        return LockCheck(os.path.exists(path), True)
    directory = os.path.dirname(os.path.abspath(path))
    try:
        file_st = os.lstat(path)
    except FileNotFoundError:
        return LockCheck(False)
    except OSError as exc:  # e.g. EACCES on the directory: cannot tell who made it, so do not trust it
        return LockCheck(True, False, f"cannot inspect the lock file {path}: {exc.strerror or exc}")
    owners = frozenset({0, os.geteuid()})
    try:
        dir_st = os.lstat(directory)
    except OSError as exc:
        return LockCheck(True, False, f"cannot inspect the lock directory {directory}: {exc.strerror or exc}")
    if not stat.S_ISDIR(dir_st.st_mode):
        return LockCheck(True, False, f"the lock directory {directory} is not a directory (a symlink?)")
    why = _owner_problem(dir_st, "the lock directory", directory, owners)
    if why:
        return LockCheck(True, False, why)
    if not stat.S_ISREG(file_st.st_mode):
        return LockCheck(True, False, f"the lock {path} is not a regular file (a symlink or special file)")
    why = _owner_problem(file_st, "the lock file", path, owners)
    return LockCheck(True, not why, why)


class MigApplyLock:
    """One component's view of the lock: ``held()`` is True only for a trusted lock; an untrusted one is
    logged as a warning when it appears or its reason changes, and kept in ``untrusted`` (for a metric).
    Thread-safe; ``held()`` costs two ``lstat`` calls."""

    def __init__(self, path: str | None, permissive: bool = False, component: str = "hami-agent") -> None:
        self.path = path or ""
        self.permissive = permissive
        self.component = component
        self.untrusted = ""  # the reason while an untrusted lock file is present, else ""
        self._lock = threading.Lock()

    def check(self) -> LockCheck:
        result = check_lock_file(self.path, self.permissive)
        reason = result.reason if result.present and not result.trusted else ""
        with self._lock:
            changed, self.untrusted = reason != self.untrusted, reason
        if changed and reason:
            logger.warning("%s: IGNORING an untrusted MIG apply lock: %s. NVML is NOT paused. Remove the "
                           "file (and the directory if it is not root's), or keep the lock in a root-owned "
                           "directory such as /run/hami (--mig-apply-lock; --mig-apply-lock-permissive "
                           "restores HAMi's rule where /tmp is private to the container)", self.component,
                           reason)
        elif changed:
            logger.info("%s: the untrusted MIG apply lock at %s is gone (or trusted now)", self.component,
                        self.path)
        return result

    def held(self) -> bool:
        return self.check().held


__all__ = ["LockCheck", "MigApplyLock", "check_lock_file"]
