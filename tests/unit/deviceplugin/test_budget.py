"""The deadline budget and the commit rule: once the kubelet is answered with an error, no success is
written; a success that was committed is what the kubelet gets. Plus the background late writer."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from hami_agent.deviceplugin.allocator import Allocator
from hami_agent.deviceplugin.budget import BudgetExhausted, LateCommit, RpcBudget, State
from hami_agent.deviceplugin.devices import plan_resources
from hami_agent.deviceplugin.latewriter import LateWriter
from hami_agent.deviceplugin.podsource import MemoryPodSource, PodSourceError
from hami_agent.deviceplugin.settings import PluginSettings
from hami_agent.kubeletplugin import DeadlineExceeded, DeadlineRunner
from hami_agent.protocol import keys
from tests.clock import ManualClock
from tests.unit.deviceplugin.fakes import (
    FakeSnapshot,
    ctr,
    full_gpus,
    gpu_uuid,
    hami_pod,
    lock_value,
    node_register,
)

pytestmark = pytest.mark.unit
NODE = "gpu-1"
U0 = gpu_uuid(0)


# --------------------------------------------------------------------------------------- RpcBudget
def test_call_timeouts_are_what_is_left_minus_the_reply_margin_capped_by_the_api_timeout():
    clock = ManualClock()
    b = RpcBudget("Allocate", 2.0, reply_margin_s=0.1, commit_margin_s=0.25, api_timeout_s=1.0, clock=clock)
    assert b.call_timeout("get node") == pytest.approx(1.0)  # capped
    clock.t += 1.5
    assert b.call_timeout("get pod") == pytest.approx(0.4)  # 0.5 left - 0.1 margin
    clock.t += 0.42
    with pytest.raises(BudgetExhausted, match="not enough for patch pod"):
        b.call_timeout("patch pod")


def test_commit_is_not_started_without_the_safety_margin():
    clock = ManualClock()
    b = RpcBudget("Allocate", 2.0, commit_margin_s=0.25, clock=clock)
    clock.t += 1.8
    wrote = []
    with pytest.raises(BudgetExhausted, match="not starting the success write"):
        b.commit(wrote.append, "ok")
    assert wrote == [] and b.state is State.OPEN


def test_an_error_answer_before_the_commit_means_the_write_never_starts():
    b = RpcBudget("Allocate", 2.0)
    assert b.answer_error() == (False, None)
    wrote = []
    with pytest.raises(BudgetExhausted):
        b.commit(wrote.append, "ok")
    with pytest.raises(BudgetExhausted, match="already answered"):
        b.call_timeout("get node")
    assert wrote == []


def test_a_committed_success_wins_over_a_later_error_answer():
    b = RpcBudget("Allocate", 2.0)
    assert b.commit(lambda _t: None, "result") == "result"
    assert b.answer_error() == (True, "result")


def test_an_error_answer_while_the_write_is_in_flight_makes_its_return_a_late_commit():
    b = RpcBudget("Allocate", 2.0)
    in_write, release = threading.Event(), threading.Event()
    outcome: list[object] = []

    def write(_timeout):
        in_write.set()
        release.wait(5)

    def body():
        try:
            outcome.append(b.commit(write, "result"))
        except LateCommit as exc:
            outcome.append(exc)

    t = threading.Thread(target=body)
    t.start()
    assert in_write.wait(5)
    assert b.answer_error() == (False, None)  # the runner answers DEADLINE_EXCEEDED
    release.set()
    t.join(5)
    assert len(outcome) == 1 and isinstance(outcome[0], LateCommit)


def test_a_failed_write_is_abandoned_and_answered_as_an_error():
    b = RpcBudget("Allocate", 2.0)

    def write(_timeout):
        raise PodSourceError("patch pod error: timeout", unknown=True)

    with pytest.raises(PodSourceError):
        b.commit(write, "result")
    assert b.state is State.ABANDONED and b.answer_error() == (False, None)


def test_the_write_gets_all_the_remaining_budget_as_timeout():
    clock = ManualClock()
    b = RpcBudget("Allocate", 2.0, reply_margin_s=0.1, api_timeout_s=1.0, clock=clock)
    clock.t += 0.3
    seen = []
    b.commit(seen.append, "ok")
    assert seen == [pytest.approx(1.6)]  # not capped by the lookups' API timeout: it is the last call


# ----------------------------------------------------------------------------------- DeadlineRunner
def run_body(runner: DeadlineRunner, how: str, body, what: str = "Allocate for 'x'"):
    """The body under the runner as a thread waits for it (``run``) or as the gRPC loop does
    (``run_async``)."""
    if how == "thread":
        return runner.run(body, what)
    return asyncio.run(runner.run_async(body, what))


WAYS = ["thread", "loop"]


@pytest.mark.parametrize("how", WAYS)
def test_runner_answers_a_success_committed_at_the_deadline(how):
    """The body committed, then stalled before returning: the success was written, so it is the answer."""
    runner = DeadlineRunner(workers=2, deadline_s=0.3, commit_margin_s=0.1, reply_margin_s=0.05)
    release = threading.Event()

    def body(budget):
        result = budget.commit(lambda _t: None, "written")
        release.wait(5)  # e.g. descheduled between the commit and the return
        return result

    assert run_body(runner, how, body) == "written"
    release.set()
    runner.shutdown()


@pytest.mark.parametrize("how", WAYS)
def test_runner_answers_deadline_exceeded_and_the_write_in_flight_becomes_late(how):
    runner = DeadlineRunner(workers=2, deadline_s=0.3, commit_margin_s=0.1, reply_margin_s=0.05)
    release, late = threading.Event(), threading.Event()

    def body(budget):
        try:
            return budget.commit(lambda _t: release.wait(5), "written")
        except LateCommit:
            late.set()
            raise

    t0 = time.monotonic()
    with pytest.raises(DeadlineExceeded, match="did not finish within the 0.3s deadline"):
        run_body(runner, how, body)
    assert time.monotonic() - t0 < 2.0
    release.set()
    assert late.wait(5)
    runner.shutdown()


@pytest.mark.parametrize("how", WAYS)
def test_runner_raises_the_bodys_own_timeout_error_not_a_deadline(how):
    """A body's ``TimeoutError`` (a socket's) is its error, not the runner's deadline: since Python 3.11
    ``concurrent.futures.TimeoutError`` is that same class, so waiting must not tell them apart by type."""
    runner = DeadlineRunner(workers=1, deadline_s=5.0)

    def body(_budget):
        raise TimeoutError("read timed out")

    with pytest.raises(TimeoutError, match="read timed out"):
        run_body(runner, how, body)
    runner.shutdown()


def test_a_caller_that_leaves_stops_the_success_from_being_written():
    """The gRPC call was cancelled (the kubelet went away) while the body ran: nobody will hear a success,
    so the body's commit must fail rather than write one."""
    runner = DeadlineRunner(workers=1, deadline_s=5.0)
    started, release, refused = threading.Event(), threading.Event(), threading.Event()
    written = []

    def body(budget):
        started.set()
        release.wait(5)
        try:
            return budget.commit(written.append, "written")
        except BudgetExhausted:  # not started: nothing written
            refused.set()
            raise

    async def caller_leaves():
        task = asyncio.ensure_future(runner.run_async(body, "Allocate for 'x'"))
        await asyncio.get_running_loop().run_in_executor(None, started.wait, 5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(caller_leaves())
    release.set()
    assert refused.wait(5) and written == []
    runner.shutdown()


# ------------------------------------------------------------------------- Allocate's late path
class SlowWrites(MemoryPodSource):
    """Pod patches take ``delay`` seconds and are then applied, like an API server that answers late."""

    delay = 0.0

    def patch_pod_if(self, ref, expect, changes, timeout_s):
        time.sleep(self.delay)  # the server applies the write whatever the client's timeout was
        super().patch_pod_if(ref, expect, changes, timeout_s)


def test_a_success_write_that_lands_after_the_deadline_is_undone(tmp_path):
    """Issue 16 finding 1: the pod ended bind-phase=success although the kubelet had failed it."""
    s = PluginSettings(node_name=NODE, hook_path=str(tmp_path / "hook"), vgpu_lock_dir=str(tmp_path / "l"),
                       device_split_count=2, rpc_deadline_s=0.5, api_timeout_s=0.4)
    src = SlowWrites(NODE)
    src.node_annotations[keys.NODE_REGISTER] = node_register(1, count=2)
    src.node_annotations[keys.NODE_LOCK] = lock_value("slow")
    src.add_pod(hami_pod("slow", NODE, [ctr("c", 1)], f"{U0},NVIDIA,1000,10:;"))
    plan = plan_resources(FakeSnapshot(gpus=full_gpus(1)), s)["nvidia.com/gpu"]
    alloc = Allocator(s, src)
    runner = DeadlineRunner(2, s.rpc_deadline_s, reply_margin_s=s.rpc_reply_margin_s,
                            commit_margin_s=s.commit_margin_s, api_timeout_s=s.api_timeout_s)
    src.delay = 1.0  # the commit lands 0.5 s after the kubelet's error answer
    with pytest.raises(DeadlineExceeded):
        runner.run(lambda budget: alloc.allocate(plan, [[f"{U0}-0"]], budget), "Allocate for 'gpu'")
    src.delay = 0.0
    deadline = time.monotonic() + 10
    # two patches: the late success write, then the failure record the allocator queues once the late
    # write returns (waiting for "writer idle" alone races that queueing on a loaded machine)
    while time.monotonic() < deadline and (len(src.patches) < 2 or not alloc.writer.wait_idle(0.1)):
        time.sleep(0.05)
    ann = src.pods[("default", "slow")]["metadata"]["annotations"]
    # the late success write landed first, then the failure record restored the allocation
    assert src.patches[0][2][keys.BIND_PHASE] == "success"
    assert ann[keys.BIND_PHASE] == "failed" and ann[keys.DEVICES_TO_ALLOCATE] == f"{U0},NVIDIA,1000,10:;"
    assert keys.NODE_LOCK not in src.node_annotations
    runner.shutdown()
    alloc.close()


# ------------------------------------------------------------------------------------- LateWriter
def test_late_writer_retries_with_backoff_until_the_write_lands():
    w = LateWriter(0.5, first_retry_s=0.01, max_retry_s=0.05)
    calls = []

    def attempt(timeout_s):
        calls.append(timeout_s)
        if len(calls) < 4:
            raise PodSourceError("patch pod error: 503", unknown=True)

    assert w.submit("mark failed", attempt)
    assert w.wait_idle(5)
    assert calls == [0.5] * 4 and w.done == 1
    w.stop()


def test_late_writer_gives_up_after_its_age_limit_and_its_queue_is_bounded():
    w = LateWriter(0.1, first_retry_s=0.01, max_retry_s=0.02, give_up_after_s=0.2, max_pending=2)
    calls = []

    def never(_t):
        calls.append(1)
        raise PodSourceError("release node lock error: timeout", unknown=True)

    assert w.submit("a", never) and w.submit("b", never)
    assert not w.submit("c", never) and w.dropped == 1
    assert w.wait_idle(5) and w.done == 0 and len(calls) >= 4
    w.stop()


def test_a_deadline_too_short_for_the_commit_margin_is_a_clear_settings_error():
    from hami_agent.deviceplugin.settings import SettingsError

    with pytest.raises(SettingsError, match=r"--rpc-deadline \(0.2s\) must be longer than the 0.25s"):
        PluginSettings(node_name=NODE, rpc_deadline_s=0.2, api_timeout_s=0.1).validate()
