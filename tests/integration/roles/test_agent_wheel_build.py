"""roles/hami_agent/tasks/install.yml builds the agent's wheel on the controller from a private copy of the
source. pip builds a local directory in place (setuptools writes ``build/`` and the egg-info into it), so
the slices of ``tools/site_slices.py`` building one checkout at once broke each other ("File exists:
build/bdist.linux-x86_64/wheel/hami_agent-0.1.0.dist-info", found by ``python -m benchmarks fleet --slices
4``). This runs the role's own command (its Jinja arguments filled in) four times at once over one source
tree: every build succeeds, the wheels are byte-identical (an unchanged source copies nothing to the nodes)
and the source tree is left as it was."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[3]
TASKS = yaml.safe_load((ROOT / "roles" / "hami_agent" / "tasks" / "install.yml").read_text())


def _argv(source: Path, wheel_dir: Path) -> list[str]:
    task = next(t for t in TASKS if t["name"] == "Build the agent and dependency wheels on the controller")
    fill = {"{{ hami_agent_source_dir }}": str(source), "{{ hami_agent_controller_python }}": sys.executable,
            "{{ hami_agent_build_dir }}": str(wheel_dir)}
    argv = [fill.get(a, a) for a in task["ansible.builtin.command"]["argv"]]
    assert not [a for a in argv if "{{" in a], argv  # every argument of the task is filled in here
    return argv


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def test_concurrent_builds_of_one_source_tree_all_succeed_and_leave_it_untouched(tmp_path: Path) -> None:
    source = tmp_path / "collection"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "plugins/module_utils/known_bad_drivers.py"):
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, source / name)
    # links kept as links, as in the collection (the agent links a module of plugins/module_utils)
    shutil.copytree(ROOT / "agent", source / "agent", symlinks=True,
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"))
    assert any(p.is_symlink() for p in (source / "agent").rglob("*.py"))
    before = _tree(source)
    # the agent alone: its dependencies are not what races (PIP_NO_DEPS is pip's --no-deps)
    env = {**os.environ, "PIP_NO_DEPS": "1", "SOURCE_DATE_EPOCH": "315532800"}
    procs = [subprocess.Popen(_argv(source, tmp_path / f"wheels-{i}"), env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for i in range(4)]
    outs = [p.communicate(timeout=540)[0] for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, "\n".join(o[-2000:] for o in outs)
    digests = set()
    for i in range(4):
        (wheel,) = (tmp_path / f"wheels-{i}").glob("hami_agent-*.whl")
        digests.add(hashlib.sha256(wheel.read_bytes()).hexdigest())
    assert len(digests) == 1  # byte-identical: the node's copy stays unchanged run after run
    with zipfile.ZipFile(wheel) as whl:  # the linked module is in the wheel, as a file
        assert "hami_agent/known_bad_drivers.py" in whl.namelist()
    assert _tree(source) == before  # no build/, no egg-info written into the collection
