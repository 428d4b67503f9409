"""The hami_rbac role, run by the real ansible-playbook (render-only, local connection), writes exactly the
documents the tests load into the simulated API server (``tests/sim/role_manifests.py``): the policy and
RBAC under test are the files the role ships, not a copy. Also: the manifests are 0600 in a 0700 directory,
and a bad allocation key is refused before anything is rendered."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.sim.role_manifests import render

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parents[3]
if not shutil.which("ansible-playbook", path=str(Path(sys.executable).parent)):
    pytest.skip("ansible-playbook is installed with the dev extra on Python >= 3.11", allow_module_level=True)


def _play(tmp_path: Path, extra: dict) -> subprocess.CompletedProcess[str]:
    coll = tmp_path / "coll" / "ansible_collections" / "hami"
    coll.mkdir(parents=True, exist_ok=True)
    if not (coll / "node").exists():
        (coll / "node").symlink_to(ROOT)
    play = tmp_path / "play.yml"
    play.write_text(yaml.safe_dump([{"hosts": "localhost", "connection": "local", "gather_facts": False,
                                     "roles": ["hami.node.hami_rbac"]}]))
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(tmp_path / "coll"), ANSIBLE_FORCE_COLOR="0",
               ANSIBLE_LOCALHOST_WARNING="false", ANSIBLE_INVENTORY_UNPARSED_WARNING="false",
               PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""))
    extra = {"ansible_python_interpreter": sys.executable, **extra}
    return subprocess.run(["ansible-playbook", str(play), "-e", json.dumps(extra)], cwd=tmp_path, env=env,
                          text=True, capture_output=True, timeout=200, check=False)


def test_the_role_renders_what_the_tests_load(tmp_path: Path) -> None:
    out_dir = tmp_path / "manifests"
    overrides = {"hami_rbac_node_name": "gpu-0", "hami_rbac_doctor_groups": ["sre"],
                 "hami_rbac_scheduler_token_review": True}
    res = _play(tmp_path, {"hami_rbac_manifest_dir": str(out_dir), **overrides})
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert oct(out_dir.stat().st_mode & 0o777) == "0o700"
    for name, template in (("hami-admission-policy.yaml", "admission.yaml.j2"),
                           ("hami-rbac-cluster.yaml", "cluster.yaml.j2"),
                           ("hami-rbac-node-gpu-0.yaml", "node.yaml.j2")):
        path = out_dir / name
        assert oct(path.stat().st_mode & 0o777) == "0o600", name
        rendered = [d for d in yaml.safe_load_all(path.read_text()) if d]
        assert rendered == render(template, **overrides), name


def test_a_key_that_would_break_the_policy_is_refused_before_rendering(tmp_path: Path) -> None:
    out_dir = tmp_path / "manifests"
    res = _play(tmp_path, {"hami_rbac_manifest_dir": str(out_dir), "hami_rbac_node_name": "gpu-0",
                           "hami_rbac_allocation_annotations": ["hami.io/vgpu-node", "x' || true || '"]})
    assert res.returncode != 0
    assert "must be" in res.stdout and "annotation/label keys" in res.stdout, res.stdout[-2000:]
    assert not out_dir.exists()  # checked before anything is rendered
