"""The sandbox's SIMULATED /proc/driver/nvidia lets doctor see a mixed MIG layout while NVML hangs."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from hami_agent.doctor.collect.base import Context
from hami_agent.doctor.collect.host import collect_driver_files, derive_driver_facts
from hami_agent.doctor.model import Facts
from sandbox import config
from sandbox.cluster import Sandbox

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


@pytest.fixture
def short_dir() -> Iterator[Path]:
    # a run dir short enough for the kubelet socket path (config.load checks the unix socket limit)
    path = Path(tempfile.mkdtemp(prefix="hs-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _sandbox(run_dir: Path) -> Sandbox:
    cfg = config.load(run_dir)
    return Sandbox(cfg, progress=lambda _msg: None)


@pytest.mark.parametrize(("node", "mixed", "mig_minors"),
                         [("gpu-h20", True, [0, 1, 2]), ("gpu-a100", False, [])])
def test_doctor_reads_the_layout_from_the_emulated_procfs(short_dir: Path, node: str, mixed: bool,
                                                          mig_minors: list[int]) -> None:
    sb = _sandbox(short_dir)
    state = sb.cfg.gpusim_state(node)
    state.parent.mkdir(parents=True)
    sb.gpusim(node, "init", "--profile", sb.cfg.node(node).profile)
    sb.gpusim(node, "driver", "570.158.01")
    sb.write_emulated_procfs(node)
    host_root = sb.cfg.host_root(node)
    for name in ("sys", "proc"):
        (host_root / name).symlink_to(f"run/gpusim/{name}")
    facts = Facts()
    ctx = Context(host_root=str(host_root))
    collect_driver_files(ctx, facts)
    derive_driver_facts(facts)
    assert facts.get("host.gpus.minors") == list(range(8))
    assert facts.get("host.mig.enabled_minors") == mig_minors
    assert facts.get("mig.mixed") is mixed
    # no sysfs module version was written: the version comes from the emulated /proc/driver/nvidia/version
    assert facts.get("driver.version") == "570.158.01"
    assert facts.get("driver.known_bad") is True
