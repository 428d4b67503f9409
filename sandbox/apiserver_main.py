"""Run the SIMULATED Kubernetes API server (tests/sim/apiserver.py) as a process on a fixed loopback
port and write a kubeconfig for it: ``python -m sandbox.apiserver_main --port 16443 --kubeconfig PATH``.

The data lives in memory: stopping this process is a cluster wipe (``sandbox down``). With
``--graceful-deletion`` a deleted pod that runs on a node terminates first (``deletionTimestamp``) and is
removed when its (simulated) kubelet confirms, as on a real cluster; ``--request-log FILE`` appends one JSON
line per request (time, method, path, query; the body of node writes and evictions), so a test can show
what a playbook run asked of the API.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import sys
import threading
import time
from typing import IO

from tests.sim.apiserver import ApiServer, RequestRecord

LOGGED_BODIES = ("/nodes/", "/eviction")  # bodies worth keeping: cordons, annotations, evictions


def log_requests(api: ApiServer, fh: IO[str]) -> None:
    """Append every request the server receives to ``fh`` as a JSON line."""
    lock = threading.Lock()
    keep = api._log

    def log(rec: RequestRecord) -> None:
        keep(rec)
        body = rec.body if any(p in rec.path for p in LOGGED_BODIES) and rec.method != "GET" else None
        line = json.dumps({"t": round(time.time(), 3), "method": rec.method, "path": rec.path,
                           "query": rec.query, "body": body})
        with lock:
            fh.write(line[:8000] + "\n")
            fh.flush()

    api._log = log  # type: ignore[method-assign]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m sandbox.apiserver_main", description="SIMULATED Kubernetes API server for the sandbox"
    )
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--kubeconfig", required=True, help="write a kubeconfig pointing at the server here")
    p.add_argument("--identities", metavar="DIR", help="authenticate, enforce the hami_rbac role's RBAC and "
                   "admission policy, write one kubeconfig per component to DIR and DIR/audit.jsonl on exit "
                   "(sandbox/identities.py)")
    p.add_argument("--nodes", default="", help="with --identities: comma-separated GPU node names")
    p.add_argument("--graceful-deletion", action="store_true",
                   help="pods on a node terminate until their kubelet confirms the deletion")
    p.add_argument("--request-log", help="append every request as a JSON line to this file")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s apiserver %(message)s")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    auth: dict = {}
    if args.identities:
        from tests.sim.apiserver_auth import TokenTable

        auth = {"auth": TokenTable(), "rbac": True}
    api = ApiServer(port=args.port, **auth)
    api.policy.graceful_deletion = args.graceful_deletion
    request_log = open(args.request_log, "a") if args.request_log else None  # noqa: SIM115 - lives with the server
    if request_log is not None:
        log_requests(api, request_log)
    try:
        api.start()
    except OSError as exc:
        logging.error(
            "cannot listen on 127.0.0.1:%d: %s (is another sandbox running? `python -m sandbox down`)",
            args.port,
            exc,
        )
        return 1
    tmp = args.kubeconfig + ".tmp"
    shutil.copyfile(api.kubeconfig_path, tmp)
    os.chmod(tmp, 0o644)  # the node containers read it through a bind mount
    os.replace(tmp, args.kubeconfig)
    if args.identities:
        from pathlib import Path

        from sandbox import identities

        names = identities.setup(api, [n for n in args.nodes.split(",") if n], Path(args.identities))
        logging.info("per-component identities (RBAC + admission policy enforced): %s", names)
    logging.info("serving the simulated Kubernetes API on %s (kubeconfig %s)", api.url, args.kubeconfig)
    stop.wait()
    if args.identities:
        n = identities.dump_audit(api, Path(args.identities) / "audit.jsonl")
        logging.info("wrote %d audit records to %s/audit.jsonl", n, args.identities)
    api.close()
    if request_log is not None:
        request_log.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
