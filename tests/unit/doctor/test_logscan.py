"""Log pattern tables against the seeds' lines."""

from __future__ import annotations

from pathlib import Path

import pytest

from hami_agent.doctor import logscan
from hami_agent.doctor.model import Facts

pytestmark = pytest.mark.unit

LOGS = Path(__file__).resolve().parents[2] / "fixtures" / "logs"


def _scan(name: str, table: dict[str, str]) -> logscan.ScanResult:
    return logscan.scan((LOGS / name).read_text(encoding="utf-8").splitlines(), table, name)


def test_plugin_errors_from_seed_000() -> None:
    r = _scan("seed000_plugin_errors.log", logscan.PLUGIN_PATTERNS)
    assert r.counts == {"nvml_init_err": 1, "patch_node_error": 1, "device_number_mismatch": 1}


def test_mps_daemon_log_from_seed_003() -> None:
    r = _scan("seed003_mps_daemon.log", logscan.PLUGIN_PATTERNS)
    assert r.counts.get("mps_binary_missing") == 2
    assert "executable file not found in $PATH" in r.matches["mps_binary_missing"][0]


def test_hami_core_lines() -> None:
    r = _scan("seed002_hami_core.log", logscan.HAMI_CORE_PATTERNS)
    assert r.counts.get("oom") == 1 and r.counts.get("lock_timeout") == 1 and r.counts.get("initialized") == 1


def test_to_facts_caps_lines_and_counts_all() -> None:
    r = logscan.scan(["patch node error %d" % i for i in range(9)], logscan.PLUGIN_PATTERNS, "p.log")
    f = Facts()
    logscan.to_facts(r, "plugin.log", logscan.PLUGIN_PATTERNS, f)
    assert f.get("plugin.log.patch_node_error") == 9
    assert f.get("plugin.log.nvml_init_err") == 0
    lines = f.lines("plugin.log.patch_node_error")
    assert len(lines) == logscan.MAX_LINES_PER_KEY + 1 and lines[-1].startswith("... 4 more")
