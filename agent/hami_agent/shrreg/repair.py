# Over 500 lines on purpose: one repair transaction (lock, re-read, verify, write), side by side.
"""Safe, in-place repair of a shared region: force-unlock and dead-slot cleanup.

Rules (Project-HAMi/HAMi-core ``src/multiprocess/multiprocess_memory_limit.c``
``clear_proc_slot_nolock``, ``exit_handler``; seed 002 "共享区域锁恢复流程"):

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
* **Decide, then write, all or nothing.** Every check runs first, on a read-only snapshot (``pread``), and
  yields a plan (actions, refusals, what is kept). Any refusal, or a dry run, returns before anything is
  opened for writing: the file stays byte-identical. Only then are the region's locks taken and every fact
  the plan rests on re-read under them; if one changed, nothing is written (re-run). A repair never
  applies the allowed half of a plan whose other half was refused.
* The file is the tenant's: it is opened with ``safeopen.open_regular`` (no symlink below the directory
  the tool was pointed at, no FIFO or device), and the mapping is only touched in a forked child
  (``childrun``), because a file truncated under the mapping (HAMi-core's ``O_TRUNC`` on re-creation)
  raises SIGBUS: the child checks the size before every wait, and if it dies anyway the tool reports it
  cleanly.
"""

from __future__ import annotations

import fcntl
import logging
import mmap
import os
import signal
import struct
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from hami_agent import log
from hami_agent.shrreg.childrun import ChildFailed, run_in_child
from hami_agent.shrreg.layout import LAYOUTS, V11_TRANSIENT, V12, Layout, RegionFormatError, detect_layout
from hami_agent.shrreg.liveness import Attachment, State, scan_attachment
from hami_agent.shrreg.model import ProcSlot, Region
from hami_agent.shrreg.reader import decode_region, postinit_offset, read_region
from hami_agent.shrreg.safeopen import open_regular
from hami_agent.shrreg.sem import MappedWord, SharedSemaphore, libatomic, libc, release_all

logger = logging.getLogger(__name__)

DEFAULT_LOCK_TIMEOUT_S = 10.0  # HAMi-core's SEM_WAIT_TIME: a waiter's own timeout
LOCKF_POLL_S = 0.01
SEM_SLICE_S = 0.05  # the semaphore wait is cut into slices; the file size is checked between them

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


class FileShrank(RuntimeError):
    """The region file became shorter than its layout while we held it mapped."""


class _Mapped:
    """Safe open + mmap of a region for repair. Used only inside the repair child (``childrun``)."""

    def __init__(self, path: str, root: str | None = None):
        self.path = path
        self.fd = open_regular(path, root, writable=True)
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

    def check_size(self) -> None:
        """Raise FileShrank when the file no longer covers the mapping (touching it would be SIGBUS)."""
        assert self.layout is not None
        size = os.fstat(self.fd).st_size
        if size < self.layout.size:
            raise FileShrank(
                f"the region file {self.path} shrank from {self.file_size} to {size} bytes while the repair "
                "held it (truncated or re-created: HAMi-core's shrreg-tool --create_new or a restarted "
                "container); nothing more was written; re-run the repair on the new file"
            )

    def region(self) -> Region:
        assert self.mm is not None and self.layout is not None
        self.check_size()
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
            self.check_size()
            try:
                fcntl.lockf(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB, self.layout.size, 0, os.SEEK_SET)
                self.locked_lockf = True
                return True
            except OSError:
                if time.monotonic() >= deadline:
                    return False
                time.sleep(delay)
                delay = min(delay * 2, 0.2)

    def acquire(self, sem: SharedSemaphore, timeout_s: float) -> bool:
        """The region semaphore, waited for in short slices with a size check before each one."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.check_size()
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if sem.timed_acquire(min(SEM_SLICE_S, left)):
                return True

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
            try:
                self.check_size()
                self.mm.flush()
            except FileShrank:
                pass
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


def _child_timeout(lock_timeout_s: float) -> float:
    return 2 * lock_timeout_s + 30.0  # lockf wait + semaphore wait + the /proc scan and the writes


def _in_child(res: RepairResult, fn: Callable[[], dict[str, Any]], lock_timeout_s: float) -> None:
    """Run the write phase in a child and merge what it did (or why it failed) into ``res``."""
    _preload()
    try:
        out = run_in_child(fn, _child_timeout(lock_timeout_s))
    except ChildFailed as exc:
        if exc.signal == signal.SIGBUS:
            res.error = (f"the region file {res.path} was truncated while the repair held it mapped (SIGBUS: "
                         "HAMi-core's shrreg-tool --create_new or a restarted container re-creates it); "
                         "nothing more was written; re-run the repair on the new file")
        else:
            res.error = f"{res.operation} of {res.path}: the repair process {exc}"
        res.actions = []
        return
    res.actions = [Action(**a) for a in out.get("actions", [])]
    res.kept.extend(out.get("kept", []))
    res.applied = bool(out.get("applied"))
    res.error = out.get("error")
    for line in out.get("log", []):
        logger.info("%s", line)


def _preload() -> None:
    """Load what the child needs before forking it (the child must not import or dlopen)."""
    libc()
    libatomic()


def force_unlock(
    path: str,
    *,
    dry_run: bool = False,
    lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S,
    attach: AttachFn | None = None,
    assume_complete: bool = False,
    root: str | None = None,
) -> RepairResult:
    """Release ``sem`` if (and only if) its holder is verifiably dead; reset a dead ``sem_postinit``.

    Decide-then-write: any refusal returns before the file is opened for writing."""
    res = RepairResult(path=path, operation="force-unlock", dry_run=dry_run)
    attach = attach or _default_attach(assume_complete)
    try:
        region = read_region(path, root=root)
        why = _transient_refusal(LAYOUTS[region.layout])
        if why:
            res.refused.append(why)
            return res
        att = attach(path)
    except (OSError, RegionFormatError) as exc:
        res.error = str(exc)
        return res
    _plan_unlock(region, att, res)
    _plan_postinit(region, att, res)
    if res.refused or dry_run or not res.actions:
        return res  # a refusal writes nothing, not even the actions that were allowed
    planned = [a.kind for a in res.actions]
    _in_child(res, lambda: _write_unlock(path, root, region, planned, lock_timeout_s, attach), lock_timeout_s)
    if libatomic() is None and res.applied:
        log.v(logger, 3, "libatomic not found: owner_pid was changed by a checked single store")
    return res


def _write_unlock(path: str, root: str | None, before: Region, planned: list[str], lock_timeout_s: float,
                  attach: AttachFn) -> dict[str, Any]:
    """In the repair child: take lockf, re-check every planned fact, then write (all or nothing)."""
    out: dict[str, Any] = {"actions": [], "kept": [], "log": [], "applied": False, "error": None}
    try:
        m = _Mapped(path, root)
    except (OSError, RegionFormatError) as exc:
        out["error"] = str(exc)
        return out
    sem = postinit = owner = None
    try:
        assert m.layout is not None and m.mm is not None
        if not m.lockf(lock_timeout_s):
            out["error"] = (
                f"Lock shrreg timeout: could not take lockf on {path} within {lock_timeout_s:g}s (a "
                "process is initialising the region or holding the old fix-up lock); retry"
            )
            return out
        # Facts can change between the decision and the lock (a holder releases, a library recovers the
        # lock itself, a process attaches): decide again from what the region says now, under lockf.
        region = m.region()
        check = RepairResult(path=path, operation="force-unlock", dry_run=False)
        att = attach(path)
        _plan_unlock(region, att, check)
        _plan_postinit(region, att, check)
        now = [a.kind for a in check.actions]
        if check.refused or now != planned or region.owner_pid != before.owner_pid:
            what = "; ".join(check.refused) or f"planned {planned}, now {now} (owner_pid {region.owner_pid})"
            out["kept"].append(f"the region changed while we checked ({what}); nothing written, re-run")
            return out
        done: list[Action] = []
        if "force-unlock" in planned:
            sem = SharedSemaphore(m.mm, m.layout.off_sem)
            owner = MappedWord(m.mm, m.layout.off_owner_pid)
            # the compare-and-swap is the commit point: if another recoverer won, nothing is written
            if sem.value() != 0 or not owner.cas_u64(region.owner_pid, 0):
                out["kept"].append(
                    f"the lock was released or recovered by another process while we checked (owner_pid "
                    f"{region.owner_pid}); nothing written")
                return out
            sem.post()
            done.append(next(a for a in check.actions if a.kind == "force-unlock"))
            out["log"].append(f"Cleared dead owner_pid {region.owner_pid} and posted the semaphore of {path}")
        if "reset-postinit" in planned:
            off = postinit_offset(m.layout)
            assert off is not None
            m.check_size()
            postinit = SharedSemaphore(m.mm, off)
            postinit.reinit(1)
            done.append(next(a for a in check.actions if a.kind == "reset-postinit"))
            out["log"].append(f"Re-initialised sem_postinit of {path} (value 1, pshared)")
        out["actions"] = [asdict(a) for a in done]
        out["applied"] = bool(done)
        return out
    except FileShrank as exc:
        out["error"] = str(exc)
        return out
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
    root: str | None = None,
) -> RepairResult:
    """Remove the slots of dead processes, in place, under lockf + the region semaphore.

    Decide-then-write: a refusal (or nothing to do) returns before the file is opened for writing."""
    res = RepairResult(path=path, operation="cleanup", dry_run=dry_run)
    attach = attach or _default_attach(assume_complete)
    try:
        region = read_region(path, root=root)
        why = _transient_refusal(LAYOUTS[region.layout]) or _corrupt_refusal(region)
        if why:
            res.refused.append(why)
            return res
        plan = _plan_cleanup(region, attach(path), res)
    except (OSError, RegionFormatError) as exc:
        res.error = str(exc)
        return res
    if dry_run or not plan:
        return res
    planned = res.actions
    res.actions, res.kept = [], []
    _in_child(res, lambda: _write_cleanup(path, root, lock_timeout_s, attach), lock_timeout_s)
    if not res.applied and not res.error and not res.actions:
        res.kept.append("under the lock there was nothing left to clean (planned without it: "
                        f"{'; '.join(a.detail for a in planned)})")
    return res


def _corrupt_refusal(region: Region) -> str | None:
    if region.corrupt or not 0 <= region.proc_num <= 1024:
        return (
            f"proc_num {region.proc_num} / device_num {region.device_num} out of range: the region is "
            "corrupt (proc_num must be 0..1024); restart the pod so its container gets a fresh region"
        )
    return None


def _write_cleanup(path: str, root: str | None, lock_timeout_s: float, attach: AttachFn) -> dict[str, Any]:
    """In the repair child: lockf, the region semaphore, decide again with the facts read under them,
    then compact."""
    out: dict[str, Any] = {"actions": [], "kept": [], "log": [], "applied": False, "error": None}
    try:
        m = _Mapped(path, root)
    except (OSError, RegionFormatError) as exc:
        out["error"] = str(exc)
        return out
    sem = None
    have_sem = False
    try:
        assert m.layout is not None and m.mm is not None
        if not m.lockf(lock_timeout_s):
            out["error"] = (
                f"Lock shrreg timeout: could not take lockf on {path} within {lock_timeout_s:g}s; retry"
            )
            return out
        sem = SharedSemaphore(m.mm, m.layout.off_sem)
        if not m.acquire(sem, lock_timeout_s):
            region = m.region()
            out["error"] = (
                f"Lock shrreg timeout after {lock_timeout_s:g}s, owner={region.owner_pid}: the region lock "
                "is held; if the owner is dead run --force-unlock first"
            )
            return out
        have_sem = True
        owner = MappedWord(m.mm, m.layout.off_owner_pid)
        try:
            # owner_pid = us while we hold it, as lock_shrreg does: if this tool dies inside, HAMi-core's
            # own dead-owner recovery releases the lock instead of leaving the #2500 state (owner 0).
            owner.store_u64(os.getpid())
        finally:
            owner.release()
        # Decide again, with facts read under the lock; every check before the first write.
        region = m.region()
        why = _corrupt_refusal(region)
        if why:
            out["kept"].append(f"{why} (found under the lock); nothing written")
            return out
        res = RepairResult(path=path, operation="cleanup", dry_run=False)
        plan = _plan_cleanup(region, attach(path), res)
        if plan:
            m.check_size()
            _apply_cleanup(m, region, plan, res)
            out["applied"] = True
            out["log"].append(f"Cleaned {len(plan)} dead slots of {path}")
        out["actions"] = [asdict(a) for a in res.actions]
        out["kept"].extend(res.kept)
        return out
    except FileShrank as exc:
        out["error"] = str(exc)
        have_sem = False  # the semaphore went with the old file: nothing to post
        return out
    finally:
        if have_sem and sem is not None and m.mm is not None and m.layout is not None:
            try:
                m.check_size()
                m.put_u64(m.layout.off_owner_pid, 0)
                sem.post()
            except (FileShrank, OSError) as exc:  # pragma: no cover - sem_post on a mapped sem does not fail
                out["error"] = out["error"] or f"releasing the region lock failed: {exc}"
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
    # no logging here: this runs in the repair child (the parent logs what the child reports)
