"""Worker helpers that need no NVML: sysfs NUMA lookup, error wording, CLI formatting."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from hami_agent.nvml import cmd
from hami_agent.nvml.errors import NvmlTimeout, phrase_for
from hami_agent.nvml.inventory import build_snapshot
from hami_agent.nvml.worker import Channel, numa_from_sysfs, sysfs_bus_id

pytestmark = pytest.mark.unit


def test_sysfs_bus_id() -> None:
    assert sysfs_bus_id("00000000:0F:00.0") == "0000:0f:00.0"
    assert sysfs_bus_id("00000009:01:00.0") == "0009:01:00.0"


@pytest.mark.parametrize(("content", "expected"), [("1\n", 1), ("0", 0), ("-1\n", None), ("junk", None)])
def test_numa_from_sysfs(tmp_path: Path, content: str, expected: int | None) -> None:
    dev = tmp_path / "bus/pci/devices/0000:af:00.0"
    dev.mkdir(parents=True)
    (dev / "numa_node").write_text(content)
    assert numa_from_sysfs("00000000:AF:00.0", str(tmp_path)) == expected


def test_numa_missing_file(tmp_path: Path) -> None:
    assert numa_from_sysfs("00000000:AF:00.0", str(tmp_path)) is None


def test_error_phrases_follow_hami_logs() -> None:
    assert phrase_for("nvmlInit") == "nvml Init err"
    assert phrase_for("nvmlDeviceGetCount") == "nvml GetDeviceCount err"
    assert phrase_for("nvmlDeviceGetMemoryInfo") == "nvml get memory error"
    assert phrase_for("nvmlDeviceGetMigMode") == "nvml GetMigMode err"
    err = NvmlTimeout("nvmlInit", 10.0, pid=42)
    assert str(err) == "nvml call nvmlInit did not return within 10s (NVML is hung; worker pid 42 abandoned)"
    assert err.call == "nvmlInit"


def test_timeout_flag_validation() -> None:
    assert cmd._positive_float("2.5") == 2.5
    for bad in ("0", "-3", "x", "nan"):
        with pytest.raises(argparse.ArgumentTypeError):
            cmd._positive_float(bad)


def test_hang_hint_only_for_init() -> None:
    assert "570.172.08" in cmd.hang_hint("nvmlInit")
    assert cmd.hang_hint("nvmlDeviceGetName") == ""


def test_table_shows_pending_mig_and_unknown_values() -> None:
    snap = build_snapshot({"driver_version": "580.65.06", "cuda_driver_version": 13000, "gpus": [
        {"index": 0, "uuid": "GPU-a", "name": "NVIDIA GH200 480GB", "pci_bus_id": "00000009:01:00.0",
         "memory_mib": None, "numa": None, "mig_capable": True, "mig_enabled": False, "mig_pending": True,
         "mig_devices": []},
    ]})
    text = cmd.format_table(snap)
    assert text.splitlines()[0] == "driver 580.65.06  CUDA 13.0  1 GPUs, 0 MIG devices"
    row = text.splitlines()[2]
    assert "480GB  N/A     -     disabled (pending enabled)  healthy" in row


def test_slices_from_mig_device_name() -> None:
    from hami_agent.nvml.worker import _slices_from_name

    assert _slices_from_name("NVIDIA H20 MIG 3g.48gb") == 3
    assert _slices_from_name("NVIDIA A100-SXM4-40GB MIG 1g.5gb+me") == 1
    assert _slices_from_name("odd name") == 1


class _Writes:
    def __init__(self) -> None:
        self.writes: list[str] = []

    def write(self, text: str) -> None:
        self.writes.append(text)

    def flush(self) -> None:
        pass


def test_a_held_end_travels_with_the_next_message_in_one_write() -> None:
    out = _Writes()
    chan = Channel(out)
    chan.send({"t": "end", "k": 1}, hold=True)
    assert out.writes == []  # held: one pipe write (one supervisor wakeup) per call, not two
    chan.send({"t": "begin", "k": 2})
    assert out.writes == ['{"t":"end","k":1}\n{"t":"begin","k":2}\n']
    chan.send({"t": "end", "k": 2}, hold=True)
    chan.flush()  # before the worker waits for anything but NVML (serve mode: the next request)
    chan.flush()
    assert out.writes[1:] == ['{"t":"end","k":2}\n']
