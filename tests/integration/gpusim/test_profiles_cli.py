"""gpusim profiles, the state module and the ``gpusim`` CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hami_agent.nvml.model import mig_profile_name
from tests.gpusim import gpusim_state as gs
from tests.gpusim.fixtures import GPUSIM_CLI

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]
PROFILES = ["a100-80gb-x8", "gh200-unified", "h100-80gb-x4", "h100-sxm", "h20-mig-mixed"]


def cli(*args: str, state: Path | None = None) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, str(GPUSIM_CLI)]
    if state is not None:
        argv += ["--state", str(state)]
    return subprocess.run([*argv, *args], capture_output=True, text=True, timeout=30, check=False)


def test_profiles_exist_and_validate() -> None:
    assert gs.list_profiles() == PROFILES
    for name in gs.list_profiles():
        state = gs.load_profile(name)
        assert state["profile"] == name
        assert len({g["uuid"] for g in state["gpus"]}) == len(state["gpus"])
        for gpu in state["gpus"]:
            assert gpu["name"] in state["mig_profiles"], f"{name}: no MIG catalog for {gpu['name']}"


def test_seed_003_node() -> None:
    state = gs.load_profile("h20-mig-mixed")
    assert state["driver_version"] == "570.158.01"
    gpus = state["gpus"]
    assert len(gpus) == 8 and {g["name"] for g in gpus} == {"NVIDIA H20"}
    assert {g["memory_total_mib"] for g in gpus} == {97871}
    assert [g["mig"]["current"] for g in gpus] == [1, 1, 1, 0, 0, 0, 0, 0]
    assert [g["numa_node"] for g in gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [g["pci_bus_id"][9:11] for g in gpus] == ["0F", "34", "48", "5A", "87", "AE", "C2", "D7"]
    for g in gpus[:3]:
        assert [d["profile"] for d in g["mig"]["devices"]] == ["3g.48gb", "1g.24gb", "1g.12gb", "1g.12gb"]
    assert gpus[2]["mig"]["devices"][3]["uuid"] == "MIG-e99237a2-b951-5f96-af7b-d0c5ecedb6f4"
    assert gpus[7]["uuid"] == "GPU-9648f14e-6ab2-46f0-221f-777f7652630b"
    assert gs.is_mixed_mig(state) and gs.init_would_hang(state)


@pytest.mark.parametrize("name", PROFILES)
def test_catalog_names_follow_nvidia_smi_naming(name: str) -> None:
    """Each catalog entry's name must be what the agent derives from its slices and memory."""
    state = gs.load_profile(name)
    for gpu in state["gpus"]:
        for p in state["mig_profiles"][gpu["name"]]:
            derived = mig_profile_name(p["slices"], gpu["memory_total_mib"], p["memory_mib"],
                                       f"{gpu['name']} MIG {p['name']}")
            assert derived == p["name"]
            assert all(pl["size"] == p["memory_slices"] for pl in p["placements"])
        catalog = {p["name"]: p for p in state["mig_profiles"][gpu["name"]]}
        used = 0
        for d in gpu["mig"]["devices"]:
            entry = catalog[d["profile"]]
            assert d["memory_mib"] == entry["memory_mib"] and d["sm_count"] == entry["sm_count"]
            used += entry["slices"]
        assert used <= 7
        spans = sorted((gi["placement"]["start"], gi["placement"]["start"] + gi["placement"]["size"])
                       for gi in gpu["mig"]["gpu_instances"])
        pairs = zip(spans, spans[1:], strict=False)
        assert all(a[1] <= b[0] for a, b in pairs), f"overlapping GIs on {gpu['uuid']}"


def test_h100_sxm_is_the_lent_board_from_public_specs() -> None:
    """issue 30: one H100 SXM5 80GB, MIG capable and disabled, built from public facts until the first real
    run's answers (scripts/device_check.py) correct it."""
    state = gs.load_profile("h100-sxm")
    assert "to be corrected from the first real run" in state["source"]
    (gpu,) = state["gpus"]
    assert (gpu["name"], gpu["memory_total_mib"], gpu["cores"], gpu["compute_capability"]) == (
        "NVIDIA H100 80GB HBM3", 81559, 132, [9, 0])
    assert gpu["mig"]["capable"] and gpu["mig"]["current"] == 0 and not gpu["mig"]["devices"]
    counts = {p["name"]: p["max_instances"] for p in state["mig_profiles"][gpu["name"]]}
    assert counts == {"1g.10gb": 7, "1g.10gb+me": 1, "1g.20gb": 4, "2g.20gb": 3, "3g.40gb": 2, "4g.40gb": 1,
                      "7g.80gb": 1}


def test_gh200_reports_no_memory() -> None:
    state = gs.load_profile("gh200-unified")
    assert [g["memory_info_supported"] for g in state["gpus"]] == [False]


def test_write_state_is_atomic_and_validates(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    gs.write_state(path, gs.load_profile("a100-80gb-x8"))
    assert gs.read_state(path)["profile"] == "a100-80gb-x8"
    assert [p.name for p in tmp_path.iterdir()] == ["s.json"]
    with pytest.raises(gs.StateError, match="gpus\\[0\\] lacks field 'uuid'"):
        gs.write_state(path, {"schema": 1, "driver_version": "x", "gpus": [{"index": 0}]})
    assert gs.read_state(path)["profile"] == "a100-80gb-x8"  # old file untouched


def test_read_state_errors(tmp_path: Path) -> None:
    with pytest.raises(gs.StateError, match="does not exist: create it with `gpusim init"):
        gs.read_state(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(gs.StateError, match="is not valid JSON"):
        gs.read_state(bad)
    with pytest.raises(gs.StateError, match="unknown gpusim profile 'nope'"):
        gs.load_profile("nope")


def test_update_state_from_parallel_processes_loses_nothing(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    gs.write_state(path, gs.load_profile("a100-80gb-x8"))
    code = ("import sys; sys.path.insert(0, %r)\n"
            "import gpusim_state as gs\n"
            "for _ in range(15): gs.update_state(%r, lambda s: gs.add_xid(s, 0, 48))\n") % (
        str(GPUSIM_CLI.parent.parent), str(path))
    procs = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(3)]
    for p in procs:
        assert p.wait(timeout=60) == 0
    events = gs.read_state(path)["gpus"][0]["xid_events"]
    assert sorted(e["seq"] for e in events) == list(range(1, 46))


def test_cli_init_show_and_faults(tmp_path: Path) -> None:
    state = tmp_path / "node.json"
    r = cli("init", "--profile", "h20-mig-mixed", state=state)
    assert r.returncode == 0, r.stderr
    assert "8 GPUs, driver 570.158.01" in r.stdout
    assert cli("init", "--profile", "h20-mig-mixed", state=state).returncode == 1  # exists, no --force
    r = cli("show", state=state)
    assert "nvmlInit HANGS" in r.stdout
    assert "MIG 1g.24gb Device 1: (MIG-160ae368-7334-5d1e-91ad-d6eb55ec6f67)" in r.stdout

    assert cli("driver", "570.172.08", state=state).returncode == 0
    assert "nvmlInit ok" in cli("show", state=state).stdout
    # `--state` also works after the subcommand (the form common.md documents)
    assert cli("fault", "--state", str(state), "init-hang", "on").returncode == 0
    assert gs.read_state(state)["faults"]["init_hang"] is True
    assert cli("fault", "hang-after", "7", state=state).returncode == 0
    assert cli("fault", "hang-function", "nvmlDeviceGetName", state=state).returncode == 0
    assert cli("fault", "driver-not-loaded", "on", state=state).returncode == 0
    s = gs.read_state(state)
    assert s["faults"]["hang_after_calls"] == 7 and s["faults"]["hang_functions"] == ["nvmlDeviceGetName"]
    assert s["driver_loaded"] is False
    assert cli("fault", "hang-function", "nvmlDeviceGetName", "off", state=state).returncode == 0
    assert gs.read_state(state)["faults"]["hang_functions"] == []
    assert cli("fault", "unsupported-function", "nvmlDeviceGetAttributes", state=state).returncode == 0
    assert gs.read_state(state)["faults"]["unsupported_functions"] == ["nvmlDeviceGetAttributes"]
    assert cli("fault", "clear", state=state).returncode == 0
    s = gs.read_state(state)
    assert s["faults"]["init_hang"] is False and s["faults"]["hang_after_calls"] is None
    assert s["faults"]["unsupported_functions"] == []
    assert s["driver_loaded"] is True

    r = cli("xid", "--gpu", "3", "--xid", "79", state=state)
    assert r.returncode == 0 and "seq 1" in r.stdout
    assert cli("gpu-lost", "--gpu", "2", state=state).returncode == 0
    assert cli("mig-pending", "--gpu", "5", "1", state=state).returncode == 0
    s = gs.read_state(state)
    assert s["gpus"][3]["xid_events"][0]["xid"] == 79
    assert s["gpus"][2]["lost"] is True and s["gpus"][5]["mig"]["pending"] == 1
    assert json.loads(cli("show", "--json", state=state).stdout)["gpus"][2]["lost"] is True


def test_init_for_a_node_gives_it_its_own_uuids(tmp_path: Path) -> None:
    """A profile is one machine's: ``--node`` derives every GPU and listed MIG UUID from the node's name,
    the same for one name every time and different for two nodes (none left from the profile)."""
    def uuids(state: dict) -> list[str]:
        return [u for g in state["gpus"] for u in
                [g["uuid"], *(m["uuid"] for m in (g.get("mig") or {}).get("devices") or [])]]

    profile = uuids(gs.load_profile("h20-mig-mixed"))
    got = {}
    for name, node in (("a", "gpu-a"), ("a2", "gpu-a"), ("b", "gpu-b")):
        r = cli("init", "--profile", "h20-mig-mixed", "--node", node, state=tmp_path / f"{name}.json")
        assert r.returncode == 0, r.stderr
        got[name] = uuids(gs.read_state(tmp_path / f"{name}.json"))
    assert got["a"] == got["a2"]  # stable per node
    assert not set(got["a"]) & set(got["b"]) and not set(got["a"]) & set(profile)
    assert len(set(got["a"])) == len(profile)  # still one per device
    assert all(u.startswith(("GPU-", "MIG-")) and len(u) == 40 for u in got["a"])


def test_cli_bad_input(tmp_path: Path) -> None:
    state = tmp_path / "node.json"
    r = cli("init", "--profile", "nope", state=state)
    assert r.returncode == 1 and "unknown gpusim profile 'nope'" in r.stderr
    r = cli("show", state=state)
    assert r.returncode == 1 and "does not exist" in r.stderr
    assert cli("init", "--profile", "a100-80gb-x8", state=state).returncode == 0
    r = cli("xid", "--gpu", "9", "--xid", "79", state=state)
    assert r.returncode == 1 and "no GPU with index 9" in r.stderr
    assert cli("fault", "bogus", state=state).returncode == 2
    assert cli("xid", "--gpu", "x", "--xid", "1", state=state).returncode == 2
    r = cli("fault", "init-hang", "maybe", state=state)
    assert r.returncode == 2 and r.stderr.strip() == "gpusim: expected on|off, got 'maybe'"
    r = cli("fault", "hang-after", "many", state=state)
    assert r.returncode == 2 and "expected a number of calls" in r.stderr
    r = cli("mig-pending", "--gpu", "0", "1", state=tmp_path / "missing.json")
    assert r.returncode == 1 and "Traceback" not in r.stderr
