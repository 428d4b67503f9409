"""c) A sample workload through the API server: shared vGPUs, an exclusive GPU, a MIG device, a pod with an
init container; where each landed and what each container received from Allocate (the simulated kubelet
records it).
"""

from __future__ import annotations

import json

from sandbox.cluster import wait_for
from sandbox.demo.core import SEED_NODE, Demo
from sandbox.workload import sample_workload


def run(demo: Demo) -> None:
    demo.header("c", "sample workload: shared vGPUs, an exclusive GPU, a MIG device, an init container")
    client = demo.sb.kube()
    pods = sample_workload(SEED_NODE)
    for p in pods:
        client.create("pods", p)
    client.close()
    names = [p["metadata"]["name"] for p in pods]
    wait_for(
        lambda: all(
            demo.pods()[n].get("status", {}).get("phase") in ("Running", "Failed") for n in names
        ),
        60,
    )
    live, adm = demo.pods(), demo.admissions()
    demo.say(
        f"  {'pod':11} {'node':9} {'phase':8} {'container':8} {'resource':24} "
        "devices -> what the container got"
    )
    for n in names:
        p = live[n]
        node = p["spec"].get("nodeName") or "-"
        phase = (p.get("status") or {}).get("phase", "Pending")
        rec = adm.get(n, {})
        allocs = rec.get("allocations") or {}
        if not allocs:
            demo.say(f"  {n:11} {node:9} {phase:8} {rec.get('message') or ''}")
        for ctr, per_res in allocs.items():
            for res, a in per_res.items():
                envs = a.get("envs") or {}
                shown = {
                    k: v
                    for k, v in envs.items()
                    if k
                    in ("NVIDIA_VISIBLE_DEVICES", "CUDA_DEVICE_MEMORY_LIMIT_0", "CUDA_DEVICE_SM_LIMIT")
                }
                mounts = [m["containerPath"] for m in a.get("mounts") or []]
                demo.say(
                    f"  {n:11} {node:9} {phase:8} {ctr:8} {res:24} {len(a['devices'])} -> {shown}"
                    + (f" mounts {mounts}" if mounts else "")
                )
    (demo.out / "workload.json").write_text(
        json.dumps({n: {"pod": live[n], "admission": adm.get(n)} for n in names}, indent=2)
    )
    for n in names:
        demo.check(
            f"pod {n} Running",
            (live[n].get("status") or {}).get("phase") == "Running",
            f"on {live[n]['spec'].get('nodeName')}; {adm.get(n, {}).get('message') or ''}".strip("; "),
        )

    def env(n: str, ctr: str, res: str = "nvidia.com/gpu") -> dict:
        return (((adm.get(n) or {}).get("allocations") or {}).get(ctr) or {}).get(res, {}).get(
            "envs"
        ) or {}

    demo.check(
        "shared-a got a 10240 MiB / 30% vGPU (HAMi-core limits)",
        env("shared-a", "infer").get("CUDA_DEVICE_MEMORY_LIMIT_0") == "10240m"
        and env("shared-a", "infer").get("CUDA_DEVICE_SM_LIMIT") == "30",
    )
    demo.check(
        "exclusive got a whole GPU (100% cores)",
        env("exclusive", "train").get("CUDA_DEVICE_SM_LIMIT") == "100",
    )
    mig = env("mig-3g", "infer", "nvidia.com/mig-3g.48gb").get("NVIDIA_VISIBLE_DEVICES", "")
    demo.check("mig-3g got one 3g.48gb MIG device of the seed's node", mig.startswith("MIG-"), mig)
    demo.check(
        "with-init: the init container and the app container both got their vGPU",
        env("with-init", "warmup").get("CUDA_DEVICE_MEMORY_LIMIT_0") == "4096m"
        and env("with-init", "app").get("CUDA_DEVICE_MEMORY_LIMIT_0") == "8192m",
    )
    shared = [
        (live[n].get("metadata", {}).get("annotations") or {}).get("hami.io/vgpu-devices-allocated", "")
        for n in ("shared-a", "shared-b")
    ]
    demo.say(f"  hami.io/vgpu-devices-allocated: shared-a={shared[0]!r} shared-b={shared[1]!r}")
