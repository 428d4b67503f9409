"""Run real ansible-playbook / ansible-doc against this collection (tests only)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.unit.plugins.collection_path import collections_root
from tests.unit.plugins.gpusim_states import GPUSIM_BIN

VENV_BIN = Path(sys.executable).parent


def ansible_env(tmp_path: Path, state: Path | None = None, stubs: bool = True) -> dict:
    env = dict(os.environ)
    env.update(
        {
            "ANSIBLE_COLLECTIONS_PATH": str(collections_root()),
            "ANSIBLE_LOCAL_TEMP": str(tmp_path / "ansible-tmp"),
            "ANSIBLE_REMOTE_TEMP": str(tmp_path / "ansible-tmp"),
            "ANSIBLE_LOCALHOST_WARNING": "false",
            "ANSIBLE_INVENTORY_UNPARSED_WARNING": "false",
            "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_FORCE_COLOR": "0",
            "ANSIBLE_RETRY_FILES_ENABLED": "false",
            "LC_ALL": "C.UTF-8",
        }
    )
    path = [str(VENV_BIN), env.get("PATH", "/usr/bin:/bin")]
    if stubs:
        path.insert(0, str(GPUSIM_BIN))
    env["PATH"] = ":".join(path)
    if state is not None:
        env["GPUSIM_STATE"] = str(state)
    return env


def run_playbook(tmp_path: Path, playbook: str, env: dict, timeout: int = 240) -> subprocess.CompletedProcess:
    book = tmp_path / "playbook.yml"
    book.write_text(playbook)
    cmd = [
        str(VENV_BIN / "ansible-playbook"),
        "-i",
        "localhost,",
        "-c",
        "local",
        "-e",
        "ansible_python_interpreter=%s" % sys.executable,
        str(book),
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        print(proc.stdout[-8000:])
        print(proc.stderr[-4000:])
    return proc
