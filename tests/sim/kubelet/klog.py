"""klog-format log lines and Go's spelling of errors, as the simulated kubelet writes them.

The kubelet logs with klog's structured calls (``klog.V(n).InfoS`` / ``klog.ErrorS``): a header
``I1121 10:30:15.123456   1234 manager.go:956] ``, the quoted message, then ``key=value`` pairs, with
``err="..."`` first for ``ErrorS``. The doctor parses exactly these lines (``doctor/kubeletlog.py``).
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any, TextIO

import grpc


def _fmt_value(v: Any) -> str:
    if isinstance(v, (list, tuple, set, frozenset)):
        return "[" + " ".join(str(x) for x in v) + "]"
    if isinstance(v, str):
        return json.dumps(v)
    return str(v)


class KlogWriter:
    """Collects (and optionally streams) klog lines; ``level`` is the ``V(n)`` of the real call."""

    def __init__(self, verbosity: int = 4, stream: TextIO | None = None) -> None:
        self.verbosity = verbosity
        self.stream = stream
        self.lines: list[str] = []
        self._lock = threading.Lock()

    def log(self, level: int, where: str, msg: str, severity: str = "I", **kv: Any) -> None:
        if level > self.verbosity:
            return
        now = time.time()
        t = time.localtime(now)
        header = "%s%02d%02d %02d:%02d:%02d.%06d %7d %s] " % (
            severity,
            t.tm_mon,
            t.tm_mday,
            t.tm_hour,
            t.tm_min,
            t.tm_sec,
            int((now % 1) * 1e6),
            os.getpid(),
            where,
        )
        line = header + json.dumps(msg) + "".join(f" {k}={_fmt_value(v)}" for k, v in kv.items())
        with self._lock:
            self.lines.append(line)
            if self.stream is not None:
                self.stream.write(line + "\n")
                self.stream.flush()

    def error_s(self, where: str, msg: str, err: Any, **kv: Any) -> None:
        """``klog.ErrorS(err, msg, kv...)``: always logged, ``err`` first."""
        self.log(0, where, msg, severity="E", err=str(err), **kv)

    def grep(self, text: str) -> list[str]:
        with self._lock:
            return [ln for ln in self.lines if text in ln]


def go_quote(s: str) -> str:
    """Go's ``%q`` of a string."""
    return json.dumps(s)


def go_quote_list(items: list[str] | tuple[str, ...]) -> str:
    """Go's ``%q`` of a ``[]string``: ``["a" "b"]``."""
    return "[" + " ".join(go_quote(x) for x in items) + "]"


def rpc_error_text(exc: BaseException) -> str:
    """How a gRPC client error prints in Go (``rpc error: code = Unknown desc = ...``)."""
    if not isinstance(exc, grpc.RpcError) or not hasattr(exc, "code"):
        return str(exc)
    code = exc.code()
    name = "".join(p.capitalize() for p in code.name.split("_")) if code else "Unknown"
    if name == "Cancelled":
        name = "Canceled"  # grpc-go's codes.Canceled.String()
    return f"rpc error: code = {name} desc = {exc.details()}"
