"""The agent and the collection's plugins need nothing newer than Python 3.10.

The agent runs on the GPU nodes' own Python (Ubuntu 22.04 ships 3.10; ``requires-python = ">=3.10"``), and
the collection's modules run there too, while every test here runs on 3.11: a 3.11-only API
(``tomllib``, ``asyncio.timeout``, ``datetime.UTC``, ``except*``...) would pass the whole suite and fail on
the node at import. vermin reads the source and knows when each stdlib module, member and syntax appeared.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
FLOOR = "3.10"


def _vermin(*paths: Path) -> subprocess.CompletedProcess:
    exe = shutil.which("vermin", path=str(Path(sys.executable).parent)) or shutil.which("vermin")
    assert exe, "vermin is not installed (it is in the dev extra: make setup)"
    return subprocess.run(
        [exe, f"--target={FLOOR}-", "--violations", "--no-tips", "--eval-annotations", "--no-parse-comments",
         *map(str, paths)],
        capture_output=True, text=True, timeout=120, check=False)


def test_agent_and_plugins_need_nothing_newer_than_the_floor() -> None:
    r = _vermin(ROOT / "agent" / "hami_agent", ROOT / "plugins")
    assert r.returncode == 0, f"code that needs Python newer than {FLOOR}:\n{r.stdout}{r.stderr}"


def test_the_check_finds_a_newer_api(tmp_path: Path) -> None:
    (tmp_path / "config.py").write_text("import tomllib\n")
    (tmp_path / "wait.py").write_text("import asyncio\n\n\nasync def g():\n"
                                      "    async with asyncio.timeout(1):\n        pass\n")
    r = _vermin(tmp_path)
    assert r.returncode != 0
    assert "'tomllib' module requires" in r.stdout and "'asyncio.timeout' member requires" in r.stdout
