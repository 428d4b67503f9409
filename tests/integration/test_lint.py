"""The project's own linters as tests, so CI enforces them: ruff on the Python code, and the Ansible
checks of scripts/lint-ansible.sh (ansible-lint production profile, module docs, ansible-doc)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "NO_COLOR": "1"}
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=840, check=False)


def test_ruff_is_clean():
    res = _run([str(BIN / "ruff"), "check", "agent", "tests", "benchmarks", "plugins", "sandbox",
                "scripts"])
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]


def test_ansible_lint_production_profile_and_module_docs():
    res = _run(["bash", "scripts/lint-ansible.sh"])
    assert res.returncode == 0, res.stdout[-6000:] + res.stderr[-2000:]
