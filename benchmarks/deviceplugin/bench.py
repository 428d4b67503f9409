"""Device plugin RPC latency: GetPreferredAllocation and Allocate as the kubelet sees them.

Compares our server with a *bare* gRPC server (no-op handlers, same messages, same unix-socket kind),
with NVML healthy and with NVML hung (gpusim, the SIMULATED libnvidia-ml.so.1, driver 570.158.01 on
seed 003's node: every NVML call blocks). Goal (DESIGN §2 rule 1): ours <= 3x the bare round trip and
unaffected by the hang. Each Allocate is for a fresh pending pod (annotations as HAMi's scheduler
writes them, with the node lock naming it), so the full path runs: lock-owner lookup, decode, capacity
and kubelet-choice checks, envs/mounts, host dirs, the conditional annotation patch (in-memory pod
source, no network); the lock release runs on the background writer.

Run: ``python -m benchmarks deviceplugin``, or
``python -m benchmarks.deviceplugin.bench [--calls N] [--json]``.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import logging
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import grpc

from benchmarks import goals
from hami_agent.deviceplugin.api import api_pb2, api_pb2_grpc
from hami_agent.deviceplugin.manager import DevicePluginManager
from hami_agent.deviceplugin.podsource import MemoryPodSource
from hami_agent.deviceplugin.settings import PluginSettings
from hami_agent.protocol import keys
from hami_agent.protocol.devices import NodeDevice, encode_node_devices

NODE = "bench-node"


class BareServicer(api_pb2_grpc.DevicePluginServicer):
    def GetPreferredAllocation(self, request, context):  # noqa: N802
        return api_pb2.PreferredAllocationResponse(
            container_responses=[
                api_pb2.ContainerPreferredAllocationResponse(
                    deviceIDs=list(r.available_deviceIDs[: r.allocation_size])
                )
                for r in request.container_requests
            ]
        )

    def Allocate(self, request, context):  # noqa: N802
        return api_pb2.AllocateResponse(
            container_responses=[
                api_pb2.ContainerAllocateResponse(envs={"NVIDIA_VISIBLE_DEVICES": ",".join(r.devices_ids)})
                for r in request.container_requests
            ]
        )


class OnePendingPod(MemoryPodSource):
    """Holds the one pod being admitted, like a node where pods arrive one by one."""

    def next_pod(self, i: int, uuid: str) -> None:
        with self._lock:
            self.pods.clear()
        self.add_pod(
            {
                "metadata": {
                    "name": f"bench-{i}",
                    "namespace": "default",
                    "uid": f"uid-{i}",
                    "annotations": {
                        keys.VGPU_NODE: NODE,
                        keys.BIND_TIME: str(i),
                        keys.BIND_PHASE: keys.BIND_PHASE_ALLOCATING,
                        keys.DEVICES_TO_ALLOCATE: f"{uuid},NVIDIA,4096,30:;",
                        keys.DEVICES_ALLOCATED: f"{uuid},NVIDIA,4096,30:;",
                    },
                },
                "spec": {
                    "nodeName": NODE,
                    "containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
                },
                "status": {"phase": "Pending"},
            }
        )
        # what the scheduler's /bind and the node registration loop leave on the node
        self.node_annotations[keys.NODE_LOCK] = f"2026-11-21T12:00:00Z,default,bench-{i}"
        self.node_annotations[keys.NODE_REGISTER] = encode_node_devices(
            [NodeDevice(id=uuid, count=10, devmem=97871, devcore=100, type="NVIDIA-H20", health=True)]
        )


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q / 100 * (len(values) - 1))))]


def measure(
    stub: Any, calls: int, available: list[str], uuid: str, before_allocate=None
) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"GetPreferredAllocation": [], "Allocate": []}
    pref = api_pb2.PreferredAllocationRequest(
        container_requests=[
            api_pb2.ContainerPreferredAllocationRequest(available_deviceIDs=available, allocation_size=1)
        ]
    )
    for i in range(calls):
        if before_allocate:
            before_allocate(i)
        t0 = time.perf_counter()
        resp = stub.GetPreferredAllocation(pref, timeout=10)
        t1 = time.perf_counter()
        ids = list(resp.container_responses[0].deviceIDs)
        stub.Allocate(
            api_pb2.AllocateRequest(container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=ids)]),
            timeout=10,
        )
        t2 = time.perf_counter()
        out["GetPreferredAllocation"].append(t1 - t0)
        out["Allocate"].append(t2 - t1)
    return out


def wait_for(pred, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.02)
    return False


def run_ours(sock_dir: str, tmp: str, source: Any, calls: int, hung_check=None) -> dict[str, list[float]]:
    pods = OnePendingPod(NODE)
    s = PluginSettings(
        node_name=NODE,
        device_plugin_dir=sock_dir,
        device_split_count=10,
        hook_path=os.path.join(tmp, "hook"),
        vgpu_lock_dir=os.path.join(tmp, "lock"),
        mig_apply_lock=os.path.join(tmp, "mig.lock"),
        mig_strategy="mixed",
        first_snapshot_wait_s=20,
    )
    m = DevicePluginManager(s, lambda: source, pods)
    t = threading.Thread(target=m.run, daemon=True)
    t.start()
    try:
        if not wait_for(
            lambda: "nvidia.com/gpu" in m.servers and m.states["nvidia.com/gpu"].current()[0].devices, 30
        ):
            raise RuntimeError("device plugin did not come up with devices")
        if hung_check is not None and not wait_for(hung_check, 30):
            raise RuntimeError("NVML did not become stuck")
        plan = m.states["nvidia.com/gpu"].current()[0]
        uuid = plan.devices[0].physical_uuid
        available = [d.id for d in plan.devices]
        with grpc.insecure_channel(f"unix://{sock_dir}/nvidia-gpu.sock") as ch:
            stub = api_pb2_grpc.DevicePluginStub(ch)
            measure(stub, 20, available, uuid, lambda i: pods.next_pod(-1 - i, uuid))  # warm-up
            return measure(stub, calls, available, uuid, lambda i: pods.next_pod(i, uuid))
    finally:
        m.stop()
        t.join(10)


def run_bare(sock_dir: str, calls: int, available: list[str]) -> dict[str, list[float]]:
    server = grpc.server(cf.ThreadPoolExecutor(max_workers=8))
    api_pb2_grpc.add_DevicePluginServicer_to_server(BareServicer(), server)
    server.add_insecure_port(f"unix://{sock_dir}/bare.sock")
    server.start()
    try:
        with grpc.insecure_channel(f"unix://{sock_dir}/bare.sock") as ch:
            stub = api_pb2_grpc.DevicePluginStub(ch)
            measure(stub, 20, available, "")
            return measure(stub, calls, available, "")
    finally:
        server.stop(0)


def gpusim_source(tmp: str, hung: bool):
    from hami_agent.nvml import NvmlSupervisor
    from tests.gpusim import gpusim_state as gs
    from tests.gpusim.fixtures import build_lib, make_node

    node = make_node(
        Path(tmp),
        "h20-mig-mixed",
        driver=gs.FIXED_DRIVER,
        name="hung" if hung else "ok",
        lib_path=build_lib(),
    )
    os.environ["GPUSIM_STATE"] = str(node.state_path)
    sup = NvmlSupervisor(
        lib_path=str(node.lib_path),
        call_timeout_s=0.5,
        refresh_interval_s=0.5,
        backoff_initial_s=0.5,
        backoff_max_s=2.0,
    )
    return node, sup


SUMMARY: list[tuple[str, str, str, bool]] = []  # the last run's figures, for make bench's table
GOAL_RATIO = 3.0  # DESIGN §2 rule 1: ours <= 3x the bare round trip, NVML healthy or hung
OURS = ("hami-agent, NVML healthy", "hami-agent, NVML hung (seed 003)")


def figures(results: dict[str, dict[str, dict[str, float]]]) -> list[tuple[str, str, str, bool]]:
    """(figure, value, goal, met): each RPC's p50 against the bare server's, NVML healthy and hung."""
    rows = []
    for scenario in OURS:
        for method, fig in results.get(scenario, {}).items():
            ratio = fig["p50_ratio_to_bare"]
            rows.append((f"device plugin {method} p50 vs bare gRPC, {scenario.split(', ', 1)[1]}",
                         f"{ratio:.2f}x ({fig['p50_ms']:.3f} ms)", f"<= {GOAL_RATIO:g}x",
                         ratio <= GOAL_RATIO))
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.deviceplugin.bench")
    p.add_argument("--calls", type=int, default=300, help="RPC pairs per scenario (default 300)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    goals.add_flag(p)
    args = p.parse_args(argv)
    logging.getLogger("hami_agent").setLevel(logging.ERROR)
    sock_dir = tempfile.mkdtemp(prefix="dpb-", dir="/tmp")
    results: dict[str, dict[str, dict[str, float]]] = {}
    try:

        def summarize(name: str, samples: dict[str, list[float]]) -> None:
            results[name] = {
                m: {
                    "p50_ms": pct(v, 50) * 1e3,
                    "p99_ms": pct(v, 99) * 1e3,
                    "mean_ms": statistics.fmean(v) * 1e3,
                    "n": len(v),
                }
                for m, v in samples.items()
            }

        available = [f"GPU-{i:08x}-aaaa-bbbb-cccc-{i:012x}-{r}" for i in range(5) for r in range(10)]
        summarize("bare gRPC (no-op handlers)", run_bare(sock_dir, args.calls, available))
        node, sup = gpusim_source(sock_dir, hung=False)
        summarize("hami-agent, NVML healthy", run_ours(sock_dir, sock_dir, sup, args.calls))
        node2, sup2 = gpusim_source(sock_dir, hung=True)

        hung: list[bool] = []

        def hang_now() -> bool:
            # once the healthy inventory is served, switch to the seed's driver with every call hanging
            if not hung and sup2.snapshot().status == "ok":
                node2.set_driver("570.158.01")
                node2.set_fault(hang_after_calls=0)
                hung.append(True)
            return sup2.snapshot().status == "stuck"

        summarize(
            "hami-agent, NVML hung (seed 003)", run_ours(sock_dir, sock_dir, sup2, args.calls, hang_now)
        )
    finally:
        shutil.rmtree(sock_dir, ignore_errors=True)

    bare = results["bare gRPC (no-op handlers)"]
    for per in results.values():
        for method, fig in per.items():
            fig["p50_ratio_to_bare"] = fig["p50_ms"] / bare[method]["p50_ms"]
            fig["p99_ratio_to_bare"] = fig["p99_ms"] / bare[method]["p99_ms"]
    SUMMARY[:] = figures(results)
    if args.json:
        print(json.dumps({**results, "figures": SUMMARY}, indent=2))
        return goals.exit_code(SUMMARY, args.no_goals)
    print(
        f"device plugin RPC latency over a unix socket, {args.calls} calls per row "
        f"(python {sys.version.split()[0]}, grpcio {grpc.__version__})"
    )
    print(f"{'scenario':36} {'method':24} {'p50 ms':>8} {'p99 ms':>8} {'p50 x bare':>10} {'p99 x bare':>10}")
    for name, per in results.items():
        for method, fig in per.items():
            print(
                f"{name:36} {method:24} {fig['p50_ms']:8.3f} {fig['p99_ms']:8.3f} "
                f"{fig['p50_ratio_to_bare']:10.2f} {fig['p99_ratio_to_bare']:10.2f}"
            )
    for name, value, goal, ok in SUMMARY:
        print(f"{'ok ' if ok else 'MISS'} {name}: {value} (goal {goal})")
    return goals.exit_code(SUMMARY, args.no_goals)


if __name__ == "__main__":
    sys.exit(main())
