"""Starting and stopping a device snapshot source (the NVML supervisor, or a test double with the same
``snapshot()`` / ``wait_for_change()`` methods), shared by the device plugin and the DRA driver."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)


def start_source(factory: Callable[[], Any]) -> Any:
    """Build the source and start it when it has a ``start()``."""
    source = factory()
    start = getattr(source, "start", None)
    if callable(start):
        start()
    return source


def first_snapshot(source: Any, wait_s: float, stop: threading.Event) -> Any:
    """The source's snapshot, waiting up to ``wait_s`` (or until ``stop``) while it is still
    ``starting``: the first NVML answer, or whatever the source has when the wait ends."""
    snap = source.snapshot()
    end = time.monotonic() + wait_s
    while getattr(snap, "status", "ok") == "starting" and time.monotonic() < end and not stop.is_set():
        snap = source.wait_for_change(getattr(snap, "generation", 0), min(0.2, end - time.monotonic()))
    return snap


def stop_source(source: Any) -> None:
    """Stop the source when it has a ``stop()``; a failure is logged, never raised (shutdown goes on)."""
    stop = getattr(source, "stop", None)
    if callable(stop):
        try:
            stop()
        except Exception as exc:
            logger.warning("stopping the NVML supervisor failed: %s", exc)
