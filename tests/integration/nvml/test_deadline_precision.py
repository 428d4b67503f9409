"""A call that overruns a deadline shorter than the readers' 0.1 s polling period is caught while it is in
flight (issue 30: the device check gives a real driver's nvmlInit a 1 ms deadline).

Before, the client and the supervisor waited up to 0.1 s for the worker's next line, so a call that ended
within that wait (50 ms against a 5 ms deadline here) was never seen overdue. Now they wake just past the
first in-flight deadline. A fake worker (the real protocol, no NVML) makes the timing exact."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from hami_agent.nvml import client as client_mod
from hami_agent.nvml import supervisor as supervisor_mod
from hami_agent.nvml.callslot import CallSlot
from hami_agent.nvml.errors import NvmlTimeout
from hami_agent.nvml.process import _PKG_ROOT, WorkerProcess
from hami_agent.nvml.reaper import WorkerReaper

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

# announces nvmlInit with the parent's call limit, takes 50 ms, then answers every request
FAKE = r"""
import json, sys, time
limit = float(sys.argv[1])
def send(m):
    sys.stdout.write(json.dumps(m) + "\n"); sys.stdout.flush()
send({"t": "begin", "k": 1, "fn": "nvmlInit", "limit": limit})
time.sleep(0.05)
send({"t": "end", "k": 1, "fn": "nvmlInit", "s": 0.05})
inv = {"driver_version": "1", "cuda_driver_version": 12080, "gpus": []}
if sys.argv[2] == "watch":
    send({"t": "inventory", "data": inv})
    time.sleep(30)
for line in sys.stdin:
    req = json.loads(line)
    send({"t": "inventory", "id": req["id"], "data": inv})
"""


class FakeWorker(WorkerProcess):
    def start(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", FAKE, str(self.call_limit_s), self.mode],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True)
        threading.Thread(target=self._read, args=(self.proc,), daemon=True).start()


# the same inside a batch: the call is only in the shared call slot, never on stdout
FAKE_BATCH = r"""
import json, sys, time
from hami_agent.nvml.callslot import CallSlot
limit, mode, fd = float(sys.argv[1]), sys.argv[2], int(sys.argv[3])
slot = CallSlot.attach(fd)
def send(m):
    sys.stdout.write(json.dumps(m) + "\n"); sys.stdout.flush()
def inventory():
    send({"t": "batch", "k": 1, "limit": limit})
    slot.publish(2, "nvmlDeviceGetMigMode", limit)
    time.sleep(0.05)
    slot.clear()
    send({"t": "batch-end", "k": 1, "calls": [["nvmlDeviceGetMigMode", 0.05]]})
    return {"driver_version": "1", "cuda_driver_version": 12080, "gpus": []}
if mode == "watch":
    send({"t": "inventory", "data": inventory()})
    time.sleep(30)
for line in sys.stdin:
    req = json.loads(line)
    send({"t": "inventory", "id": req["id"], "data": inventory()})
"""


class FakeBatchWorker(WorkerProcess):
    def start(self) -> None:
        created = CallSlot.create()
        assert created is not None
        self.slot, fd = created
        cmd = [sys.executable, "-c", FAKE_BATCH, str(self.call_limit_s), self.mode, str(fd)]
        path = os.pathsep.join(filter(None, [_PKG_ROOT, os.environ.get("PYTHONPATH")]))
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, pass_fds=(fd,),
                                     env=dict(os.environ, PYTHONPATH=path), start_new_session=True)
        os.close(fd)
        threading.Thread(target=self._read, args=(self.proc,), daemon=True).start()


# each fake worker and the call it keeps in flight for 50 ms: announced on stdout, or only in the call slot
WORKERS = pytest.mark.parametrize(("worker", "call"), [(FakeWorker, "nvmlInit"),
                                                       (FakeBatchWorker, "nvmlDeviceGetMigMode")],
                                  ids=["announced", "in-the-slot"])


@WORKERS
def test_client_catches_a_call_past_a_1ms_deadline_that_ends_within_the_poll(monkeypatch, worker, call):
    monkeypatch.setattr(client_mod, "WorkerProcess", worker)
    reaper = WorkerReaper(limit=2)
    c = client_mod.NvmlClient("/dev/null", call_timeout_s=0.001, reaper=reaper)
    t0 = time.monotonic()
    with pytest.raises(NvmlTimeout) as info:
        c.inventory(timeout_s=5)
    assert info.value.call == call
    assert time.monotonic() - t0 < 2.0
    end = time.monotonic() + 5
    while reaper.reap() and time.monotonic() < end:  # the SIGKILLed fake exits at once
        time.sleep(0.02)
    assert reaper.reap() == 0
    c.close()


@WORKERS
def test_client_with_a_normal_deadline_is_answered(monkeypatch, worker, call):
    monkeypatch.setattr(client_mod, "WorkerProcess", worker)
    c = client_mod.NvmlClient("/dev/null", call_timeout_s=1.0, reaper=WorkerReaper(limit=2))
    assert c.inventory(timeout_s=5).driver_version == "1"
    c.close()


@WORKERS
def test_supervisor_marks_stuck_on_a_5ms_deadline(monkeypatch, worker, call):
    monkeypatch.setattr(supervisor_mod, "WorkerProcess", worker)
    sup = supervisor_mod.NvmlSupervisor("/dev/null", call_timeout_s=0.005, refresh_interval_s=30,
                                        watch_events=False, reaper=WorkerReaper(limit=2), backoff_initial_s=5)
    sup.start()
    try:
        snap = sup.wait_for_change(0, 5)
        assert snap.status == "stuck" and snap.stuck_call == call, snap
    finally:
        sup.stop()
