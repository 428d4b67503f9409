"""Decide, then write, all or nothing: for every repair action, a refusal (or a fact that changed before
the write) leaves the file byte-identical, and the same repair without the obstacle still works."""

import hashlib

import pytest

from hami_agent.shrreg import cleanup, force_unlock, read_region
from hami_agent.shrreg.liveness import Attachment, HostProcess
from tests.shrreg.helpers import MIB, Mk, dead_pid, stop

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def unverifiable(path: str) -> Attachment:
    """What a tool in a child PID namespace sees: no process at all, and it cannot prove anyone dead."""
    return Attachment(path=path, child_namespace=True)


def test_force_unlock_refused_owner_writes_nothing_not_even_the_allowed_postinit_reset(mkregion, tmp_path):
    """Issue 17 finding 3: the owner cannot be proven dead -> 'refused', exit 1, and the old code had
    already re-initialised sem_postinit (the planned half that was allowed)."""
    f = tmp_path / "r.cache"
    mk = Mk(f, "v1.1").create()  # v1.1: sem_postinit bytes are zero, a reset would be planned
    mk.lock(dead_pid())
    before = digest(f)
    res = force_unlock(str(f), attach=unverifiable)
    assert not res.ok and not res.applied and not res.error
    assert "cannot be verified dead" in res.refused[0]
    assert any(a.kind == "reset-postinit" for a in res.actions)  # it was part of the plan ...
    assert digest(f) == before  # ... and nothing was written
    # the same file, with an owner that is provably dead: both actions run
    res = force_unlock(str(f))
    assert res.ok and res.applied and [a.kind for a in res.actions] == ["force-unlock", "reset-postinit"]
    sv = mk.semval()
    assert sv["sem"] == "1" and sv["owner"] == "0"
    assert read_region(f).sem_postinit.value == 1  # the v1.1 trailer, read as v1.2's sem_postinit


def test_force_unlock_live_owner_refused_byte_identical(mkregion, tmp_path, procs):
    f = tmp_path / "r.cache"
    mk = Mk(f, "v1.2").create()
    holder = mk.spawn("live", 30, "hold")
    procs.append(holder)
    before = digest(f)
    res = force_unlock(str(f))
    assert not res.ok and "still running" in res.refused[0]
    assert digest(f) == before
    stop(holder)  # the holder dies with the lock held: now the same repair is accepted
    res = force_unlock(str(f))
    assert res.ok and res.applied and mk.semval()["sem"] == "1"


def test_force_unlock_fact_changed_under_the_lock_writes_nothing(mkregion, tmp_path):
    """Decided with the owner dead; under lockf the owner turns out alive (PID reuse, a wrong first
    look): nothing is written."""
    f = tmp_path / "r.cache"
    mk = Mk(f, "v1.2").create()
    owner = dead_pid()
    mk.lock(owner)
    looks = iter([
        Attachment(path=str(f)),  # first look: nobody attached -> owner dead
        Attachment(path=str(f), processes=[HostProcess(pid=4242, nspids=(owner,), state="S")]),
    ])
    before = digest(f)
    res = force_unlock(str(f), attach=lambda p: next(looks))
    assert not res.applied and not res.actions
    assert any("changed while we checked" in k for k in res.kept), res
    assert digest(f) == before


def test_reset_postinit_kept_when_processes_attached_and_applied_when_quiescent(mkregion, tmp_path, procs):
    f = tmp_path / "r.cache"
    mk = Mk(f, "v1.1").create()
    p = mk.spawn("live", 30)
    procs.append(p)
    before = digest(f)
    res = force_unlock(str(f))
    assert not res.applied and any("sem_postinit" in k for k in res.kept)
    assert digest(f) == before
    stop(p)
    res = force_unlock(str(f))
    assert res.applied and read_region(f).sem_postinit.value == 1


@pytest.mark.parametrize("layout,kind", [("v1.2", "remove-slot"), ("v1.2", "tombstone-slot"),
                                         ("v1.1", "remove-slot")])
def test_cleanup_action_refused_by_a_held_lock_is_byte_identical_then_applied(mkregion, tmp_path, procs,
                                                                               layout, kind):
    f = tmp_path / "r.cache"
    mk = Mk(f, layout).create()
    mk.slot(dead_pid(), 0, 1, 64 * MIB)  # slot 0: dead
    live = mk.spawn("live", 30)  # slot 1: alive
    procs.append(live)
    if kind == "remove-slot" and layout == "v1.2":
        mk.slot(dead_pid(), 0, 1, 32 * MIB)  # slot 2: dead and last -> removed, no tombstone
    holder = mk.spawn("live", 30, "hold")  # takes the region lock and keeps it
    procs.append(holder)
    before = digest(f)
    res = cleanup(str(f), lock_timeout_s=0.5)
    assert not res.ok and "Lock shrreg timeout" in (res.error or "")
    assert digest(f) == before
    stop(holder)  # dies holding the lock; release it the supported way, then clean up
    assert force_unlock(str(f)).applied
    res = cleanup(str(f))
    assert res.ok and res.applied and any(a.kind == kind for a in res.actions), res
    r = read_region(f)
    alive = {s.pid for s in r.procs if s.pid}
    assert live.ready_pid in alive and holder.ready_pid not in alive


def test_cleanup_refusals_before_any_lock(mkregion, tmp_path):
    f = tmp_path / "r.cache"
    mk = Mk(f, "v1.1-transient").create()
    mk.slot(dead_pid(), 0, 1, MIB)
    before = digest(f)
    res = cleanup(str(f))
    assert not res.ok and "v1.1-transient" in res.refused[0]
    assert digest(f) == before


def test_cleanup_nothing_to_do_takes_no_lock_and_writes_nothing(mkregion, tmp_path, procs):
    f = tmp_path / "r.cache"
    mk = Mk(f, "v1.2").create()
    live = mk.spawn("live", 30)
    procs.append(live)
    before = digest(f)
    res = cleanup(str(f))
    assert res.ok and not res.applied and not res.actions
    assert digest(f) == before
