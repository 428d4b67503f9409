"""Shared-region verdicts from region files written by the mkregion helper (real pshared semaphores)."""

from __future__ import annotations

import pytest

from tests.integration.doctor.helpers import codes, run_doctor, verdict
from tests.shrreg import helpers as mk

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

POD_DIR = "0f3c8a52-7a51-4f5e-9d0e-2b8f1c1d9e11_main"


@pytest.fixture(scope="module")
def mkregion():
    return mk.build()


def _doctor(capsys, tmp_path, root):
    return run_doctor(capsys, "node", "gpu-1", "--local", "--no-nvml", "--no-journal", "--host-root",
                      str(tmp_path / "host"), "--shrreg-root", str(root), "--kubeconfig", "/nonexistent")


def test_dead_lock_holder(mkregion, tmp_path, capsys) -> None:
    region = mk.Mk(tmp_path / "containers" / POD_DIR / "a.cache", "v1.2").create(ndev=1)
    holder = mk.dead_pid()
    region.lock(holder)
    rc, report = _doctor(capsys, tmp_path, tmp_path / "containers")
    assert rc == 1
    v = verdict(report, "SHRREG_DEAD_LOCK_HOLDER")
    assert v["severity"] == "critical"
    assert any(f"Lock Holder PID {holder} is DEAD" in line for line in v["evidence"])
    assert "remediate_shrreg.yml" in v["fix"]


def test_zombie_task(mkregion, tmp_path, capsys) -> None:
    region = mk.Mk(tmp_path / "containers" / POD_DIR / "a.cache", "v1.2").create(ndev=1)
    dead = mk.dead_pid()
    region.slot(dead, dead, 1, 64 * mk.MIB)
    rc, report = _doctor(capsys, tmp_path, tmp_path / "containers")
    assert rc == 1 and "SHRREG_ZOMBIE_TASKS" in codes(report)


def test_healthy_region_has_no_shrreg_verdict(mkregion, tmp_path, capsys) -> None:
    mk.Mk(tmp_path / "containers" / POD_DIR / "a.cache", "v1.2").create(ndev=1)
    _rc, report = _doctor(capsys, tmp_path, tmp_path / "containers")
    assert not [c for c in codes(report) if c.startswith("SHRREG_")]
    assert report["facts"]["shrreg.regions"] == 1
