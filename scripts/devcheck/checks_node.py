"""Node checks under the project's simulators: the device plugin (kubelet simulator + simulated API server),
the DRA driver's ResourceSlice, and ``hami-agent doctor node`` on this node.

The agent runs as its own processes (``python -m hami_agent ...`` from this tree) against the real driver;
the kubelet and the API server are the project's simulators (``tests/sim``), started in this process as the
integration tests start them (tests/integration/deviceplugin/test_cmd_process.py, tests/sim/dra_cluster.py).
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path
from typing import Any

from devcheck.checks_nvml import devices_json, nvml_dump
from devcheck.core import FAIL, NOT_SUPPORTED, PASS, CheckError, Ctx, Result, wait_until

NODE = "device-check-node"
GPU = "nvidia.com/gpu"
SPLIT = 4
DRA_DRIVER = "gpu.hami.io"
GPA_CALLS = 300
GPA_P99_LIMIT_S = 0.05  # the RPC answers from memory; the kubelet's budget is the plugin's 2 s deadline
GPA_P99_LIMIT_DRY_S = 0.25  # dry run: the simulators, the plugin and the test suite share two busy cores
SHARE_MIB, SHARE_CORES = 4096, 30  # the HAMi-core check's share (issue 30)


# ------------------------------------------------------------------------------------ shared setup
def cluster(ctx: Ctx) -> dict[str, Any]:
    """The simulated API server (with this node's Node object) and a client; started once."""
    if "cluster" in ctx.facts:
        return ctx.facts["cluster"]
    from hami_agent.k8s.client import KubeClient
    from tests.sim.apiserver import ApiServer

    api = ApiServer().start()
    ctx.cleanups.append(api.close)
    api.create({"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": NODE, "labels": {"kubernetes.io/hostname": NODE}, "annotations": {}}})
    client = KubeClient.from_kubeconfig(api.kubeconfig_path, timeout_s=5)
    c = {"api": api, "client": client, "kubeconfig": api.kubeconfig_path,
         "hook": ctx.work / "hook", "socks": ctx.work / "dp"}
    (ctx.work / "hook" / "vgpu").mkdir(parents=True, exist_ok=True)
    ctx.facts["cluster"] = c
    return c


def http_get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def _tail(path: Path, n: int = 1500) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return ""


def _pctl(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(round(q * len(s) + 0.5)) - 1))]


# ------------------------------------------------------------------------------- 5. device plugin
def start_device_plugin(ctx: Ctx) -> dict[str, Any]:
    from tests.sim.kubelet import SimulatedKubelet
    from tests.sim.ports import free_port

    c = cluster(ctx)
    c["socks"].mkdir(parents=True, exist_ok=True)
    kubelet = SimulatedKubelet(str(c["socks"]), verbosity=4, node_name=NODE).start()
    ctx.cleanups.append(kubelet.close)
    port = free_port()
    log = ctx.log_path("device-plugin.log")
    log.parent.mkdir(parents=True, exist_ok=True)
    env = dict(ctx.env, HOOK_PATH=str(c["hook"]))
    argv = ctx.agent_argv("device-plugin", "-v", "4", "--node-name", NODE, "--kubeconfig", c["kubeconfig"],
                          "--device-plugin-dir", str(c["socks"]), "--metrics-bind", f"127.0.0.1:{port}",
                          "--device-split-count", str(SPLIT), "--hook-path", str(c["hook"]),
                          "--vgpu-lock-dir", str(ctx.work / "vgpulock"),
                          "--mig-apply-lock", str(ctx.work / "mig-apply.lock"),
                          "--nvml-refresh-interval", "5", "--poll-interval", "0.1")
    proc = ctx.procs.start("device-plugin", argv, env, log)
    dp = {"kubelet": kubelet, "port": port, "proc": proc, "log": log}
    ctx.facts["device_plugin"] = dp
    return dp


def _admit(ctx: Ctx, dp: dict[str, Any], name: str, uuid: str, mem: int, cores: int) -> Any:
    from hami_agent.protocol import keys
    from tests.unit.deviceplugin.fakes import ctr, hami_pod

    c = cluster(ctx)
    api = c["api"]
    pod = hami_pod(name, NODE, [ctr("cuda", 1)], f"{uuid},NVIDIA,{mem},{cores}:;")
    api.create(pod)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    api.patch("nodes", None, NODE, {"metadata": {"annotations": {keys.NODE_LOCK: f"{stamp},default,{name}"}}})
    return dp["kubelet"].admit(api.get("pods", "default", name), timeout=ctx.budget(15))


def check_device_plugin(ctx: Ctx) -> Result:
    from hami_agent.protocol import decode_node_devices, keys

    dev = devices_json(ctx)
    gpus = [g for g in dev["gpus"] if not g["mig_enabled"]]
    if not gpus:
        return Result(NOT_SUPPORTED, "every GPU has MIG enabled: the hami-core mode advertises none "
                                     "(MIG mode is never changed by this check)")
    dp = start_device_plugin(ctx)
    kubelet, api = dp["kubelet"], cluster(ctx)["api"]
    want = SPLIT * len(gpus)
    t0 = time.monotonic()
    if not kubelet.wait_registered(GPU, ctx.budget(30), min_devices=want):
        raise CheckError(f"{GPU} did not register with {want} devices within 30 s; plugin log: "
                         f"{_tail(dp['log'], 600)}")
    reg_s = time.monotonic() - t0
    details: dict[str, Any] = {"registered_after_s": round(reg_s, 3)}
    # ListAndWatch: every replica of every real GPU, Healthy
    devs = kubelet.devices(GPU)
    expect_ids = {f"{g['uuid']}-{i}" for g in gpus for i in range(SPLIT)}
    details["listandwatch"] = devs
    if set(devs) != expect_ids or set(devs.values()) != {"Healthy"}:
        raise CheckError(f"ListAndWatch sent {sorted(devs.items())[:6]}..., expected {len(expect_ids)} "
                         f"Healthy replicas of {[g['uuid'] for g in gpus]}")
    # the node register annotation (what the scheduler sees): the real memory, type and NUMA
    reg = wait_until(lambda: (api.get("nodes", None, NODE)["metadata"].get("annotations") or {}).get(
        keys.NODE_REGISTER), ctx.budget(15))
    if not reg:
        raise CheckError("the node register annotation was not written within 15 s")
    registered = {d.id: d for d in decode_node_devices(reg)}
    details["register"] = reg
    for g in gpus:
        d = registered.get(g["uuid"])
        if d is None or d.devmem != g["memory_mib"] or d.count != SPLIT or d.devcore != 100:
            raise CheckError(f"register annotation for {g['uuid']}: {d}, expected devmem {g['memory_mib']}, "
                             f"count {SPLIT}, devcore 100")
    # GetPreferredAllocation p99 through the kubelet's own connection, as during an admission: the node
    # lock names a bound pod whose annotation says which GPU the scheduler chose (the plugin maps it)
    from hami_agent.protocol import keys as k8s_keys
    from tests.unit.deviceplugin.fakes import ctr, hami_pod

    g = gpus[-1]
    api.create(hami_pod("gpa-probe", NODE, [ctr("cuda", 1)], f"{g['uuid']},NVIDIA,1024,10:;"))
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    api.patch("nodes", None, NODE, {"metadata": {"annotations": {
        k8s_keys.NODE_LOCK: f"{stamp},default,gpa-probe"}}})
    time.sleep(0.5)  # the plugin's informers see the pod and the lock (a miss would read the API: slower)
    ep = kubelet.device_manager.endpoints[GPU].e
    ids = sorted(expect_ids)
    lat = []
    hinted = 0
    for n in range(GPA_CALLS):
        t = time.monotonic()
        resp = ep.get_preferred_allocation(ids, [], 1)
        lat.append(time.monotonic() - t)
        if not resp.container_responses or not resp.container_responses[0].deviceIDs:
            raise CheckError(f"GetPreferredAllocation #{n} answered no devices")
        hinted += all(d.startswith(g["uuid"]) for d in resp.container_responses[0].deviceIDs)
        if ctx.left() < 5:
            break
    api.delete("pods", "default", "gpa-probe")
    api.patch("nodes", None, NODE, {"metadata": {"annotations": {k8s_keys.NODE_LOCK: None}}})
    if hinted != len(lat):
        raise CheckError(f"GetPreferredAllocation followed the scheduler's GPU in {hinted} of {len(lat)} "
                         "calls")
    p50, p99, worst = _pctl(lat, 0.5), _pctl(lat, 0.99), max(lat)
    details["get_preferred_allocation_s"] = {"calls": len(lat), "p50": p50, "p99": p99, "max": worst}
    time.sleep(0.5)  # the informers see the probe pod and the lock go
    # Allocate: the whole card (limits = the real memory), then the HAMi-core share (kept for later)
    g = gpus[0]
    res = _admit(ctx, dp, "whole-gpu", g["uuid"], g["memory_mib"], 100)
    if res is None or not res.admitted:
        raise CheckError(f"Allocate of the whole GPU refused: {res}; log {_tail(dp['log'], 800)}")
    envs = res.allocations["cuda"][GPU]["envs"]
    details["allocate_whole"] = res.allocations["cuda"][GPU]
    if (envs.get("NVIDIA_VISIBLE_DEVICES") != g["uuid"] or envs.get("CUDA_DEVICE_MEMORY_LIMIT_0")
            != f"{g['memory_mib']}m" or envs.get("CUDA_DEVICE_SM_LIMIT") != "100"):
        raise CheckError(f"Allocate envs {envs} do not match GPU {g['uuid']} with {g['memory_mib']} MiB")
    # free it (the pod goes), then the 4096 MiB / 30 % share HAMi-core is checked with
    api.delete("pods", "default", "whole-gpu")
    kubelet.release("uid-whole-gpu")
    share = None
    for _ in range(20):
        time.sleep(0.3)
        share = _admit(ctx, dp, "hami-core-share", g["uuid"], SHARE_MIB, SHARE_CORES)
        if share is not None and share.admitted:
            break
        api.delete("pods", "default", "hami-core-share")  # over-commit refused: the cache was behind
        if share is not None:
            kubelet.release(share.uid)
        if ctx.left() < 10:
            break
    if share is None or not share.admitted:
        raise CheckError(f"Allocate of {SHARE_MIB} MiB / {SHARE_CORES} % refused: {share}")
    alloc = share.allocations["cuda"][GPU]
    ctx.facts["share_allocation"] = {"pod": "default/hami-core-share", "uid": share.uid, "gpu": g["uuid"],
                                     "gpu_index": g["index"], **alloc}
    ctx.save("allocate-share.json", ctx.facts["share_allocation"])
    details["allocate_share"] = alloc
    senv = alloc["envs"]
    if senv.get("CUDA_DEVICE_MEMORY_LIMIT_0") != f"{SHARE_MIB}m" or senv.get("CUDA_DEVICE_SM_LIMIT") != \
            str(SHARE_CORES):
        raise CheckError(f"share envs {senv}")
    status, body = http_get(f"http://127.0.0.1:{dp['port']}/metrics")
    ctx.save("device-plugin-metrics.txt", body)
    ok_metric = 'hami_device_plugin_allocations_total{resource="nvidia.com/gpu",result="success"} 2.0' in body
    if status != 200 or not ok_metric:
        raise CheckError(f"/metrics answered {status} without 2 successful allocations")
    ctx.save("device-plugin.json", details)
    limit = GPA_P99_LIMIT_DRY_S if ctx.dry_run else GPA_P99_LIMIT_S
    details["get_preferred_allocation_s"]["p99_limit"] = limit
    if p99 > limit:
        return Result(FAIL, f"GetPreferredAllocation p99 {p99 * 1000:.1f} ms over {len(lat)} calls, limit "
                            f"{limit * 1000:.0f} ms", details)
    return Result(PASS, f"registered in {reg_s:.2f}s; ListAndWatch {len(devs)} Healthy replicas of "
                        f"{len(gpus)} GPU(s); register annotation devmem {g['memory_mib']} MiB; "
                        f"GetPreferredAllocation p50 {p50 * 1000:.2f} / p99 {p99 * 1000:.2f} / max "
                        f"{worst * 1000:.2f} ms ({len(lat)} calls, each mapped to the scheduler's GPU); "
                        f"Allocate {g['uuid']}: "
                        f"CUDA_DEVICE_MEMORY_LIMIT_0={g['memory_mib']}m, then {SHARE_MIB}m/{SHARE_CORES}%",
                  details)


# ------------------------------------------------------------------------------------------ 6. DRA
def check_dra(ctx: Ctx) -> Result:
    import yaml

    from tests.sim.kubelet import SimulatedKubelet

    dev = devices_json(ctx)
    c = cluster(ctx)
    root = ctx.work / "dra"
    (root / "dp").mkdir(parents=True, exist_ok=True)
    kubelet = SimulatedKubelet(str(root / "dp"), verbosity=4, node_name=NODE, dra_client=c["client"],
                               dra_root=str(root)).start()
    ctx.cleanups.append(kubelet.close)
    cfg = root / "config.yaml"
    cfg.write_text(yaml.safe_dump({"dra": {"devices": "all", "driverName": DRA_DRIVER}}))
    log = ctx.log_path("dra.log")
    log.parent.mkdir(parents=True, exist_ok=True)
    argv = ctx.agent_argv("dra", "-v", "4", "--node-name", NODE, "--kubeconfig", c["kubeconfig"],
                          "--config", str(cfg), "--plugins-dir", str(root / "plugins"),
                          "--plugins-registry-dir", str(root / "plugins_registry"),
                          "--cdi-dir", str(root / "cdi"), "--state-dir", str(root / "state"),
                          "--hook-path", str(c["hook"]), "--vgpu-lock-dir", str(ctx.work / "vgpulock"),
                          "--metrics-bind", "none", "--mig-apply-lock", str(root / "mig-apply.lock"),
                          "--nvml-refresh-interval", "5", "--poll-interval", "0.1")
    proc = ctx.procs.start("dra", argv, ctx.env, log)
    registered = wait_until(lambda: kubelet.dra.registered(DRA_DRIVER), ctx.budget(30))

    def devices() -> dict[str, dict]:
        items, _rv = c["client"].list("resourceslices", field_selector=f"spec.nodeName={NODE}")
        return {d["name"]: d for s in items for d in s["spec"].get("devices") or []}

    want = {f"gpu-{g['index']}" for g in dev["gpus"] if not g["mig_enabled"]}
    want |= {f"gpu-{g['index']}-mig-{m['gi_id']}-{m['ci_id']}" for g in dev["gpus"] if g["mig_enabled"]
             for m in g["mig_devices"]}
    def complete() -> dict[str, dict] | None:
        d = devices()
        return d if set(d) >= want else None

    published = wait_until(complete, ctx.budget(30))
    slices, _rv = c["client"].list("resourceslices", field_selector=f"spec.nodeName={NODE}")
    ctx.save("dra-resourceslices.json", slices)
    ctx.procs.stop(proc, grace_s=5)
    if not published:
        raise CheckError(f"no ResourceSlice with {sorted(want)} within 30 s (registered: "
                         f"{bool(registered)}); "
                         f"log {_tail(log, 800)}")
    from hami_agent.dra.devices import architecture, semver_of

    problems = []
    cuda = dev.get("cuda_driver_version")
    for g in dev["gpus"]:
        if g["mig_enabled"]:
            continue
        d = published[f"gpu-{g['index']}"]
        a = {k: next(iter(v.values())) for k, v in d.get("attributes", {}).items()}
        cap = d.get("capacity", {})
        expect = {"uuid": g["uuid"], "productName": g["name"], "index": g["index"],
                  "driverVersion": semver_of(dev.get("driver_version")),
                  "cudaDriverVersion": f"{cuda // 1000}.{cuda % 1000 // 10}.0" if cuda else None,
                  "resource.kubernetes.io/pciBusID": _sysfs(g["pci_bus_id"])}
        arch = architecture(g["name"])
        if arch:
            expect["cudaComputeCapability"] = semver_of(arch[1])
            expect["architecture"] = arch[0]
        if g["numa"] is not None:
            expect["numaNode"] = g["numa"]
        for k, v in expect.items():
            if v is not None and a.get(k) != v:
                problems.append(f"{d['name']} attribute {k}: {a.get(k)!r}, expected {v!r}")
        mem = (cap.get("memory") or {}).get("value")
        if mem != f"{g['memory_mib']}Mi":
            problems.append(f"{d['name']} capacity memory {mem}, expected {g['memory_mib']}Mi")
        if (cap.get("cores") or {}).get("value") != "100" or not d.get("allowMultipleAllocations"):
            problems.append(f"{d['name']} cores {cap.get('cores')}, shared "
                            f"{d.get('allowMultipleAllocations')}")
        if d.get("taints"):
            problems.append(f"{d['name']} tainted {d['taints']}")
    mig = mig_profile_answers(ctx, dev)
    details = {"devices": published, "registered_with_kubelet": bool(registered), "mig_profiles": mig}
    if problems:
        return Result(FAIL, "; ".join(problems[:5]), details)
    g0 = next(g for g in dev["gpus"] if not g["mig_enabled"]) if want else None
    return Result(PASS, f"{len(published)} device(s) published{' and registered' if registered else ''}; "
                        f"gpu-{g0['index'] if g0 else '?'}: memory "
                        f"{g0['memory_mib'] if g0 else '?'}Mi, cores "
                        f"100, shared, attributes equal NVML's; MIG profiles: {mig['summary']}", details)


def _sysfs(bus: str) -> str:
    domain, _, rest = bus.partition(":")
    return f"{int(domain or '0', 16):04x}:{rest.lower()}"


def mig_profile_answers(ctx: Ctx, dev: dict[str, Any]) -> dict[str, Any]:
    """What NVML answers for the GPU-instance profiles through the agent's own MIG op (``mig_profiles``, the
    dynamic-MIG path) and the raw dump, with MIG as it is (never changed here)."""
    from hami_agent.nvml.client import NvmlClient
    from hami_agent.nvml.errors import NvmlError

    out: dict[str, Any] = {"gpus": []}
    with NvmlClient(ctx.nvml_lib, call_timeout_s=10.0) as client:
        for g in dev["gpus"]:
            try:
                data = client.request("mig_profiles", ctx.budget(15), args={"gpu": g["uuid"]})
            except NvmlError as exc:
                data = {"error": str(exc)}
            out["gpus"].append({"index": g["index"], "mig_enabled": g["mig_enabled"], "answer": data})
    raw = nvml_dump(ctx)
    answered = [e for g in out["gpus"] for e in (g["answer"].get("profiles") or [])]
    refused = [e.get("error") for rg in raw.get("gpus", [])
               for e in rg.get("nvmlDeviceGetGpuInstanceProfileInfo", []) if "error" in e]
    if answered:
        out["summary"] = ", ".join(f"{p['name']} x{p['instances']} ({p['memory_mb']} MB)" for p in answered)
        out["status"] = PASS
    else:
        kind = sorted({r.split(":")[0] for r in refused if r}) or ["no answer"]
        mode = "disabled" if not any(g["mig_enabled"] for g in dev["gpus"]) else "as configured"
        out["summary"] = f"not answered by NVML with MIG {mode} ({', '.join(kind)})"
        out["status"] = NOT_SUPPORTED
    return out


# ---------------------------------------------------------------------------------------- 7. doctor
def check_doctor(ctx: Ctx) -> Result:
    from hami_agent.protocol import keys
    from hami_agent.protocol.handshake import format_requesting

    c = cluster(ctx)
    dp = ctx.facts.get("device_plugin")
    # the extender's side of the handshake, as HAMi's scheduler writes it every sync (no extender runs here)
    import datetime

    c["api"].patch("nodes", None, NODE, {"metadata": {"annotations": {
        keys.NODE_HANDSHAKE: format_requesting(datetime.datetime.now())}}})
    if dp:
        # the kubelet's node status update (the simulated kubelet keeps capacity in memory only)
        cap, alloc = dp["kubelet"].capacity(GPU), dp["kubelet"].allocatable(GPU)
        status = {"capacity": {GPU: str(cap)}, "allocatable": {GPU: str(alloc)}}
        c["api"].patch("nodes", None, NODE, {"status": status}, subresource="status")
    argv = ctx.agent_argv("doctor", "node", NODE, "--local", "--json", "--kubeconfig", c["kubeconfig"],
                          "--hook-path", str(c["hook"]), "--no-journal", "--nvml-timeout", "20",
                          "--collector-timeout", "30")
    if ctx.nvml_lib:
        argv += ["--nvml-lib", ctx.nvml_lib]
    if dp and dp["proc"].poll() is None:
        argv += ["--plugin-url", f"http://127.0.0.1:{dp['port']}", "--plugin-log", str(dp["log"])]
    ran = ctx.run(argv, timeout=60)
    ctx.save("doctor-node.json", ran.out)
    if ran.err:
        ctx.save("logs/doctor.stderr", ran.err)
    if ran.timed_out:
        raise CheckError("hami-agent doctor node did not finish within 60 s")
    try:
        report = json.loads(ran.out)
    except ValueError as exc:
        raise CheckError(f"doctor printed no JSON (exit {ran.rc}): {(ran.err or ran.out)[-300:]}") from exc
    # verdicts that are TRUE on this machine by construction, each with the fact that makes it true
    vgpu = c["hook"] / "vgpu"
    true_here = {}
    if not (vgpu / "libvgpu.so").exists() or not (vgpu / "ld.so.preload").exists():
        true_here["LIBVGPU_NOT_LOADED"] = f"no libvgpu.so was built in this run: {vgpu} has none"
    if ctx.facts.get("killed_probes"):
        true_here["SHRREG_ZOMBIE_TASKS"] = (f"the check had to kill {ctx.facts['killed_probes']} probe(s) "
                                            "before HAMi-core's exit handler ran: their slots stay")
    verdicts = report.get("verdicts", [])
    problems = [v for v in verdicts if v.get("severity") in ("critical", "error", "warning")]
    false = [v for v in problems if v["code"] not in true_here]
    explained = [f"{v['code']} ({true_here[v['code']]})" for v in problems if v["code"] in true_here]
    failed_collectors = [f"{x['name']}: {x.get('error')}" for x in report.get("collectors", [])
                         if not x["ok"]]
    details = {"exit_code": ran.rc, "verdicts": verdicts, "collectors": report.get("collectors"),
               "true_here": true_here, "plugin_running": bool(dp and dp["proc"].poll() is None)}
    if false:
        return Result(FAIL, f"doctor exit {ran.rc} with verdict(s) "
                            f"{[(v['code'], v['severity'], v['summary'][:120]) for v in false]} on a healthy "
                            f"node (each is a false verdict unless its evidence is true here: see "
                            f"evidence/doctor-node.json)", details)
    note = f"; collectors that failed: {failed_collectors}" if failed_collectors else ""
    extra = f"; true here and expected: {', '.join(explained)}" if explained else ""
    return Result(PASS, f"no false verdict ({len(verdicts)} verdict(s), exit {ran.rc}; "
                        f"{len(report.get('collectors', []))} collectors, the device plugin's /metrics and "
                        "log "
                        f"included){extra}{note}", details)
