"""``hami-agent doctor pod NS/NAME | node NAME | cluster | logs --kubelet FILE | invariants``.

Import-light: the kubernetes client, NVML and shrreg are imported only when a collector needs them.
Exit codes: 0 no problem found, 1 a problem found (or evidence could not be collected), 2 usage error.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from datetime import datetime

logger = logging.getLogger(__name__)

EXIT_OK, EXIT_PROBLEM, EXIT_USAGE = 0, 1, 2


def _shared(parser: argparse.ArgumentParser) -> None:
    """Flags every doctor action accepts (after the action name)."""
    out = parser.add_argument_group("output")
    out.add_argument("--json", action="store_true", help="print the report as JSON")
    out.add_argument("--query", metavar="EXPR", help="JMESPath expression over the JSON report, e.g. "
                     "\"verdicts[?severity=='critical'].code\"")
    # cli.py's common flags also work after the action; SUPPRESS keeps a value given before it
    parser.add_argument("-v", "--v", dest="verbosity", type=int, metavar="N", default=argparse.SUPPRESS,
                        help="klog verbosity")
    parser.add_argument("--kubeconfig", default=argparse.SUPPRESS, help="kubeconfig file")
    parser.add_argument("--node-name", default=argparse.SUPPRESS, help="the node this command runs on")
    ev = parser.add_argument_group("evidence sources")
    ev.add_argument("--kubelet-log", metavar="FILE", help="kubelet log file (else journalctl -u kubelet "
                    "when run on the node)")
    ev.add_argument("--plugin-log", metavar="FILE", help="device plugin log file")
    ev.add_argument("--hami-core-log", metavar="FILE", help="a container log with HAMi-core lines")
    ev.add_argument("--scheduler-url", metavar="URL", help="scheduler extender base URL for /healthz, "
                                                           "/metrics")
    ev.add_argument("--plugin-url", metavar="URL", help="device plugin base URL for /healthz, /metrics "
                    "(e.g. http://127.0.0.1:9394)")
    ev.add_argument("--host-root", default="/", metavar="DIR", help="node filesystem root (default /)")
    ev.add_argument("--proc-root", metavar="DIR", help="node /proc (default <host-root>/proc or /proc)")
    ev.add_argument("--hook-path", default=os.environ.get("HOOK_PATH", "/usr/local"),
                    help="HAMi HOOK_PATH on the node (default /usr/local; libvgpu.so under <it>/vgpu)")
    ev.add_argument("--shrreg-root", metavar="DIR", help="shared regions (default "
                                                         "<hook-path>/vgpu/containers)")
    ev.add_argument("--local", dest="local", action="store_true", default=None,
                    help="collect node-local evidence (NVML, /sys, files, journal) on this machine")
    ev.add_argument("--no-local", dest="local", action="store_false",
                    help="never collect node-local evidence (default: only when the node is this machine)")
    ev.add_argument("--no-nvml", dest="nvml", action="store_false", default=True,
                    help="do not probe NVML (local evidence)")
    ev.add_argument("--nvml-lib", default=os.environ.get("HAMI_NVML_LIBRARY"),
                    help="libnvidia-ml.so.1 path (env HAMI_NVML_LIBRARY)")
    ev.add_argument("--no-journal", dest="journal", action="store_false", default=True,
                    help="do not run journalctl for the kubelet log")
    ev.add_argument("--journal-since", default="-2h", help="journalctl --since (default -2h)")
    ev.add_argument("--expect-mps", action="store_true", help="this node shares GPUs with MPS")
    th = parser.add_argument_group("thresholds and timeouts")
    th.add_argument("--stall-after", type=float, default=30.0, metavar="S",
                    help="log seconds with no allocation after GetPreferredAllocation = stall (30)")
    th.add_argument("--pending-after", type=float, default=60.0, metavar="S",
                    help="a pod Pending longer than this is a symptom (default 60)")
    th.add_argument("--handshake-timeout", type=float, default=60.0, metavar="S", help="default 60 (HAMi)")
    th.add_argument("--lock-expiry", type=float, default=300.0, metavar="S", help="node lock expiry (300)")
    th.add_argument("--scheduler-name", default="hami-scheduler", help="HAMi's schedulerName")
    th.add_argument("--nvml-timeout", type=float, default=10.0, metavar="S", help="NVML probe deadline")
    th.add_argument("--api-timeout", type=float, default=10.0, metavar="S", help="per API call")
    th.add_argument("--http-timeout", type=float, default=5.0, metavar="S", help="per /healthz or /metrics")
    th.add_argument("--collector-timeout", type=float, default=30.0, metavar="S",
                    help="deadline of each evidence collector")
    th.add_argument("--year", type=int, default=datetime.now().year,
                    help="year of log timestamps (klog and journald omit it)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="doctor_action", metavar="ACTION")
    p = sub.add_parser("pod", help="why is this pod Pending / failing?")
    p.add_argument("pod", metavar="NS/NAME", help="pod as namespace/name (or NAME with -n)")
    p.add_argument("-n", "--namespace", default="default")
    _shared(p)
    p = sub.add_parser("node", help="is this node's GPU stack healthy?")
    p.add_argument("node", metavar="NAME")
    _shared(p)
    p = sub.add_parser("cluster", help="all GPU nodes and pending GPU pods, findings ranked")
    p.add_argument("--max-pods", type=int, default=50, help="pending pods to examine (default 50)")
    _shared(p)
    p = sub.add_parser("logs", help="offline analysis of log files (no API, no node access)")
    p.add_argument("--kubelet", dest="kubelet_log_file", metavar="FILE", help="kubelet log (journal export "
                                                                              "ok)")
    p.add_argument("--plugin", dest="plugin_log_file", metavar="FILE", help="device plugin log")
    p.add_argument("--hami-core", dest="hami_core_log_file", metavar="FILE", help="container log")
    _shared(p)
    from hami_agent.doctor import invariants_cmd

    p = sub.add_parser("invariants", help="is anything over-committed or inconsistent right now? (all nodes "
                                          "and pods, two list calls, or a kubectl dump)")
    invariants_cmd.add_arguments(p)


def _context(args: argparse.Namespace):  # -> Context (import kept light)
    from hami_agent.doctor.collect.base import Context

    return Context(
        self_node=getattr(args, "node_name", None), host_root=args.host_root, proc_root=args.proc_root,
        hook_path=args.hook_path, shrreg_root=args.shrreg_root, kubelet_log=args.kubelet_log,
        plugin_log=args.plugin_log, hami_core_log=args.hami_core_log, use_journal=args.journal,
        journal_since=args.journal_since, scheduler_url=args.scheduler_url, plugin_url=args.plugin_url,
        http_timeout_s=args.http_timeout, nvml=args.nvml, nvml_lib=args.nvml_lib,
        nvml_timeout_s=args.nvml_timeout, expect_mps=args.expect_mps, scheduler_name=args.scheduler_name,
        handshake_timeout_s=args.handshake_timeout, lock_expiry_s=args.lock_expiry,
        stall_after_s=args.stall_after, pending_after_s=args.pending_after, year=args.year,
        collector_timeout_s=args.collector_timeout,
    )


def _client(args: argparse.Namespace, ctx) -> None:
    from hami_agent.k8s import KubeClient, KubeConfigError, RetryPolicy

    try:
        ctx.client = KubeClient.from_kubeconfig(getattr(args, "kubeconfig", None), timeout_s=args.api_timeout,
                                                retry=RetryPolicy(attempts=2, base_s=0.2, cap_s=1.0),
                                                component="doctor")
    except KubeConfigError as exc:
        ctx.kube_error = str(exc)


def _usage(msg: str) -> int:
    print(f"hami-agent doctor: error: {msg}", file=sys.stderr)
    return EXIT_USAGE


def run(args: argparse.Namespace) -> int:
    from hami_agent.doctor import diagnose, render

    action = getattr(args, "doctor_action", None)
    if not action:
        return _usage("choose an action: pod NS/NAME, node NAME, cluster, logs --kubelet FILE, invariants")
    if action == "invariants":
        from hami_agent.doctor import invariants_cmd

        return invariants_cmd.run(args)
    if action == "logs":
        args.kubelet_log = args.kubelet_log_file or args.kubelet_log
        args.plugin_log = args.plugin_log_file or args.plugin_log
        args.hami_core_log = args.hami_core_log_file or args.hami_core_log
        if not (args.kubelet_log or args.plugin_log or args.hami_core_log):
            return _usage("logs needs at least one of --kubelet FILE, --plugin FILE, --hami-core FILE")
    for flag in ("kubelet_log", "plugin_log", "hami_core_log"):
        path = getattr(args, flag)
        if path and not os.path.isfile(path):
            return _usage(f"--{flag.replace('_', '-')} {path}: no such file")
    ctx = _context(args)
    if getattr(args, "config", None) or getattr(args, "node_config", None):
        from hami_agent.config import ConfigError, load_config

        try:
            ctx.config = load_config(args.config, getattr(args, "node_name", None),
                                     node_config_path=getattr(args, "node_config", None))
        except (ConfigError, OSError) as exc:
            return _usage(f"--config/--node-config: {exc}")
    if action == "logs":
        report = diagnose.diagnose_logs(ctx)
    else:
        _client(args, ctx)
        if action == "pod":
            ns, sep, name = args.pod.partition("/")
            if not sep:
                ns, name = args.namespace, args.pod
            if not ns or not name:
                return _usage(f"pod {args.pod!r}: expected NS/NAME")
            ctx.pod_ns, ctx.pod_name = ns, name
            report = diagnose.diagnose_pod(ctx, local=args.local)
        elif action == "node":
            ctx.node_name = args.node
            report = diagnose.diagnose_node(ctx, local=args.local)
        else:
            local_node = ctx.self_node if args.local is not False else None
            report = diagnose.diagnose_cluster(ctx, local_node=local_node,
                                               max_pods=args.max_pods)
        if ctx.client is not None:
            ctx.client.close()
    if args.query:
        try:
            result = render.query(report, args.query)
        except ValueError as exc:
            return _usage(str(exc))
        print(json.dumps(result, indent=2, default=str))
    elif args.json:
        print(render.to_json(report))
    else:
        print(render.to_text(report))
    return report.exit_code()
