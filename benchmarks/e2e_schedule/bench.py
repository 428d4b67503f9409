"""End-to-end scheduling throughput on a SIMULATED cluster (issue 18 item 4): kube-scheduler simulator +
the real extender (``hami-agent scheduler`` process: /filter, /bind, node lock) + simulated kubelets + the
real device plugin's Allocate (lock-owner lookup, write-back, lock release); see ``cluster.py``.

Two cases, each run with the extender and again with it switched off (kube-scheduler alone on
``nvidia.com/gpu`` counts, a plain device plugin). Pods are created as a workload controller creates them:
concurrently, at most ``CREATE_IN_FLIGHT`` (16) requests in flight; the creation rate is printed beside
every run.

* ``job40``: a 40-pod job (1 GPU, 4 GiB, 10 cores each) onto one node with 8 GPUs split 10, kube-scheduler
  running while the pods are created: time from the first create to the last pod ``Running``; goal <= 10 s.
* ``fleet``: 1,000 such pods over 100 nodes (node hosts in processes of their own), every pod created
  before kube-scheduler starts (its queue holds them all, as after a kube-scheduler restart or behind a
  large job): pods/s from kube-scheduler's start to the last ``Running``, so that the rate at which pods
  are created does not cap either variant; goal >= 50 % of the extender-off run. (With pods created one
  at a time while kube-scheduler ran, the extender-off run only measured the creation rate.) Also
  printed: binds/s from the first binding to the last. Run a third time with the
  extender's node policy ``spread``, and a fourth with ``--strict-node-order`` (HAMi's node choice: binpack
  sends consecutive pods to the same node even while one is admitted there, and its node lock then
  serializes their bindings; by default the extender prefers another node that fits, scheduler/state/busy.py).

The node-lock hold time is measured from the lock's appearance on the Node (the extender's /bind) to its
removal (the device plugin's Allocate released it), as seen by a watch on the nodes; the extender-off run
takes no lock. Exit status 1 when a goal is missed (``--no-goals``: 0, report only).

Run: ``python -m benchmarks e2e_schedule`` (or ``make bench``); ``--quick``: 200 pods over 20 nodes;
``--pin``: each process on cores of its own (``pinning.py``; a machine with 14 or more cores).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

from benchmarks import goals
from benchmarks.e2e_schedule.cluster import CREATE_IN_FLIGHT, SimCluster
from benchmarks.e2e_schedule.pinning import CORES_EACH, CorePlan, plan_cores
from hami_agent.scheduler.verbs.extender import SchedulerConfig
from tests.sim import kube_scheduler as ks

SUMMARY: list[tuple[str, str, str, bool]] = []  # the last run's figures, for make bench's table


def pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


class _VerbTimes:
    """Times kube-scheduler's extender calls by verb (the simulator runs in this process)."""

    def __init__(self) -> None:
        self.times: dict[str, list[float]] = {}
        self._real = ks.ExtenderClient.post

    def __enter__(self) -> _VerbTimes:
        real, times = self._real, self.times

        def post(client: Any, verb: str, body: Any) -> Any:
            t0 = time.monotonic()
            try:
                return real(client, verb, body)
            finally:
                times.setdefault(verb, []).append(time.monotonic() - t0)

        ks.ExtenderClient.post = post  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        ks.ExtenderClient.post = self._real  # type: ignore[method-assign]


def run_case(n_nodes: int, n_pods: int, *, extender: bool, hosts: int, timeout_s: float,
             node_policy: str = "binpack", strict: bool = False, sync_write: bool = False,
             queued: bool = False, cores: CorePlan | None = None) -> dict[str, Any]:
    """One run. ``queued``: every pod is created (concurrently, bounded) before kube-scheduler starts, and
    the rate is measured from its start to the last pod ``Running``: scheduling throughput that the rate of
    creating pods does not cap. Otherwise the clock starts at the first create (a job's user-visible time)."""
    cluster = SimCluster(n_nodes, extender=extender, hosts=hosts, cores=cores,
                         config=SchedulerConfig(event_nodes=5, node_policy=node_policy,
                                                avoid_busy_nodes=not strict, write_behind=not sync_write))
    verbs = _VerbTimes()
    try:
        t_setup = time.monotonic()
        cluster.start(hold_scheduler=queued)
        setup_s = time.monotonic() - t_setup
        with verbs:
            t_create = time.monotonic()
            if queued:
                keys_ = cluster.create_pods("job", n_pods)
                created_s = time.monotonic() - t_create
                cpu0 = cluster.cpu_seconds()
                cluster.api.accounting(reset=True)  # API requests from here on
                t0 = time.monotonic()
                cluster.start_scheduler()
            else:
                cpu0 = cluster.cpu_seconds()
                cluster.api.accounting(reset=True)
                t0 = t_create
                keys_ = cluster.create_pods("job", n_pods)
                created_s = time.monotonic() - t_create
            ok = cluster.wait_running(keys_, timeout_s)
        with cluster._lock:  # noqa: SLF001 - the observer's record
            done = [cluster.running_at[k] for k in keys_ if k in cluster.running_at]
            bound = sorted(cluster.pod_times[k]["bound"] for k in keys_
                           if "bound" in cluster.pod_times.get(k, {}))
        last = max(done) if done else time.monotonic()
        wall = last - t0
        cpu = {k: v - cpu0[k] for k, v in cluster.cpu_seconds().items()}
        requests: dict[str, dict[str, int]] = {}  # agent -> verb -> requests (the bench's observers excluded)
        for row in cluster.api.accounting()["rows"]:
            agent = row["agent"].rsplit(") ", 1)[-1]  # the component of hami-agent's User-Agent
            if agent != "bench":
                verbs_ = requests.setdefault(agent, {})
                verbs_[row["verb"]] = verbs_.get(row["verb"], 0) + row["requests"]
        time.sleep(0.5)  # the last lock release reaches the observer's watch
        holds = cluster.lock_holds()
        not_held = cluster.pinning_not_held()
        sim = cluster.sim
        return {"nodes": n_nodes, "pods": n_pods, "extender": extender, "policy": node_policy,
                "strict_node_order": strict, "sync_filter_write": sync_write,
                "cpu_ms_per_pod": {k: v * 1e3 / max(1, len(done)) for k, v in cpu.items()},
                "api_requests_per_pod": {a: {v: n / max(1, len(done)) for v, n in vs.items()}
                                         for a, vs in requests.items()},
                "all_running": ok,
                "running": len(done), "failed": len(cluster.failed), "wall_s": wall, "create_s": created_s,
                "queued": queued, "create_per_s": n_pods / created_s if created_s > 0 else 0.0,
                "first_bind_s": (bound[0] - t0) if bound else None,
                "binds_per_s": ((len(bound) - 1) / (bound[-1] - bound[0])
                                if len(bound) > 1 and bound[-1] > bound[0] else 0.0),
                "pods_per_s": len(done) / wall if wall > 0 else 0.0, "setup_s": setup_s,
                "lock_holds": len(holds), "lock_p50_ms": pct(holds, 0.5) * 1e3,
                "lock_p99_ms": pct(holds, 0.99) * 1e3,
                "filter_calls": sim.filter_calls if sim else 0, "refusals": len(sim.failures) if sim else 0,
                "filter_p50_ms": pct(verbs.times.get("filter", []), 0.5) * 1e3,
                "bind_p50_ms": pct(verbs.times.get("bind", []), 0.5) * 1e3,
                "refusal_sample": sorted({m[:160] for _k, m in (sim.failures if sim else [])})[:3],
                "pinning": (None if cores is None else
                            {"cores": cores.as_dict(), "held": not not_held, "not_held": not_held[:10]})}
    finally:
        cluster.stop()


def _share(case: dict, off: dict) -> float:
    return case["pods_per_s"] / off["pods_per_s"] if off["pods_per_s"] else 0.0


def _vs_off(case: dict, off: dict) -> str:
    return f"{case['pods_per_s']:.1f} / {off['pods_per_s']:.1f} = {_share(case, off):.0%}"


def figures(job: dict[str, dict], fleet: dict[str, dict]) -> list[tuple[str, str, str, bool]]:
    """(figure, value, goal, met) rows for ``make bench``'s summary table."""
    jo, jb = job["on"], job["off"]
    fo, fb = fleet["on"], fleet["off"]
    rows = [
        (f"e2e: {jo['pods']}-pod job onto one 8-GPU node (split 10), all Running",
         f"{jo['wall_s']:.2f} s ({jo['running']}/{jo['pods']}; off: {jb['wall_s']:.2f} s; created in "
         f"{jo['create_s']:.2f} / {jb['create_s']:.2f} s, {CREATE_IN_FLIGHT} in flight)", "<= 10 s",
         jo["all_running"] and jo["wall_s"] <= 10.0),
        (f"e2e: {fo['pods']} pods over {fo['nodes']} nodes, all queued before kube-scheduler starts, "
         "pods/s to Running vs extender off",
         f"{_vs_off(fo, fb)} (created at {fo['create_per_s']:.0f} / {fb['create_per_s']:.0f} pods/s, "
         f"{CREATE_IN_FLIGHT} in flight)", ">= 50 %", fo["all_running"] and _share(fo, fb) >= 0.5),
        (f"e2e: node-lock hold p50 / p99 ({fo['nodes']} nodes)",
         f"{fo['lock_p50_ms']:.0f} / {fo['lock_p99_ms']:.0f} ms", "-", True),
    ]
    if "spread" in fleet:
        rows.append(("e2e: the same with --node-scheduler-policy spread, pods/s vs extender off",
                     _vs_off(fleet["spread"], fb), "-", True))
    if "sync-write" in fleet:
        sw = fleet["sync-write"]
        rows.append(("e2e: the same with --sync-filter-write (/filter answers after its write, as HAMi), "
                     "pods/s vs extender off",
                     f"{_vs_off(sw, fb)}; /filter p50 {sw['filter_p50_ms']:.1f} ms (default: "
                     f"{fo['filter_p50_ms']:.1f} ms)", "-", True))
    if "strict" in fleet:
        st = fleet["strict"]
        rows.append(("e2e: the same with --strict-node-order (HAMi's node choice), pods/s vs extender off",
                     f"{_vs_off(st, fb)}; lock hold p50 {st['lock_p50_ms']:.0f} ms, /bind p50 "
                     f"{st['bind_p50_ms']:.0f} ms (default: {fo['bind_p50_ms']:.0f} ms)", "-", True))
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks e2e_schedule", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="the fleet case with 200 pods over 20 nodes")
    p.add_argument("--nodes", type=int, default=None)
    p.add_argument("--pods", type=int, default=None)
    p.add_argument("--hosts", type=int, default=4, help="node-host processes for the fleet case")
    p.add_argument("--json", action="store_true")
    p.add_argument("--pin", action="store_true",
                   help=f"each process on {CORES_EACH} cores of its own: the benchmark (kube-scheduler sim), "
                        "the API server, the extender, every node host (issue 31 item 6; needs "
                        f"{CORES_EACH} x (3 + --hosts) cores, 14 with 4 hosts)")
    goals.add_flag(p)
    args = p.parse_args(argv)
    n_nodes = args.nodes or (20 if args.quick else 100)
    n_pods = args.pods or (200 if args.quick else 1000)
    cores = None
    if args.pin:
        try:
            cores = plan_cores(os.sched_getaffinity(0), args.hosts)
        except ValueError as exc:
            p.error(str(exc))
    job = {k: run_case(1, 40, extender=k == "on", hosts=0, timeout_s=60, cores=cores) for k in ("on", "off")}
    fleet = {k: run_case(n_nodes, n_pods, extender=k != "off", hosts=args.hosts, timeout_s=600,
                         node_policy="spread" if k == "spread" else "binpack", strict=k == "strict",
                         sync_write=k == "sync-write", queued=True, cores=cores)
             for k in ("on", "off", "spread", "strict", "sync-write")}
    SUMMARY[:] = figures(job, fleet)
    machine = {"cpus": os.cpu_count(), "pinned": cores.as_dict() if cores else None,
               "pinning_held": all((r.get("pinning") or {}).get("held", True)
                                   for runs in (job, fleet) for r in runs.values())}
    if args.json:
        print(json.dumps({"machine": machine, "job40": job, "fleet": fleet, "figures": SUMMARY}, indent=2))
        return goals.exit_code(SUMMARY, args.no_goals)
    print("end-to-end scheduling, SIMULATED cluster: kube-scheduler sim + extender process + kubelet sims + "
          "real device plugins (Allocate)")
    print(f"machine: {machine['cpus']} CPUs; " + (
        f"each process on cores of its own: {machine['pinned']}; pinning held in every run: "
        f"{machine['pinning_held']}" if cores else "not pinned (the kernel shares the cores)"))
    print(f"{'case':<7} {'extender':>8} {'nodes':>5} {'pods':>5} {'Running':>7} {'failed':>6} "
          f"{'create/s':>8} "
          f"{'wall s':>7} {'pods/s':>7} {'binds/s':>7} {'/filter':>7} {'refused':>7} {'locks':>5} "
          f"{'hold p50':>8} {'hold p99':>8} "
          f"{'filter p50':>10} {'bind p50':>8}")
    for case, runs in (("job40", job), ("fleet", fleet)):
        for k in runs:
            r = runs[k]
            print(f"{case:<7} {k:>8} {r['nodes']:>5} {r['pods']:>5} {r['running']:>7} {r['failed']:>6} "
                  f"{r['create_per_s']:>8.1f} {r['wall_s']:>7.2f} {r['pods_per_s']:>7.1f} "
                  f"{r['binds_per_s']:>7.1f} "
                  f"{r['filter_calls']:>7} {r['refusals']:>7} "
                  f"{r['lock_holds']:>5} {r['lock_p50_ms']:>6.0f}ms {r['lock_p99_ms']:>6.0f}ms "
                  f"{r['filter_p50_ms']:>8.1f}ms {r['bind_p50_ms']:>6.1f}ms")
            for m in r["refusal_sample"]:
                print(f"          refused: {m}")
            cpu = r["cpu_ms_per_pod"]
            print("          CPU ms per pod: " + ", ".join(f"{k} {v:.1f}" for k, v in cpu.items())
                  + f" (all {sum(cpu.values()):.1f})")
            api = r["api_requests_per_pod"]
            by_agent = (f"{a} " + "+".join(f"{n:.1f} {v}" for v, n in sorted(vs.items()))
                        for a, vs in sorted(api.items()))
            print("          API requests per pod: " + ", ".join(by_agent)
                  + f" (all {sum(sum(vs.values()) for vs in api.values()):.1f})")
    for name, value, goal, ok in SUMMARY:
        print(f"{'ok ' if ok else 'MISS'} {name}: {value} (goal {goal})")
    return goals.exit_code(SUMMARY, args.no_goals)


if __name__ == "__main__":
    raise SystemExit(main())
