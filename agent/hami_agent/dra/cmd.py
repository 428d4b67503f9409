"""``hami-agent dra``: the DRA driver for this node's NVIDIA GPUs (docs/dra.md).

Import-light on purpose: grpc, kubernetes and pynvml are imported inside ``run``.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
from typing import Any

logger = logging.getLogger(__name__)


def add_arguments(p: argparse.ArgumentParser) -> None:
    env = os.environ.get
    p.add_argument("--driver-name", default=None,
                   help="DRA driver name (default: config dra.driverName, gpu.hami.io)")
    p.add_argument("--plugins-dir", default="/var/lib/kubelet/plugins",
                   help="the plugin socket is <dir>/<driver>/dra.sock (default /var/lib/kubelet/plugins)")
    p.add_argument("--kubelet-plugins-dir", default=None,
                   help="the same directory as the kubelet sees it, when the driver runs in a container")
    p.add_argument("--plugins-registry-dir", default="/var/lib/kubelet/plugins_registry",
                   help="kubelet plugin watcher directory (registration socket <driver>-reg.sock)")
    p.add_argument("--cdi-dir", default="/var/run/cdi", help="where CDI specs of prepared claims are written")
    p.add_argument("--state-dir", default="/var/lib/hami/dra", help="checkpoint of prepared claims")
    p.add_argument("--nvml-lib", default=env("HAMI_NVML_LIBRARY"),
                   help="path of libnvidia-ml.so.1 (env HAMI_NVML_LIBRARY; default: the system's)")
    p.add_argument("--metrics-bind", default=":9397",
                   help="[HOST]:PORT for /metrics and /healthz (default :9397; 'none' disables)")
    p.add_argument("--rpc-deadline", type=float, default=5.0,
                   help="hard deadline (s) of every NodePrepareResources/NodeUnprepareResources answer "
                        "(default 5; the kubelet gives up after 45)")
    p.add_argument("--api-timeout", type=float, default=2.0,
                   help="cap in seconds of the one claim lookup a prepare may make on a cache miss "
                        "(default 2)")
    p.add_argument("--hook-path", default=None,
                   help="HAMi-core prefix, files under <hook-path>/vgpu (env HOOK_PATH, default /usr/local)")
    p.add_argument("--vgpu-lock-dir", default="/tmp/vgpulock", help="host directory mounted at /tmp/vgpulock")
    p.add_argument("--health-recovery-quiet", type=float, default=30.0,
                   help="seconds a device must stay healthy before its unhealthy taint is removed")
    p.add_argument("--unhealthy-taint-effect", choices=("NoSchedule", "NoExecute"), default="NoSchedule",
                   help="effect of the <driver>/unhealthy device taint (NoExecute also evicts running pods "
                        "whose claims do not tolerate it)")
    p.add_argument("--poll-interval", type=float, default=0.25,
                   help="seconds between checks of sockets and the MIG apply lock without inotify, and "
                        "while a device waits out its recovery quiet period (else changes wake the driver)")
    p.add_argument("--mig-apply-lock", default=None,
                   help="pause NVML while this file exists (default /tmp/hami/hami-mig-apply.lock)")
    p.add_argument("--nvml-call-timeout", type=float, default=None, help="NVML call deadline (default 5)")
    p.add_argument("--nvml-refresh-interval", type=float, default=None,
                   help="seconds between NVML inventory refreshes (default 30)")


def build_settings(args: argparse.Namespace, cfg: Any) -> Any:
    from hami_agent import __version__
    from hami_agent.dra.settings import DraSettings

    agent, node = cfg.agent, cfg.node
    return DraSettings(
        node_name=args.node_name or "",
        driver_name=args.driver_name or cfg.dra.driver_name,
        partition=cfg.dra.partition_for(args.node_name),
        plugins_dir=args.plugins_dir,
        kubelet_plugins_dir=args.kubelet_plugins_dir,
        plugins_registry_dir=args.plugins_registry_dir,
        cdi_dir=args.cdi_dir,
        state_dir=args.state_dir,
        hook_path=args.hook_path or os.environ.get("HOOK_PATH") or agent.hook_path,
        vgpu_lock_dir=args.vgpu_lock_dir,
        device_memory_scaling=node.device_memory_scaling,
        pre_configured_device_memory=node.pre_configured_device_memory,
        lib_cuda_log_level=node.lib_cuda_log_level or "",
        disable_core_limit=cfg.nvidia.disable_core_limit,
        plugin_version=__version__,
        rpc_deadline_s=args.rpc_deadline,
        api_timeout_s=args.api_timeout,
        health_recovery_quiet_s=args.health_recovery_quiet,
        unhealthy_effect=args.unhealthy_taint_effect,
        poll_interval_s=args.poll_interval,
        mig_apply_lock=args.mig_apply_lock or agent.mig_apply_lock_path,
    )


def run(args: argparse.Namespace) -> int:
    from hami_agent.config import ConfigError, load_config
    from hami_agent.dra.settings import SettingsError

    try:
        cfg = load_config(args.config, args.node_name, node_config_path=args.node_config)
        settings = build_settings(args, cfg)
        settings.validate()
    except (ConfigError, SettingsError, OSError) as exc:
        logger.error("%s", exc)
        return 2
    return _serve(args, cfg, settings)


def _serve(args: argparse.Namespace, cfg: Any, settings: Any) -> int:  # noqa: PLR0915 - wiring only
    from hami_agent.deviceplugin.httpserver import OpsServer
    from hami_agent.dra.claims import ClaimRef, K8sClaimSource
    from hami_agent.dra.driver import DraDriver
    from hami_agent.dra.metrics import DraMetrics
    from hami_agent.dra.publisher import SlicePublisher
    from hami_agent.k8s.client import KubeClient
    from hami_agent.k8s.errors import KubeError, NotFoundError
    from hami_agent.k8s.informer import Informer

    agent = cfg.agent
    metrics = DraMetrics()
    logger.info("DRA driver %s on node %s: GPUs %s; plugin %s; CDI specs in %s", settings.driver_name,
                settings.node_name, settings.partition.describe(), settings.plugin_socket, settings.cdi_dir)
    try:
        client = KubeClient.from_kubeconfig(args.kubeconfig, timeout_s=agent.api_timeout_s)
    except Exception as exc:
        logger.error("cannot load kubeconfig: %s", exc)
        return 1
    own_slices = f"spec.nodeName={settings.node_name},spec.driver={settings.driver_name}"
    try:  # resource.k8s.io/v1 is GA since Kubernetes 1.34; older servers need a newer cluster, not retries
        client.list("resourceslices", field_selector=own_slices, timeout_s=10)
    except NotFoundError:
        logger.error("the API server does not serve resource.k8s.io/v1 (Dynamic Resource Allocation, "
                     "Kubernetes >= 1.34): upgrade the cluster or run the device plugin instead "
                     "(hami_agent_mode: device-plugin)")
        return 1
    except KubeError as exc:
        logger.warning("cannot check for resource.k8s.io/v1 now (%s); starting anyway", exc)
    fast = client.with_options(timeout_s=settings.api_timeout_s, attempts=1)
    claims_inf = Informer(client, "resourceclaims").start()
    slices_inf = Informer(client, "resourceslices", field_selector=own_slices)
    node_uid: dict[str, str] = {}

    def get_node_uid() -> str | None:
        if "uid" not in node_uid:
            try:
                node_uid["uid"] = client.get_node(settings.node_name)["metadata"]["uid"]
            except KubeError as exc:
                logger.warning("cannot read Node %s for the slices' owner reference: %s", settings.node_name,
                               exc)
                return None
        return node_uid["uid"]

    publisher = SlicePublisher(client, settings.driver_name, settings.node_name, node_uid=get_node_uid,
                               unhealthy_effect=settings.unhealthy_effect,
                               retry_max_s=settings.publish_retry_max_s, informer=slices_inf)
    publisher.on_write = lambda what: metrics.slice_writes.labels(what).inc()
    publisher.start()
    slices_inf.start()

    def claim_gone(ref: ClaimRef) -> bool:
        if claims_inf.synced and claims_inf.get(ref.namespace, ref.name) is not None:
            cached = claims_inf.get(ref.namespace, ref.name)
            if (cached.get("metadata") or {}).get("uid") == ref.uid:
                return False
        try:
            obj = client.get("resourceclaims", ref.name, ref.namespace)
        except NotFoundError:
            return True
        return (obj.get("metadata") or {}).get("uid") != ref.uid

    def source_factory() -> Any:
        from prometheus_client import CollectorRegistry

        from hami_agent.nvml import NvmlSupervisor

        registry = CollectorRegistry()
        sup = NvmlSupervisor(lib_path=args.nvml_lib or agent.nvml_lib or None,
                             call_timeout_s=args.nvml_call_timeout or agent.nvml_call_timeout_s,
                             refresh_interval_s=args.nvml_refresh_interval or agent.nvml_refresh_interval_s,
                             registry=registry)
        metrics.nvml.target = registry
        return sup

    driver = DraDriver(settings, source_factory, K8sClaimSource(fast, claims_inf, settings.driver_name),
                       publisher=publisher, metrics=metrics, claim_gone=claim_gone)
    ops = None
    if args.metrics_bind and args.metrics_bind != "none":
        try:
            ops = OpsServer(args.metrics_bind, metrics.registry, driver.healthz).start()
        except (OSError, ValueError) as exc:
            logger.error("cannot serve /metrics and /healthz on %s: %s", args.metrics_bind, exc)
            publisher.stop()
            return 1

    def on_term(signum: int, _frame: Any) -> None:
        logger.info("received signal %d, shutting down", signum)
        driver.stop()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    try:
        return driver.run()
    finally:
        for inf in (claims_inf, slices_inf):
            inf.stop()
        if ops is not None:
            ops.stop()
