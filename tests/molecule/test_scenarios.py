"""Runs every molecule scenario under extensions/molecule/ against podman containers (marker: molecule).

Once per session: build the simulated node image (tests/images/build-image.sh, cached by hash) and the
simulated NVIDIA apt repository (tests/images/build-apt-repo.sh, cached by hash). Then
``molecule test -s <scenario>`` per scenario, exactly as a user runs it: destroy, dependency (the preflight
that links this checkout as ``hami.node``, extensions/molecule/shared/preflight.sh), create, prepare,
converge, idempotence, verify, destroy. Skipped only when podman is absent.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.molecule

ROOT = Path(__file__).resolve().parents[2]
SCENARIO_ROOT = ROOT / "extensions" / "molecule"
# Order: cheapest proof of the foundation first; the rest follow the priority.
PREFERRED_ORDER = ["driver", "remediation", "remediation_mps", "kubelet", "mps", "mig", "agent", "site"]
SCENARIO_TIMEOUT_S = 900


def _scenarios() -> list[str]:
    found = sorted(p.parent.name for p in SCENARIO_ROOT.glob("*/molecule.yml"))
    ranked = [s for s in PREFERRED_ORDER if s in found]
    return ranked + [s for s in found if s not in ranked]


def _run(cmd: list[str], env: dict[str, str], timeout: float, log: Path) -> subprocess.CompletedProcess[str]:
    started = time.monotonic()
    proc = subprocess.run(
        cmd, cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        timeout=timeout, check=False,
    )
    log.write_text(proc.stdout)
    took = time.monotonic() - started
    sys.stderr.write(f"{' '.join(cmd[:3])}: rc={proc.returncode} in {took:.0f}s (log {log})\n")
    return proc


@pytest.fixture(scope="session")
def molecule_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    if shutil.which("podman") is None:
        pytest.skip("podman is not installed: molecule scenarios need it (scripts/install-system-deps.sh)")
    logs = tmp_path_factory.mktemp("molecule-build")
    env = dict(os.environ)
    venv_bin = str(Path(sys.executable).parent)
    env["PATH"] = venv_bin + os.pathsep + env.get("PATH", "")
    for script, timeout in (("build-image.sh", 900), ("build-apt-repo.sh", 300)):
        proc = _run([str(ROOT / "tests" / "images" / script)], env, timeout, logs / f"{script}.log")
        assert proc.returncode == 0, f"{script} failed:\n{proc.stdout[-4000:]}"
    # no collections path, apt repository or profile variables: extensions/molecule/config.yml has them
    env.update(
        ANSIBLE_FORCE_COLOR="0",
        NO_COLOR="1",
        MOLECULE_NO_LOG="false",
    )
    env["HAMI_MOLECULE_LOGS"] = str(logs)
    return env


@pytest.mark.timeout(SCENARIO_TIMEOUT_S + 60)
@pytest.mark.parametrize("scenario", _scenarios())
def test_scenario(scenario: str, molecule_env: dict[str, str]) -> None:
    log = Path(molecule_env["HAMI_MOLECULE_LOGS"]) / f"{scenario}.log"
    try:
        proc = _run(["molecule", "test", "-s", scenario], molecule_env, SCENARIO_TIMEOUT_S, log)
    except subprocess.TimeoutExpired:
        subprocess.run(["molecule", "destroy", "-s", scenario], cwd=ROOT, env=molecule_env,
                       capture_output=True, timeout=120, check=False)
        pytest.fail(f"molecule test -s {scenario} took longer than {SCENARIO_TIMEOUT_S}s (log {log})")
    assert proc.returncode == 0, (
        f"molecule test -s {scenario} failed (full log {log}):\n{proc.stdout[-6000:]}"
    )
    # the second converge must have run and changed nothing, and verify must have run
    for step in ("dependency", "converge", "idempotence", "verify"):
        assert f"{scenario} > {step}: Executed: Successful" in proc.stdout, (
            f"molecule step {step} did not succeed for {scenario} (log {log})"
        )
    # scenarios with a `check` step: --check on the converged node must report no change
    check = _section(proc.stdout, f"[{scenario} > check] Executing", f"[{scenario} > check] Executed")
    if check is not None:
        recaps = [ln for ln in check.splitlines() if "changed=" in ln and "unreachable=" in ln]
        assert recaps and all(" changed=0 " in ln for ln in recaps), (
            f"--check on the converged node reported changes for {scenario}: {recaps} (log {log})"
        )


def _section(text: str, start: str, end: str) -> str | None:
    i = text.find(start)
    if i < 0:
        return None
    j = text.find(end, i)
    return text[i: j if j >= 0 else None]
