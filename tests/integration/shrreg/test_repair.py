"""force-unlock and cleanup on C-written regions: act only on verified facts, refuse without writing."""

import os

import pytest

from hami_agent.shrreg import cleanup, force_unlock, read_region
from tests.shrreg.helpers import MIB, Mk, dead_pid

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

REPAIRABLE = ["v0b", "v1.1", "v1.2"]


@pytest.mark.parametrize("layout", REPAIRABLE)
def test_force_unlock_releases_lock_of_dead_owner(mkregion, tmp_path, layout):
    f = tmp_path / "r.cache"
    mk = Mk(f, layout).create()
    owner = dead_pid()
    mk.lock(owner)
    res = force_unlock(str(f))
    assert res.ok and res.applied, res
    assert [a.kind for a in res.actions][0] == "force-unlock"
    sv = mk.semval()
    assert sv["sem"] == "1" and sv["owner"] == "0"
    # idempotent: a second run must not post again (value would become 2 -> two holders)
    res2 = force_unlock(str(f))
    assert res2.ok and not any(a.kind == "force-unlock" for a in res2.actions)
    assert mk.semval()["sem"] == "1"


@pytest.mark.parametrize("layout", REPAIRABLE)
def test_force_unlock_refuses_live_owner_and_writes_nothing(mkregion, tmp_path, layout, procs):
    f = tmp_path / "r.cache"
    mk = Mk(f, layout).create()
    holder = mk.spawn("live", 30, "hold")
    procs.append(holder)
    before = f.read_bytes()
    res = force_unlock(str(f))
    assert not res.ok and not res.applied
    assert "still running" in res.refused[0] and str(holder.ready_pid) in res.refused[0]
    assert f.read_bytes() == before
    assert mk.semval()["sem"] == "0"


def test_force_unlock_owner_zero_refused_while_attached_released_when_quiescent(mkregion, tmp_path, procs):
    f = tmp_path / "r.cache"
    mk = Mk(f, "v1.2").create()
    mk.lock(0)  # the HAMi #2500 window: value 0, owner 0
    p = mk.spawn("live", 30, "noslot")  # a live process with the region mapped
    procs.append(p)
    before = f.read_bytes()
    res = force_unlock(str(f))
    assert not res.ok and "owner_pid 0" in res.refused[0] and "#2500" in res.refused[0]
    assert f.read_bytes() == before
    from tests.shrreg.helpers import stop

    stop(p)
    res = force_unlock(str(f))
    assert res.ok and res.applied
    assert mk.semval()["sem"] == "1"


def test_force_unlock_dry_run_writes_nothing(mkregion, tmp_path):
    f = tmp_path / "r.cache"
    mk = Mk(f, "v1.2").create()
    mk.lock(dead_pid())
    before = f.read_bytes()
    res = force_unlock(str(f), dry_run=True)
    assert res.ok and not res.applied and res.actions
    assert f.read_bytes() == before


def test_transient_layout_is_refused(mkregion, tmp_path):
    f = tmp_path / "r.cache"
    mk = Mk(f, "v1.1-transient").create()
    mk.lock(dead_pid())
    before = f.read_bytes()
    for fn in (force_unlock, cleanup):
        res = fn(str(f))
        assert not res.ok and "v1.1-transient" in res.refused[0]
    assert f.read_bytes() == before


def test_postinit_of_v11_file_reset_only_when_quiescent(mkregion, tmp_path, procs):
    f = tmp_path / "r.cache"
    mk = Mk(f, "v1.1").create()
    p = mk.spawn("live", 30)
    procs.append(p)
    res = force_unlock(str(f))
    assert not any(a.kind == "reset-postinit" for a in res.actions)
    assert any("sem_postinit" in k for k in res.kept)
    from tests.shrreg.helpers import stop

    stop(p)
    res = force_unlock(str(f))
    assert any(a.kind == "reset-postinit" for a in res.actions) and res.applied
    r = read_region(f)
    assert r.sem_postinit.value == 1 and r.sem_postinit.pshared


@pytest.mark.parametrize("layout", REPAIRABLE)
def test_cleanup_removes_only_dead_slots(mkregion, tmp_path, layout, procs):
    f = tmp_path / "r.cache"
    mk = Mk(f, layout).create()
    d1, d2 = dead_pid(), dead_pid()
    mk.slot(d1, d1, 1, 512 * MIB)
    live = mk.spawn("live", 30)  # slot 1, a live process
    procs.append(live)
    mk.slot(d2, 0, 1, 256 * MIB)  # slot 2, dead, last
    assert read_region(f).used_bytes(0) == 768 * MIB

    dry = cleanup(str(f), dry_run=True)
    assert dry.ok and len([a for a in dry.actions if a.kind == "remove-slot"]) == 2
    res = cleanup(str(f))
    assert res.ok and res.applied, res
    r = read_region(f)
    live_slots = [s for s in r.procs if s.pid > 0]
    assert [s.pid for s in live_slots] == [live.ready_pid]
    assert r.used_bytes(0) == 0
    assert r.sem.value == 1 and r.owner_pid == 0
    if layout == "v1.2":
        # the live slot was not moved; the hole below it is an exited tombstone for the library
        assert r.proc_num == 2 and r.procs[0].pid == 0 and r.procs[0].status == 0
        assert r.procs[1].pid == live.ready_pid
    else:
        # old libraries spin on pid==0 slots: the hole is filled by moving the last slot in
        assert r.proc_num == 1 and r.procs[0].pid == live.ready_pid
    assert f.stat().st_size == len(f.read_bytes())  # not truncated / re-created


def test_cleanup_dry_run_and_nothing_to_do_write_nothing(mkregion, tmp_path, procs):
    f = tmp_path / "r.cache"
    mk = Mk(f, "v1.2").create()
    mk.slot(dead_pid(), 0, 1, MIB)
    before = f.read_bytes()
    ino = f.stat().st_ino
    res = cleanup(str(f), dry_run=True)
    assert res.actions and not res.applied
    assert f.read_bytes() == before
    live = mk.spawn("live", 30)
    procs.append(live)
    assert cleanup(str(f)).applied
    after = f.read_bytes()
    res = cleanup(str(f))
    assert res.ok and not res.actions and not res.applied
    assert f.read_bytes()[:16] == after[:16] and f.stat().st_ino == ino


def test_cleanup_times_out_on_held_lock_and_names_owner(mkregion, tmp_path):
    f = tmp_path / "r.cache"
    mk = Mk(f, "v1.2").create()
    owner = dead_pid()
    mk.slot(dead_pid(), 0, 1, MIB)
    mk.lock(owner)
    before = f.read_bytes()
    res = cleanup(str(f), lock_timeout_s=0.3)
    assert res.error and "Lock shrreg timeout" in res.error and f"owner={owner}" in res.error
    assert "--force-unlock" in res.error
    assert f.read_bytes() == before


def test_cleanup_refuses_corrupt_proc_num(mkregion, tmp_path):
    f = tmp_path / "r.cache"
    Mk(f, "v1.2").create()
    data = bytearray(f.read_bytes())
    data[2008896:2008900] = (5000).to_bytes(4, "little")
    f.write_bytes(bytes(data))
    res = cleanup(str(f))
    assert not res.ok and "proc_num 5000" in res.refused[0]
    assert f.read_bytes() == bytes(data)


def test_repair_of_unreadable_file_reports_error(tmp_path):
    f = tmp_path / "bad.cache"
    f.write_bytes(b"\x00" * 100)
    for fn in (force_unlock, cleanup):
        res = fn(str(f))
        assert res.error and str(f) in res.error
    assert os.path.getsize(f) == 100


def test_v11_pid_zero_slot_below_live_slot_is_compacted_not_left(mkregion, tmp_path, procs):
    """§7 hazard: a v1.1 library's clear_proc_slot_nolock spins forever on a pid==0 slot below proc_num
    (left e.g. by a newer library's exit handler). Cleanup must never leave one in a v1.1/v0b file."""
    f = tmp_path / "r.cache"
    mk = Mk(f, "v1.1").create()
    mk.slot(0, 0, 0, 8 * MIB)  # exited tombstone written by a newer library
    live = mk.spawn("live", 30)
    procs.append(live)
    res = cleanup(str(f))
    assert res.ok and res.applied
    r = read_region(f)
    assert r.proc_num == 1 and r.procs[0].pid == live.ready_pid
    assert all(s.pid != 0 for s in r.procs)


def test_v12_tombstone_with_leftover_counters_is_zeroed(mkregion, tmp_path, procs):
    """The v1.2 exit handler stores pid=0/status=0 but leaves counters, which the OOM check still sums."""
    f = tmp_path / "r.cache"
    mk = Mk(f, "v1.2").create()
    mk.slot(0, 0, 0, 8 * MIB)
    live = mk.spawn("live", 30)
    procs.append(live)
    assert read_region(f).used_bytes(0) == 8 * MIB
    res = cleanup(str(f))
    assert res.ok and res.applied
    r = read_region(f)
    assert r.used_bytes(0) == 0 and r.procs[1].pid == live.ready_pid
    assert not cleanup(str(f)).actions  # a clean tombstone below a live slot is left to the library
