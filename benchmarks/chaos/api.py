"""The test API server of the soak (``tests/sim/apiserver.py``) plus the request log the late-write count
needs: every pod write that sets ``hami.io/bind-phase=success``, stamped with the machine's monotonic
clock when the server has read the request (before any injected delay or error applies to it).

The simulator keeps only its last 2,000 requests, without times; an hour of soak makes millions, so this
log keeps just the success writes (one or two per admitted pod).
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass
from typing import Any

from hami_agent.protocol import keys
from tests.sim.apiserver import ApiServer, Fault

POD_PATH = re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/pods/(?P<name>[^/]+)$")
PHASE_POINTER = "/metadata/annotations/" + keys.BIND_PHASE.replace("~", "~0").replace("/", "~1")
UID_POINTER = "/metadata/uid"


@dataclass(frozen=True)
class SuccessWrite:
    at: float  # time.monotonic() when the server read the request
    namespace: str
    name: str
    uid: str | None  # from the JSON patch's uid test, when there is one
    method: str


def success_write(method: str, path: str, body: Any) -> tuple[str, str, str | None] | None:
    """(namespace, name, uid) if this request writes ``bind-phase=success`` on a pod, else None."""
    if method not in ("PATCH", "PUT"):
        return None
    m = POD_PATH.match(path)
    if m is None:
        return None
    uid = None
    sets = False
    if isinstance(body, list):  # JSON patch
        for op in body:
            if not isinstance(op, dict):
                continue
            if op.get("op") == "test" and op.get("path") == UID_POINTER:
                uid = op.get("value")
            if op.get("op") in ("add", "replace") and op.get("path") == PHASE_POINTER \
                    and op.get("value") == keys.BIND_PHASE_SUCCESS:
                sets = True
            if op.get("op") in ("add", "replace") and op.get("path") == "/metadata/annotations" \
                    and isinstance(op.get("value"), dict) \
                    and op["value"].get(keys.BIND_PHASE) == keys.BIND_PHASE_SUCCESS:
                sets = True
    elif isinstance(body, dict):  # merge patch or full object
        md = body.get("metadata") if isinstance(body.get("metadata"), dict) else {}
        ann = md.get("annotations") if isinstance(md.get("annotations"), dict) else {}
        sets = ann.get(keys.BIND_PHASE) == keys.BIND_PHASE_SUCCESS
        uid = md.get("uid") if isinstance(md.get("uid"), str) else None
    return (m["ns"], m["name"], uid) if sets else None


class ChaosApiServer(ApiServer):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.success_writes: list[SuccessWrite] = []
        self._sw_lock = threading.Lock()

    def _log(self, rec: Any) -> None:  # called once per request, after the body is read
        super()._log(rec)
        hit = success_write(rec.method, rec.path, rec.body)
        if hit is not None:
            with self._sw_lock:
                self.success_writes.append(SuccessWrite(time.monotonic(), hit[0], hit[1], hit[2], rec.method))

    def writes(self) -> list[SuccessWrite]:
        with self._sw_lock:
            return list(self.success_writes)

    @staticmethod
    def end_fault(fault: Fault) -> None:
        """End one injected fault without touching the others (``clear_faults`` drops them all)."""
        fault.times = 0

    def expire_events(self, older_than_s: float, seen: dict[tuple[str, str], float]) -> int:
        """The real server keeps events for an hour (``--event-ttl``); the simulator keeps them for ever.
        Deletes events first seen more than ``older_than_s`` ago (``seen`` is the caller's memory)."""
        now = time.monotonic()
        gone = 0
        live = set()
        for ev in self.list("Event"):
            md = ev.get("metadata") or {}
            key = (md.get("namespace", ""), md.get("name", ""))
            live.add(key)
            first = seen.setdefault(key, now)
            if now - first > older_than_s:
                try:
                    self.delete("Event", key[0], key[1])
                    gone += 1
                except Exception:  # noqa: BLE001 - deleted meanwhile
                    pass
        for key in [k for k in seen if k not in live]:
            seen.pop(key, None)
        return gone
