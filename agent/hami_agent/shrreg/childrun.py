"""Run the part of a repair that touches a live mapping in a forked child, so SIGBUS kills only the child.

A region can be truncated at any moment by another process (HAMi-core's ``shrreg-tool --create_new``
opens it with ``O_TRUNC``; a restarted container re-creates it). A process touching a mapped page beyond
the new end of file gets SIGBUS, which Python cannot catch: the tool would die mid-repair with no message.
The repair checks the file size before every wait and write, but the file can shrink between a check
and the access; so the mapping is only ever touched in a short-lived child (``os.fork``: no re-import,
a few milliseconds). The child sends its JSON result over a pipe; a child killed by a signal becomes a
clear error here. Why fork and not a thread or a subprocess: a signal kills the whole process (a thread
does not help), and exec'ing a fresh interpreter costs ~0.2 s per repair for nothing.

The child must not log or import (another thread of the parent may have held a lock at fork time): it
returns messages for the parent to log.
"""

from __future__ import annotations

import faulthandler
import json
import os
import select
import signal
import time
from collections.abc import Callable
from typing import Any


class ChildFailed(RuntimeError):
    """The child crashed (``signal`` set), raised, or did not finish in time."""

    def __init__(self, message: str, signal_number: int | None = None) -> None:
        super().__init__(message)
        self.signal = signal_number


def run_in_child(fn: Callable[[], dict[str, Any]], timeout_s: float) -> dict[str, Any]:
    """``fn()`` in a forked child; its (JSON-able) result. Raises ``ChildFailed``. Never waits without a
    deadline: a child past ``timeout_s`` is SIGKILLed and polled for at most one more second."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: no logging, no imports; always _exit
        code = 0
        try:
            faulthandler.disable()  # a SIGBUS here is expected and reported by the parent, not dumped
            os.close(r)
            try:
                out: dict[str, Any] = {"ok": fn()}
            except BaseException as exc:  # noqa: BLE001 - reported to the parent, never raised here
                out = {"exc": f"{type(exc).__name__}: {exc}"}
            data = json.dumps(out).encode()
            while data:
                data = data[os.write(w, data):]
        except BaseException:  # noqa: BLE001
            code = 70
        finally:
            os._exit(code)
    os.close(w)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    timed_out = False
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            ready, _, _ = select.select([r], [], [], min(left, 1.0))
            if not ready:
                continue
            chunk = os.read(r, 65536)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(r)
    if timed_out:
        _kill(pid)
    status = _poll_exit(pid, 1.0)
    if timed_out:
        raise ChildFailed(f"did not finish within {timeout_s:g}s (killed)")
    if status is not None and os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        raise ChildFailed(f"killed by {signal.Signals(sig).name}", sig)
    try:
        doc = json.loads(b"".join(chunks) or b"{}")
    except ValueError:
        raise ChildFailed("sent no readable result") from None
    if "exc" in doc:
        raise ChildFailed(str(doc["exc"]))
    if "ok" not in doc:
        raise ChildFailed("exited without a result")
    return dict(doc["ok"])


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _poll_exit(pid: int, timeout_s: float) -> int | None:
    """waitpid(WNOHANG) until the child is collected or ``timeout_s`` passes (then it is left behind)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return None
        if done:
            return status
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.005)
