"""The chaos soak: ``python -m benchmarks chaos [--seconds N] [--seed S] [--nodes 4]`` (``make chaos``).

A simulated cluster (``cluster.py``) runs under the seeded fault schedule and pod churn of ``plan.py`` for
``--seconds``; then faults and churn stop and the system gets a bounded quiet period to converge; then
the invariant checker and the soak's own records decide (``report.py``). One JSON line on stdout; exit
code 0 only when every count that must be 0 is 0 and the NVML process counts are within their bounds.
A failure prints the seed and the exact command that replays the same plan.

Not part of ``make bench`` (it is a soak, not a performance figure): run it by name.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import shutil
import signal
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

RUN_BY_DEFAULT = False  # `python -m benchmarks` without names skips it


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks chaos", description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=60.0, help="length of the fault phase (default 60)")
    p.add_argument("--seed", type=int, default=None, help="fault schedule seed (default: drawn and printed)")
    p.add_argument("--nodes", type=int, default=4, help="simulated GPU nodes (default 4)")
    p.add_argument("--quiet", type=float, default=None,
                   help="bounded wait for convergence after the faults (default 30s; long runs up to 120s)")
    p.add_argument("--stall-margin", type=float, default=5.0,
                   help="an RPC slower than the plugin's deadline + this many seconds is a stall (default 5)")
    p.add_argument("--workdir", default=None, help="logs and state (default: a temporary directory, removed "
                   "after a passing run unless --keep)")
    p.add_argument("--keep", action="store_true", help="keep the work directory after a passing run")
    p.add_argument("--plan", action="store_true", help="print the fault plan as JSON and exit")
    p.add_argument("--run-id", default="", help="marker put in every process's environment (HAMI_CHAOS_RUN); "
                   "a caller can kill whatever is left of the run by it (default: pid, seed and time)")
    p.add_argument("--no-goals", dest="no_goals", action="store_true",
                   help="accepted for the runner: the soak's verdict is its invariants, always judged")
    args = p.parse_args(argv)
    if args.seconds <= 0 or args.nodes < 1 or args.nodes > 16:
        p.error("--seconds must be > 0 and --nodes 1..16")
    return args


def reproduce(args: argparse.Namespace, seed: int) -> str:
    return f"python -m benchmarks chaos --seconds {args.seconds:g} --seed {seed} --nodes {args.nodes}"


def _sigterm(*_: Any) -> None:
    raise KeyboardInterrupt("SIGTERM")


def converge(cluster: Any, quiet_s: float) -> tuple[bool, float, str]:
    """Wait (at most ``quiet_s``) until the system has settled: both extender replicas ready, every pending
    pod refused by kube-scheduler since then for a fit reason (an error, e.g. no leader yet, is retried),
    no bound pod waiting for its admission, no kubelet busy, and the invariants hold. Returns (settled,
    seconds waited, what was still unsettled when it gave up)."""
    from benchmarks.chaos.cluster import http_ok
    from hami_agent.doctor.invariants import check

    start = time.monotonic()
    sim = cluster.scheduler
    marker: int | None = None  # index into kube-scheduler's failures once both replicas were ready
    why = ""
    while True:
        if marker is None and all(http_ok(u + "/readyz") for u in cluster.extender_urls):
            marker = len(sim.failures)
        api = cluster.api
        pods = api.list("Pod")
        admitted = {a.uid for n in cluster.nodes.values() for a in n.kubelet.admissions}
        last = {key: msg for key, msg in sim.failures[marker or 0:]}  # latest outcome per pod since then
        untried, waiting = [], []
        for p in pods:
            md, spec = p["metadata"], p.get("spec") or {}
            if (p.get("status") or {}).get("phase") != "Pending":
                continue
            key = f"{md.get('namespace')}/{md['name']}"
            if not spec.get("nodeName") and (marker is None or not last.get(key, "").startswith("0/")):
                untried.append(key)  # not yet refused for a fit reason ("0/4 nodes are available: ...")
            elif spec.get("nodeName") and md.get("uid") not in admitted:
                waiting.append(key)
        busy = [n.name for n in cluster.nodes.values() if n.kubelet.in_admission() or n.kubelet.waiting()]
        rep = check(api.list("Node"), pods)
        if marker is not None and not untried and not waiting and not busy and rep.ok:
            return True, time.monotonic() - start, ""
        why = (f"extenders ready: {marker is not None}; {len(untried)} pending pods not refused for a fit "
               f"reason since; "
               f"{len(waiting)} bound pods not admitted; kubelets busy: {busy}; "
               f"invariants: {rep.by_kind() or 'hold'}")
        if time.monotonic() - start > quiet_s:
            return False, time.monotonic() - start, why
        time.sleep(0.5)


def run(args: argparse.Namespace, seed: int, workdir: Path) -> tuple[dict, dict, list[str]]:
    import logging

    status = sys.stderr  # progress lines; everything the simulators print goes to harness.log
    harness_log = open(workdir / "harness.log", "a")  # noqa: SIM115 - closed in finally
    logging.basicConfig(level=logging.INFO, stream=harness_log, force=True,
                        format="%(asctime)s %(threadName)s %(name)s %(levelname)s %(message)s")
    sys.stderr = harness_log
    try:
        return _run(args, seed, workdir, status)
    finally:
        sys.stderr = status
        logging.shutdown()
        harness_log.close()


def _run(args: argparse.Namespace, seed: int, workdir: Path, status: Any) -> tuple[dict, dict, list[str]]:
    from benchmarks.chaos import report
    from benchmarks.chaos.churn import Churn
    from benchmarks.chaos.cluster import Cluster, Settings
    from benchmarks.chaos.faults import FaultRunner
    from benchmarks.chaos.observe import Watcher
    from benchmarks.chaos.plan import make_plan

    settings = Settings()
    plan = make_plan(seed, args.seconds, args.nodes, settings.gpus_per_node)
    (workdir / "plan.json").write_text(plan.to_json())
    quiet_s = args.quiet if args.quiet is not None else min(120.0, max(30.0, args.seconds / 10))
    counts: dict[str, Any] = {"seconds": args.seconds, "seed": seed}
    harness_errors: list[str] = []
    t_setup = time.monotonic()
    cluster = Cluster(workdir, plan.nodes, seed, settings, run_id=args.run_id)
    with cluster:
        setup_s = time.monotonic() - t_setup
        print(f"chaos: cluster up in {setup_s:.1f}s ({len(plan.nodes)} nodes, plan {plan.digest}: "
              f"{len(plan.faults)} faults, {len(plan.pods)} pods); faults for {args.seconds:g}s",
              file=status, flush=True)
        watcher = Watcher(cluster)
        faults = FaultRunner(cluster, plan, workdir / "faults.jsonl")
        churn = Churn(cluster, plan)
        t0 = time.monotonic()
        for part in (watcher, faults, churn):
            part.start(t0)
        try:
            time.sleep(max(0.0, t0 + args.seconds - time.monotonic()))
        except BaseException:
            watcher.stop()  # interrupted: no restarts while the cluster is torn down
            raise
        finally:
            churn.stop()
            faults.stop()
        print(f"chaos: faults over ({faults.counts()}); quiet period (at most {quiet_s:g}s)",
              file=status, flush=True)
        converged, waited, why = converge(cluster, quiet_s)
        assert cluster.api is not None
        now = time.monotonic()
        admissions = [a for n in cluster.nodes.values() for a in n.kubelet.admissions]
        state, details = report.state_counts(
            cluster.api.list("Node"), cluster.api.list("Pod"), admissions, cluster.rpc_log.snapshot(),
            cluster.api.writes(), stall_limit_s=settings.rpc_deadline_s + args.stall_margin, now=now)
        watcher.stop()
        watcher.sample()
        counts.update(state)
        harness_errors += faults.errors + churn.errors + watcher.errors
        counts.update({
            "max_nvml_processes": watcher.max_nvml.value,
            "max_abandoned_workers": watcher.max_abandoned.value,
            "nvml_peak_at": f"{watcher.max_nvml.where} at {watcher.max_nvml.at}s",
            "max_d_state_workers": watcher.max_d_state,
            "agent_rss": watcher.rss_growth(),
            "k": settings.max_abandoned_workers,
            "unkillable_model": faults.unkillable_model,
            "faults": faults.counts(),
            "faults_skipped": faults.skipped(),
            "pods_created": churn.created,
            "pods_deleted": churn.deleted,
            # the churn's weight: admissions over the fault phase (the default plan aims at >= 2/s)
            "pods_admitted_per_s": round(state.get("pods_admitted", 0) / args.seconds, 2),
            "converged": converged,
            "converge_s": round(waited, 1),
            "setup_s": round(setup_s, 1),
            "plan": plan.digest,
            "nodes": args.nodes,
        })
        if not converged:
            details["not_converged"] = [why]
        agents = cluster.agents()
    # the cluster is down: every log is complete, every exit code known
    tb = report.scan_tracebacks([a.log_path for a in agents])
    unclean = [f"{a.name}: exit {e.rc}{' (SIGKILLed after the SIGTERM timeout)' if e.forced else ''}"
               for a in agents for e in a.unclean_stops()]
    crash_lines = [f"{a.name} exited with code {e.rc} at {e.at - t0:.1f}s (log {a.log_path})"
                   for a in agents for e in a.crashes()]
    counts["crashes"] = len(crash_lines) + tb.count
    counts["tracebacks"] = tb.count
    counts["unclean_stops"] = len(unclean)
    counts["max_stop_s"] = round(max((e.took_s for a in agents for e in a.exits
                                      if e.expected and e.sig == signal.SIGTERM), default=0.0), 1)
    counts["harness_errors"] = len(harness_errors)
    details.update({"crashes": crash_lines + tb.samples, "unclean_stops": unclean,
                    "harness_errors": harness_errors})
    return counts, details, report.verdict(counts, settings.max_abandoned_workers)


def environment() -> dict[str, Any]:
    return {"machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} CPUs",
            "load_1m": round(os.getloadavg()[0], 1),  # when the run started
            "date": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}


def load_at_end() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())  # 1, 5 and 15 minutes


def main(argv: list[str] | None = None) -> int:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 10**6)
    if args.plan:
        from benchmarks.chaos.plan import make_plan

        print(make_plan(seed, args.seconds, args.nodes).to_json())
        return 0
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix=f"hami-chaos-{seed}-"))
    workdir.mkdir(parents=True, exist_ok=True)
    old = signal.signal(signal.SIGTERM, _sigterm)
    started = time.monotonic()
    env = environment()
    try:
        counts, details, failures = run(args, seed, workdir)
    except KeyboardInterrupt:
        print(f"chaos: interrupted; seed {seed}; logs in {workdir}", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, old)
    from benchmarks.chaos.report import json_line

    counts["wall_s"] = round(time.monotonic() - started, 1)
    counts["load_at_end"] = load_at_end()
    counts["harness_max_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    counts.update(env)
    line = json.dumps(json_line(counts))
    (workdir / "details.json").write_text(json.dumps(details, indent=2))
    (workdir / "result.json").write_text(line + "\n")
    print(line, flush=True)
    if failures:
        print(f"chaos: FAILED with seed {seed}: {', '.join(failures)}", file=sys.stderr)
        for name, lines in details.items():
            for line in lines[:10]:
                print(f"chaos:   {name}: {line}", file=sys.stderr)
        print(f"chaos: reproduce with: {reproduce(args, seed)}   (logs: {workdir})", file=sys.stderr)
        return 1
    if not args.keep and not args.workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    else:
        print(f"chaos: logs in {workdir}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
