"""Garbage-collector settings for the extender process.

The usage cache holds one object per GPU, pod and memoised fit (hundreds of thousands at 5,000 nodes).
CPython's full collection walks all of them: ~100 ms pauses that land in /filter's tail latency. After
the caches are built they are long-lived, so we move them to the permanent generation (``gc.freeze``)
and collect the young generation less often; request garbage is acyclic and freed by refcounting."""

from __future__ import annotations

import gc

GEN0_THRESHOLD = 20000


def settle_heap() -> None:
    """Call once the caches are synced (process-wide: only the scheduler process calls it)."""
    gc.collect()
    gc.freeze()
    _t0, t1, t2 = gc.get_threshold()
    gc.set_threshold(GEN0_THRESHOLD, t1, t2)
