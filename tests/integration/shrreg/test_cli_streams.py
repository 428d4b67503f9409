"""shrreg_tool's text output when stdout and stderr share one file (``2>&1``, a log, ``| less``):
every "Diagnosis for" block starts on a line of its own, after the region it diagnoses (issue 21)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.unit.shrreg.builder import build

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

DEAD_PID = 2**22 + 12345  # above the default pid_max (4194304): never a live process


def test_diagnosis_never_runs_onto_a_region_line(tmp_path):
    root = tmp_path / "containers"
    # enough regions that stdout's block buffer (8 KiB when not a terminal) is flushed mid-line
    for i in range(40):
        region = root / f"0b6e5f7c-1111-2222-3333-{i:012d}_main" / "abc.cache"
        region.parent.mkdir(parents=True)
        region.write_bytes(build("v1.2", ndev=2, owner=DEAD_PID, sem_value=0,
                                 slots=[(100 + i, 5000 + i, 1, [64, 0])]))
    out_file = tmp_path / "out.txt"
    # Python's default buffering, as a user's shell gives it (the test runner may set PYTHONUNBUFFERED)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    with out_file.open("wb") as sink:
        proc = subprocess.run([sys.executable, "-m", "hami_agent.shrreg.tool", "--inspect", "--dir",
                               str(root)],
                              stdout=sink, stderr=subprocess.STDOUT, env=env, timeout=60, check=False)
    text = out_file.read_text()
    assert proc.returncode == 1, text[-2000:]  # the stale locks are errors
    assert text.count("Diagnosis for ") == 40, text[-2000:]
    assert len(text) > 3 * 8192, "too little output to cross stdout's buffer"
    for line in text.splitlines():
        assert "Diagnosis for" not in line or line.startswith("Diagnosis for "), line
    # each diagnosis follows its own region's picture
    for block in re.split(r"(?m)^Region: ", text)[1:]:
        path = block.split("  ", 1)[0].split("\n", 1)[0]
        assert f"Diagnosis for {path}:" in block, block[:300]
