"""`hami-agent doctor logs` and `kubectl hami doctor`: output forms and exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hami_agent.cli import main as agent_main
from hami_agent.doctor.kubectl import main as kubectl_main

pytestmark = pytest.mark.unit

LOGS = Path(__file__).resolve().parents[2] / "fixtures" / "logs"
STALLED = str(LOGS / "seed003_kubelet_stalled_then_later.log")
NORMAL = str(LOGS / "seed003_kubelet_normal.log")


def test_logs_stall_json(capsys: pytest.CaptureFixture[str]) -> None:
    rc = agent_main(["doctor", "logs", "--kubelet", STALLED, "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 1 and out["problem_found"] is True
    v = out["verdicts"][0]
    assert v["code"] == "KUBELET_DEVICE_MANAGER_STALL" and v["severity"] == "critical"
    assert "69e0758e-d625-4013-9258-df8b7ddf04e2" in v["summary"]
    assert "0730 20:39:03.753013" in v["summary"]
    assert any("manager.go:956" in line for line in v["evidence"])
    # the journald prefix names the node, so the fix is concrete
    assert "remediate_nvml_hang.yml -l ai-app-8-1-msxf" in v["fix"]
    assert out["facts"]["kubelet.stall.pod_uid"] == "69e0758e-d625-4013-9258-df8b7ddf04e2"


def test_logs_normal_is_clean(capsys: pytest.CaptureFixture[str]) -> None:
    rc = agent_main(["doctor", "logs", "--kubelet", NORMAL])
    out = capsys.readouterr().out
    assert rc == 0 and "no problem found" in out


def test_short_stalled_excerpt_is_unknown_not_a_verdict(capsys: pytest.CaptureFixture[str]) -> None:
    rc = agent_main(["doctor", "logs", "--kubelet", str(LOGS / "seed003_kubelet_stalled.log"),
                     "--query", "verdicts[].code"])
    assert rc == 1 and json.loads(capsys.readouterr().out) == ["UNKNOWN"]
    rc = agent_main(["doctor", "logs", "--kubelet", str(LOGS / "seed003_kubelet_stalled.log"),
                     "--stall-after", "0.05", "--query", "verdicts[].code"])
    assert rc == 1 and json.loads(capsys.readouterr().out) == ["KUBELET_DEVICE_MANAGER_STALL"]


def test_plugin_and_hami_core_logs(capsys: pytest.CaptureFixture[str]) -> None:
    rc = agent_main(["doctor", "logs", "--plugin", str(LOGS / "seed000_plugin_errors.log"),
                     "--hami-core", str(LOGS / "seed002_hami_core.log"), "--query", "verdicts[].code"])
    codes = json.loads(capsys.readouterr().out)
    assert rc == 1
    assert {"NVML_INIT_ERROR", "PATCH_NODE_ERROR", "ALLOCATE_DEVICE_NUMBER_MISMATCH", "CUDA_OOM",
            "SHRREG_LOCK_TIMEOUT"} <= set(codes)


def test_text_output_is_a_tree(capsys: pytest.CaptureFixture[str]) -> None:
    agent_main(["doctor", "logs", "--kubelet", STALLED])
    out = capsys.readouterr().out
    assert out.startswith("hami doctor logs ")
    assert "`-- [CRITICAL] KUBELET_DEVICE_MANAGER_STALL" in out
    assert "fix: " in out and "runbook: docs/runbooks/KUBELET_DEVICE_MANAGER_STALL.md" in out


@pytest.mark.parametrize("argv", [
    ["doctor"],
    ["doctor", "logs"],
    ["doctor", "logs", "--kubelet", "/nonexistent/kubelet.log"],
    ["doctor", "logs", "--kubelet", NORMAL, "--query", "verdicts[?"],
])
def test_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert agent_main(argv) == 2
    assert "error" in capsys.readouterr().err


def test_kubectl_plugin_forwards_to_the_same_parser(capsys: pytest.CaptureFixture[str]) -> None:
    rc = kubectl_main(["doctor", "logs", "--kubelet", STALLED, "--query", "verdicts[0].code"])
    assert rc == 1 and json.loads(capsys.readouterr().out) == "KUBELET_DEVICE_MANAGER_STALL"
    with pytest.raises(SystemExit) as exc:
        kubectl_main(["doctor", "bogus"])
    assert exc.value.code == 2
