"""``hami-agent doctor invariants`` (and ``kubectl hami doctor invariants``): is the cluster's GPU
allocation state consistent right now? Runs the invariant checker (``doctor/invariants.py``) over every
node and pod, read with exactly two list calls (nodes, pods in all namespaces) whatever the cluster's
size, or over a ``kubectl get nodes,pods -A -o json`` dump (``--from-file``, ``-`` for stdin).

Prints a table (or ``--json``); exit 0 when every invariant holds, 1 when one is broken or the objects
could not be read, 2 on a usage error (a file that is not such a dump)."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import timedelta
from typing import Any

EXIT_OK, EXIT_PROBLEM, EXIT_USAGE = 0, 1, 2
MAX_FILE_BYTES = 1 << 30  # a dump of 100,000 pods is a few hundred MB


class DumpError(ValueError):
    """The file is not a ``kubectl get nodes,pods -o json`` dump; the message says what it is instead."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--from-file", metavar="FILE",
                   help="read nodes and pods from a `kubectl get nodes,pods -A -o json` dump ('-' = stdin) "
                        "instead of the API")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--include-pending", action="store_true",
                   help="count pending pods' reservations too (default: bound pods hold devices)")
    p.add_argument("--lock-expiry", type=float, default=300.0, metavar="S",
                   help="a node lock older than this is stale (default 300, HAMi's)")
    p.add_argument("--api-timeout", type=float, default=60.0, metavar="S",
                   help="per list call (default 60: a big cluster's pod list is large)")
    p.add_argument("-v", "--v", dest="verbosity", type=int, metavar="N", default=argparse.SUPPRESS,
                   help="klog verbosity")
    p.add_argument("--kubeconfig", default=argparse.SUPPRESS, help="kubeconfig file")


def split_dump(doc: Any) -> tuple[list[dict], list[dict]]:
    """Nodes and pods of a dump: a ``List`` (``kubectl get nodes,pods -o json``), a ``NodeList`` /
    ``PodList``, a list of such documents, or one object. Other kinds are ignored; anything else that
    is not an object or list raises ``DumpError``."""
    nodes: list[dict] = []
    pods: list[dict] = []

    def walk(obj: Any, where: str) -> None:
        if isinstance(obj, list):
            for i, item in enumerate(obj):
                walk(item, f"{where}[{i}]")
            return
        if not isinstance(obj, dict):
            raise DumpError(f"{where}: want a Kubernetes object or list, got {type(obj).__name__}")
        kind = obj.get("kind")
        if isinstance(obj.get("items"), list) and (kind is None or str(kind).endswith("List")):
            default = {"NodeList": "Node", "PodList": "Pod"}.get(str(kind))
            for i, item in enumerate(obj["items"]):
                untyped = isinstance(item, dict) and default and "kind" not in item
                # `kubectl get pods -o json` leaves out the items' kind
                walk({**item, "kind": default} if untyped else item, f"{where}.items[{i}]")
        elif kind == "Node":
            nodes.append(obj)
        elif kind == "Pod":
            pods.append(obj)

    walk(doc, "dump")
    return nodes, pods


def read_dump(path: str) -> tuple[list[dict], list[dict]]:
    try:
        if path == "-":
            text = sys.stdin.read(MAX_FILE_BYTES + 1)
        else:
            with open(path, encoding="utf-8") as f:
                text = f.read(MAX_FILE_BYTES + 1)
    except (OSError, UnicodeDecodeError) as exc:
        raise DumpError(f"--from-file {path}: cannot read: {exc}") from exc
    if len(text) > MAX_FILE_BYTES:
        raise DumpError(f"--from-file {path}: larger than {MAX_FILE_BYTES >> 20} MiB")
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise DumpError(f"--from-file {path}: not JSON ({exc}); write it with `kubectl get nodes,pods -A -o "
                        "json`") from exc
    nodes, pods = split_dump(doc)
    if not nodes and not pods:
        raise DumpError(f"--from-file {path}: no Node or Pod objects in it; write it with `kubectl get "
                        "nodes,pods -A -o json`")
    return nodes, pods


def read_api(args: argparse.Namespace) -> tuple[list[dict], list[dict]]:
    """Two list calls: every node, every pod (all namespaces); at most one retry each (after a 5xx or a
    dropped connection, with backoff): each is the largest request the cluster answers."""
    from hami_agent.k8s import KubeClient, RetryPolicy

    client = KubeClient.from_kubeconfig(getattr(args, "kubeconfig", None), timeout_s=args.api_timeout,
                                        retry=RetryPolicy(attempts=2, base_s=1.0, cap_s=5.0))
    try:
        return client.list_nodes(), client.list_pods()
    finally:
        client.close()


def report_dict(rep: Any, source: str) -> dict[str, Any]:
    from hami_agent.doctor.invariant_docs import runbook_path

    return {"source": source, "ok": rep.ok, "counts": dict(rep.counts), "by_kind": rep.by_kind(),
            "violations": [{"kind": v.kind, "subject": v.subject, "detail": v.detail,
                            "runbook": runbook_path(v.kind)} for v in rep.violations]}


def to_text(out: dict[str, Any]) -> str:
    counts = ", ".join(f"{k}={v}" for k, v in sorted(out["counts"].items()))
    if out["ok"]:
        return f"hami doctor invariants ({out['source']}): all invariants hold ({counts})"
    rows = [("KIND", "SUBJECT", "DETAIL")]
    rows += [(v["kind"], v["subject"], v["detail"]) for v in out["violations"]]
    w0 = max(len(r[0]) for r in rows)
    w1 = min(60, max(len(r[1]) for r in rows))
    lines = [f"hami doctor invariants ({out['source']}): {len(out['violations'])} violation(s) "
             f"{out['by_kind']} ({counts})", ""]
    lines += [f"{k:<{w0}}  {s:<{w1}}  {d}" for k, s, d in rows]
    lines += ["", "runbooks:"] + [f"  {k}: docs/runbooks/invariants/{k}.md" for k in sorted(out["by_kind"])]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from hami_agent.doctor.invariants import check

    if args.lock_expiry <= 0 or args.api_timeout <= 0:
        print("hami-agent doctor invariants: error: --lock-expiry and --api-timeout must be > 0 seconds",
              file=sys.stderr)
        return EXIT_USAGE
    if args.from_file:
        try:
            nodes, pods = read_dump(args.from_file)
        except DumpError as exc:
            print(f"hami-agent doctor invariants: error: {exc}", file=sys.stderr)
            return EXIT_USAGE
        source = f"file {args.from_file}"
    else:
        from hami_agent.k8s import KubeConfigError, KubeError

        try:
            nodes, pods = read_api(args)
        except (KubeConfigError, KubeError, OSError) as exc:
            print(f"hami-agent doctor invariants: cannot list nodes and pods: {exc}", file=sys.stderr)
            return EXIT_PROBLEM
        source = "API"
    rep = check(nodes, pods, lock_expiry=timedelta(seconds=args.lock_expiry),
                include_pending=args.include_pending)
    out = report_dict(rep, source)
    print(json.dumps(out, indent=2) if args.json else to_text(out))
    return EXIT_OK if rep.ok else EXIT_PROBLEM
