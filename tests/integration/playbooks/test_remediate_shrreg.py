"""playbooks/remediate_shrreg.yml on this machine (local connection) against HAMi-core regions written by
the mkregion C helper: a dead lock holder with its zombie slot is repaired, a live holder is left alone,
and a second run changes nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.shrreg.helpers import MIB, Mk, build, dead_pid, stop

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parents[3]
UID = "0c2a5e1e-8f3b-4a5c-9d7e-1f2a3b4c5d6e"


def _play(tmp_path: Path, region_dir: Path) -> subprocess.CompletedProcess[str]:
    coll = tmp_path / "coll" / "ansible_collections" / "hami"
    coll.mkdir(parents=True, exist_ok=True)
    if not (coll / "node").exists():
        (coll / "node").symlink_to(ROOT)
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(tmp_path / "coll"), ANSIBLE_FORCE_COLOR="0",
               ANSIBLE_LOCALHOST_WARNING="false", ANSIBLE_INVENTORY_UNPARSED_WARNING="false",
               PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""))
    extra = {"remediate_hosts": "localhost", "remediate_shrreg_dir": str(region_dir),
             "remediate_shrreg_tool": str(Path(sys.executable).parent / "shrreg_tool"),
             "ansible_python_interpreter": sys.executable}
    return subprocess.run(
        ["ansible-playbook", "-i", "localhost,", "-c", "local",
         str(ROOT / "playbooks" / "remediate_shrreg.yml"), "-e", json.dumps(extra)],
        cwd=tmp_path, env=env, text=True, capture_output=True, timeout=200, check=False,
    )


def _codes(region_dir: Path) -> list[str]:
    out = subprocess.run([str(Path(sys.executable).parent / "shrreg_tool"), "--inspect", "--json", "--dir",
                          str(region_dir)], capture_output=True, text=True, timeout=60, check=False).stdout
    return sorted(f["code"] for r in json.loads(out)["regions"] for f in r["findings"])


def _changed(out: str) -> int:
    line = next(ln for ln in out.splitlines() if ln.startswith("localhost") and "changed=" in ln)
    return int(line.split("changed=")[1].split()[0])


def test_repairs_dead_holder_keeps_live_holder_then_idempotent(tmp_path: Path) -> None:
    build()
    region_dir = tmp_path / "containers"
    dead = Mk(region_dir / f"{UID}_dead" / "a.cache", "v1.2").create(ndev=1)
    gone = dead_pid()
    dead.slot(gone, gone, 1, 1024 * MIB)
    dead.lock(gone)
    live = Mk(region_dir / f"{UID}_live" / "b.cache", "v1.2").create(ndev=1)
    holder = live.spawn("live", 120, "hold")
    try:
        before = _codes(region_dir)
        assert "LOCK_HELD_DEAD_OWNER" in before and "ZOMBIE_TASK" in before, before

        first = _play(tmp_path, region_dir)
        assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-2000:]
        after = _codes(region_dir)
        assert "LOCK_HELD_DEAD_OWNER" not in after and "ZOMBIE_TASK" not in after, after
        assert "LOCK_HELD_LIVE_OWNER" in after  # the live holder was left alone
        assert _changed(first.stdout) == 2

        second = _play(tmp_path, region_dir)
        assert second.returncode == 0, second.stdout[-4000:]
        assert _changed(second.stdout) == 0
    finally:
        stop(holder)
