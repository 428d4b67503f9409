"""Where the CPU of one ``e2e_schedule`` fleet run goes (issue 31 item 2), in three modes:

* ``case``: the fleet case with the extender on (``bench.run_case``), its CPU ms per pod by component and
  API requests per pod as JSON. For an A/B, run it once per code version with ``PYTHONPATH`` naming the
  ``agent/`` copy under test first (every process of the simulated cluster inherits it), rounds interleaved.
* ``extender``: the same with the extender process under cProfile, a per-thread CPU clock in every thread
  (``time.thread_time``: waiting costs nothing), stats dumped to ``--out`` and the top printed.
* ``allocate``: the same with each node-host process adding up the thread CPU of the device plugin's
  Allocate path: Allocate's and GetPreferredAllocation's own steps on the gRPC loop and their bodies on the
  ``DeadlineRunner``'s threads, and the lock release; prints ms per Allocate (grpc.aio's own work on the
  loop around the steps, and gRPC's C core, are not in it).
* ``threads``: the same with the threads of the extender and of the node-host processes mapped from their
  kernel ids to their Python names, their CPU and context switches read from ``/proc/<pid>/task/*/`` at
  the start and the end of the scheduling window (no profiler inflates it); prints both per scheduled pod
  by thread name, pools and the node hosts' processes added up.

Run: ``python -m benchmarks.e2e_schedule.profile MODE [--nodes 20] [--pods 200] [--out DIR]``. Exits 1 when
not every pod ran (a profile of a run that did not schedule measures nothing).
"""

from __future__ import annotations

import argparse
import atexit
import glob
import inspect
import json
import os
import re
import runpy
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

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


class _OwnSteps:
    """Awaits a coroutine, adding up the thread CPU of its own steps only: each step runs on the event loop
    between two awaits, and what the loop runs for other tasks in between is not counted (a thread-CPU
    clock read around the whole ``await`` would count it)."""

    def __init__(self, coro: Any, add: Callable[[float], None]) -> None:
        self.coro, self.add = coro, add

    def __await__(self) -> Any:
        value: Any = None
        error: BaseException | None = None
        while True:
            t0 = time.thread_time()
            try:
                yielded = self.coro.throw(error) if error is not None else self.coro.send(value)
            except StopIteration as stop:
                self.add(time.thread_time() - t0)
                return stop.value
            except BaseException:
                self.add(time.thread_time() - t0)
                raise
            self.add(time.thread_time() - t0)
            value, error = None, None
            try:
                value = yield yielded
            except BaseException as exc:  # noqa: BLE001 - thrown into the coroutine, as await does
                error = exc


def _allocate_cpu(module: str, argv: list[str], out: str) -> None:
    """Run ``module`` adding up the thread CPU of the device plugin's Allocate path; JSON to ``out``.

    The unary RPCs are ``async`` (grpc.aio's loop runs their own steps and hands the body to the
    ``DeadlineRunner``'s threads): each RPC is counted as its steps on the loop plus its body on the
    runner's thread, and the lock release on the late writer's thread."""
    from hami_agent import kubeletplugin
    from hami_agent.deviceplugin import latewriter, server

    acc: dict[str, list] = {}
    lock = threading.Lock()

    def add(key: str, seconds: float, calls: int) -> None:
        with lock:
            c = acc.setdefault(key, [0.0, 0])
            c[0] += seconds
            c[1] += calls

    def timed(fn: Callable, key: str) -> Callable:
        def run(*a, **kw):
            t0 = time.thread_time()
            try:
                return fn(*a, **kw)
            finally:
                add(key, time.thread_time() - t0, 1)
        return run

    def wrap_sync(cls: type, name: str, key: str) -> None:
        setattr(cls, name, timed(getattr(cls, name), key))

    def wrap_async(cls: type, name: str, key: str) -> None:
        real = getattr(cls, name)
        assert inspect.iscoroutinefunction(real), f"{cls.__name__}.{name} is not async: adapt the profile"

        async def steps(*a, **kw):
            add(key, 0.0, 1)
            return await _OwnSteps(real(*a, **kw), lambda dt: add(key, dt, 0))

        setattr(cls, name, steps)

    real_run_async = kubeletplugin.DeadlineRunner.run_async

    async def run_async(self, fn, what: str):  # the body, on the runner's thread
        return await real_run_async(self, timed(fn, f"{what.split(maxsplit=1)[0]} body"), what)

    kubeletplugin.DeadlineRunner.run_async = run_async  # type: ignore[method-assign]
    wrap_sync(latewriter.LateWriter, "_attempt", "lock release")
    wrap_async(server.DevicePluginServicer, "Allocate", "Allocate on the gRPC loop")
    wrap_async(server.DevicePluginServicer, "GetPreferredAllocation",
               "GetPreferredAllocation on the gRPC loop")
    atexit.register(lambda: json.dump(acc, open(out, "w")))  # noqa: SIM115
    sys.argv = [module, *argv]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


# The node-host processes' threads that are our device plugin's (the rest is the simulated kubelet, its gRPC
# client channels, and gRPC's C-core threads, which the plugin's server and the kubelet's client share)
PLUGIN_THREADS = frozenset({
    "rpc-body",  # DeadlineRunner: Allocate's and GetPreferredAllocation's bodies
    "grpc-aio", "Thread (_poll_wrapper)",  # grpc.aio's loop and its completion-queue poller
    "grpc-nvidia-gpu.sock",  # the socket's pool the synchronous servicers run on
    "informer-pods", "informer-nodes", "informer-pods-resync", "informer-nodes-resync",
    "late-writer", "deviceplugin-fswatch", "plugin-node",
})
SHARED_THREADS = frozenset({"event_engine", "grpc_global_tim", "lifeguard"})  # gRPC's C core


def _named_threads(module: str, argv: list[str], out: str) -> None:
    """Run ``module`` writing each thread's kernel id and Python name to ``out`` as it starts."""
    real_run = threading.Thread.run
    lock = threading.Lock()

    def run(self: threading.Thread) -> None:
        with lock, open(out, "a") as f:
            f.write(f"{threading.get_native_id()}\t{self.name}\n")
        real_run(self)

    threading.Thread.run = run  # type: ignore[method-assign]
    sys.argv = [module, *argv]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


def thread_cpu(pid: int, names_file: str) -> dict[str, tuple[float, int]]:
    """CPU seconds and context switches (voluntary + involuntary: the times it slept or was put off its
    core) by thread name of process ``pid`` (names from ``_named_threads``' file, the main thread and
    unnamed ones by their kernel name); a pool's threads (names ending in a number) added up under one
    name, as are unnamed threads by their function (``Thread-12 (_run)``). The CPU is the scheduler's
    own clock (``/proc/<pid>/task/<tid>/schedstat``, nanoseconds): a thread's utime + stime in its
    ``stat`` are sampled at the timer tick and miss most of a thread that wakes briefly and often (in
    one node-host process they added up to 1.24 s where the scheduler counted 2.13)."""
    names: dict[str, str] = {}
    if os.path.exists(names_file):
        with open(names_file) as f:
            for line in f.read().splitlines():
                tid, _, name = line.partition("\t")
                names[tid] = name
    out: dict[str, tuple[float, int]] = {}
    for d in glob.glob(f"/proc/{pid}/task/*"):
        try:
            with open(os.path.join(d, "schedstat")) as f:
                on_cpu_s = int(f.read().split()[0]) / 1e9
            with open(os.path.join(d, "status")) as f:
                status = f.read()
            with open(os.path.join(d, "comm")) as f:
                comm = f.read().strip()
        except OSError:  # the thread ended
            continue
        name = names.get(os.path.basename(d)) or comm
        switches = sum(int(line.split()[1]) for line in status.splitlines() if "ctxt_switches" in line)
        key = re.sub(r"[-_ ]?\d+$", "", re.sub(r"^Thread-\d+ ", "Thread ", name)) or name
        cpu, n = out.get(key, (0.0, 0))
        out[key] = (cpu + on_cpu_s, n + switches)
    return out


def _run_case(nodes: int, pods: int, wrap_mode: str | None, out: str) -> dict:
    from benchmarks.e2e_schedule import bench, cluster

    extender, hosts = ["-m", "hami_agent"], ["-m", "benchmarks.e2e_schedule.cluster"]
    targets = {"extender": [extender], "allocate": [hosts], "threads": [extender, hosts]}
    real = subprocess.Popen
    n = [0]
    files: dict[int, str] = {}  # pid -> its file of thread names (threads mode)

    def popen(cmd, *a, **kw):
        if wrap_mode and isinstance(cmd, list) and cmd[1:3] in targets[wrap_mode]:
            n[0] += 1
            path = os.path.join(out, f"{wrap_mode}.{n[0]}")
            cmd = [cmd[0], "-m", SELF, f"wrap-{wrap_mode}", cmd[2], path, *cmd[3:]]
            proc = real(cmd, *a, **kw)
            files[proc.pid] = path
            return proc
        return real(cmd, *a, **kw)

    snapshots: list[dict[str, dict[str, tuple[float, int]]]] = []  # component -> thread -> (CPU, switches)
    real_cpu = cluster.SimCluster.cpu_seconds

    def cpu_seconds(self: cluster.SimCluster) -> dict[str, float]:  # called at the window's start and end
        if wrap_mode == "threads" and self.extender_proc is not None:
            snap = {"extender": thread_cpu(self.extender_proc.pid, files.get(self.extender_proc.pid, "")),
                    "node hosts": {}}
            for proc in self.host_procs:
                for k, (cpu, sw) in thread_cpu(proc.pid, files.get(proc.pid, "")).items():
                    c0, s0 = snap["node hosts"].get(k, (0.0, 0))
                    snap["node hosts"][k] = (c0 + cpu, s0 + sw)
            snapshots.append(snap)
        return real_cpu(self)

    cluster.subprocess.Popen = popen
    cluster.SimCluster.cpu_seconds = cpu_seconds  # type: ignore[method-assign]
    try:
        r = bench.run_case(nodes, pods, extender=True, hosts=4, timeout_s=600, queued=True)
    finally:
        cluster.subprocess.Popen = real
        cluster.SimCluster.cpu_seconds = real_cpu  # type: ignore[method-assign]
    if len(snapshots) >= 2:
        first, last = snapshots[0], snapshots[-1]
        per = max(1, r["running"])
        r["threads_per_pod"] = {}
        for part in last:
            rows = {k: {"cpu_ms": (cpu - first[part].get(k, (0.0, 0))[0]) * 1e3 / per,
                        "switches": (sw - first[part].get(k, (0.0, 0))[1]) / per}
                    for k, (cpu, sw) in last[part].items()}
            r["threads_per_pod"][part] = dict(sorted(rows.items(), key=lambda kv: -kv[1]["cpu_ms"]))
    return r


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    wrappers = {"wrap-extender": _profiled, "wrap-allocate": _allocate_cpu, "wrap-threads": _named_threads}
    if argv and argv[0] in wrappers:  # inside a wrapped child process
        wrappers[argv[0]](argv[1], argv[3:], argv[2])
        return 0
    p = argparse.ArgumentParser(prog=f"python -m {SELF}", description=__doc__.split("\n")[0])
    p.add_argument("mode", choices=("case", "extender", "allocate", "threads"))
    p.add_argument("--nodes", type=int, default=20)
    p.add_argument("--pods", type=int, default=200)
    p.add_argument("--out", default=None, help="directory for the profiles (default: a new temporary one)")
    args = p.parse_args(argv)
    out = args.out or tempfile.mkdtemp(prefix="e2e-profile-")
    os.makedirs(out, exist_ok=True)
    r = _run_case(args.nodes, args.pods, None if args.mode == "case" else args.mode, out)
    print(json.dumps({k: r[k] for k in ("nodes", "pods", "running", "cpu_ms_per_pod", "api_requests_per_pod",
                                        "pods_per_s")}))
    if r["running"] < args.pods:  # a profile of a run that did not schedule is no profile (a broken wrapper)
        print(f"profile: only {r['running']} of {args.pods} pods are Running; logs: {out}", file=sys.stderr)
        return 1
    if args.mode == "threads":
        for part, threads in r.get("threads_per_pod", {}).items():
            print(f"{part}, per scheduled pod:")
            for k, v in threads.items():
                if v["cpu_ms"] > 0 or v["switches"] > 0:
                    print(f"  {k:36} {v['cpu_ms']:7.3f} ms CPU {v['switches']:7.2f} context switches")
            if part == "node hosts":
                for what, owns in (("our device plugin", lambda k: k in PLUGIN_THREADS),
                                   ("gRPC C core, shared", lambda k: k in SHARED_THREADS),
                                   ("the simulated kubelets",
                                    lambda k: k not in PLUGIN_THREADS and k not in SHARED_THREADS)):
                    mine = [v for k, v in threads.items() if owns(k)]
                    print(f"  = {what:34} {sum(v['cpu_ms'] for v in mine):7.3f} ms CPU "
                          f"{sum(v['switches'] for v in mine):7.2f} context switches")
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
        calls = acc.get("Allocate body", [0.0, 0])[1]
        per = {k: s * 1e3 / max(1, calls) for k, (s, _c) in acc.items()}
        print(json.dumps({"allocates": calls, "calls": {k: c for k, (_s, c) in acc.items()},
                          "ms_per_allocate": per,
                          "total_ms_per_allocate": sum(s for s, _c in acc.values()) * 1e3 / max(1, calls)}))
        if calls < r["running"]:
            print(f"profile: {calls} Allocate bodies counted for {r['running']} running pods: the wrappers "
                  "missed the RPCs", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
