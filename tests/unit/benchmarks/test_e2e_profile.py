"""``benchmarks.e2e_schedule.profile``'s per-thread accounting: threads named from the file the wrapped
process writes, pools added up under one name, CPU by the scheduler's clock."""

from __future__ import annotations

import os
import threading
import time

from benchmarks.e2e_schedule.profile import thread_cpu


def _spin(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_threads_are_named_from_the_file_and_a_pool_is_added_up(tmp_path) -> None:
    names = tmp_path / "threads.1"
    go = threading.Event()
    done = threading.Event()
    started = []

    def worker() -> None:
        started.append(threading.get_native_id())
        with open(names, "a") as f:
            f.write(f"{threading.get_native_id()}\t{threading.current_thread().name}\n")
        _spin(0.05)
        go.set()
        done.wait(10)

    threads = [threading.Thread(target=worker, name=f"pool-x_{i}", daemon=True) for i in range(2)]
    for t in threads:
        t.start()
    try:
        assert go.wait(10)
        while len(started) < 2:
            time.sleep(0.01)
        time.sleep(0.1)  # both have spun
        out = thread_cpu(os.getpid(), str(names))
    finally:
        done.set()
        for t in threads:
            t.join(5)
    assert "pool-x" in out, out
    cpu, switches = out["pool-x"]
    assert cpu >= 0.09  # two threads of 0.05 s each, by the scheduler's clock (tick sampling may miss them)
    assert switches >= 2  # each slept at least once (the wait)
    assert not any(k.startswith("pool-x_") for k in out)


def test_a_missing_names_file_falls_back_to_the_kernel_names(tmp_path) -> None:
    out = thread_cpu(os.getpid(), str(tmp_path / "none"))
    assert out and all(isinstance(k, str) and k for k in out)
    assert sum(cpu for cpu, _n in out.values()) > 0


def test_own_steps_count_the_coroutines_steps_and_not_the_loops_other_work() -> None:
    import asyncio

    from benchmarks.e2e_schedule.profile import _OwnSteps

    counted: list[float] = []

    async def rpc() -> str:
        _spin(0.02)
        await asyncio.sleep(0.05)  # meanwhile the loop runs `other`: not this coroutine's CPU
        _spin(0.02)
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            _spin(0.01)
            return "cancelled, answered"
        return "slept"

    async def other() -> None:
        _spin(0.2)

    async def main() -> str:
        task = asyncio.ensure_future(_OwnSteps(rpc(), counted.append))
        await asyncio.sleep(0.01)
        await other()
        await asyncio.sleep(0.1)
        task.cancel()  # thrown into the coroutine, which catches it and answers
        return await task

    assert asyncio.run(main()) == "cancelled, answered"
    assert 0.045 <= sum(counted) < 0.15, counted  # its 0.05 s of steps, not the other task's 0.2 s
    assert len(counted) == 3  # three steps: start, after the first sleep, after the cancel


def test_own_steps_pass_an_exception_out() -> None:
    import asyncio

    import pytest

    from benchmarks.e2e_schedule.profile import _OwnSteps

    counted: list[float] = []

    async def failing() -> None:
        await asyncio.sleep(0)
        raise ValueError("no device")

    async def main() -> None:
        await _OwnSteps(failing(), counted.append)

    with pytest.raises(ValueError, match="no device"):
        asyncio.run(main())
    assert len(counted) == 2  # the step before the sleep and the one that raised
