"""Collectors: deadlines, failures as evidence, journalctl with a timeout, driver files."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest

from hami_agent.doctor.collect import host, logs
from hami_agent.doctor.collect.base import Context, run_collector
from hami_agent.doctor.model import Facts

pytestmark = pytest.mark.unit

LOGS = Path(__file__).resolve().parents[2] / "fixtures" / "logs"


def test_a_hung_collector_is_evidence_not_a_hang() -> None:
    f = Facts()
    started = time.monotonic()
    res = run_collector("slow", lambda ctx, facts: time.sleep(5), Context(), f, timeout_s=0.2)
    assert time.monotonic() - started < 2
    assert res.ok is False and "did not finish within 0.2s" in (res.error or "")
    assert f.get("collect.slow.error") == res.error


def test_a_failing_collector_keeps_what_it_learned() -> None:
    def boom(ctx: Context, facts: Facts) -> None:
        facts.set("early", 1)
        raise OSError("disk on fire")

    f = Facts()
    res = run_collector("boom", boom, Context(), f)
    assert res.ok is False and "OSError: disk on fire" in (res.error or "")
    assert f.get("early") == 1


def _fake_journalctl(tmp_path: Path, body: str) -> None:
    script = tmp_path / "journalctl"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


def test_journal_is_read_with_journalctl(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = LOGS / "seed003_kubelet_stalled_then_later.log"
    _fake_journalctl(tmp_path, f'[ "$1 $2" = "-u kubelet" ] || exit 3\ncat "{log}"\n')
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    f = Facts()
    res = run_collector("kubelet_log", logs.collect_kubelet_log, Context(use_journal=True), f)
    assert res.ok, res.error
    assert f.get("kubelet.stall.pod_uid") == "69e0758e-d625-4013-9258-df8b7ddf04e2"
    assert f.get("kubelet.log.source").startswith("journalctl -u kubelet --since")


def test_journalctl_timeout_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_journalctl(tmp_path, "sleep 5\n")
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    f = Facts()
    ctx = Context(use_journal=True, journal_timeout_s=0.3)
    res = run_collector("kubelet_log", logs.collect_kubelet_log, ctx, f)
    assert res.ok is False and "did not finish within 0.3s" in (res.error or "")


def test_driver_version_from_proc_when_sys_is_absent(tmp_path: Path) -> None:
    proc = tmp_path / "proc/driver/nvidia"
    proc.mkdir(parents=True)
    (proc / "version").write_text(
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.158.01  Tue Jun  3 18:57:45 UTC 2025\n"
        "GCC version:  gcc version 12.3.0\n")
    f = Facts()
    host.collect_driver_files(Context(host_root=str(tmp_path)), f)
    host.derive_driver_facts(f)
    assert f.get("driver.version") == "570.158.01"
    assert f.get("driver.known_bad") is True
    assert f.has("mig.mixed") is False  # no GPU list: MIG layout unknown, not guessed


def test_driver_version_from_hami_sysfs_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # simulated nodes keep the loaded module version outside /sys (HAMI_SYSFS_ROOT, as the NVML layer)
    sysfs = tmp_path / "run/gpusim/sys/module/nvidia"
    sysfs.mkdir(parents=True)
    (sysfs / "version").write_text("570.158.01\n")
    (tmp_path / "sys/module/nvidia").mkdir(parents=True)
    (tmp_path / "sys/module/nvidia/version").write_text("570.172.08\n")
    monkeypatch.setenv("HAMI_SYSFS_ROOT", str(tmp_path / "run/gpusim/sys"))
    f = Facts()
    host.collect_driver_files(Context(host_root=str(tmp_path)), f)
    host.derive_driver_facts(f)
    assert f.get("driver.version") == "570.158.01"
    assert f.get("driver.known_bad") is True


def test_mig_layout_from_node_allocatable_when_nothing_else() -> None:
    f = Facts()
    f.set("node.found", True)
    f.set("node.allocatable_gpu", 5)
    f.set("node.mig_allocatable", {"nvidia.com/mig-3g.48gb": 3})
    host.derive_driver_facts(f)
    assert f.get("mig.mixed") is True
