"""The seed-003 stall detector against the seed's own kubelet log excerpts."""

from __future__ import annotations

from pathlib import Path

import pytest

from hami_agent.doctor.kubeletlog import analyse_kubelet_log, parse_line

pytestmark = pytest.mark.unit

LOGS = Path(__file__).resolve().parents[2] / "fixtures" / "logs"
STALLED_UID = "69e0758e-d625-4013-9258-df8b7ddf04e2"
NORMAL_UID = "cf97dd7e-bc61-44c1-8241-b47204a2e9b1"


def _lines(name: str) -> list[str]:
    return (LOGS / name).read_text(encoding="utf-8").splitlines(keepends=True)


def test_normal_seed_log_has_no_stall() -> None:
    a = analyse_kubelet_log(_lines("seed003_kubelet_normal.log"))
    assert a.stalls == [] and a.outstanding == []
    assert [c.pod_uid for c in a.answered] == [NORMAL_UID]
    call = a.answered[0]
    assert call.container == "neal-0729-1"
    assert call.resource == "nvidia.com/mig-3g.48gb"
    assert "MIG-5e2f454b-6cf3-51c3-a060-0a34ba38dfe4" in call.answered.raw


def test_stalled_seed_log_with_later_lines_is_a_stall_with_exact_uid_and_time() -> None:
    a = analyse_kubelet_log(_lines("seed003_kubelet_stalled_then_later.log"))
    assert len(a.stalls) == 1
    stall = a.stalls[0]
    assert stall.pod_uid == STALLED_UID
    assert stall.container == "neal-0729-6"
    assert stall.resource == "nvidia.com/gpu"
    assert stall.kubelet_pid == 45878
    assert stall.issued.klog_time == "0730 20:39:03.753013"
    assert stall.issued.lineno == 5
    # 20:39:03.753013 -> last line of the same kubelet at 21:02:03.804343
    assert stall.waited_s == pytest.approx(1380.05133, abs=1e-3)
    assert stall.kubelet_restarted is False


def test_stalled_excerpt_alone_is_outstanding_not_a_stall() -> None:
    """The excerpt ends 51 ms after the call: too little log time to call it a stall at 30 s."""
    a = analyse_kubelet_log(_lines("seed003_kubelet_stalled.log"))
    assert a.stalls == []
    assert [c.pod_uid for c in a.outstanding] == [STALLED_UID]
    # ... but with a window shorter than the 51 ms of later cadvisor lines it is one
    short = analyse_kubelet_log(_lines("seed003_kubelet_stalled.log"), stall_after_s=0.05)
    assert [c.pod_uid for c in short.stalls] == [STALLED_UID]


def test_no_later_lines_is_never_a_stall() -> None:
    issuing = _lines("seed003_kubelet_stalled.log")[:5]  # ends on the Issuing line itself
    a = analyse_kubelet_log(issuing, stall_after_s=0.0)
    assert a.stalls == [] and len(a.outstanding) == 1


def _klog(t: str, pid: int, where: str, msg: str, **kv: str) -> str:
    return f'I0730 {t} {pid:7d} {where}] "{msg}"' + "".join(f' {k}="{v}"' for k, v in kv.items()) + "\n"


def test_bare_klog_lines_as_the_kubelet_simulator_writes_them() -> None:
    lines = [
        _klog("10:00:00.000000", 7, "manager.go:956", "Issuing a GetPreferredAllocation call for container",
              containerName="c1", podUID="uid-a"),
        'I0730 10:00:00.001000       7 manager.go:819] "Making allocation request for device plugin" '
        'devices=["GPU-1-0"] resourceName="nvidia.com/gpu"\n',
        _klog("10:00:01.000000", 7, "manager.go:956", "Issuing a GetPreferredAllocation call for container",
              containerName="c2", podUID="uid-b"),
        _klog("10:01:00.000000", 7, "kubelet.go:2343", "SyncLoop ADD", source="api"),
    ]
    a = analyse_kubelet_log(lines)
    assert [c.pod_uid for c in a.answered] == ["uid-a"]
    assert [(c.pod_uid, c.container) for c in a.stalls] == [("uid-b", "c2")]
    assert a.stalls[0].waited_s == pytest.approx(59.0)


def test_a_call_followed_by_another_call_was_not_stuck() -> None:
    """Serial admission: a new Issuing line means the kubelet got past the previous call (it errored)."""
    lines = [
        _klog("10:00:00.000000", 7, "manager.go:956", "Issuing a GetPreferredAllocation call for container",
              containerName="c1", podUID="uid-a"),
        _klog("10:00:05.000000", 7, "manager.go:956", "Issuing a GetPreferredAllocation call for container",
              containerName="c2", podUID="uid-b"),
        'I0730 10:00:05.001000       7 manager.go:819] "Making allocation request for device plugin" '
        'devices=["GPU-1-0"] resourceName="nvidia.com/gpu"\n',
        _klog("10:05:00.000000", 7, "kubelet.go:2343", "SyncLoop ADD", source="api"),
    ]
    a = analyse_kubelet_log(lines)
    assert a.stalls == []
    assert [c.pod_uid for c in a.answered] == ["uid-b"]
    assert a.calls[0].superseded is True


def test_kubelet_restart_keeps_the_stall_of_the_old_process() -> None:
    lines = [
        _klog("10:00:00.000000", 7, "manager.go:956", "Issuing a GetPreferredAllocation call for container",
              containerName="c1", podUID="uid-a"),
        _klog("10:02:00.000000", 7, "fs.go:419", "noise"),
        _klog("10:10:00.000000", 9, "server.go:1", "Starting kubelet"),
    ]
    a = analyse_kubelet_log(lines)
    assert [c.pod_uid for c in a.stalls] == ["uid-a"]
    assert a.stalls[0].kubelet_restarted is True


def test_parse_line_rejects_non_klog_and_reads_journald_prefix() -> None:
    assert parse_line("hello world") is None
    assert parse_line("I1399 10:00:00.000000 1 x.go:1] bad month") is None
    line = parse_line(_lines("seed003_kubelet_normal.log")[3], 4, year=2025)
    assert line is not None and line.pid == 26361 and line.where == "manager.go:956"
    assert line.kv["podUID"] == NORMAL_UID and line.time.year == 2025
