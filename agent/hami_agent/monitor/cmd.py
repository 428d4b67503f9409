"""``hami-agent monitor``: scan the node's shared regions periodically and serve Prometheus metrics.

HAMi's own vGPU monitor listens on ``:9394``; in this agent ``:9394`` belongs to the device plugin and
``:9395`` to the scheduler, so the monitor defaults to ``:9396`` (change with ``--metrics-bind``).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

DEFAULT_METRICS_BIND = ":9396"
DEFAULT_INTERVAL_S = 5.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--metrics-bind",
        default=DEFAULT_METRICS_BIND,
        metavar="[HOST]:PORT",
        help="address of the /metrics endpoint (default %(default)s; HAMi's monitor uses :9394)",
    )
    parser.add_argument(
        "--dir",
        default=None,
        metavar="DIR",
        help="directory of <podUID>_<container>/ cache dirs (default: $HOOK_PATH/vgpu/containers, "
        "HOOK_PATH defaulting to /usr/local; a HOOK_PATH ending in /vgpu is used as is)",
    )
    parser.add_argument(
        "--interval",
        type=float,
        default=DEFAULT_INTERVAL_S,
        metavar="SECONDS",
        help="scan period (default %(default)s)",
    )
    parser.add_argument(
        "--legacy-metrics",
        dest="legacy_metrics",
        action="store_true",
        default=True,
        help="also export HAMi's legacy names used by its Grafana dashboard (default on)",
    )
    parser.add_argument(
        "--no-legacy-metrics",
        dest="legacy_metrics",
        action="store_false",
        help="export only the current hami_* names",
    )
    parser.add_argument(
        "--host-metrics",
        dest="host_metrics",
        action="store_true",
        default=True,
        help="also export per-GPU HostGPUMemoryUsage/HostCoreUtilization from NVML (default on; NVML runs "
        "in a child process with a deadline)",
    )
    parser.add_argument(
        "--no-host-metrics", dest="host_metrics", action="store_false", help="do not query NVML"
    )
    parser.add_argument(
        "--nvml-lib",
        default=os.environ.get("HAMI_NVML_LIBRARY"),
        metavar="PATH",
        help="libnvidia-ml.so.1 to use (env HAMI_NVML_LIBRARY; default: the system's)",
    )
    parser.add_argument(
        "--mig-apply-lock",
        default=None,
        metavar="PATH",
        help="do not call NVML while this file exists and is trusted: it and its directory owned by root "
        "and not group/other-writable (default: the config's migApplyLockPath, else "
        "/run/hami/mig-apply.lock, the nvidia_mig role's lock)",
    )
    parser.add_argument(
        "--mig-apply-lock-permissive",
        action="store_true",
        help="honour any file at --mig-apply-lock, whoever made it (HAMi's rule; only where /tmp is private "
        "to the container)",
    )
    parser.add_argument(
        "--once", action="store_true", help="scan once, print the metrics in Prometheus text format and exit"
    )
    parser.add_argument("--json", action="store_true", help="with --once: print the scan as JSON instead")


def parse_bind(bind: str) -> tuple[str, int]:
    host, sep, port = bind.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--metrics-bind {bind!r}: expected [HOST]:PORT, e.g. :9396 or 127.0.0.1:9396")
    return (host.strip("[]") or "0.0.0.0"), int(port)


class PodNames:
    """podUID -> (namespace, name) of this node's pods, for the metrics' pod labels.

    A long-running monitor keeps a watch of its node's pods (``spec.nodeName=<node>``) and reads it on
    every scan: after the first list (served from the API server's watch cache) an idle node costs the
    API server nothing. It used to list the node's pods every 30 s without a resourceVersion, a quorum
    read that makes the API server read every pod of the cluster from etcd; from 5,000 nodes that is
    ~170 such lists per second. ``--once`` lists once, from the watch cache."""

    def __init__(self, client: Any, node_name: str, watch: bool) -> None:
        self.client = client
        self.node_name = node_name
        self.informer: Any = None
        if watch:
            from hami_agent.k8s.informer import Informer

            self.informer = Informer(client, "pods", field_selector=f"spec.nodeName={node_name}",
                                     resync_s=0).start()

    def __call__(self) -> dict:
        from hami_agent.monitor.collector import PodRef

        if self.informer is not None:
            if not self.informer.synced:
                self.informer.wait_synced(2.0)  # first scans: the names fill in as soon as it syncs
            pods = self.informer.list()
        else:
            pods, _rv = self.client.list("pods", field_selector=f"spec.nodeName={self.node_name}",
                                         resource_version="0")
        out = {}
        for pod in pods:
            md = pod.get("metadata", {})
            if md.get("uid"):
                out[md["uid"]] = PodRef(namespace=md.get("namespace", ""), name=md.get("name", ""))
        return out

    def close(self) -> None:
        if self.informer is not None:
            self.informer.stop()


def _pod_resolver(args: argparse.Namespace) -> PodNames | None:
    """podUID -> (namespace, name) from the API, for pods on this node; None when no API is configured."""
    if not (args.kubeconfig or os.environ.get("KUBERNETES_SERVICE_HOST")):
        return None
    if not args.node_name:
        return None
    from hami_agent.k8s import KubeClient
    from hami_agent.k8s.ratelimit import DEFAULT_BURST, DEFAULT_QPS

    client = KubeClient.from_kubeconfig(args.kubeconfig, timeout_s=10, component="monitor", qps=DEFAULT_QPS,
                                        burst=DEFAULT_BURST)
    return PodNames(client, args.node_name, watch=not args.once)


def mig_apply_lock_path(args: argparse.Namespace) -> str:
    """``--mig-apply-lock``, else the agent config's ``migApplyLockPath``, else the default
    (``/run/hami/mig-apply.lock``)."""
    if args.mig_apply_lock:
        return args.mig_apply_lock
    if args.config:
        from hami_agent.config import load_config

        return load_config(args.config, args.node_name).agent.mig_apply_lock_path
    from hami_agent.protocol import keys

    return keys.MIG_APPLY_LOCK_PATH


def _host_source(args: argparse.Namespace, mig_lock: str):
    from hami_agent.monitor.hostgpu import HostGpuSource
    from hami_agent.nvml.client import NvmlClient

    timeout_s = max(1.0, min(10.0, args.interval * 2))
    # one worker for the monitor's lifetime, reused by every sample
    return HostGpuSource(NvmlClient(args.nvml_lib, call_timeout_s=timeout_s), mig_lock, timeout_s,
                         permissive=bool(getattr(args, "mig_apply_lock_permissive", False)))


def run(args: argparse.Namespace) -> int:
    import logging

    from hami_agent.monitor.collector import RegionMonitor
    from hami_agent.shrreg.reader import resolve_root

    logger = logging.getLogger("hami_agent.monitor.cmd")
    if args.interval <= 0:
        sys.stderr.write("hami-agent monitor: --interval must be > 0 seconds\n")
        return 2
    try:
        host, port = parse_bind(args.metrics_bind)
    except ValueError as exc:
        sys.stderr.write(f"hami-agent monitor: {exc}\n")
        return 2
    try:
        root = resolve_root(args.dir, args.config, args.node_name)
    except (OSError, ValueError) as exc:
        sys.stderr.write(f"hami-agent monitor: --config: {exc}\n")
        return 2
    try:
        mig_lock = mig_apply_lock_path(args)
    except (OSError, ValueError) as exc:
        sys.stderr.write(f"hami-agent monitor: --config: {exc}\n")
        return 2
    try:
        resolver = _pod_resolver(args)
    except Exception as exc:  # a bad kubeconfig must not stop the metrics: names fall back to pod UIDs
        logger.warning("pod names unavailable (%s); labelling pods by UID", exc)
        resolver = None
    mon = RegionMonitor(
        root,
        node_name=args.node_name or "",
        interval_s=args.interval,
        legacy=args.legacy_metrics,
        pod_resolver=resolver,
        pod_refresh_s=0.0,  # a read of the watch cache: every scan sees the names of new pods
        host_source=_host_source(args, mig_lock) if args.host_metrics else None,
    )
    try:
        return _serve(args, mon, root, host, port, logger)
    finally:
        close = getattr(mon.host_source, "close", None)
        if callable(close):
            close()  # stop the NVML worker (a stuck one is left to the reaper, never waited for)
        if resolver is not None:
            resolver.close()


def _serve(args: argparse.Namespace, mon: Any, root: str, host: str, port: int, logger: Any) -> int:
    import json
    import signal
    import threading

    from prometheus_client import CollectorRegistry, generate_latest

    from hami_agent.httpserve.ops import ops_server
    from hami_agent.monitor.collector import error_reason

    registry = CollectorRegistry()
    registry.register(mon)
    if args.once:
        res = mon.refresh()
        if args.json:
            _, pods = mon.snapshot()
            json.dump(
                {
                    "root": root,
                    "regions": [
                        {
                            "path": c.path,
                            "pod_uid": c.pod_uid,
                            "container": c.container,
                            "pod": pods[c.pod_uid].__dict__ if c.pod_uid in pods else None,
                            "region": c.region.to_dict(),
                        }
                        for c in res.containers
                    ],
                    "skipped": res.errors,
                    "corrupt": sorted(p for p, msg in res.errors.items() if error_reason(msg) == "corrupt"),
                    "refused": sorted(p for p, msg in res.errors.items() if error_reason(msg) == "refused"),
                },
                sys.stdout,
                indent=2,
            )
            sys.stdout.write("\n")
        else:
            sys.stdout.write(generate_latest(registry).decode())
        return 0
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        # the shared serving layer (bounded connections, read/idle deadlines); /metrics is read-only
        server = ops_server(args.metrics_bind, registry, name="monitor").start()
    except OSError as exc:
        logger.error("listen on %s failed: %s", args.metrics_bind, exc)
        return 1
    logger.info(
        "vGPU monitor scanning %s every %gs, metrics on %s:%d/metrics", root, args.interval, host, port
    )
    mon.start()
    try:
        stop.wait()
    finally:
        mon.stop()
        server.stop()
    logger.info("vGPU monitor stopped")
    return 0
