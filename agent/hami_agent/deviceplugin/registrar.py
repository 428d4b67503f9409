"""Registration with the kubelet, one background thread per resource, so that a missing kubelet never
stalls the device plugin's loop (``manager.py``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from hami_agent.deviceplugin.kubelet_registration import RegistrationError, register_with_retry
from hami_agent.deviceplugin.metrics import PluginMetrics
from hami_agent.deviceplugin.server import PluginServer
from hami_agent.deviceplugin.settings import PluginSettings


class Registrar:
    """Registers one resource in the background; ``trigger()`` asks for a (re-)registration."""

    def __init__(self, server: PluginServer, settings: PluginSettings, metrics: PluginMetrics,
                 fatal: Callable[[str], None]) -> None:
        """``fatal``: called with the message when registering can never succeed (the plugin exits)."""
        self.settings = settings
        self.metrics = metrics
        self.fatal = fatal
        self.server = server
        self.registered = threading.Event()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"register-{server.endpoint}", daemon=True)
        self._thread.start()

    def trigger(self) -> None:
        self.registered.clear()
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def _run(self) -> None:
        s = self.settings
        while not self._stop.is_set():
            self._wake.wait()
            self._wake.clear()
            if self._stop.is_set():
                return
            if s.registration_mode == "plugin-watcher":
                # the kubelet finds our registry socket itself; nothing to dial
                self.registered.set()
                continue
            # a new trigger while retrying restarts the attempt (the kubelet changed under us)
            retry_stop = _AnyEvent(self._stop, self._wake)
            try:
                ok = register_with_retry(s.kubelet_socket, self.server.resource, self.server.endpoint,
                                         s.register_dial_timeout_s, stop=retry_stop,
                                         max_backoff_s=max(0.5, min(5.0, s.poll_interval_s * 4)))
            except RegistrationError as exc:
                self.fatal(str(exc))
                return
            if ok and not self._wake.is_set():
                self.registered.set()
                self.metrics.registrations.labels(self.server.resource).inc()


class _AnyEvent:
    """Looks like a ``threading.Event`` that is set when any of the given events is set."""

    def __init__(self, *events: threading.Event) -> None:
        self.events = events

    def is_set(self) -> bool:
        return any(e.is_set() for e in self.events)

    def wait(self, timeout: float) -> bool:
        end = time.monotonic() + timeout
        while not self.is_set():
            left = end - time.monotonic()
            if left <= 0:
                return False
            self.events[0].wait(min(left, 0.05))
        return True
