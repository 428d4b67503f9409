"""Findings: zombie tasks, seed 002's four leak cases, lock states, version mismatch, slots full."""

import pytest

from hami_agent.shrreg import analysis as A
from hami_agent.shrreg.liveness import Attachment, HostProcess
from hami_agent.shrreg.reader import decode_region
from tests.unit.shrreg.builder import MIB, build, uuid_for

pytestmark = pytest.mark.unit


def region(**kw):
    raw = build(**kw)
    return decode_region(raw, len(raw), "/r/uid_ctr/x.cache")


def attached(*pairs):
    """(host_pid, container_pid) of live processes that have the region mapped."""
    return Attachment(path="x", processes=[HostProcess(pid=h, nspids=(h, c), state="S") for h, c in pairs])


def codes(findings):
    return [f.code for f in findings]


def test_zombie_task_with_tracked_memory():
    r = region(slots=[(7, 1007, 1, [512 * MIB]), (8, 1008, 1, [0])])
    f = A.analyse_region(r, attached((1008, 8)))
    z = [x for x in f if x.code == A.ZOMBIE_TASK]
    assert len(z) == 1 and z[0].pid == 7 and "PID 7: DEAD (zombie entry)" in z[0].message
    assert "512 MiB" in z[0].message and "--cleanup" in z[0].remedy


def test_no_liveness_without_attachment():
    r = region(slots=[(7, 1007, 1, [MIB])])
    assert A.ZOMBIE_TASK not in codes(A.analyse_region(r, None))


def test_lock_states():
    r = region(owner=7, sem_value=0, slots=[(7, 0, 1, [0])])
    dead = A.analyse_region(r, attached())
    assert A.LOCK_HELD_DEAD_OWNER in codes(dead)
    assert "force-unlock" in [x for x in dead if x.code == A.LOCK_HELD_DEAD_OWNER][0].remedy
    live = A.analyse_region(r, attached((2000, 7)))
    assert A.LOCK_HELD_LIVE_OWNER in codes(live) and A.LOCK_HELD_DEAD_OWNER not in codes(live)
    r0 = region(owner=0, sem_value=0)
    assert A.LOCK_HELD_NO_OWNER in codes(A.analyse_region(r0, attached()))
    assert not {A.LOCK_HELD_NO_OWNER, A.LOCK_HELD_DEAD_OWNER} & set(
        codes(A.analyse_region(region(), attached()))
    )


def test_four_leak_cases_of_seed_002():
    # normal: tracked 2048, NVML 2100 (context overhead)
    # internal: tracked 2048, NVML lists nothing for the process (freed but not decremented)
    # external: tracked 1024, NVML 4096
    # mismatch: tracked 4096, NVML 1024
    slots = [
        (1, 101, 1, [2048 * MIB]),
        (2, 102, 1, [2048 * MIB]),
        (3, 103, 1, [1024 * MIB]),
        (4, 104, 1, [4096 * MIB]),
    ]
    r = region(slots=slots)
    u = uuid_for(0)
    nvml = [
        A.NvmlProcess(u, 101, 2100 * MIB),
        A.NvmlProcess(u, 103, 4096 * MIB),
        A.NvmlProcess(u, 104, 1024 * MIB),
    ]
    f = A.analyse_region(r, attached((101, 1), (102, 2), (103, 3), (104, 4)), nvml)
    by_pid = {x.pid: x for x in f if x.code.startswith("LEAK_")}
    assert by_pid[1].code == A.LEAK_NORMAL and by_pid[1].severity == A.OK
    assert by_pid[2].code == A.LEAK_INTERNAL and "内部泄漏" in by_pid[2].message
    assert by_pid[3].code == A.LEAK_EXTERNAL and "外部泄漏" in by_pid[3].message
    assert by_pid[4].code == A.LEAK_TRACKING_MISMATCH and "跟踪不一致" in by_pid[4].message


def test_hostpid_zero_is_matched_through_nspid_and_untracked_process_is_external():
    r = region(slots=[(9, 0, 1, [100 * MIB])])
    u = uuid_for(0)
    nvml = [A.NvmlProcess(u, 5009, 100 * MIB), A.NvmlProcess(u, 5010, 3000 * MIB)]
    f = A.analyse_region(r, attached((5009, 9), (5010, 10)), nvml)
    assert [x.code for x in f if x.pid == 9 and x.code.startswith("LEAK")] == [A.LEAK_NORMAL]
    ext = [x for x in f if x.pid == 5010]
    assert ext and ext[0].code == A.LEAK_EXTERNAL and "no task slot" in ext[0].message
    assert A.HOSTPID_UNKNOWN in codes(f)


def test_version_findings():
    assert codes(A.analyse_version(region(layout="v1.2"))) == []
    v11 = A.analyse_version(region(layout="v1.1"))
    assert codes(v11) == [A.VERSION_MISMATCH_MINOR] and "330 s" in v11[0].message
    assert "向下兼容" in v11[0].remedy
    assert codes(A.analyse_version(region(layout="v0b"))) == [A.VERSION_MISMATCH_MAJOR]
    assert codes(A.analyse_version(region(layout="v1.1-transient"))) == [A.TRANSIENT_LAYOUT]
    assert codes(A.analyse_version(region(layout="v1.1"), (1, 1))) == []
    assert A.parse_version("1.2") == (1, 2)
    with pytest.raises(ValueError, match="MAJOR.MINOR"):
        A.parse_version("x")


def test_slots_full_wrap_over_limit_and_write_in_progress():
    r = region(proc_num=1024)
    assert A.SLOTS_FULL in codes(A.analyse_region(r))
    r = region(slots=[(5, 50, 1, [(1 << 64) - 10])])
    assert A.COUNTER_WRAP in codes(A.analyse_region(r, attached((50, 5))))
    r = region(limit_mib=100, slots=[(5, 50, 1, [200 * MIB])])
    over = [x for x in A.analyse_region(r, attached((50, 5))) if x.code == A.OVER_LIMIT]
    assert over and "过量分配" in over[0].message
    r = region(slots=[(5, 50, 1, [MIB])], seqlock_odd=(0,))
    w = [x for x in A.analyse_region(r, attached()) if x.code == A.WRITE_IN_PROGRESS]
    assert w and w[0].severity == A.ERROR and "dead" in w[0].message


def test_load_nvml_processes(tmp_path):
    p = tmp_path / "n.json"
    p.write_text(
        '[{"uuid": "GPU-1", "pid": 3, "used_mib": 2}, {"gpu_uuid": "GPU-2", "pid": 4, "used_bytes": 5}]'
    )
    assert A.load_nvml_processes(str(p)) == [A.NvmlProcess("GPU-1", 3, 2 * MIB), A.NvmlProcess("GPU-2", 4, 5)]
    p.write_text('[{"pid": 1}]')
    with pytest.raises(ValueError, match="entry 0"):
        A.load_nvml_processes(str(p))
    assert A.worst_severity([]) == A.OK
