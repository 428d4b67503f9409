"""Safe, in-place repair of a shared region: force-unlock and dead-slot cleanup.

Rules (reference/hami-core.md §7, §11; seed 002 "共享区域锁恢复流程"):

* The file is never deleted, truncated or re-created (HAMi's monitor keeps reading the old inode,
  and live processes keep pointers into it). We change a few words of the live mapping.
* We act only on facts we verified *while holding the region's own locks*: ``lockf`` on
  ``[0, SIZE)`` (what HAMi-core holds while initialising a region, and what the old
  ``fix_lock_shrreg`` takes), then for cleanup the region semaphore ``sem`` itself.
* force-unlock posts the semaphore only when it is held (value 0) and its owner is verifiably
  dead, after a compare-and-swap of ``owner_pid`` from the dead PID to 0 (the same CAS HAMi-core's
  own recovery does, so exactly one recoverer posts). Never posted when the value is already >= 1.
* cleanup removes only dead slots. It never moves a live slot on v1.2 files (live processes
  write their counters lock-free through a pointer to their slot): a hole below a live slot
  becomes an exited tombstone (``pid=0, status=0``), the v1.2 library's own exit protocol, which
  the library compacts itself. Older libraries (v0b, v1.1) spin forever on ``pid == 0`` slots,
  so there the hole is filled the way those libraries do it themselves: move the last slot in.
* v1.1-transient files (HAMi v2.8.1) are refused: libraries of other versions corrupt them.
* Refusals say why, and write nothing.
"""

from __future__ import annotations

import fcntl
import logging
import mmap
import os
import struct
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from hami_agent import log
from hami_agent.shrreg.layout import V11_TRANSIENT, V12, Layout, RegionFormatError, detect_layout
from hami_agent.shrreg.liveness import Attachment, State, scan_attachment
from hami_agent.shrreg.model import ProcSlot, Region
from hami_agent.shrreg.reader import decode_region, postinit_offset
from hami_agent.shrreg.sem import MappedWord, SharedSemaphore, libatomic, release_all

logger = logging.getLogger(__name__)

DEFAULT_LOCK_TIMEOUT_S = 10.0  # HAMi-core's SEM_WAIT_TIME: a waiter's own timeout
LOCKF_POLL_S = 0.01

AttachFn = Callable[[str], Attachment]


@dataclass
class Action:
    kind: str  # force-unlock | reset-postinit | remove-slot | tombstone-slot
    detail: str


@dataclass
class RepairResult:
    path: str
    operation: str  # force-unlock | cleanup
    dry_run: bool
    actions: list[Action] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    applied: bool = False
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and not self.refused

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ok"] = self.ok
        return d


class _Mapped:
    """Open + lock-free mmap of a region for repair; closes cleanly even with ctypes exports."""

    def __init__(self, path: str):
        self.path = path
        self.fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        self.mm: mmap.mmap | None = None
        self.layout: Layout | None = None
        self.locked_lockf = False
        try:
            size = os.fstat(self.fd).st_size
            self.file_size = size
            layout, _, _ = detect_layout(size, os.pread(self.fd, 12, 0), path)
            self.layout = layout
            self.mm = mmap.mmap(self.fd, layout.size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except Exception:
            self.close()
            raise

    def region(self) -> Region:
        assert self.mm is not None and self.layout is not None
        buf = self.mm[: self.layout.size]

        def slot_reader(i: int) -> bytes:
            off = self.layout.slot_offset(i)
            return self.mm[off : off + self.layout.slot_size]

        return decode_region(buf, self.file_size, self.path, slot_reader=slot_reader)

    def lockf(self, timeout_s: float) -> bool:
        """``lockf(F_LOCK, SIZE)`` as HAMi-core does, polled with a deadline instead of blocking."""
        assert self.layout is not None
        deadline = time.monotonic() + timeout_s
        delay = LOCKF_POLL_S
        while True:
            try:
                fcntl.lockf(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB, self.layout.size, 0, os.SEEK_SET)
                self.locked_lockf = True
                return True
            except OSError:
                if time.monotonic() >= deadline:
                    return False
                time.sleep(delay)
                delay = min(delay * 2, 0.2)

    def put_i32(self, off: int, v: int) -> None:
        assert self.mm is not None
        self.mm[off : off + 4] = struct.pack("<i", v)

    def put_u64(self, off: int, v: int) -> None:
        assert self.mm is not None
        self.mm[off : off + 8] = struct.pack("<Q", v)

    def close(self) -> None:
        if self.locked_lockf and self.layout is not None:
            try:
                fcntl.lockf(self.fd, fcntl.LOCK_UN, self.layout.size, 0, os.SEEK_SET)
            except OSError:
                pass
            self.locked_lockf = False
        if self.mm is not None:
            self.mm.flush()
            self.mm.close()
            self.mm = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _default_attach(assume_complete: bool) -> AttachFn:
    return lambda p: scan_attachment(p, assume_complete=assume_complete)


def _transient_refusal(layout: Layout) -> str | None:
    if layout.name == V11_TRANSIENT:
        return (
            "layout v1.1-transient (HAMi v2.8.1): libraries of other versions corrupt these files and "
            "HAMi's monitor misreads them (HAMi PR #1792); not repairing. Remedy: upgrade HAMi-core to "
            "v2.8.2+ on the node and restart the pod (a new container gets a new file)"
        )
    return None


def force_unlock(
    path: str,
    *,
    dry_run: bool = False,
    lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S,
    attach: AttachFn | None = None,
    assume_complete: bool = False,
) -> RepairResult:
    """Release ``sem`` if (and only if) its holder is verifiably dead; reset a dead ``sem_postinit``."""
    res = RepairResult(path=path, operation="force-unlock", dry_run=dry_run)
    attach = attach or _default_attach(assume_complete)
    try:
        m = _Mapped(path)
    except (OSError, RegionFormatError) as exc:
        res.error = str(exc)
        return res
    sem = postinit = owner = None
    try:
        assert m.layout is not None and m.mm is not None
        why = _transient_refusal(m.layout)
        if why:
            res.refused.append(why)
            return res
        if not dry_run and not m.lockf(lock_timeout_s):
            res.error = (
                f"Lock shrreg timeout: could not take lockf on {path} within {lock_timeout_s:g}s (a "
                "process is initialising the region or holding the old fix-up lock); retry"
            )
            return res
        region = m.region()
        att = attach(path)
        _plan_unlock(region, att, res)
        _plan_postinit(region, att, res)
        if dry_run or not res.actions:
            return res
        # Apply, still under lockf. Re-check each fact right before the write.
        # Facts can change between planning and writing (a holder releases, a library recovers the
        # lock itself); then nothing is written and the action is reported as not needed.
        performed: list[Action] = []
        for act in res.actions:
            if act.kind == "force-unlock":
                sem = SharedSemaphore(m.mm, m.layout.off_sem)
                owner = MappedWord(m.mm, m.layout.off_owner_pid)
                if sem.value() != 0:
                    res.kept.append("the lock was released while we checked; nothing posted")
                    continue
                if not owner.cas_u64(region.owner_pid, 0):
                    res.kept.append(
                        f"owner_pid changed from {region.owner_pid} while we checked (the lock was released "
                        "or recovered by another process); nothing posted"
                    )
                    continue
                sem.post()
                performed.append(act)
                logger.info("Cleared dead owner_pid %d and posting semaphore of %s", region.owner_pid, path)
            elif act.kind == "reset-postinit":
                off = postinit_offset(m.layout)
                assert off is not None
                postinit = SharedSemaphore(m.mm, off)
                postinit.reinit(1)
                performed.append(act)
                logger.info("Re-initialised sem_postinit of %s (value 1, pshared)", path)
        res.actions = performed
        res.applied = bool(performed)
        if libatomic() is None:
            log.v(logger, 3, "libatomic not found: owner_pid was changed by a checked single store")
        return res
    except Exception as exc:  # a repair must report, never crash half-way without saying so
        res.error = f"force-unlock of {path} failed: {exc}"
        return res
    finally:
        release_all(sem, postinit, owner)
        m.close()


def _plan_unlock(region: Region, att: Attachment, res: RepairResult) -> None:
    if not region.sem.initialised and region.sem.value == 0:
        res.refused.append(
            "the region semaphore was never initialised (sem_t is zero): header is corrupt; restart the "
            "pod so its container gets a fresh region"
        )
        return
    if region.sem.value >= 1:
        res.kept.append(f"Lock Status: UNLOCKED (sem value {region.sem.value}); nothing to release")
        return
    owner = region.owner_pid
    if owner != 0:
        v = att.verdict(owner)
        if v.state is State.DEAD:
            res.actions.append(
                Action(
                    "force-unlock",
                    f"release lock held by dead PID {owner}: owner_pid {owner} -> 0, sem_post ({v.reason})",
                )
            )
        elif v.state is State.ALIVE:
            res.refused.append(
                f"lock holder PID {owner} is still running ({v.reason}); not force-unlocking: analyse why "
                "the process holds the lock (deadlock?) before anything else"
            )
        else:
            res.refused.append(f"lock holder PID {owner} cannot be verified dead: {v.reason}")
        return
    others = att.others()
    if not others:
        res.actions.append(
            Action(
                "force-unlock",
                "release lock with owner_pid 0 (holder killed between clearing owner_pid and sem_post, "
                "HAMi issue #2500); no process has the region mapped",
            )
        )
    else:
        hp = ", ".join(str(p.pid) for p in others[:8])
        res.refused.append(
            f"lock held with owner_pid 0 while {len(others)} process(es) have the region mapped (host PID "
            f"{hp}): a process may be inside the critical section, or one was killed between clearing "
            "owner_pid and sem_post (HAMi issue #2500); stop those processes (restart the pod) and re-run"
        )


def _plan_postinit(region: Region, att: Attachment, res: RepairResult) -> None:
    pi = region.sem_postinit
    if pi is None or pi.value >= 1:
        return
    if att.others():
        what = "never initialised (v1.1 file)" if not pi.initialised else "held"
        res.kept.append(
            f"sem_postinit is {what} (value 0) but processes have the region mapped; a process may be in "
            "host-PID detection: not resetting it (new processes wait ~330 s, then 'Skipped host PID "
            "detection due to lock timeout')"
        )
        return
    res.actions.append(Action("reset-postinit", "sem_postinit value 0 and no process attached: sem_init(1)"))


def cleanup(
    path: str,
    *,
    dry_run: bool = False,
    lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S,
    attach: AttachFn | None = None,
    assume_complete: bool = False,
) -> RepairResult:
    """Remove the slots of dead processes, in place, under lockf + the region semaphore."""
    res = RepairResult(path=path, operation="cleanup", dry_run=dry_run)
    attach = attach or _default_attach(assume_complete)
    try:
        m = _Mapped(path)
    except (OSError, RegionFormatError) as exc:
        res.error = str(exc)
        return res
    sem = None
    have_sem = False
    try:
        assert m.layout is not None and m.mm is not None
        why = _transient_refusal(m.layout)
        if why:
            res.refused.append(why)
            return res
        region = m.region()
        if not 0 <= region.proc_num <= 1024:
            res.refused.append(
                f"proc_num {region.proc_num} is out of range 0..1024: the region is corrupt; restart the "
                "pod so its container gets a fresh region"
            )
            return res
        if dry_run:
            _plan_cleanup(region, attach(path), res)
            return res
        if not m.lockf(lock_timeout_s):
            res.error = (
                f"Lock shrreg timeout: could not take lockf on {path} within {lock_timeout_s:g}s; retry"
            )
            return res
        sem = SharedSemaphore(m.mm, m.layout.off_sem)
        if not sem.timed_acquire(lock_timeout_s):
            region = m.region()
            res.error = (
                f"Lock shrreg timeout after {lock_timeout_s:g}s, owner={region.owner_pid}: the region lock "
                "is held; if the owner is dead run --force-unlock first"
            )
            return res
        have_sem = True
        owner = MappedWord(m.mm, m.layout.off_owner_pid)
        try:
            # owner_pid = us while we hold it, as lock_shrreg does: if this tool dies inside, HAMi-core's
            # own dead-owner recovery releases the lock instead of leaving the #2500 state (owner 0).
            owner.store_u64(os.getpid())
        finally:
            owner.release()
        # Decide with facts read under the lock.
        region = m.region()
        plan = _plan_cleanup(region, attach(path), res)
        if plan:
            _apply_cleanup(m, region, plan, res)
            res.applied = True
        return res
    except Exception as exc:
        res.error = f"cleanup of {path} failed: {exc}"
        return res
    finally:
        if have_sem and sem is not None and m.mm is not None and m.layout is not None:
            m.put_u64(m.layout.off_owner_pid, 0)
            try:
                sem.post()
            except OSError as exc:  # pragma: no cover - sem_post on a mapped sem does not fail
                res.error = res.error or f"sem_post failed: {exc}"
        release_all(sem)
        m.close()


def _is_clean_tombstone(slot: ProcSlot) -> bool:
    """An exited slot with nothing left in it (what we, or the v1.2 exit path plus compaction, leave)."""
    return (
        slot.pid == 0
        and slot.status == 0
        and slot.hostpid == 0
        and not any(u.total or u.context_size or u.module_size or u.data_size for u in slot.used)
        and not any(slot.monitorused)
        and not slot.write_in_progress
    )


def _plan_cleanup(region: Region, att: Attachment, res: RepairResult) -> list[int]:
    remove: list[int] = []
    for slot in region.procs:
        if slot.pid == 0:
            remove.append(slot.index)
            continue
        v = att.verdict(slot.pid)
        if v.state is State.DEAD:
            remove.append(slot.index)
            mem = sum(u.total for u in slot.used)
            res.actions.append(
                Action(
                    "remove-slot",
                    f"slot {slot.index}: PID {slot.pid} (host PID {slot.hostpid}) DEAD (zombie entry), "
                    f"frees {mem >> 20} MiB of tracked memory ({v.reason})",
                )
            )
        elif v.state is State.ALIVE:
            res.kept.append(f"slot {slot.index}: PID {slot.pid} ALIVE")
        else:
            res.kept.append(f"slot {slot.index}: PID {slot.pid} kept, {v.reason}")
    if region.layout == V12:
        # Clean tombstones below a live slot are the v1.2 library's own exit state; it compacts them.
        # Rewriting them would be a no-op, so they are not actions (a second cleanup changes nothing).
        dead = set(remove)
        tail = region.proc_num
        while tail > 0 and (tail - 1) in dead:
            tail -= 1
        for slot in region.procs:
            if slot.pid == 0 and slot.index < tail and _is_clean_tombstone(slot):
                remove.remove(slot.index)
                res.kept.append(
                    f"slot {slot.index}: exited tombstone (pid 0), left for the library to compact"
                )
    for slot in region.procs:
        if slot.pid == 0 and slot.index in remove:
            res.actions.append(Action("remove-slot", f"slot {slot.index}: exited process (pid 0)"))
    return remove


def _zero_slot(m: _Mapped, index: int) -> None:
    assert m.layout is not None and m.mm is not None
    off = m.layout.slot_offset(index)
    m.mm[off : off + m.layout.slot_size] = bytes(m.layout.slot_size)


def _apply_cleanup(m: _Mapped, region: Region, remove: list[int], res: RepairResult) -> None:
    """Compact under the lock. See the module docstring for why live v1.2 slots are never moved."""
    layout = m.layout
    assert layout is not None and m.mm is not None
    dead = set(remove)
    n = region.proc_num
    # 1. Trailing dead slots: zero and shrink proc_num; no live slot moves.
    while n > 0 and (n - 1) in dead:
        n -= 1
        m.put_i32(layout.off_proc_num, n)  # publish the shrink first, then clear the bytes
        _zero_slot(m, n)
        dead.discard(n)
    # 2. Holes below live slots.
    for idx in sorted(dead):
        if idx >= n:
            continue
        if layout.name == V12:
            off = layout.slot_offset(idx)
            _zero_slot(m, idx)  # pid 0, status 0, counters 0, seqlock 0 (even)
            res.actions.append(
                Action(
                    "tombstone-slot",
                    f"slot {idx}: left as exited (pid 0) for the v1.2 library to compact; live slots are "
                    f"not moved (offset {off})",
                )
            )
        else:
            last = n - 1
            while last > idx and last in dead:
                n -= 1
                m.put_i32(layout.off_proc_num, n)
                _zero_slot(m, last)
                dead.discard(last)
                last = n - 1
            if last > idx:
                src = layout.slot_offset(last)
                dst = layout.slot_offset(idx)
                m.mm[dst : dst + layout.slot_size] = m.mm[src : src + layout.slot_size]
            n -= 1
            m.put_i32(layout.off_proc_num, n)
            _zero_slot(m, last if last > idx else idx)
        dead.discard(idx)
    logger.info("Cleaned %d dead slots of %s (proc_num now %d)", len(remove), m.path, n)
