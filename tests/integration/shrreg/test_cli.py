"""shrreg_tool and hami-agent shrreg: seed 002's output shape, JSON, version, repair flags, exit codes."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hami_agent import cli
from hami_agent.shrreg import tool
from tests.shrreg.helpers import LAYOUT_NAMES, MIB, Mk, dead_pid, uuid_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

UID = "0b6e5f7c-1111-2222-3333-444455556666"


def _run(argv, capsys):
    rc = tool.main(argv)
    out = capsys.readouterr()
    return rc, out.out, out.err


def _region(root, layout, ctr="main"):
    return Mk(root / f"{UID}_{ctr}" / "abc.cache", layout)


@pytest.mark.parametrize("layout", LAYOUT_NAMES)
def test_inspect_prints_seed_shape_for_every_layout(mkregion, region_dir, layout, capsys, procs):
    mk = _region(region_dir, layout).create(ndev=2, limit_mib=16384, sm_limit=50)
    live = mk.spawn("live", 30)
    big = mk.spawn("live", 30, used_bytes=4096 * MIB)
    procs.extend([live, big])
    rc, out, err = _run(["--inspect", "--dir", str(region_dir)], capsys)
    # against the expected 1.2 library, v0b is a major version mismatch and transient files are
    # corrupted by other versions: failures found (exit 1); v1.1 is a minor mismatch (warning)
    failing = {"v0b": "VERSION_MISMATCH_MAJOR", "v1.1-transient": "TRANSIENT_LAYOUT"}
    assert rc == (1 if layout in failing else 0), err
    if layout in failing:
        assert failing[layout] in err
    assert ("VERSION_MISMATCH_MINOR" in err) == (layout == "v1.1")
    assert out.startswith("=== Shared Region Info ===\n")
    assert f"(pod {UID}, container main)" in out
    assert re.search(
        r"^Device 0:\n  UUID: +%s\n  Total Memory: +16384 MB\n  Used Memory: +4096 MB\n"
        r"  Task Count: +2\n  Tasks:\n" % uuid_for(0),
        out,
        re.M,
    ), out
    assert re.search(
        r"^    PID: %d  Memory: 4096 MB  Util Limit: 50%%  Status: ACTIVE" % big.ready_pid, out, re.M
    )
    assert re.search(
        r"^    PID: %d  Memory: 0 MB  Util Limit: 50%%  Status: ACTIVE" % live.ready_pid, out, re.M
    )
    assert "  Lock Status:     UNLOCKED\n" in out
    if layout == "v0b":
        assert "  Version:         none (v0b header)" in out
    else:
        minor = 2 if layout == "v1.2" else 1
        assert f"  Version:         MAJOR=1, MINOR={minor}\n" in out
    # the seed's zombie recipe: `grep PID | awk '{print $2}'` yields exactly the slot PIDs
    pids = [line.split()[1] for line in out.splitlines() if "PID" in line]
    assert set(pids) == {str(big.ready_pid), str(live.ready_pid)}
    assert "DEAD" not in out


def test_inspect_device_filter_lock_holder_and_zombies(mkregion, region_dir, capsys):
    mk = _region(region_dir, "v1.2").create(ndev=2)
    gone = dead_pid()
    mk.slot(gone, gone, 1, 512 * MIB, 256 * MIB)
    mk.lock(gone)
    rc, out, err = _run(["--inspect", "--device", "1", "--dir", str(region_dir)], capsys)
    assert rc == 1  # failures found: dead lock holder, zombie task
    assert "Device 0:" not in out and "Device 1:" in out
    assert "Memory: 256 MB" in out and "DEAD (zombie entry)" in out
    assert "  Lock Status:     LOCKED\n" in out
    holder = [line.split()[-1] for line in out.splitlines() if "Lock Holder" in line]
    assert holder == [str(gone)]  # the seed's `grep "Lock Holder" | awk '{print $NF}'`
    assert (
        "LOCK_HELD_DEAD_OWNER" in err and "ZOMBIE_TASK" in err and "Remedy: shrreg_tool --force-unlock" in err
    )
    rc, out, _ = _run(["--inspect", "--device", uuid_for(1)[:12], "--dir", str(region_dir)], capsys)
    assert "Device 1:" in out and "Device 0:" not in out


def test_lock_recovery_sequence_of_seed_002(mkregion, region_dir, capsys):
    """--inspect (LOCKED) -> --force-unlock -> --cleanup -> --inspect (UNLOCKED, tasks updated)."""
    mk = _region(region_dir, "v1.1").create(ndev=1)
    gone = dead_pid()
    mk.slot(gone, gone, 1, 1024 * MIB)
    mk.lock(gone)
    rc, out, _ = _run(["--inspect", "--device", "0", "--dir", str(region_dir)], capsys)
    assert rc == 1 and "LOCKED" in out
    rc, out, _ = _run(["--force-unlock", "--device", "0", "--dir", str(region_dir)], capsys)
    assert rc == 0 and "did: force-unlock" in out, out
    rc, out, _ = _run(["--cleanup", "--device", "0", "--dir", str(region_dir)], capsys)
    assert rc == 0 and "did: remove-slot" in out and f"PID {gone}" in out, out
    rc, out, _ = _run(["--inspect", "--device", "0", "--dir", str(region_dir)], capsys)
    assert rc == 0, out
    assert (
        "Lock Status:     UNLOCKED" in out and "Task Count:      0" in out and "Used Memory:     0 MB" in out
    )


def test_repair_requires_a_target_and_refusal_exits_1(mkregion, region_dir, capsys, procs):
    mk = _region(region_dir, "v1.2").create()
    rc, _, err = _run(["--force-unlock", "--dir", str(region_dir)], capsys)
    assert rc == 2 and "--device" in err
    holder = mk.spawn("live", 30, "hold")
    procs.append(holder)
    before = mk.path.read_bytes()
    rc, out, _ = _run(["--force-unlock", "--device", "0", "--dir", str(region_dir)], capsys)
    assert rc == 1 and "refused:" in out and "still running" in out
    assert mk.path.read_bytes() == before


def test_dry_run_prints_and_writes_nothing(mkregion, region_dir, capsys):
    mk = _region(region_dir, "v1.2").create()
    mk.slot(dead_pid(), 0, 1, MIB)
    before = mk.path.read_bytes()
    rc, out, _ = _run(["--cleanup", "--dry-run", "--file", str(mk.path)], capsys)
    assert rc == 0 and "(dry run)" in out and "would: remove-slot" in out
    assert mk.path.read_bytes() == before
    rc, out, _ = _run(["--cleanup", "--dry-run", "--file", str(mk.path), "--json"], capsys)
    doc = json.loads(out)
    assert doc["results"][0]["dry_run"] is True and doc["results"][0]["applied"] is False


def test_json_inspect_has_every_field(mkregion, region_dir, capsys):
    mk = _region(region_dir, "v1.2").create(ndev=1)
    mk.slot(dead_pid(), 0, 1, 3 * MIB)
    (region_dir / f"{UID}_broken").mkdir()
    (region_dir / f"{UID}_broken" / "x.cache").write_bytes(b"\0" * 64)
    rc, out, _ = _run(["--json", "--dir", str(region_dir)], capsys)
    assert rc == 1
    doc = json.loads(out)
    good = [r for r in doc["regions"] if r["region"]][0]
    bad = [r for r in doc["regions"] if r["error"]][0]
    reg = good["region"]
    for key in (
        "layout",
        "major",
        "minor",
        "sem",
        "sem_postinit",
        "owner_pid",
        "device_num",
        "uuids",
        "limit",
        "sm_limit",
        "procs",
        "proc_num",
        "utilization_switch",
        "recent_kernel",
        "priority",
        "last_kernel_time",
        "used_bytes",
        "liveness",
    ):
        assert key in reg, key
    assert reg["procs"][0]["used"][0]["total"] == 3 * MIB
    assert good["identity"] == {"pod_uid": UID, "container": "main"}
    assert "not initialised" in bad["error"]
    assert {f["code"] for f in good["findings"]} >= {"ZOMBIE_TASK"}


def test_version_flag(mkregion, region_dir, capsys):
    _region(region_dir, "v1.1", "a").create()
    _region(region_dir, "v1.1-transient", "b").create()
    _region(region_dir, "v1.2", "c").create()
    rc, out, _ = _run(["--version", "--dir", str(region_dir)], capsys)
    assert out.splitlines()[0] == "shrreg size: 2008952, version 1.2"
    assert "layout v1.1, version 1.1" in out and "MINOR_VERSION" in out or "version mismatch" in out
    assert "layout v1.1-transient" in out and "v2.8.2" in out
    assert rc == 1  # the transient file is an error-level mismatch
    rc, out, _ = _run(
        [
            "--version",
            "--json",
            "--expect-version",
            "1.1",
            "--file",
            str(region_dir / f"{UID}_a" / "abc.cache"),
        ],
        capsys,
    )
    doc = json.loads(out)
    assert rc == 0 and doc["regions"][0]["findings"] == [] and doc["version"] == "1.2"
    rc, _, err = _run(["--version", "--expect-version", "one", "--dir", str(region_dir)], capsys)
    assert rc == 2 and "MAJOR.MINOR" in err


def test_env_cache_path_default(mkregion, tmp_path, capsys, monkeypatch):
    mk = Mk(tmp_path / "in-container.cache", "v1.2").create()
    monkeypatch.setenv("CUDA_DEVICE_MEMORY_SHARED_CACHE", str(mk.path))
    rc, out, _ = _run(["--inspect"], capsys)
    assert rc == 0 and str(mk.path) in out


def test_hami_agent_shrreg_is_the_same_tool(mkregion, region_dir, capsys):
    _region(region_dir, "v1.2").create()
    rc1 = cli.main(["shrreg", "--inspect", "--dir", str(region_dir)])
    out1 = capsys.readouterr().out
    rc2 = tool.main(["--inspect", "--dir", str(region_dir)])
    out2 = capsys.readouterr().out
    assert rc1 == rc2 == 0 and out1 == out2 and "=== Shared Region Info ===" in out1


def test_console_script_runs(mkregion, region_dir):
    _region(region_dir, "v0b").create()
    exe = Path(sys.executable).parent / "shrreg_tool"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "hami_agent.shrreg.tool"]
    cp = subprocess.run(
        [*cmd, "--inspect", "--expect-version", "0.0", "--dir", str(region_dir)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert cp.returncode == 0, cp.stderr
    assert "Layout:          v0b (HAMi v2.4.0)" in cp.stdout
