"""The shared call slot: the NVML call in progress inside a batch, read by the parent only at deadlines
(issue 31: an inventory used to cost ~75 stdout lines, each waking two parent threads)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest

from hami_agent.nvml import callslot
from hami_agent.nvml.callslot import CallSlot
from hami_agent.nvml.process import OpenBatch, WorkerProcess, batch_calls
from hami_agent.nvml.worker import Channel, Nvml

pytestmark = pytest.mark.unit


def _slot() -> CallSlot:
    created = CallSlot.create()
    assert created is not None, "memfd_create is available on every Linux the agent supports"
    slot, fd = created
    os.close(fd)
    return slot


def test_a_published_call_reads_back_and_clears() -> None:
    slot = _slot()
    assert slot.read() is None  # a fresh slot: no call
    before = time.monotonic()
    slot.publish(7, "nvmlDeviceGetMemoryInfo", 5.0)
    call = slot.read()
    assert call is not None
    assert (call.k, call.fn, call.limit) == (7, "nvmlDeviceGetMemoryInfo", 5.0)
    assert before <= call.started <= time.monotonic()  # the worker's clock is the parent's (CLOCK_MONOTONIC)
    slot.clear()
    assert slot.read() is None


def test_a_record_caught_mid_rewrite_is_never_read(monkeypatch: pytest.MonkeyPatch) -> None:
    slot = _slot()
    slot.publish(3, "nvmlInit", 1.0)
    callslot._SEQ.pack_into(slot._buf, 0, 5)  # odd: a writer killed between its two sequence writes
    monkeypatch.setattr(callslot, "READ_TRIES", 3)
    assert slot.read() is None


def test_a_long_name_is_cut_not_refused() -> None:
    slot = _slot()
    slot.publish(1, "nvmlDevice" + "X" * 100, 1.0)
    call = slot.read()
    assert call is not None and len(call.fn) == 64


def test_the_worker_writes_what_the_parent_reads_across_processes() -> None:
    created = CallSlot.create()
    assert created is not None
    slot, fd = created
    child = ("import sys, time\nfrom hami_agent.nvml.callslot import CallSlot\n"
             "s = CallSlot.attach(int(sys.argv[1]))\ns.publish(42, 'nvmlDeviceGetUUID', 2.5)\n"
             "print('published', flush=True)\ntime.sleep(30)\n")
    proc = subprocess.Popen([sys.executable, "-c", child, str(fd)], pass_fds=(fd,), stdout=subprocess.PIPE,
                            text=True)
    try:
        os.close(fd)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "published"
        call = slot.read()
        assert call is not None and (call.k, call.fn, call.limit) == (42, "nvmlDeviceGetUUID", 2.5)
    finally:
        proc.kill()
        proc.wait(10)


class _Writes:
    def __init__(self) -> None:
        self.lines: list[dict] = []

    def write(self, text: str) -> None:
        self.lines += [json.loads(x) for x in text.splitlines()]

    def flush(self) -> None:
        pass


def _nvml(slot: CallSlot | None) -> tuple[Nvml, _Writes]:
    pytest.importorskip("pynvml")
    out = _Writes()
    return Nvml(Channel(out), 5.0, slot), out


def test_calls_in_a_batch_go_to_the_slot_and_the_parent_hears_twice() -> None:
    slot = _slot()
    nv, out = _nvml(slot)
    seen = []
    with nv.batch():
        nv.call("nvmlDeviceGetCount", lambda: seen.append(slot.read()) or 2)
        nv.call("nvmlDeviceGetUUID", lambda: seen.append(slot.read()) or "GPU-1")
    nv.chan.flush()
    assert [c.fn for c in seen] == ["nvmlDeviceGetCount", "nvmlDeviceGetUUID"]  # named while in flight
    assert slot.read() is None  # and cleared after
    assert [m["t"] for m in out.lines] == ["batch", "batch-end"]
    assert out.lines[0]["limit"] == 5.0
    assert [fn for fn, _s in batch_calls(out.lines[1])] == ["nvmlDeviceGetCount", "nvmlDeviceGetUUID"]


def test_without_a_slot_every_call_is_announced_as_before() -> None:
    nv, out = _nvml(None)
    with nv.batch():
        nv.call("nvmlDeviceGetCount", lambda: 2)
    nv.chan.flush()
    assert [m["t"] for m in out.lines] == ["begin", "end"]


def test_another_threads_call_during_a_batch_is_announced() -> None:
    """The XID event thread waits in NVML while an inventory runs: its call must not touch the slot the
    batch owns, and the parent must still see it (a begin line)."""
    slot = _slot()
    nv, out = _nvml(slot)
    with nv.batch():
        t = threading.Thread(target=lambda: nv.call("nvmlEventSetWait_v2", lambda: None, limit=10.0))
        t.start()
        t.join()
    nv.chan.flush()
    assert [m["t"] for m in out.lines] == ["batch", "begin", "end", "batch-end"]
    assert out.lines[1]["fn"] == "nvmlEventSetWait_v2" and out.lines[1]["limit"] == 10.0


def _tracked(slot: CallSlot, limit: float = 5.0) -> WorkerProcess:
    w = WorkerProcess(slot=slot)
    w._track({"t": "batch", "k": 1, "limit": limit})
    return w


def test_parent_judges_the_slot_call_only_while_a_batch_is_open() -> None:
    slot = _slot()
    w = _tracked(slot, limit=0.05)
    assert w.batch == OpenBatch(1, 0.05)
    assert w.until_next_deadline() == pytest.approx(0.05)  # no call yet: look again within one limit
    slot.publish(2, "nvmlDeviceGetMigMode", 0.05)
    due = w.until_next_deadline()
    assert due is not None and 0 < due <= 0.05
    assert w.overdue() is None
    now = time.monotonic() + 0.1
    stuck = w.overdue(now)
    assert stuck is not None and stuck.fn == "nvmlDeviceGetMigMode"
    assert w.oldest_inflight() is not None and w.oldest_inflight().fn == "nvmlDeviceGetMigMode"
    w._track({"t": "batch-end", "k": 1, "calls": [["nvmlDeviceGetMigMode", 0.2], ["junk"], "x"]})
    assert w.batch is None and w.overdue(now) is None and w.until_next_deadline() is None
    assert w.durations == {"nvmlDeviceGetMigMode": 0.2}  # malformed entries skipped
