"""``hami-agent scheduler``: the extender + webhook process (import-light: heavy imports in ``run``)."""

from __future__ import annotations

import argparse
import os
import re

from hami_agent.protocol.annotations import (
    DEFAULT_GPU_POLICY,
    DEFAULT_NODE_POLICY,
    GPU_POLICIES,
    NODE_POLICIES,
)

_DUR = re.compile(r"(\d+(?:\.\d+)?)(h|ms|m|s)")


def parse_duration(value: str) -> float:
    """Seconds from a Go duration (``5m``, ``1m30s``, ``300ms``) or a plain number of seconds."""
    v = value.strip()
    try:
        return float(v)
    except ValueError:
        pass
    pos, total = 0, 0.0
    for m in _DUR.finditer(v):
        if m.start() != pos:
            break
        total += float(m.group(1)) * {"h": 3600, "m": 60, "s": 1, "ms": 0.001}[m.group(2)]
        pos = m.end()
    if pos != len(v) or not v:
        raise argparse.ArgumentTypeError(f"{value!r} is not a duration (e.g. 5m, 90s, 1m30s)")
    return total


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bind-address", "--http_bind", dest="bind_address", default="127.0.0.1:8080",
                   help="extender listen address host:port (HAMi default 127.0.0.1:8080; its chart serves "
                        "https on 443 with --cert-file/--key-file)")
    p.add_argument("--cert-file", "--cert_file", dest="cert_file", default="", help="TLS certificate (PEM)")
    p.add_argument("--key-file", "--key_file", dest="key_file", default="", help="TLS private key (PEM)")
    p.add_argument("--scheduler-name", default="hami-scheduler",
                   help="schedulerName set by the webhook and the event source component")
    p.add_argument("--metrics-bind", default=":9395", help="Prometheus metrics address ('' to disable)")
    p.add_argument("--leader-elect", action="store_true", help="run leader election on a Lease")
    p.add_argument("--leader-elect-namespace", default=os.environ.get("POD_NAMESPACE", "kube-system"))
    p.add_argument("--leader-elect-name", default="hami-scheduler", help="Lease name")
    # kube-scheduler's flag names and defaults; failover after a crash takes about the lease duration
    p.add_argument("--leader-elect-lease-duration", type=parse_duration, default=15.0,
                   help="how long followers wait after the last renewal before taking over (default 15s)")
    p.add_argument("--leader-elect-renew-deadline", type=parse_duration, default=10.0,
                   help="the leader stops writing (fencing) and steps down when it could not renew for "
                        "this long (default 10s; must be below the lease duration)")
    p.add_argument("--leader-elect-retry-period", type=parse_duration, default=2.0,
                   help="how often the Lease is renewed or tried (default 2s)")
    p.add_argument("--advertise-url", default="",
                   help="URL where the other replicas reach this one's /filter and /bind while it leads "
                        "(followers forward to it); default <scheme>://<bind host or FQDN>:<port>")
    p.add_argument("--forward-ca-file", default="",
                   help="CA that signed the other replicas' serving certificates (forwarding; default: the "
                        "system trust store)")
    p.add_argument("--forward-cert-file", default="",
                   help="client certificate presented when forwarding to the leader (mTLS extenders)")
    p.add_argument("--forward-key-file", default="", help="key of --forward-cert-file")
    p.add_argument("--forward-peers", default="",
                   help="comma-separated https URLs of the replicas (their --advertise-url): a follower "
                        "forwards to one of these whoever the Lease names; any other URL on the Lease only "
                        "when its certificate names the Lease holder")
    p.add_argument("--node-lock-timeout", type=parse_duration,
                   default=parse_duration(os.environ.get("HAMI_NODELOCK_EXPIRE", "5m")),
                   help="node lock expiry (Go duration; env HAMI_NODELOCK_EXPIRE; default 5m)")
    p.add_argument("--node-scheduler-policy", choices=NODE_POLICIES, default=DEFAULT_NODE_POLICY)
    p.add_argument("--strict-node-order", action="store_true",
                   help="choose the best node by policy even while another pod is being admitted there "
                        "(HAMi's choice; its /bind then waits for the node lock). Default: prefer a node "
                        "that fits and has no admission under way")
    p.add_argument("--sync-filter-write", action="store_true",
                   help="answer /filter only after the pod's assignment annotations are written (HAMi's "
                        "order). Default: answer once the decision is reserved, write in a bounded pool, and "
                        "let /bind wait for the write")
    p.add_argument("--preemption", choices=PREEMPTION_MODES, default="off",
                   help="GPU preemption (issue 29): off = HAMi's answers, a pod blocked only by "
                        "lower-priority GPU pods stays Pending (HAMi never evicts for GPUs); extender = "
                        "/filter preempts lower-priority GPU pods itself; kube-scheduler is refused at start "
                        "(not built; docs/scheduler.md \"Preemption\")")
    p.add_argument("--gpu-scheduler-policy", default=DEFAULT_GPU_POLICY,
                   help=f"{'|'.join(GPU_POLICIES)}, or a chain such as binpack,numa")
    p.add_argument("--default-mem", type=int, default=None,
                   help="MiB when a pod gives no gpumem (0 = whole card)")
    p.add_argument("--default-cores", type=int, default=None, help="gpucores when a pod gives none")
    p.add_argument("--default-gpu-num", type=int, default=None, help="nvidia.com/gpu added by the webhook")
    p.add_argument("--node-label-selector", default=None, help="only consider nodes matching this selector")
    p.add_argument("--register-interval", type=parse_duration, default=15.0, help="node register loop period")
    p.add_argument("--audit-interval", type=parse_duration, default=60.0,
                   help="how often the leader releases node locks whose owner no longer needs them and "
                        "re-reads unconfirmed cache entries (default 60s)")
    p.add_argument("--force-overwrite-default-scheduler", default="true", choices=("true", "false"))
    # /validate (scheduler/serve/guard.py): the admission policies' rules where the cluster cannot run them
    p.add_argument("--guard-scheduler-user", default="system:serviceaccount:kube-system:hami-scheduler",
                   help="/validate: the scheduler's ServiceAccount user, the one writer of HAMi allocation "
                        "keys")
    p.add_argument("--guard-plugin-user-prefix",
                   default="system:serviceaccount:kube-system:hami-device-plugin-",
                   help="/validate: a node's device plugin user is this prefix + the node name")
    p.add_argument("--max-body-bytes", type=int, default=1 << 20, help="request body limit (default 1 MiB)")
    # -- who may call /filter, /prioritize, /bind (docs/scheduler.md "Authentication")
    p.add_argument("--extender-auth", choices=("loopback", "mtls", "token"), default="loopback",
                   help="loopback: verbs on a loopback listener only (default); mtls: client certificate "
                        "signed by --client-ca-file; token: bearer token checked with TokenReview and "
                        "SubjectAccessReview")
    p.add_argument("--extender-bind-address", default="",
                   help="separate listener for the extender verbs (e.g. 127.0.0.1:9444); --bind-address then "
                        "serves the webhook, health and metrics only")
    p.add_argument("--public-listener-process", choices=("true", "false"), default="true",
                   help="with --extender-bind-address: serve --bind-address (webhook, /validate, health, "
                        "metrics) and --metrics-bind from a child process, so that nothing sent there holds "
                        "the interpreter lock the extender verbs need (default true)")
    p.add_argument("--public-listener-nice", type=int, default=10,
                   help="nice increment of that process (0-19, default 10): under a flood the verbs, and "
                        "everything else on the host, get the CPU first; the webhook still gets its share")
    p.add_argument("--client-ca-file", default="",
                   help="mtls: CA that signs kube-scheduler's client certificate")
    p.add_argument("--extender-allowed-cns", default="",
                   help="mtls: comma-separated client certificate CNs allowed (default: any the CA signed)")
    p.add_argument("--extender-token-audiences", default="",
                   help="token: comma-separated TokenReview audiences (default: the API server's)")
    # -- serving bounds (docs/scheduler.md "Serving")
    p.add_argument("--max-connections", type=int, default=1024,
                   help="open connections of each listener group (the extender verbs' listener; the webhook "
                        "and metrics listeners together); idle ones are evicted for new ones, beyond that "
                        "503 (default 1024; the unit's LimitNOFILE allows it)")
    p.add_argument("--request-workers", type=int, default=8,
                   help="request handler threads of each listener group (default 8); up to 4x as many "
                        "requests wait, then 503")
    p.add_argument("--max-connections-per-peer", type=int, default=128,
                   help="connections one client address may hold on the webhook and metrics listeners "
                        "(default 128; its oldest idle one is closed for a new one, else the new one is "
                        "refused)")
    p.add_argument("--max-requests-per-peer", type=int, default=16,
                   help="requests one client address may have in flight on the webhook and metrics "
                        "listeners (default 16; beyond: 429 with Retry-After)")
    p.add_argument("--allowed-sources", default="",
                   help="comma-separated addresses/CIDRs allowed to connect to --bind-address (the webhook's "
                        "listener: the API servers, probes; default: any). Others are closed before TLS")
    p.add_argument("--profiling", action="store_true",
                   help="serve /debug/pprof/profile?seconds=N (CPU, folded stacks) and "
                        "/debug/pprof/goroutine (thread dump)")


PREEMPTION_MODES = ("off", "extender", "kube-scheduler")


def preemption_mode(value: str) -> str:
    """The ``--preemption`` mode the scheduler can run, or ValueError naming what is missing."""
    if value in ("off", "extender"):
        return value
    if value == "kube-scheduler":
        raise ValueError("--preemption kube-scheduler: not implemented: it needs kube-scheduler v1.38's "
                         "preemption with filter extenders (kubernetes/kubernetes#135486), not yet read; "
                         "use --preemption off")
    raise ValueError(f"--preemption {value!r}: want one of {', '.join(PREEMPTION_MODES)}")


def build_config(args: argparse.Namespace):
    from hami_agent.protocol.requests import RequestConfig
    from hami_agent.scheduler.verbs.extender import SchedulerConfig

    nv = dra = None
    if getattr(args, "config", None):
        from hami_agent.config import load_config

        cfg = load_config(args.config, None)
        nv, dra = cfg.nvidia, cfg.dra
    # The nvidia: section itself carries the resource names and request defaults the protocol reads.
    names = nv if nv is not None else RequestConfig()
    flags = (("default_memory", args.default_mem), ("default_cores", args.default_cores),
             ("default_gpu_num", args.default_gpu_num))
    overrides = {k: v for k, v in flags if v is not None}
    if overrides:
        from dataclasses import replace

        names = replace(names, **overrides)
    return SchedulerConfig(
        scheduler_name=args.scheduler_name, node_policy=args.node_scheduler_policy,
        gpu_policy=args.gpu_scheduler_policy, names=names, node_lock_timeout_s=args.node_lock_timeout,
        force_overwrite_default_scheduler=args.force_overwrite_default_scheduler == "true",
        gpu_core_policy=getattr(nv, "gpu_core_policy", "default") if nv else "default",
        overwrite_env=bool(getattr(nv, "overwrite_env", False)) if nv else False,
        runtime_class_name=getattr(nv, "runtime_class_name", "") if nv else "", dra=dra,
        avoid_busy_nodes=not args.strict_node_order, write_behind=not args.sync_filter_write,
        preemption=preemption_mode(getattr(args, "preemption", "off")))


def _csv(value: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in value.split(",") if v.strip())


def build_serving(args: argparse.Namespace) -> dict:
    """The ``serving`` keyword arguments of ``SchedulerApp``: authentication and serving bounds."""
    from hami_agent.httpserve import Limits
    from hami_agent.httpserve.model import PeerLimits, parse_cidrs
    from hami_agent.scheduler.serve.auth import AuthConfig
    from hami_agent.scheduler.serve.server import parse_bind

    if args.max_connections < 16:
        raise ValueError(f"--max-connections {args.max_connections}: want at least 16")
    if not 1 <= args.request_workers <= 256:
        raise ValueError(f"--request-workers {args.request_workers}: want 1 to 256")
    if not 0 <= args.public_listener_nice <= 19:
        raise ValueError(f"--public-listener-nice {args.public_listener_nice}: want 0 to 19")
    if args.max_connections_per_peer < 1 or args.max_requests_per_peer < 1:
        raise ValueError("--max-connections-per-peer and --max-requests-per-peer: want at least 1")
    if args.extender_auth == "mtls" and not (args.client_ca_file and args.cert_file and args.key_file):
        raise ValueError("--extender-auth=mtls needs --client-ca-file, --cert-file and --key-file")
    if args.client_ca_file and args.extender_auth != "mtls":
        raise ValueError("--client-ca-file is used only with --extender-auth=mtls")
    auth = AuthConfig(mode=args.extender_auth, client_ca_file=args.client_ca_file,
                      allowed_cns=_csv(args.extender_allowed_cns),
                      token_audiences=_csv(args.extender_token_audiences), scheduler_name=args.scheduler_name)
    ext = (parse_bind(args.extender_bind_address, default_host="127.0.0.1")
           if args.extender_bind_address else None)
    limits = Limits(max_connections=args.max_connections, workers=args.request_workers,
                    max_queued=4 * args.request_workers, max_body=args.max_body_bytes)
    peers = PeerLimits(max_connections=args.max_connections_per_peer, max_inflight=args.max_requests_per_peer,
                       allowed_sources=parse_cidrs(args.allowed_sources))
    return {"auth": auth, "extender_bind": ext, "limits": limits, "peers": peers,
            "public_process": args.public_listener_process == "true" and ext is not None,
            "public_nice": args.public_listener_nice}


def run(args: argparse.Namespace) -> int:
    import logging
    import signal
    import threading

    from hami_agent.scheduler.serve.app import SchedulerApp
    from hami_agent.scheduler.serve.guard import AllocationGuard
    from hami_agent.scheduler.serve.server import parse_bind
    from hami_agent.scheduler.verbs.leadership import ForwardSettings, normalize_url

    logger = logging.getLogger("hami_agent.scheduler")
    try:
        host, port = parse_bind(args.bind_address, default_host="0.0.0.0")
        mhost_port = parse_bind(args.metrics_bind) if args.metrics_bind else None
        cfg = build_config(args)
        leader_kwargs = {"lease_duration_s": args.leader_elect_lease_duration,
                         "renew_deadline_s": args.leader_elect_renew_deadline,
                         "retry_period_s": args.leader_elect_retry_period}
        if args.leader_elect:
            from hami_agent.k8s.leader import JITTER

            if not leader_kwargs["lease_duration_s"] > leader_kwargs["renew_deadline_s"] > (
                    leader_kwargs["retry_period_s"] * JITTER):
                raise ValueError("--leader-elect-lease-duration must exceed --leader-elect-renew-deadline, "
                                 f"which must exceed {JITTER} x --leader-elect-retry-period")
        peers = _csv(args.forward_peers)
        bad = [u for u in peers if not (normalize_url(u) or "").startswith("https://")]
        if bad:
            raise ValueError(f"--forward-peers: {', '.join(bad)}: want https://host:port (kube-scheduler's "
                             "requests are never forwarded in clear text)")
        if args.leader_elect and not args.forward_ca_file:
            logger.warning("--leader-elect without --forward-ca-file: this replica will not forward to a "
                           "leader (followers verify the leader against the replicas' CA, never the system "
                           "trust store); kube-scheduler's calls to it fail while it follows")
        forward = ForwardSettings(ca_file=args.forward_ca_file or None,
                                  cert_file=args.forward_cert_file or None,
                                  key_file=args.forward_key_file or None, peers=peers)
        serving = build_serving(args)
        if args.audit_interval < 1:
            raise ValueError(f"--audit-interval {args.audit_interval:g}s: want at least 1s")
    except (ValueError, OSError) as exc:
        logger.error("bad flags: %s", exc)
        return 2
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        app = SchedulerApp.from_kubeconfig(
            args.kubeconfig, cfg, host=host, port=port, cert_file=args.cert_file or None,
            key_file=args.key_file or None, leader_elect=args.leader_elect,
            lease_namespace=args.leader_elect_namespace, lease_name=args.leader_elect_name,
            profiling=args.profiling, max_body=args.max_body_bytes, metrics_bind=mhost_port,
            register_interval_s=args.register_interval, node_label_selector=args.node_label_selector,
            tune_gc=True, leader_kwargs=leader_kwargs, advertise_url=args.advertise_url or None,
            forward=forward, serving=serving, audit_interval_s=args.audit_interval,
            guard=AllocationGuard(args.guard_scheduler_user, args.guard_plugin_user_prefix,
                                  (args.scheduler_name,), cfg.names))
        app.start()
    except ValueError as exc:  # a listener/auth combination that would not protect the verbs
        logger.error("bad flags: %s", exc)
        return 2
    except Exception as exc:
        logger.error("scheduler failed to start: %s", exc)
        return 1
    try:
        stop.wait()
    finally:
        app.stop()
    return 0
