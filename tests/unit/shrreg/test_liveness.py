"""Liveness against a fake /proc tree: maps + NSpid decide, unreadable/child-namespace views refuse."""

import os

import pytest

from hami_agent.shrreg.liveness import State, scan_attachment, scan_attachments

pytestmark = pytest.mark.unit


def _proc(root, pid, nspids, state="S", maps=""):
    d = root / str(pid)
    d.mkdir(parents=True)
    (d / "status").write_text(f"Name:\tx\nPid:\t{pid}\nNSpid:\t{' '.join(map(str, nspids))}\n")
    (d / "stat").write_text(f"{pid} (a (weird) name) {state} 1 1 1\n")
    (d / "maps").write_text(maps)


def _maps_line(path, dev=None):
    st = os.stat(path)
    major, minor = (os.major(st.st_dev), os.minor(st.st_dev)) if dev is None else dev
    return (
        f"7f0000000000-7f00001ea000 rw-s 00000000 {major:02x}:{minor:02x} {st.st_ino}    "
        f"/usr/local/vgpu/{os.path.basename(path)}\n"
    )


@pytest.fixture
def region(tmp_path):
    f = tmp_path / "r.cache"
    f.write_bytes(b"x" * 64)
    return f


@pytest.fixture
def proc(tmp_path):
    root = tmp_path / "proc"
    _proc(root, "self", [4242])  # this tool: root PID namespace
    return root


def test_attached_process_in_container_namespace(region, proc):
    _proc(proc, 5001, [5001, 1], maps=_maps_line(region))  # container PID 1
    _proc(proc, 5002, [5002, 7], maps="")  # same container, not attached
    _proc(proc, 1, [1])  # host init: PID 1, not attached
    att = scan_attachment(region, proc_root=str(proc))
    assert [p.pid for p in att.processes] == [5001]
    v = att.verdict(1)
    assert v.state is State.ALIVE and v.host_pids == (5001,)
    assert att.verdict(7).state is State.DEAD  # alive but never attached: not holding the region
    assert att.verdict(9).state is State.DEAD
    assert att.verdict(0).state is State.DEAD


def test_zombie_attached_process_is_dead(region, proc):
    _proc(proc, 6000, [6000, 3], state="Z", maps=_maps_line(region))
    assert scan_attachment(region, proc_root=str(proc)).verdict(3).state is State.DEAD


def test_overlay_device_mismatch_matches_by_inode_and_name(region, proc):
    _proc(proc, 7000, [7000, 12], maps=_maps_line(region, dev=(0, 99)))
    assert scan_attachment(region, proc_root=str(proc)).verdict(12).state is State.ALIVE


def test_unreadable_maps_only_matter_for_the_same_pid(region, proc, monkeypatch):
    _proc(proc, 8000, [8000, 4])
    _proc(proc, 8001, [8001, 5])
    real_read_text = type(proc).read_text

    def read_text(self, *a, **k):
        if self.name == "maps" and self.parent.name == "8000":
            raise PermissionError(13, "denied")
        return real_read_text(self, *a, **k)

    monkeypatch.setattr(type(proc), "read_text", read_text)
    att = scan_attachment(region, proc_root=str(proc))
    assert att.verdict(4).state is State.UNKNOWN and "/proc/8000/maps" in att.verdict(4).reason
    assert att.verdict(5).state is State.DEAD


def test_child_namespace_view_is_never_trusted_for_dead(region, tmp_path):
    root = tmp_path / "proc2"
    _proc(root, "self", [9000, 12])  # this tool runs inside a container without hostPID
    att = scan_attachment(region, proc_root=str(root))
    assert att.verdict(3).state is State.UNKNOWN and "--in-container" in att.verdict(3).reason
    att = scan_attachment(region, proc_root=str(root), assume_complete=True)
    assert att.verdict(3).state is State.DEAD


def test_vanishing_processes_and_files(region, proc, tmp_path):
    d = proc / "9999"
    d.mkdir()  # a process directory without files: it exited mid-scan
    other = tmp_path / "gone.cache"
    atts = scan_attachments([str(region), str(other)], proc_root=str(proc))
    assert atts[str(other)].processes == [] and atts[str(region)].processes == []
