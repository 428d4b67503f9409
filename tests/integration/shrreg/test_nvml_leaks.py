"""Leak analysis with real NVML calls (pynvml in a child process) against the simulated GPU node."""

import time

import pytest

from hami_agent.shrreg import tool
from hami_agent.shrreg.layout import LAYOUTS
from hami_agent.shrreg.nvmlprobe import NvmlProbeError, probe
from tests.shrreg.helpers import MIB, Mk

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


def set_uuid(path, layout, index, uuid):
    lay = LAYOUTS[layout]
    with open(path, "r+b") as fh:
        fh.seek(lay.off_uuids + 96 * index)
        fh.write(uuid.encode().ljust(96, b"\0"))


def test_external_leak_and_normal_from_nvml(mkregion, gpusim_factory, tmp_path, procs, capsys):
    node = gpusim_factory("h100-80gb-x4")
    uuid = node.state()["gpus"][0]["uuid"]
    f = tmp_path / "c" / "r.cache"
    mk = Mk(f, "v1.2").create(ndev=1)
    set_uuid(f, "v1.2", 0, uuid)
    leaky = mk.spawn("live", 60, used_bytes=1024 * MIB)  # hostpid 0: matched through NSpid
    fine = mk.spawn("live", 60, used_bytes=2048 * MIB)
    procs.extend([leaky, fine])
    node.update(
        lambda s: s["gpus"][0].__setitem__(
            "processes",
            [
                {"pid": leaky.pid, "used_memory_mib": 5000, "name": "python"},
                {"pid": fine.pid, "used_memory_mib": 2100, "name": "python"},
            ],
        )
    )
    res = probe()
    assert {(p.pid, p.used_bytes) for p in res.processes} == {(leaky.pid, 5000 * MIB), (fine.pid, 2100 * MIB)}
    assert res.gpus[0].uuid == uuid
    rc = tool.main(["--inspect", "--nvml", "--file", str(f)])
    err = capsys.readouterr().err
    assert rc == 1
    assert "LEAK_EXTERNAL" in err and f"PID {leaky.pid}" in err and "外部泄漏" in err
    assert f"PID {fine.pid}" not in err.split("LEAK_EXTERNAL")[1].split("\n")[0]
    rc = tool.main(["--inspect", "--nvml", "--json", "--file", str(f)])
    out = capsys.readouterr().out
    assert '"LEAK_NORMAL"' in out


def test_probe_hang_is_a_timeout_not_a_hang(gpusim_factory):
    node = gpusim_factory("h100-80gb-x4")
    node.set_fault(init_hang=True)
    t0 = time.monotonic()
    # the nvml layer's wording names the hung call and the deadline (was: "timed out")
    with pytest.raises(NvmlProbeError, match=r"nvml call nvmlInit did not return within 2s \(NVML is hung"):
        probe(timeout_s=2.0)
    assert time.monotonic() - t0 < 6


def test_probe_reports_nvml_init_error(tmp_path, monkeypatch):
    missing = tmp_path / "libnvidia-ml.so.1"
    monkeypatch.setenv("HAMI_NVML_LIBRARY", str(missing))
    with pytest.raises(NvmlProbeError, match="nvml Init err"):
        probe(timeout_s=20)
