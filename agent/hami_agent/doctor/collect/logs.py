"""Evidence from logs: the kubelet (file or ``journalctl -u kubelet``), the device plugin, HAMi-core.

Every log is read as a stream (``logread.LogStream``: plain or gzip, line by line, bounded memory), and a
log that cannot be read as text (permission denied, truncated gzip, binary) makes the collector fail with
that reason, so doctor answers UNKNOWN with it instead of "no problem found". Facts learned from the part
that was readable are kept.
"""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Iterable, Iterator

from hami_agent.doctor import logscan
from hami_agent.doctor.collect.base import Context
from hami_agent.doctor.collect.logread import MAX_LINE_BYTES, LogStream, LogUnreadable
from hami_agent.doctor.kubeletlog import KubeletLogAnalyser
from hami_agent.doctor.model import Facts

LOG_BYTES_PER_S = 4 << 20  # a slow machine still reads and matches this much log per second


def log_timeout(ctx: Context, path: str) -> float:
    """The collector deadline for a log file: the usual one plus time for its size (a 200 MB kubelet log
    takes tens of seconds; the deadline exists against hangs, not against big files)."""
    try:
        size = os.path.getsize(path)
    except OSError:
        size = 0
    return ctx.collector_timeout_s + size / LOG_BYTES_PER_S


def open_log(path: str) -> LogStream:
    """A stream of the log's lines; OSError (permission denied, ...) becomes ``LogUnreadable``."""
    stream = LogStream(path)
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise LogUnreadable(f"{path}: cannot read the log: {exc.strerror or exc}") from exc
    return stream


class JournalStream:
    """``journalctl -u kubelet --since ...`` read line by line, killed at its deadline (a wedged journald
    must not wedge us, and its output is never held whole in memory)."""

    def __init__(self, ctx: Context) -> None:
        self.cmd = ["journalctl", "-u", "kubelet", "--since", ctx.journal_since, "--no-pager", "-o", "short"]
        self.timeout_s = ctx.journal_timeout_s
        self.source = f"journalctl -u kubelet --since {ctx.journal_since}"
        self.error: str | None = None

    def __iter__(self) -> Iterator[str]:
        what = " ".join(self.cmd)
        try:
            proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        except FileNotFoundError as exc:
            raise LogUnreadable(f"{what}: journalctl not found; pass --kubelet-log FILE") from exc
        timed_out = threading.Event()

        def expire() -> None:
            timed_out.set()
            proc.kill()

        timer = threading.Timer(self.timeout_s, expire)
        timer.start()
        code: int | None = None
        err = ""
        try:
            assert proc.stdout is not None
            while True:
                raw = proc.stdout.readline(MAX_LINE_BYTES)
                if not raw:
                    break
                yield raw.decode("utf-8", "replace")
            err = proc.stderr.read(4096).decode("utf-8", "replace") if proc.stderr else ""
            code = proc.wait(timeout=5)
        finally:
            timer.cancel()
            if proc.poll() is None:
                proc.kill()
                proc.wait(5)
        if timed_out.is_set():
            self.error = f"{what} did not finish within {self.timeout_s:g}s"
        elif code != 0:
            self.error = f"{what} exited {code}: {err.strip()[:200]}"

    def check(self) -> None:
        if self.error:
            raise LogUnreadable(self.error)


def collect_kubelet_log(ctx: Context, facts: Facts) -> None:
    if ctx.kubelet_log:
        stream: LogStream | JournalStream = open_log(ctx.kubelet_log)
        source = ctx.kubelet_log
    elif ctx.use_journal:
        stream = JournalStream(ctx)
        source = stream.source
    else:
        return
    kubelet_log_facts(stream, source, ctx.stall_after_s, ctx.year, facts)
    stream.check()  # after the facts: what was readable still counts
    klog = facts.get("kubelet.log.klog_lines", 0)
    total = facts.get("kubelet.log.lines", 0)
    if ctx.kubelet_log and total and not klog:
        raise LogUnreadable(f"{source}: none of its {total} lines is a klog line: not a kubelet log (wrong "
                            "file?); pass `journalctl -u kubelet` output or the kubelet's log file")


def kubelet_log_facts(lines: Iterable[str], source: str, stall_after_s: float, year: int,
                      facts: Facts) -> None:
    """One pass over ``lines`` (any iterable: a list, a LogStream) for the stall detector and the
    kubelet patterns."""
    analyser = KubeletLogAnalyser(source, stall_after_s, year)
    scanner = logscan.Scanner(logscan.KUBELET_PATTERNS, source)
    for raw in lines:
        analyser.feed(raw)
        scanner.feed(raw)
    analysis = analyser.finish()
    facts.set("kubelet.log.source", source,
              f"{source}: {analysis.lines_total} lines, {analysis.klog_lines} klog lines, "
              f"{analysis.calls_total} GetPreferredAllocation calls")
    facts.set("kubelet.log.klog_lines", analysis.klog_lines)
    if analysis.hosts:
        facts.set("kubelet.log.hosts", analysis.hosts,
                  f"{source}: journald host(s) {', '.join(analysis.hosts)}")
    facts.set("kubelet.preferred_calls", analysis.calls_total)
    facts.set("kubelet.answered_calls", analysis.answered_total)
    stalls = analysis.stalls
    facts.set("kubelet.stalls", [c.to_dict() for c in stalls])
    for call in stalls:
        facts.add_lines("kubelet.stalls",
                        f"{source}:{call.issued.lineno}: {call.issued.raw}",
                        f"no \"Making allocation request for device plugin\" from "
                        f"kubelet[{call.kubelet_pid}] "
                        f"after it: {call.later_lines} later lines over {call.waited_s:.0f}s of log time"
                        + (" (the kubelet was restarted afterwards)" if call.kubelet_restarted else ""))
    if stalls:
        first = stalls[0]
        facts.set("kubelet.stall.pod_uid", first.pod_uid)
        facts.set("kubelet.stall.container", first.container)
        facts.set("kubelet.stall.resource", first.resource or "?")
        facts.set("kubelet.stall.issued_at", first.issued.klog_time)
        facts.set("kubelet.stall.waited_s", round(first.waited_s, 3))
    pending = analysis.outstanding
    facts.set("kubelet.outstanding", [c.to_dict() for c in pending],
              *(f"{source}:{c.issued.lineno}: GetPreferredAllocation for pod {c.pod_uid} container "
                f"{c.container} unanswered at the end of the log ({c.waited_s:.1f}s later; a stall is "
                f"declared after {stall_after_s:g}s)" for c in pending))
    logscan.to_facts(scanner.result, "kubelet.log", logscan.KUBELET_PATTERNS, facts)


def _scan_file(path: str, patterns: dict[str, str], prefix: str, facts: Facts) -> None:
    stream = open_log(path)
    logscan.to_facts(logscan.scan(stream, patterns, path), prefix, patterns, facts)
    stream.check()


def collect_plugin_log(ctx: Context, facts: Facts) -> None:
    if ctx.plugin_log:
        _scan_file(ctx.plugin_log, logscan.PLUGIN_PATTERNS, "plugin.log", facts)


def collect_hami_core_log(ctx: Context, facts: Facts) -> None:
    if ctx.hami_core_log:
        _scan_file(ctx.hami_core_log, logscan.HAMI_CORE_PATTERNS, "hamicore.log", facts)
