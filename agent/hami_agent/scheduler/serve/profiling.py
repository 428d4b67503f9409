"""``--profiling``: the Python counterpart of the seed's pprof endpoints.

CPU profile: a sampling profiler over ``sys._current_frames()`` (every thread, like pprof; cProfile
only sees the thread that enabled it, which would miss the request threads). Output is the "folded"
stack format (``frame;frame;frame count``) that flamegraph.pl, speedscope and inferno read.
Thread dump: every thread's stack (the goroutine dump counterpart)."""

from __future__ import annotations

import collections
import sys
import threading
import time
import traceback

MAX_SECONDS = 120


def _frame_name(frame) -> str:
    code = frame.f_code
    return f"{code.co_name} ({code.co_filename.rsplit('/', 1)[-1]}:{frame.f_lineno})"


def cpu_profile(seconds: float, interval_s: float = 0.005) -> str:
    """Sample every thread's stack for ``seconds``; return folded stacks, hottest first."""
    seconds = max(0.1, min(float(seconds), MAX_SECONDS))
    me = threading.get_ident()
    counts: collections.Counter[str] = collections.Counter()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for ident, frame in sys._current_frames().items():
            if ident == me:
                continue
            stack = []
            f = frame
            while f is not None:
                stack.append(_frame_name(f))
                f = f.f_back
            counts[";".join(reversed(stack))] += 1
        time.sleep(interval_s)
    return "".join(f"{stack} {n}\n" for stack, n in counts.most_common())


def thread_dump() -> str:
    names = {t.ident: t.name for t in threading.enumerate()}
    out = []
    for ident, frame in sys._current_frames().items():
        out.append(f"thread {names.get(ident, '?')} ({ident}):\n")
        out.extend(traceback.format_stack(frame))
        out.append("\n")
    return "".join(out)
