"""``doctor cluster`` at fleet scale: wall time and API requests of one run against the SIMULATED API server
holding 1,000 GPU nodes (8 GPUs each, register annotation and handshake) and 10,000 GPU pods (all but 20
running with HAMi's allocation annotations; the 20 pending ones with a FilteringFailed event), and the same
at a tenth of the size: the number of list calls must not grow with the cluster.

The doctor is the real CLI (``python -m hami_agent doctor cluster --no-local --json``) in a process of its
own, timed from its start to its exit (Python start-up included). The API server runs in this process and
counts the doctor's requests by its User-Agent. Figures are printed, never asserted.

Run: ``python -m benchmarks doctor_cluster`` (or ``make bench``); ``--quick`` for 100 nodes only.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import goals
from benchmarks.doctor_cluster.fleet import populate
from hami_agent.k8s.client import PAGE_SIZE

ROOT = Path(__file__).resolve().parent.parent.parent


def run_once(n_nodes: int, n_pods: int) -> dict[str, Any]:
    from tests.sim.apiserver import ApiServer

    with ApiServer(history_limit=max(100_000, 2 * (n_nodes + n_pods))) as api:
        t0 = time.perf_counter()
        populate(api, n_nodes, n_pods, pending=20)
        populate_s = time.perf_counter() - t0
        api.accounting.reset()
        t1 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "hami_agent", "doctor", "cluster", "--kubeconfig",
                               api.kubeconfig_path, "--no-local", "--json"],
                              cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
        wall = time.perf_counter() - t1
        tally = api.accounting.by(agent_contains=" doctor")
    try:
        report = json.loads(proc.stdout)
    except json.JSONDecodeError as exc:
        raise RuntimeError(f"doctor cluster gave no JSON report (rc {proc.returncode}): "
                           f"{proc.stderr[-2000:]}") from exc
    children = report.get("children") or []
    pages = sum(-(-n // PAGE_SIZE) or 1 for n in (n_nodes, n_pods, 20))  # nodes, pods, 20 pods' events
    return {"nodes": n_nodes, "pods": n_pods, "wall_s": wall, "expected_pages": pages,
            "populate_s": populate_s,
            "rc": proc.returncode,
            "requests": {verb: t.requests for verb, t in tally.items()},
            "bytes_out": sum(t.bytes_out for t in tally.values()),
            "node_reports": sum(1 for c in children if c.get("command") == "node"),
            "pod_reports": sum(1 for c in children if c.get("command") == "pod")}


def figures(results: list[dict[str, Any]]) -> list[tuple[str, str, str, bool]]:
    """(figure, value, goal, met) rows for ``make bench``'s summary table."""
    big = max(results, key=lambda r: r["nodes"])
    small = min(results, key=lambda r: r["nodes"])
    # three lists (nodes, pods, pod events), each paginated like client-go's pager: the requests are the
    # pages of those three lists, so they grow with the objects (PAGE_SIZE a page), never per node
    lists_big = sum(n for v, n in big["requests"].items() if v.startswith("list"))
    lists_small = sum(n for v, n in small["requests"].items() if v.startswith("list"))
    others = sum(n for r in (big, small) for v, n in r["requests"].items() if not v.startswith("list"))
    rows = [(f"doctor cluster: wall time, {big['nodes']} nodes / {big['pods']} pods",
             f"{big['wall_s']:.2f} s", "<= 5 s", big["wall_s"] <= 5.0)]
    if big is not small:
        three = lists_small == small["expected_pages"] and lists_big == big["expected_pages"] and not others
        rows.append((f"doctor cluster: API requests at {small['nodes']} / {big['nodes']} nodes",
                     f"{lists_small} / {lists_big} = the pages of 3 lists ({PAGE_SIZE} objects a page), "
                     f"{others} other requests", "3 lists, none per node", three))
    return rows


SUMMARY: list[tuple[str, str, str, bool]] = []  # the last run's figures, for make bench's table


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks doctor_cluster",
                                description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="10 and 100 nodes only (smoke run)")
    p.add_argument("--json", action="store_true")
    goals.add_flag(p)
    args = p.parse_args(argv)
    sizes = [(10, 100), (100, 1000)] if args.quick else [(100, 1000), (1000, 10000)]
    results = [run_once(n, m) for n, m in sizes]
    if args.json:
        SUMMARY[:] = figures(results)
        print(json.dumps({"sizes": results, "figures": SUMMARY}, indent=2))
        return goals.exit_code(SUMMARY, args.no_goals)
    print("doctor cluster against the SIMULATED API server (real CLI process; requests counted by the "
          "server)")
    print(f"{'nodes':>6} {'pods':>6} {'wall s':>7} {'requests by verb':<40} {'MiB read':>8} {'reports':>8} "
          "rc")
    for r in results:
        verbs = ", ".join(f"{v} {n}" for v, n in sorted(r["requests"].items()))
        print(f"{r['nodes']:>6} {r['pods']:>6} {r['wall_s']:>7.2f} {verbs:<40} "
              f"{r['bytes_out'] / 2**20:>8.1f} {r['node_reports'] + r['pod_reports']:>8} {r['rc']}")
    SUMMARY[:] = figures(results)
    for name, value, goal, ok in SUMMARY:
        print(f"{'ok ' if ok else 'MISS'} {name}: {value} (goal {goal})")
    return goals.exit_code(SUMMARY, args.no_goals)


if __name__ == "__main__":
    raise SystemExit(main())
