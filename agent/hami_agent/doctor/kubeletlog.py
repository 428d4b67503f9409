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

Memory is bounded whatever the log's size (a busy node's kubelet log is hundreds of MB): lines are fed one
at a time (``KubeletLogAnalyser.feed``), and only what the stall rule needs is kept: the unanswered call
of each kubelet process, the newest ``MAX_KEPT_CALLS`` calls for the report, and counts.
"""

from __future__ import annotations

import re
from collections import OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

ISSUING = "Issuing a GetPreferredAllocation call for container"
MAKING = "Making allocation request for device plugin"
NEED = "Need devices to allocate for pod"
DEFAULT_STALL_AFTER_S = 30.0
MAX_KEPT_CALLS = 64  # newest calls kept for the report (counts cover all of them)
MAX_KUBELET_PIDS = 64  # kubelet processes followed at once (each restart is a new pid)
MAX_PENDING_NEEDS = 4096  # "Need devices to allocate" lines waiting for their GetPreferredAllocation
MAX_HOSTS = 16

# klog header: Lmmdd hh:mm:ss.uuuuuu threadid file:line] msg
_KLOG = re.compile(
    r"(?P<sev>[IWEF])(?P<mon>\d{2})(?P<day>\d{2}) (?P<h>\d{2}):(?P<m>\d{2}):(?P<s>\d{2})\.(?P<us>\d{1,6})"
    r"\s+(?P<pid>\d+) (?P<where>[^\]\s]+)\] (?P<msg>.*)$")
# The header alone (no capture of the message): the fast path that every line of a big log takes.
_HEADER = re.compile(r"[IWEF](\d{2})(\d{2}) (\d{2}):(\d{2}):(\d{2})\.(\d{1,6})\s+(\d+) [^\]\s]+\] ")
_INTERESTING = ('"' + "Need devices to allocate for pod", '"' + "Issuing a GetPreferredAllocation call",
                '"' + "Making allocation request for device plugin")
# journald "short" prefix: "Jul 30 20:39:03 ai-app-8-1-msxf kubelet[45878]: "
_JOURNAL = re.compile(r"^[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d (?P<host>\S+) kubelet\[\d+\]: ")
_QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"')
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
    q = _QUOTED.match(msg)  # structured: "message" k=v ...
    if q:
        text, rest = q[1].replace('\\"', '"'), msg[q.end():]
    elif msg.startswith('"'):  # an unterminated quote: the rest is the message
        text = msg[1:]
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
    stall_after_s: float = DEFAULT_STALL_AFTER_S
    first_time: datetime | None = None
    last_time: datetime | None = None
    hosts: list[str] = field(default_factory=list)  # node names from journald prefixes (at most 16)
    calls_total: int = 0
    answered_total: int = 0
    # the newest calls (bounded); every unanswered, not superseded call is in ``unresolved``
    calls: deque[PreferredCall] = field(default_factory=lambda: deque(maxlen=MAX_KEPT_CALLS))
    unresolved: list[PreferredCall] = field(default_factory=list)
    _answered: deque[PreferredCall] = field(default_factory=lambda: deque(maxlen=MAX_KEPT_CALLS))

    @property
    def stalls(self) -> list[PreferredCall]:
        return [c for c in self.unresolved if c.later_lines > 0 and c.waited_s >= self.stall_after_s]

    @property
    def outstanding(self) -> list[PreferredCall]:
        """Unanswered calls not (yet) long enough to be called a stall."""
        stalls = self.stalls
        return [c for c in self.unresolved if c not in stalls]

    @property
    def answered(self) -> list[PreferredCall]:
        """The newest answered calls (``answered_total`` counts all)."""
        return list(self._answered)


class KubeletLogAnalyser:
    """Feed lines one at a time; ``finish()`` gives the analysis. Memory does not grow with the log."""

    def __init__(self, source: str = "kubelet log", stall_after_s: float = DEFAULT_STALL_AFTER_S,
                 year: int = 2000) -> None:
        self.out = KubeletLogAnalysis(source=source, stall_after_s=stall_after_s)
        self.year = year
        self._open: OrderedDict[int, PreferredCall] = OrderedDict()  # kubelet pid -> unanswered call
        self._evicted: deque[PreferredCall] = deque(maxlen=MAX_KUBELET_PIDS)
        self._need: OrderedDict[tuple[int, str, str], str] = OrderedDict()  # (pid, uid, ctr) -> resource
        self._last_header: re.Match[str] | None = None

    def _time(self, m: re.Match[str]) -> datetime | None:
        try:
            return datetime(self.year, int(m[1]), int(m[2]), int(m[3]), int(m[4]), int(m[5]),
                            int(m[6].ljust(6, "0")))
        except ValueError:
            return None

    def feed(self, raw: str) -> None:
        out = self.out
        out.lines_total += 1
        # Fast path: a header match per line; the full parse (key=value pairs) only for the three
        # device-manager messages, times only while a call is open (a big log is mostly other lines).
        m = _HEADER.search(raw)
        if m is None:
            return
        when = self._time(m) if (self._open or out.first_time is None) else None
        if when is None and (self._open or out.first_time is None):
            return  # a header with an impossible date: not a klog line
        out.klog_lines += 1
        self._last_header = m
        if m.start() and len(out.hosts) < MAX_HOSTS:
            jm = _JOURNAL.match(raw)
            if jm and jm["host"] not in out.hosts:
                out.hosts.append(jm["host"])
        out.first_time = out.first_time or when
        pid = int(m[7])
        for call in self._open.values():  # only unanswered calls can still stall
            if pid == call.kubelet_pid:
                call.later_lines += 1
                call.last_seen = when
            else:
                call.kubelet_restarted = True
        if not raw.startswith(_INTERESTING, m.end()):
            return
        line = parse_line(raw, out.lines_total, self.year)
        if line is None:
            return
        if line.message == NEED:
            key = (line.pid, line.kv.get("podUID", ""), line.kv.get("containerName", ""))
            self._need[key] = line.kv.get("resourceName", "")
            self._need.move_to_end(key)
            while len(self._need) > MAX_PENDING_NEEDS:
                self._need.popitem(last=False)
        elif line.message == ISSUING:
            prev = self._open.pop(line.pid, None)
            if prev is not None:  # serial admission: the kubelet got past the previous call
                prev.superseded = True
            uid, ctr = line.kv.get("podUID", ""), line.kv.get("containerName", "")
            call = PreferredCall(uid, ctr, line.pid, line, resource=self._need.pop((line.pid, uid, ctr), ""))
            out.calls_total += 1
            out.calls.append(call)
            self._open[line.pid] = call
            while len(self._open) > MAX_KUBELET_PIDS:  # the oldest kubelet process: keep its call
                self._evicted.append(self._open.popitem(last=False)[1])
        elif line.message == MAKING:
            call = self._open.pop(line.pid, None)
            if call is not None:
                call.answered = line
                call.resource = call.resource or line.kv.get("resourceName", "")
                out.answered_total += 1
                out._answered.append(call)

    def finish(self) -> KubeletLogAnalysis:
        if self._last_header is not None:
            self.out.last_time = self._time(self._last_header) or self.out.last_time
        unresolved = [*self._evicted, *self._open.values()]
        self.out.unresolved = sorted(unresolved, key=lambda c: c.issued.lineno)
        return self.out


def analyse_kubelet_log(lines: Iterable[str], source: str = "kubelet log",
                        stall_after_s: float = DEFAULT_STALL_AFTER_S, year: int = 2000) -> KubeletLogAnalysis:
    analyser = KubeletLogAnalyser(source, stall_after_s, year)
    for raw in lines:
        analyser.feed(raw)
    return analyser.finish()
