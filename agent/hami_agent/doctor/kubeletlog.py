"""Kubelet log analysis: the seed-003 stall detector.

The kubelet's device manager logs (klog, structured) ::

    "Need devices to allocate for pod" deviceNumber=1 resourceName="nvidia.com/gpu" podUID="..."
        containerName="..."
    "Issuing a GetPreferredAllocation call for container" containerName="..." podUID="..."      (V4)
    "Making allocation request for device plugin" devices=[...] resourceName="..."               (V3)

Admission is serial in one goroutine, so "Making allocation request" carries no pod UID: it belongs to
the GetPreferredAllocation issued just before it by the same kubelet process. A call that is never
followed by its allocation request while the same kubelet keeps logging for ``stall_after_s`` or more
(log time) is the seed-003 stall: the plugin's GetPreferredAllocation never returned and every later pod
on the node waits behind it. Lines are accepted bare (klog) or with a journald prefix
(``Jul 30 20:39:03 host kubelet[45878]: I0730 ...``); the year is not in either, so it is assumed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

ISSUING = "Issuing a GetPreferredAllocation call for container"
MAKING = "Making allocation request for device plugin"
NEED = "Need devices to allocate for pod"
DEFAULT_STALL_AFTER_S = 30.0

# klog header: Lmmdd hh:mm:ss.uuuuuu threadid file:line] msg
_KLOG = re.compile(
    r"(?P<sev>[IWEF])(?P<mon>\d{2})(?P<day>\d{2}) (?P<h>\d{2}):(?P<m>\d{2}):(?P<s>\d{2})\.(?P<us>\d{1,6})"
    r"\s+(?P<pid>\d+) (?P<where>[^\]\s]+)\] (?P<msg>.*)$")
# journald "short" prefix: "Jul 30 20:39:03 ai-app-8-1-msxf kubelet[45878]: "
_JOURNAL = re.compile(r"^[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d (?P<host>\S+) kubelet\[\d+\]: ")
_KV = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|\[[^\]]*\]|\S+)')


@dataclass(frozen=True)
class KlogLine:
    lineno: int
    raw: str
    severity: str
    time: datetime
    pid: int
    where: str
    message: str
    kv: dict[str, str]

    @property
    def klog_time(self) -> str:
        """The header's own spelling, e.g. ``0730 20:39:03.753013``."""
        return self.time.strftime("%m%d %H:%M:%S.%f")


def _unquote(v: str) -> str:
    if len(v) >= 2 and v[0] == '"' and v[-1] == '"':
        return v[1:-1].replace('\\"', '"')
    return v


def parse_line(raw: str, lineno: int = 0, year: int = 2000) -> KlogLine | None:
    """A klog line (optionally journald-prefixed), or None for anything else."""
    m = _KLOG.search(raw.rstrip("\n"))
    if not m:
        return None
    try:
        when = datetime(year, int(m["mon"]), int(m["day"]), int(m["h"]), int(m["m"]), int(m["s"]),
                        int(m["us"].ljust(6, "0")))
    except ValueError:
        return None
    msg = m["msg"]
    text, rest = msg, ""
    if msg.startswith('"'):  # structured: "message" k=v ...
        end = 1
        while end < len(msg):
            if msg[end] == "\\":
                end += 2
                continue
            if msg[end] == '"':
                break
            end += 1
        text, rest = msg[1:end].replace('\\"', '"'), msg[end + 1:]
    kv = {k: _unquote(v) for k, v in _KV.findall(rest)}
    return KlogLine(lineno, raw.rstrip("\n"), m["sev"], when, int(m["pid"]), m["where"], text, kv)


@dataclass
class PreferredCall:
    """One GetPreferredAllocation issued by the kubelet, and what became of it."""

    pod_uid: str
    container: str
    kubelet_pid: int
    issued: KlogLine
    resource: str = ""
    answered: KlogLine | None = None
    superseded: bool = False  # the kubelet moved on without an allocation request (the call errored)
    later_lines: int = 0  # lines logged by the same kubelet after the call
    last_seen: datetime | None = None  # newest time logged by that kubelet after the call
    kubelet_restarted: bool = False  # a different kubelet pid logged after the call

    @property
    def waited_s(self) -> float:
        if self.last_seen is None:
            return 0.0
        return (self.last_seen - self.issued.time).total_seconds()

    def to_dict(self) -> dict[str, object]:
        return {
            "pod_uid": self.pod_uid, "container": self.container, "resource": self.resource,
            "kubelet_pid": self.kubelet_pid, "issued_at": self.issued.klog_time,
            "issued_line": self.issued.lineno, "log_line": self.issued.raw,
            "answered": self.answered is not None, "waited_s": round(self.waited_s, 3),
            "later_lines": self.later_lines, "kubelet_restarted": self.kubelet_restarted,
        }


@dataclass
class KubeletLogAnalysis:
    source: str
    lines_total: int = 0
    klog_lines: int = 0
    calls: list[PreferredCall] = field(default_factory=list)
    stall_after_s: float = DEFAULT_STALL_AFTER_S
    first_time: datetime | None = None
    last_time: datetime | None = None
    hosts: list[str] = field(default_factory=list)  # node names from journald prefixes

    @property
    def stalls(self) -> list[PreferredCall]:
        return [c for c in self.calls if c.answered is None and not c.superseded
                and c.later_lines > 0 and c.waited_s >= self.stall_after_s]

    @property
    def outstanding(self) -> list[PreferredCall]:
        """Unanswered calls not (yet) long enough to be called a stall."""
        return [c for c in self.calls if c.answered is None and not c.superseded and c not in self.stalls]

    @property
    def answered(self) -> list[PreferredCall]:
        return [c for c in self.calls if c.answered is not None]


def analyse_kubelet_log(lines: Iterable[str], source: str = "kubelet log",
                        stall_after_s: float = DEFAULT_STALL_AFTER_S, year: int = 2000) -> KubeletLogAnalysis:
    out = KubeletLogAnalysis(source=source, stall_after_s=stall_after_s)
    open_call: dict[int, PreferredCall] = {}  # kubelet pid -> its latest unanswered call
    need: dict[tuple[int, str, str], str] = {}  # (pid, podUID, container) -> resource
    for lineno, raw in enumerate(lines, 1):
        out.lines_total += 1
        line = parse_line(raw, lineno, year)
        if line is None:
            continue
        out.klog_lines += 1
        jm = _JOURNAL.match(raw)
        if jm and jm["host"] not in out.hosts:
            out.hosts.append(jm["host"])
        out.first_time = out.first_time or line.time
        out.last_time = line.time
        for call in open_call.values():  # only unanswered calls can still stall
            if line.lineno > call.issued.lineno:
                if line.pid == call.kubelet_pid:
                    call.later_lines += 1
                    call.last_seen = line.time
                else:
                    call.kubelet_restarted = True
        if line.message == NEED:
            need[(line.pid, line.kv.get("podUID", ""), line.kv.get("containerName", ""))] = \
                line.kv.get("resourceName", "")
        elif line.message == ISSUING:
            prev = open_call.pop(line.pid, None)
            if prev is not None:  # serial admission: the kubelet got past the previous call
                prev.superseded = True
            uid, ctr = line.kv.get("podUID", ""), line.kv.get("containerName", "")
            call = PreferredCall(uid, ctr, line.pid, line, resource=need.get((line.pid, uid, ctr), ""))
            out.calls.append(call)
            open_call[line.pid] = call
        elif line.message == MAKING:
            call = open_call.pop(line.pid, None)
            if call is not None:
                call.answered = line
                call.resource = call.resource or line.kv.get("resourceName", "")
    return out
