"""Where the CPU of one ``e2e_schedule`` fleet run goes (issue 31 item 2), in three modes:

* ``case``: the fleet case with the extender on (``bench.run_case``), its CPU ms per pod by component and
  API requests per pod as JSON. For an A/B, run it once per code version with ``PYTHONPATH`` naming the
  ``agent/`` copy under test first (every process of the simulated cluster inherits it), rounds interleaved.
* ``extender``: the same with the extender process under cProfile, a per-thread CPU clock in every thread
  (``time.thread_time``: waiting costs nothing), stats dumped to ``--out`` and the top printed.
* ``allocate``: the same with each node-host process adding up the thread CPU of the device plugin's
  Allocate path (the RPC's thread, ``Allocator.allocate``, the lock release, GetPreferredAllocation);
  prints ms per Allocate.

Run: ``python -m benchmarks.e2e_schedule.profile MODE [--nodes 20] [--pods 200] [--out DIR]``.
"""

from __future__ import annotations

import argparse
import atexit
import glob
import json
import os
import runpy
import subprocess
import sys
import tempfile
import threading
import time

SELF = "benchmarks.e2e_schedule.profile"


def _profiled(module: str, argv: list[str], out: str) -> None:
    """Run ``module`` with a thread-CPU cProfile in every thread; merged stats to ``out`` at exit."""
    import cProfile
    import pstats

    profs: list[cProfile.Profile] = []
    real_run = threading.Thread.run

    def run(self: threading.Thread) -> None:
        p = cProfile.Profile(time.thread_time)
        profs.append(p)
        p.enable()
        try:
            real_run(self)
        finally:
            p.disable()

    def dump() -> None:
        main.disable()
        stats = None
        for p in list(profs):
            try:
                s = pstats.Stats(p)
            except TypeError:  # a profile that recorded nothing
                continue
            stats = s if stats is None else (stats.add(s) or stats)
        if stats is not None:
            stats.dump_stats(out)

    threading.Thread.run = run  # type: ignore[method-assign]
    main = cProfile.Profile(time.thread_time)
    profs.append(main)
    atexit.register(dump)
    sys.argv = [module, *argv]
    main.enable()
    runpy.run_module(module, run_name="__main__", alter_sys=True)


def _allocate_cpu(module: str, argv: list[str], out: str) -> None:
    """Run ``module`` adding up the thread CPU of the device plugin's Allocate path; JSON to ``out``."""
    from hami_agent.deviceplugin import allocator, latewriter, server

    acc: dict[str, list] = {}
    lock = threading.Lock()

    def wrap(cls: type, name: str, key: str) -> None:
        real = getattr(cls, name)

        def timed(*a, **kw):
            t0 = time.thread_time()
            try:
                return real(*a, **kw)
            finally:
                with lock:
                    c = acc.setdefault(key, [0.0, 0])
                    c[0] += time.thread_time() - t0
                    c[1] += 1

        setattr(cls, name, timed)

    wrap(allocator.Allocator, "allocate", "allocate")
    wrap(latewriter.LateWriter, "_attempt", "lock release")
    wrap(server.DevicePluginServicer, "Allocate", "Allocate RPC thread")
    wrap(server.DevicePluginServicer, "GetPreferredAllocation", "GetPreferredAllocation")
    atexit.register(lambda: json.dump(acc, open(out, "w")))  # noqa: SIM115
    sys.argv = [module, *argv]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


def _run_case(nodes: int, pods: int, wrap_mode: str | None, out: str) -> dict:
    from benchmarks.e2e_schedule import bench, cluster

    target = {"extender": ["-m", "hami_agent"], "allocate": ["-m", "benchmarks.e2e_schedule.cluster"]}
    real = subprocess.Popen
    n = [0]

    def popen(cmd, *a, **kw):
        if wrap_mode and isinstance(cmd, list) and cmd[1:3] == target[wrap_mode]:
            n[0] += 1
            cmd = [cmd[0], "-m", SELF, f"wrap-{wrap_mode}", cmd[2], os.path.join(out, f"{wrap_mode}.{n[0]}"),
                   *cmd[3:]]
        return real(cmd, *a, **kw)

    cluster.subprocess.Popen = popen
    try:
        return bench.run_case(nodes, pods, extender=True, hosts=4, timeout_s=600, queued=True)
    finally:
        cluster.subprocess.Popen = real


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("wrap-extender", "wrap-allocate"):  # inside a wrapped child process
        (_profiled if argv[0] == "wrap-extender" else _allocate_cpu)(argv[1], argv[3:], argv[2])
        return 0
    p = argparse.ArgumentParser(prog=f"python -m {SELF}", description=__doc__.split("\n")[0])
    p.add_argument("mode", choices=("case", "extender", "allocate"))
    p.add_argument("--nodes", type=int, default=20)
    p.add_argument("--pods", type=int, default=200)
    p.add_argument("--out", default=None, help="directory for the profiles (default: a new temporary one)")
    args = p.parse_args(argv)
    out = args.out or tempfile.mkdtemp(prefix="e2e-profile-")
    os.makedirs(out, exist_ok=True)
    r = _run_case(args.nodes, args.pods, None if args.mode == "case" else args.mode, out)
    print(json.dumps({k: r[k] for k in ("nodes", "pods", "running", "cpu_ms_per_pod", "api_requests_per_pod",
                                        "pods_per_s")}))
    if args.mode == "extender":
        import pstats

        for f in glob.glob(os.path.join(out, "extender.*")):
            print(f"profile: {f}")
            pstats.Stats(f).sort_stats("cumulative").print_stats(40)
    elif args.mode == "allocate":
        acc: dict[str, list] = {}
        for f in glob.glob(os.path.join(out, "allocate.*")):
            for k, (s, c) in json.load(open(f)).items():
                a = acc.setdefault(k, [0.0, 0])
                a[0] += s
                a[1] += c
        calls = max((c for _s, c in acc.values()), default=0)
        per = {k: s * 1e3 / c for k, (s, c) in acc.items()}
        print(json.dumps({"allocates": calls, "ms_per_allocate": per,
                          "total_ms_per_allocate": sum(s for s, _c in acc.values()) * 1e3 / max(1, calls)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
