"""Issue 14 finding 5: a tenant's own region file must not stall, crash or redirect the node's tools.

Seqlock storms are bounded per file, special files are refused before open() can block, a file that
shrinks under a repair is a clean error (never SIGBUS), and no repair follows a symlink out of the
directory it was pointed at."""

import hashlib
import os
import socket
import struct
import subprocess
import sys
import time

import pytest

from hami_agent.shrreg import cleanup, force_unlock, read_region, repair
from hami_agent.shrreg.childrun import ChildFailed, run_in_child
from hami_agent.shrreg.layout import LAYOUTS, MAX_PROCS
from hami_agent.shrreg.safeopen import RefusedFile
from tests.shrreg.helpers import MIB, Mk, dead_pid
from tests.unit.shrreg.builder import build

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

UID_A = "0b6e5f7c-aaaa-4000-8000-000000000001"
UID_B = "0b6e5f7c-bbbb-4000-8000-000000000002"


def digest(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def shrreg_tool(*args, timeout=30):
    return subprocess.run([sys.executable, "-m", "hami_agent.shrreg.tool", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, check=False)


def test_every_slot_mid_update_costs_one_deadline_not_a_minute(tmp_path):
    """1024 slots whose seqlock is odd: the old per-slot retries (20 each, growing sleeps) took ~107 s;
    all retries of one file now share READ_DEADLINE_S."""
    lay = LAYOUTS["v1.2"]
    buf = bytearray(build("v1.2", slots=[(i + 1, 0, 1, [MIB]) for i in range(MAX_PROCS)]))
    for i in range(MAX_PROCS):
        off = lay.slot_offset(i) + lay.s_seqlock
        struct.pack_into("<Q", buf, off, 2 * i + 1)
    f = tmp_path / "storm.cache"
    f.write_bytes(bytes(buf))
    t0 = time.monotonic()
    r = read_region(f, deadline_s=0.25)
    took = time.monotonic() - t0
    assert len(r.procs) == MAX_PROCS and all(s.write_in_progress for s in r.procs)
    assert took < 10, f"read took {took:.1f}s"  # generous: the bound is 0.25 s of retries + decoding


@pytest.mark.parametrize("kind", ["fifo", "socket"])
def test_special_files_are_refused_before_open_blocks(tmp_path, kind, monkeypatch):
    d = tmp_path / f"{UID_A}_main"
    d.mkdir()
    p = d / "cudevshr.cache"
    if kind == "fifo":
        os.mkfifo(p)  # open(O_RDONLY) on it blocks until a writer appears: forever
    else:
        monkeypatch.chdir(d)  # a unix socket path must be short
        s = socket.socket(socket.AF_UNIX)
        s.bind(p.name)
        s.close()
    with pytest.raises(RefusedFile, match="FIFO" if kind == "fifo" else "socket"):
        read_region(p)
    cp = shrreg_tool("--inspect", "--file", p)
    assert cp.returncode == 1 and "refusing to open it" in cp.stdout, cp
    cp = shrreg_tool("--force-unlock", "--file", p)
    assert cp.returncode == 1 and "refusing to open it" in cp.stdout, cp


def test_repairs_never_follow_a_symlink_out_of_their_directory(mkregion, tmp_path):
    root = tmp_path / "containers"
    other = tmp_path / "elsewhere"  # another tenant's region, outside what the tool was pointed at
    victim = other / "cudevshr.cache"
    mk = Mk(victim, "v1.2").create()
    mk.slot(dead_pid(), 0, 1, MIB)  # a cleanup WOULD write here
    mk.lock(dead_pid())  # and a force-unlock too
    before = digest(victim)
    (root / f"{UID_A}_main").mkdir(parents=True)
    os.symlink(victim, root / f"{UID_A}_main" / "cudevshr.cache")  # the file is a symlink
    os.symlink(other, root / f"{UID_B}_main")  # a container directory is a symlink
    for fn in (force_unlock, cleanup):
        res = fn(str(root / f"{UID_A}_main" / "cudevshr.cache"), root=str(root))
        assert res.error and "symbolic link" in res.error and "refusing to follow" in res.error, res
        res = fn(str(root / f"{UID_B}_main" / "cudevshr.cache"), root=str(root))
        assert res.error and "refusing to follow" in res.error, res
    for op in ("--force-unlock", "--cleanup"):
        cp = shrreg_tool(op, "--dir", root, "--file", root / f"{UID_A}_main" / "cudevshr.cache")
        assert cp.returncode == 1 and "refusing to follow" in cp.stdout, cp
        cp = shrreg_tool(op, "--dir", root, "--file", root / f"{UID_B}_main" / "cudevshr.cache")
        assert cp.returncode == 1 and "refusing to follow" in cp.stdout, cp
        cp = shrreg_tool(op, "--dir", root, "--device", 0)
        assert cp.returncode == 1 and "refusing to follow" in cp.stdout, cp  # listed, refused, reported
    assert digest(victim) == before
    # the same file, pointed at directly, is repaired normally
    res = force_unlock(str(victim))
    assert res.applied


def test_truncation_during_cleanup_semaphore_wait_is_a_clean_error(mkregion, tmp_path):
    """HAMi-core's shrreg-tool --create_new opens with O_TRUNC while our cleanup waits on the region
    semaphore: the old tool died of SIGBUS with no message."""
    f = tmp_path / "r.cache"
    mk = Mk(f, "v1.2").create()
    mk.slot(dead_pid(), 0, 1, MIB)  # something to clean: the tool goes on to take the locks
    mk.lock(dead_pid())  # the semaphore is held (by a dead owner): cleanup waits for it
    cmd = [sys.executable, "-m", "hami_agent.shrreg.tool", "--cleanup", "--file", str(f),
           "--lock-timeout", "20"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ino = os.stat(f).st_ino
        deadline = time.monotonic() + 20
        while f":{ino} " not in open("/proc/locks").read():  # lockf taken: the semaphore wait follows
            assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
            time.sleep(0.02)
        time.sleep(0.2)
        with open(f, "r+b") as fh:  # what --create_new does: O_TRUNC
            fh.truncate(0)
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
    assert proc.returncode == 1, (proc.returncode, out, err)
    assert "shrank" in out or "truncated" in out, out
    assert "Traceback" not in err


def test_sigbus_in_the_repair_child_is_reported_not_fatal(tmp_path):
    import mmap

    f = tmp_path / "x"
    f.write_bytes(b"\1" * 8192)

    def touch_truncated() -> dict:
        fd = os.open(f, os.O_RDWR)
        mm = mmap.mmap(fd, 8192)
        os.truncate(f, 0)
        return {"byte": mm[4096]}  # beyond EOF now: SIGBUS

    with pytest.raises(ChildFailed) as info:
        run_in_child(touch_truncated, timeout_s=20)
    assert info.value.signal == __import__("signal").SIGBUS


def test_cleanup_survives_sigbus_when_the_size_check_loses_the_race(mkregion, tmp_path, monkeypatch):
    """The size checks narrow the window; the child is what makes a lost race harmless."""
    f = tmp_path / "r.cache"
    mk = Mk(f, "v1.2").create()
    mk.slot(dead_pid(), 0, 1, MIB)
    real_region = repair._Mapped.region

    def region_then_truncate(self):
        r = real_region(self)
        os.truncate(f, 0)  # the region vanishes right after we looked
        return r

    monkeypatch.setattr(repair._Mapped, "check_size", lambda self: None)
    monkeypatch.setattr(repair._Mapped, "region", region_then_truncate)
    res = cleanup(str(f), lock_timeout_s=2)
    assert res.error and "SIGBUS" in res.error and not res.applied, res
