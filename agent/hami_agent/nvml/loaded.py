"""The loaded NVIDIA kernel module, as ``/sys/module/nvidia/version`` shows it: a failing NVML is tried
again as soon as the driver under it changes, not when its backoff ends.

A worker that fails (NVML hung, driver not loaded, library/module mismatch) is retried after a delay that
doubles to 60 s. When an operator or ``remediate_nvml_hang.yml`` then replaces the module, the device
plugin would sit out the rest of that delay with every GPU unhealthy: a maintenance gate waits for it, and
on a first install (the agent before the driver) the node's GPUs come up to a minute late. The module's
version file is read only while a retry is pending, once a second (a read of a sysfs file, no NVML call):
a healthy node pays nothing for it.

``$HAMI_DRIVER_VERSION_FILE`` names another file (a simulated node's emulated sysfs,
``/run/gpusim/sys/module/nvidia/version``); a missing or unreadable file reads as ``None``, which is a
state too: a module that appears, goes or changes its version is a change.
"""

from __future__ import annotations

import os
import threading
import time

VERSION_FILE = "/sys/module/nvidia/version"
VERSION_FILE_ENV = "HAMI_DRIVER_VERSION_FILE"
POLL_S = 1.0


class LoadedDriver:
    def __init__(self, path: str | None = None, poll_s: float = POLL_S) -> None:
        self.path = path or os.environ.get(VERSION_FILE_ENV) or VERSION_FILE
        self.poll_s = poll_s

    def read(self) -> str | None:
        """The module's version, or None when the file is missing or unreadable (no module loaded)."""
        try:
            with open(self.path, encoding="utf-8", errors="replace") as f:
                return f.read(256).strip()
        except OSError:
            return None

    def changed_since(self, seen: str | None) -> bool:
        return self.read() != seen

    def wait_changed(self, seen: str | None, timeout_s: float, stop: threading.Event) -> bool:
        """Wait up to ``timeout_s`` (or until ``stop``); True as soon as the module differs from ``seen``."""
        deadline = time.monotonic() + max(0.0, timeout_s)
        while True:
            if self.changed_since(seen):
                return True
            left = deadline - time.monotonic()
            if left <= 0 or stop.wait(min(left, self.poll_s)):
                return False


__all__ = ["POLL_S", "VERSION_FILE", "VERSION_FILE_ENV", "LoadedDriver"]
