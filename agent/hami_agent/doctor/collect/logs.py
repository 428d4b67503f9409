"""Evidence from logs: the kubelet (file or ``journalctl -u kubelet``), the device plugin, HAMi-core."""

from __future__ import annotations

import subprocess

from hami_agent.doctor import logscan
from hami_agent.doctor.collect.base import Context
from hami_agent.doctor.kubeletlog import analyse_kubelet_log
from hami_agent.doctor.model import Facts


def _read_lines(path: str) -> list[str]:
    with open(path, encoding="utf-8", errors="replace") as fh:
        return fh.readlines()


def journal_lines(ctx: Context) -> list[str]:
    """``journalctl -u kubelet --since ...`` with a timeout (a wedged journald must not wedge us)."""
    cmd = ["journalctl", "-u", "kubelet", "--since", ctx.journal_since, "--no-pager", "-o", "short"]
    try:
        cp = subprocess.run(cmd, capture_output=True, text=True, timeout=ctx.journal_timeout_s, check=False)
    except FileNotFoundError as exc:
        raise RuntimeError(f"{' '.join(cmd)}: journalctl not found; pass --kubelet-log FILE") from exc
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"{' '.join(cmd)} did not finish within {ctx.journal_timeout_s:g}s") from exc
    if cp.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {cp.returncode}: {cp.stderr.strip()[:200]}")
    return cp.stdout.splitlines(keepends=True)


def collect_kubelet_log(ctx: Context, facts: Facts) -> None:
    if ctx.kubelet_log:
        lines, source = _read_lines(ctx.kubelet_log), ctx.kubelet_log
    elif ctx.use_journal:
        lines, source = journal_lines(ctx), f"journalctl -u kubelet --since {ctx.journal_since}"
    else:
        return
    kubelet_log_facts(lines, source, ctx.stall_after_s, ctx.year, facts)


def kubelet_log_facts(lines: list[str], source: str, stall_after_s: float, year: int, facts: Facts) -> None:
    analysis = analyse_kubelet_log(lines, source=source, stall_after_s=stall_after_s, year=year)
    facts.set("kubelet.log.source", source,
              f"{source}: {analysis.lines_total} lines, {analysis.klog_lines} klog lines, "
              f"{len(analysis.calls)} GetPreferredAllocation calls")
    facts.set("kubelet.log.klog_lines", analysis.klog_lines)
    if analysis.hosts:
        facts.set("kubelet.log.hosts", analysis.hosts,
                  f"{source}: journald host(s) {', '.join(analysis.hosts)}")
    facts.set("kubelet.preferred_calls", len(analysis.calls))
    facts.set("kubelet.answered_calls", len(analysis.answered))
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
    scan = logscan.scan(lines, logscan.KUBELET_PATTERNS, source)
    logscan.to_facts(scan, "kubelet.log", logscan.KUBELET_PATTERNS, facts)


def collect_plugin_log(ctx: Context, facts: Facts) -> None:
    if not ctx.plugin_log:
        return
    scan = logscan.scan(_read_lines(ctx.plugin_log), logscan.PLUGIN_PATTERNS, ctx.plugin_log)
    logscan.to_facts(scan, "plugin.log", logscan.PLUGIN_PATTERNS, facts)


def collect_hami_core_log(ctx: Context, facts: Facts) -> None:
    if not ctx.hami_core_log:
        return
    scan = logscan.scan(_read_lines(ctx.hami_core_log), logscan.HAMI_CORE_PATTERNS, ctx.hami_core_log)
    logscan.to_facts(scan, "hamicore.log", logscan.HAMI_CORE_PATTERNS, facts)
