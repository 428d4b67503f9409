"""``hami-agent device-plugin``: the kubelet device plugin for NVIDIA GPUs (HAMi-compatible).

Import-light on purpose: grpc, kubernetes and pynvml are imported inside ``run``.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
from typing import Any

logger = logging.getLogger(__name__)


def add_arguments(p: argparse.ArgumentParser) -> None:
    env = os.environ.get
    p.add_argument("--device-plugin-dir", default=None,
                   help="kubelet device-plugin directory (default /var/lib/kubelet/device-plugins)")
    p.add_argument("--nvml-lib", default=env("HAMI_NVML_LIBRARY"),
                   help="path of libnvidia-ml.so.1 (env HAMI_NVML_LIBRARY; default: the system's)")
    p.add_argument("--metrics-bind", default=None,
                   help="[HOST]:PORT for /metrics and /healthz (default :9394; 'none' disables)")
    p.add_argument("--rpc-deadline", type=float, default=None,
                   help="hard deadline (s) of every GetPreferredAllocation/Allocate answer (default 2)")
    p.add_argument("--api-timeout", type=float, default=None,
                   help="cap in seconds of one API lookup on a kubelet RPC path (default 1); every call gets "
                        "at most what is left of --rpc-deadline, the success write all of it")
    p.add_argument("--mode", choices=("hami-core", "mps", "mig"), default=None,
                   help="hami-core / mps sharing of full GPUs, or mig: dynamic MIG instances created per pod "
                        "at Allocate (default: node config operatingmode, else hami-core)")
    p.add_argument("--mig-strategy", choices=("none", "single", "mixed"), default=None,
                   help="how statically partitioned MIG devices are advertised (default none)")
    p.add_argument("--resource-name", default=None, help="resource of full GPUs (default nvidia.com/gpu)")
    p.add_argument("--device-split-count", type=int, default=None,
                   help="replicas per GPU (default: config deviceSplitCount, 10)")
    p.add_argument("--hook-path", default=None,
                   help="HAMi-core prefix, files under <hook-path>/vgpu (env HOOK_PATH, default /usr/local)")
    p.add_argument("--vgpu-lock-dir", default="/tmp/vgpulock", help="host directory mounted at /tmp/vgpulock")
    p.add_argument("--mps-root", default="/run/nvidia/mps", help="host root of MPS pipe directories")
    p.add_argument("--mps-control", default="nvidia-cuda-mps-control", help="MPS control binary (mps mode)")
    p.add_argument("--registration", choices=("kubelet", "plugin-watcher"), default="kubelet",
                   help="register via kubelet.sock (default) or the kubelet plugin watcher")
    p.add_argument("--plugins-registry-dir", default="/var/lib/kubelet/plugins_registry")
    p.add_argument("--health-recovery-quiet", type=float, default=30.0,
                   help="seconds a device must stay healthy before it is advertised Healthy again")
    p.add_argument("--poll-interval", type=float, default=0.25,
                   help="seconds between checks for kubelet restarts / deleted sockets / MIG lock where "
                        "inotify is unavailable (with inotify, changes wake the plugin at once)")
    p.add_argument("--mig-apply-lock", default=None,
                   help="pause while this file exists and is trusted: it and its directory owned by root and "
                        "not group/other-writable (default: the config's migApplyLockPath, else "
                        "/run/hami/mig-apply.lock)")
    p.add_argument("--mig-apply-lock-permissive", action="store_true",
                   help="honour any file at --mig-apply-lock, whoever made it (HAMi's rule; only where /tmp "
                        "is private to the container, e.g. HAMi's /tmp/hami/hami-mig-apply.lock)")
    p.add_argument("--nvml-call-timeout", type=float, default=None, help="NVML call deadline (default 5)")
    p.add_argument("--nvml-refresh-interval", type=float, default=None,
                   help="seconds between NVML inventory refreshes (default 30)")
    p.add_argument("--mig-reconcile-interval", type=float, default=5.0,
                   help="operatingmode mig: seconds between checks that destroy the MIG instances of pods "
                        "that are gone (HAMi: 5)")
    p.add_argument("--standalone", action="store_true",
                   help="run without the Kubernetes API (no node registration; hami-core Allocate then "
                        "refuses with 'no binding pod found': no node lock names a pod; MIG resources work)")
    p.add_argument("--no-node-register", action="store_true",
                   help="do not run the hami.io/node-nvidia-register loop")


def build_settings(args: argparse.Namespace, cfg: Any) -> Any:
    from hami_agent import __version__
    from hami_agent.deviceplugin.settings import PluginSettings

    node = cfg.node
    agent = cfg.agent

    def pick(value: Any, default: Any) -> Any:
        return default if value is None else value

    return PluginSettings(
        node_name=args.node_name or "",
        device_plugin_dir=pick(args.device_plugin_dir, agent.device_plugin_dir),
        resource_name=pick(args.resource_name, cfg.nvidia.resource_count_name),
        mode=pick(args.mode, node.operating_mode),
        mig_strategy=pick(args.mig_strategy, node.mig_strategy or "none"),
        device_split_count=pick(args.device_split_count, node.device_split_count),
        device_memory_scaling=node.device_memory_scaling,
        device_core_scaling=node.device_core_scaling,
        enable_numa_topology=node.enable_numa_topology,
        filter_uuids=tuple(node.filter_devices.uuids),
        filter_indexes=tuple(node.filter_devices.indexes),
        hook_path=pick(args.hook_path, os.environ.get("HOOK_PATH") or agent.hook_path),
        vgpu_lock_dir=args.vgpu_lock_dir,
        lib_cuda_log_level=node.lib_cuda_log_level or "",
        disable_core_limit=cfg.nvidia.disable_core_limit,
        plugin_version=__version__,
        mps_root=args.mps_root,
        mps_control_bin=args.mps_control,
        rpc_deadline_s=pick(args.rpc_deadline, agent.rpc_deadline_s),
        api_timeout_s=pick(args.api_timeout, 1.0),
        poll_interval_s=args.poll_interval,
        health_recovery_quiet_s=args.health_recovery_quiet,
        registration_mode=args.registration,
        plugins_registry_dir=args.plugins_registry_dir,
        mig_apply_lock=pick(args.mig_apply_lock, agent.mig_apply_lock_path),
        mig_apply_lock_permissive=bool(getattr(args, "mig_apply_lock_permissive", False)),
        mig_reconcile_interval_s=getattr(args, "mig_reconcile_interval", 5.0),
    )


def registrar_config(cfg: Any, settings: Any) -> Any:
    """The config the node register loop publishes from, with the plugin's effective settings: a
    ``--device-split-count`` flag overrides ``deviceSplitCount`` for the annotation's ``count`` as it does
    for the kubelet's replicas (the chaos soak found the annotation saying 10 slots per GPU while the
    kubelet had 4 replicas: the scheduler then placed pods the kubelet could not admit)."""
    from dataclasses import replace

    if cfg.node.device_split_count == settings.device_split_count:
        return cfg
    return replace(cfg, node=replace(cfg.node, device_split_count=settings.device_split_count))


def _config_summary(settings: Any) -> str:
    keys = ("mode", "mig_strategy", "device_split_count", "device_memory_scaling", "device_core_scaling",
            "enable_numa_topology", "hook_path", "rpc_deadline_s", "registration_mode")
    return "{" + " ".join(f"{k}:{getattr(settings, k)}" for k in keys) + "}"


def run(args: argparse.Namespace) -> int:
    from hami_agent.config import ConfigError, load_config, without_dra_devices
    from hami_agent.deviceplugin.settings import MODE_MPS, SettingsError

    try:
        cfg = load_config(args.config, args.node_name, node_config_path=args.node_config)
        cfg = without_dra_devices(cfg)  # GPUs the `dra:` section gives to `hami-agent dra` are not served
        settings = build_settings(args, cfg)
        settings.validate()
    except (ConfigError, SettingsError, OSError) as exc:
        logger.error("%s", exc)
        return 2
    if not settings.node_name and not args.standalone:
        logger.error("node name is empty: set --node-name or the NODE_NAME env (spec.nodeName via the "
                     "downward API), or use --standalone")
        return 2
    if settings.mode == MODE_MPS:
        from hami_agent.deviceplugin.mps import MpsError, check_mps_control

        try:
            check_mps_control(settings.mps_control_bin)
        except MpsError as exc:
            logger.error("%s", exc)
            return 1
    return _serve(args, cfg, settings)


def build_clients(args: argparse.Namespace, api_timeout_s: float,
                  background_timeout_s: float) -> tuple[Any, Any]:
    """The plugin's two API clients over one connection pool: the background one (register loop,
    watches, relists) has client-go's default client-side rate limit (QPS 5, burst 10); the one for
    Allocate's reads and writes and the lock release right after it has a single attempt, the RPC's
    timeout and no rate limiter: the kubelet admits one pod at a time, which bounds those requests, and
    a throttled Allocate would hold the node lock, and every pod queued behind it, for nothing."""
    from hami_agent.k8s.client import KubeClient
    from hami_agent.k8s.ratelimit import DEFAULT_BURST, DEFAULT_QPS

    client = KubeClient.from_kubeconfig(args.kubeconfig, timeout_s=background_timeout_s,
                                        component="device-plugin", qps=DEFAULT_QPS, burst=DEFAULT_BURST)
    return client, client.with_options(timeout_s=api_timeout_s, attempts=1, limiter=None)


def _dynamic_mig(args: argparse.Namespace, cfg: Any, settings: Any, pods: Any) -> Any:
    """The node's dynamic-MIG instance manager, with its own long-lived NVML worker (a hung create never
    stalls the inventory the supervisor keeps)."""
    from hami_agent.deviceplugin.dynmig import DynamicMig
    from hami_agent.deviceplugin.node_register import allowed_mig_profile_names
    from hami_agent.nvml.client import NvmlClient
    from hami_agent.nvml.mig import MigNvml

    client = NvmlClient(args.nvml_lib or cfg.agent.nvml_lib or None,
                        call_timeout_s=settings.mig_nvml_timeout_s)
    allowlist = cfg.nvidia.mig_profile_allowlist
    return DynamicMig(MigNvml(client), pods, lambda model: allowed_mig_profile_names(allowlist, model),
                      interval_s=settings.mig_reconcile_interval_s,
                      nvml_timeout_s=settings.mig_nvml_timeout_s)


def _run_dynamic_mig(mig: Any, manager: Any, stop: threading.Event) -> None:
    """Discover the MIG profiles once the inventory is known (retried every 5 s until one GPU has
    profiles), then keep the instances reconciled until ``stop``."""
    while not stop.is_set():
        snap = manager.current_snapshot()
        gpus = [g for g in getattr(snap, "gpus", ()) or () if getattr(g, "mig_capable", False)]
        if getattr(snap, "status", "") == "ok":
            skipped = mig.discover(gpus)
            for uuid, why in sorted(skipped.items()):
                logger.warning("GPU %s is not served in operatingmode mig: %s", uuid, why)
            if mig.gpus():
                break
        stop.wait(5.0)
    mig.run(stop)


def _serve(args: argparse.Namespace, cfg: Any, settings: Any) -> int:
    from hami_agent.deviceplugin.httpserver import OpsServer
    from hami_agent.deviceplugin.manager import DevicePluginManager
    from hami_agent.deviceplugin.metrics import PluginMetrics
    from hami_agent.deviceplugin.podsource import K8sPodSource, MemoryPodSource

    agent = cfg.agent
    logger.info("Initializing metrics for scheduler")  # HAMi's first line (seed 000 §1.2), kept for grep
    metrics = PluginMetrics()
    logger.info("reading config=%s resourceName=%s configfile=%s", _config_summary(settings),
                settings.resource_name, args.config or "")
    stop = threading.Event()
    informers: list[Any] = []
    client = None
    if args.standalone:
        pods: Any = MemoryPodSource(settings.node_name)
    else:
        from hami_agent.k8s.informer import Informer

        try:
            client, fast = build_clients(args, settings.api_timeout_s, agent.api_timeout_s)
        except Exception as exc:
            logger.error("cannot load kubeconfig: %s", exc)
            return 1
        pod_inf = Informer(client, "pods", field_selector=f"spec.nodeName={settings.node_name}")
        node_inf = Informer(client, "nodes", field_selector=f"metadata.name={settings.node_name}")
        informers = [pod_inf.start(), node_inf.start()]

        def check_synced() -> None:
            # not waited for before serving: registering with the kubelet early matters more, and
            # Allocate falls back to short API reads while the caches fill
            for inf, what in ((pod_inf, "pod"), (node_inf, "node")):
                if not inf.wait_synced(10.0):
                    logger.warning("%s informer not synced after 10s; Allocate falls back to API reads", what)

        threading.Thread(target=check_synced, name="informer-sync-check", daemon=True).start()
        pods = K8sPodSource(settings.node_name, fast, pod_inf, node_inf)

    def source_factory() -> Any:
        from prometheus_client import CollectorRegistry

        from hami_agent.nvml import NvmlSupervisor

        nvml_registry = CollectorRegistry()  # one per supervisor; see metrics.DelegatingCollector
        sup = NvmlSupervisor(lib_path=args.nvml_lib or agent.nvml_lib or None,
                             call_timeout_s=args.nvml_call_timeout or agent.nvml_call_timeout_s,
                             refresh_interval_s=args.nvml_refresh_interval or agent.nvml_refresh_interval_s,
                             registry=nvml_registry)
        metrics.nvml.target = nvml_registry
        return sup

    mig = None
    if settings.mode == "mig":
        mig = _dynamic_mig(args, cfg, settings, pods)
    manager = DevicePluginManager(settings, source_factory, pods, metrics, mig=mig)
    ops = None
    bind = args.metrics_bind if args.metrics_bind is not None else agent.metrics_bind
    if bind and bind != "none":
        try:
            ops = OpsServer(bind, metrics.registry, manager.healthz).start()
        except (OSError, ValueError) as exc:
            logger.error("cannot serve /metrics and /healthz on %s: %s", bind, exc)
            return 1

    registrar_thread = registrar = None
    if client is not None and not args.no_node_register:
        from hami_agent.deviceplugin.node_register import NodeRegistrar

        # The annotation advertises the mode this plugin serves (mig: the profiles dynamic MIG discovered),
        # and as many sharing slots per GPU as it advertises replicas to the kubelet.
        # The node is read from the node watch (no GET every 30 s); a change by someone else wakes the loop.
        registrar = NodeRegistrar(client, settings.node_name, manager.current_snapshot,
                                  registrar_config(cfg, settings),
                                  mode=settings.mode, mig_lock=manager.mig_lock,  # the plugin's lock and rule
                                  node_source=lambda: node_inf.get(None, settings.node_name),
                                  mig_profiles=mig.profiles if mig is not None else None)
        node_inf.add_handler(on_add=registrar.node_changed, on_update=lambda _o, n: registrar.node_changed(n))
        registrar_thread = registrar.start(stop)
    if mig is not None:
        threading.Thread(target=_run_dynamic_mig, args=(mig, manager, stop), name="dynamic-mig-start",
                         daemon=True).start()

    def on_term(signum: int, _frame: Any) -> None:
        logger.info("received signal %d, shutting down", signum)
        stop.set()
        manager.stop()
        if registrar is not None:
            registrar.wake()  # its sleep looks at ``stop`` only every few seconds by itself

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    signal.signal(signal.SIGUSR1, lambda *_: manager.toggle_pause())
    try:
        rc = manager.run()
    finally:
        stop.set()
        if registrar is not None:
            registrar.wake()
        if registrar_thread is not None:
            registrar_thread.join(2.0)
        for inf in informers:
            inf.stop()
        if ops is not None:
            ops.stop()
    return rc
