"""The reader against region files written by the C helper (its own structs, real pshared sems)."""

import hashlib
import os
import shutil

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hami_agent.shrreg import RegionFormatError, read_region
from hami_agent.shrreg.reader import container_identity, find_region_files
from tests.shrreg.helpers import LAYOUT_NAMES, MIB, SIZES, Mk, dead_pid, uuid_for

pytestmark = pytest.mark.integration


def _digest(path):
    st_ = os.stat(path)
    return hashlib.sha256(path.read_bytes()).hexdigest(), st_.st_mtime_ns, st_.st_size


@pytest.mark.parametrize("layout", LAYOUT_NAMES)
def test_every_field_decodes_like_the_c_structs(mkregion, tmp_path, layout):
    f = tmp_path / "uid_ctr" / "r.cache"
    mk = Mk(f, layout).create(ndev=3, limit_mib=2048, sm_limit=30)
    gone = dead_pid()
    mk.slot(os.getpid(), 4242, 1, 100 * MIB, 200 * MIB, 300 * MIB)
    mk.slot(gone, 0, 2, 5 * MIB)
    mk.halfslot(777)  # filled but never published: must not appear
    assert f.stat().st_size == SIZES[layout] + 1

    before = _digest(f)
    r = read_region(f)
    assert _digest(f) == before, "the reader must never write"

    assert r.layout == layout
    assert (r.major, r.minor) == {
        "v0b": (None, None),
        "v1.1": (1, 1),
        "v1.1-transient": (1, 1),
        "v1.2": (1, 2),
    }[layout]
    assert r.initialized_flag == 19920718
    assert r.device_num == 3
    assert r.uuids[:4] == (uuid_for(0), uuid_for(1), uuid_for(2), "")
    assert r.device_indices() == [0, 1, 2]
    assert r.limit == (2048 * MIB,) * 16
    assert r.sm_limit == (30,) * 16
    assert r.proc_num == 2 and len(r.procs) == 2
    assert (r.utilization_switch, r.recent_kernel, r.priority) == (1, 2, 1)
    assert r.sem.value == 1 and r.sem.pshared and r.owner_pid == 0
    if layout == "v0b":
        assert r.sem_postinit is None and r.last_kernel_time is None
    else:
        assert r.last_kernel_time and r.last_kernel_time > 1_600_000_000
    if layout == "v1.1":
        # v1.1's trailer is unused[4]: a v1.2 library would find an uninitialised sem_postinit
        assert r.sem_postinit is not None and not r.sem_postinit.initialised and r.sem_postinit.value == 0
    if layout in ("v1.2", "v1.1-transient"):
        assert r.sem_postinit is not None and r.sem_postinit.value == 1 and r.sem_postinit.pshared

    s0, s1 = r.procs
    assert (s0.pid, s0.hostpid, s0.status, s0.status_name) == (os.getpid(), 4242, 1, "ACTIVE")
    assert [u.total for u in s0.used[:4]] == [100 * MIB, 200 * MIB, 300 * MIB, 0]
    assert s0.used[0].context_size == MIB and s0.used[0].data_size == 99 * MIB
    assert s0.monitorused[:3] == (100 * MIB, 200 * MIB, 300 * MIB)
    assert [u.sm_util for u in s0.device_util[:4]] == [10, 20, 30, 0]
    assert (s1.pid, s1.hostpid, s1.status_name) == (gone, 0, "SUSPENDED")
    assert r.used_bytes(0) == 105 * MIB
    assert r.used_bytes(0, skip_exited=True) == 105 * MIB
    assert s0.seqlock == (None if layout in ("v0b", "v1.1") else 0)


@pytest.mark.parametrize("layout", ["v1.2", "v1.1-transient"])
def test_odd_seqlock_is_reported_after_bounded_retries(mkregion, tmp_path, layout):
    f = tmp_path / "r.cache"
    mk = Mk(f, layout).create()
    mk.slot(dead_pid(), 0, 1, MIB)
    mk.oddseq(0)
    r = read_region(f)
    assert r.procs[0].write_in_progress


@pytest.mark.parametrize("layout", LAYOUT_NAMES)
def test_held_lock_with_dead_owner_is_visible(mkregion, tmp_path, layout):
    f = tmp_path / "r.cache"
    mk = Mk(f, layout).create()
    owner = dead_pid()
    mk.lock(owner)
    r = read_region(f)
    assert r.locked and r.sem.value == 0 and r.owner_pid == owner
    assert mk.semval()["sem"] == "0"


def test_damaged_files_give_clear_errors_and_are_never_written(mkregion, tmp_path):
    good = tmp_path / "good.cache"
    Mk(good, "v1.2").create()
    data = good.read_bytes()
    cases = {
        "empty": (b"", "too short"),
        "zero": (bytes(len(data)), "not initialised"),
        "foreign": (b"\x01\x02\x03\x04" + data[4:], "magic flag not matched"),
        "truncated": (data[:1_000_000], "unknown cache file size 1000000"),
        "v0a": (data[:804681], "v0a"),
        "major2": (data[:4] + (2).to_bytes(4, "little") + data[8:], "expected major version 1"),
    }
    for name, (content, needle) in cases.items():
        f = tmp_path / f"{name}.cache"
        f.write_bytes(content)
        before = _digest(f)
        with pytest.raises(RegionFormatError) as ei:
            read_region(f)
        assert needle in str(ei.value), (name, str(ei.value))
        assert str(f) in str(ei.value)
        assert _digest(f) == before


def test_transient_sized_file_with_header_1_1_is_transient(mkregion, tmp_path):
    f = tmp_path / "r.cache"
    Mk(f, "v1.1-transient").create(ndev=1)
    r = read_region(f)
    # misreading it as v1.1 would put device_num at +56 (inside sem_postinit): check real offsets won
    assert r.layout == "v1.1-transient" and r.device_num == 1 and r.uuids[0] == uuid_for(0)


def test_find_region_files_and_container_identity(mkregion, tmp_path):
    root = tmp_path / "containers"
    a = root / "0b6e5f7c-aaaa-bbbb-cccc-000000000001_main" / "x.cache"
    b = root / "0b6e5f7c-aaaa-bbbb-cccc-000000000002_side-car" / "y.cache"
    Mk(a, "v1.2").create()
    Mk(b, "v0b").create()
    (a.parent / "libvgpu.so").write_bytes(b"")
    assert [p.name for p in find_region_files(root)] == ["x.cache", "y.cache"]
    assert container_identity(b) == ("0b6e5f7c-aaaa-bbbb-cccc-000000000002", "side-car")
    assert container_identity(tmp_path / "nounderscore" / "z.cache") is None
    assert list(find_region_files(tmp_path / "missing")) == []


@pytest.fixture(scope="module")
def real_region(tmp_path_factory):
    from tests.shrreg import helpers

    helpers.build()
    d = tmp_path_factory.mktemp("fuzz")
    f = d / "r.cache"
    mk = Mk(f, "v1.2").create(ndev=2)
    mk.slot(12, 0, 1, MIB)
    return f.read_bytes()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.integers(min_value=0, max_value=SIZES["v1.2"] + 1))
def test_truncations_of_a_real_file_never_crash(real_region, tmp_path, cut):
    f = tmp_path / "t.cache"
    f.write_bytes(real_region[:cut])
    try:
        r = read_region(f)
    except RegionFormatError as exc:
        assert "bytes" in str(exc) or "size" in str(exc) or "magic" in str(exc)
    else:
        # only cuts that keep a complete v0b-or-larger region are decodable
        assert cut >= SIZES["v0b"]
        assert r.layout in ("v0b", "v1.2")


def test_copy_is_independent_of_original(mkregion, tmp_path):
    # regression guard: read_region works on a copy (no mmap tied to the source inode)
    f = tmp_path / "a.cache"
    Mk(f, "v1.1").create()
    g = tmp_path / "b.cache"
    shutil.copy(f, g)
    assert read_region(g).layout == "v1.1"
