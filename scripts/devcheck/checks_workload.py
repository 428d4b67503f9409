# Over 500 lines on purpose: three checks around one CUDA workload and one HAMi-core build.
"""Workload checks: the monitor while a CUDA workload runs, and the real HAMi-core (build, limits, region).

Real mode: a PyTorch matmul loop (``torch_probe.py``) for the monitor; ``scripts/build-hami-core.sh`` and
``alloc_probe.cu`` (nvcc) for HAMi-core, run with exactly the env and mounts our Allocate answered.
Dry run (gpusim): no CUDA exists, so the workload is a stand-in whose process and utilisation are written
into gpusim's state, and the shared region is written by ``tests/shrreg/mkregion`` (HAMi-core's layout)
with the limits from Allocate's env; the monitor, NVML and shrreg logic then run unchanged.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from devcheck.checks_node import NODE, SHARE_MIB, cluster, http_get
from devcheck.checks_nvml import devices_json
from devcheck.core import FAIL, NOT_SUPPORTED, PASS, REPO, SKIPPED, CheckError, Ctx, Result, wait_until

HERE = Path(__file__).resolve().parent
MIB = 1 << 20
HOLD_S = 90  # how long a probe may hold its memory (it is told to stop as soon as the check is done)


# ----------------------------------------------------------------------------------------- setup
def setup_gpusim(ctx: Ctx, profile: str) -> None:
    """Dry run: a gpusim node from ``profile`` in the work folder; agent and nvidia-smi stub use it."""
    from tests.gpusim import gpusim_state as gs

    if not Path(ctx.nvml_lib or "").exists():
        raise SystemExit(f"gpusim library {ctx.nvml_lib} is missing: run `make gpusim` first")
    state = ctx.work / "gpusim-state.json"
    gs.write_state(state, gs.load_profile(profile))
    ctx.env["GPUSIM_STATE"] = str(state)
    os.environ["GPUSIM_STATE"] = str(state)  # the NVML workers this process starts inherit it
    os.environ["HAMI_NVML_LIBRARY"] = ctx.nvml_lib or ""
    ctx.facts["gpusim_state"] = state


def _torch_ok(ctx: Ctx) -> tuple[bool, str]:
    if "torch" not in ctx.facts:
        code = "import torch; print(torch.__version__, torch.cuda.is_available())"
        ran = ctx.run([sys.executable, "-c", code], timeout=60)
        ok = ran.rc == 0 and ran.out.strip().endswith("True")
        ctx.facts["torch"] = (ok, (ran.out or ran.err).strip()[-200:])
    return ctx.facts["torch"]


def start_background_build(ctx: Ctx) -> None:
    """Real mode, with a HAMi-core source: build libvgpu.so and the probe while the other checks run."""
    src = ctx.facts.get("hami_core_src")
    if ctx.dry_run:
        return
    if shutil.which("nvcc"):
        out = ctx.work / "alloc_probe"
        log = ctx.log_path("alloc_probe-nvcc.log")
        log.parent.mkdir(parents=True, exist_ok=True)
        nvcc = ["nvcc", "-O2", "-o", str(out), str(HERE / "alloc_probe.cu")]
        ctx.facts["probe_build"] = (ctx.procs.start("nvcc alloc_probe", nvcc, ctx.env, log), out, log)
    if src:
        if not (Path(src) / "CMakeLists.txt").is_file():
            ctx.facts["hami_core_error"] = f"{src} is not a HAMi-core source tree (no CMakeLists.txt)"
            return
        commit = Path(src) / "HAMI_CORE_COMMIT"
        if commit.is_file():
            ctx.facts["hami_core_commit"] = commit.read_text().strip()
        out = ctx.work / "hami-core-build"
        log = ctx.log_path("build-hami-core.log")
        log.parent.mkdir(parents=True, exist_ok=True)
        ctx.facts["hami_core_build"] = (ctx.procs.start(
            "build-hami-core", ["bash", str(REPO / "scripts" / "build-hami-core.sh"), src, str(out)], ctx.env,
            log), out, log)
        ctx.facts["hami_core_build_started"] = time.monotonic()


def _wait_proc(ctx: Ctx, proc: subprocess.Popen, want_s: float) -> int | None:
    try:
        return proc.wait(ctx.budget(want_s))
    except subprocess.TimeoutExpired:
        ctx.procs.stop(proc, grace_s=2)
        return None


# ---------------------------------------------------------------------------- 8. monitor + workload
def start_monitor(ctx: Ctx) -> dict[str, Any]:
    if "monitor" in ctx.facts:
        return ctx.facts["monitor"]
    from tests.sim.ports import free_port

    c = cluster(ctx)
    port = free_port()
    log = ctx.log_path("monitor.log")
    log.parent.mkdir(parents=True, exist_ok=True)
    argv = ctx.agent_argv("monitor", "-v", "3", "--node-name", NODE, "--kubeconfig", c["kubeconfig"],
                          "--metrics-bind", f"127.0.0.1:{port}", "--interval", "1",
                          "--dir", str(c["hook"] / "vgpu" / "containers"),
                          "--mig-apply-lock", str(ctx.work / "mig-apply.lock"))
    if ctx.nvml_lib:
        argv += ["--nvml-lib", ctx.nvml_lib]
    proc = ctx.procs.start("monitor", argv, ctx.env, log)
    mon = {"proc": proc, "port": port, "log": log}
    ctx.facts["monitor"] = mon
    return mon


def scrape(port: int) -> str:
    status, body = http_get(f"http://127.0.0.1:{port}/metrics", timeout=5)
    return body if status == 200 else ""


def metric_values(text: str, name: str, **labels: str) -> list[float]:
    out = []
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            try:
                out.append(float(line.rsplit(" ", 1)[1]))
            except ValueError:
                pass
    return out


def _stand_in_workload(ctx: Ctx, gpu_index: int, mem_mib: int) -> tuple[subprocess.Popen, dict[str, Any]]:
    """Dry run: a process that does nothing, shown by gpusim as a CUDA process with ``mem_mib`` MiB on the
    GPU, which is 63 % busy (gpusim's state: what NVML will answer)."""
    from tests.gpusim import gpusim_state as gs

    proc = ctx.procs.start("stand-in workload", [sys.executable, "-c", "import time; time.sleep(120)",
                                                 str(ctx.work)], ctx.env, None)
    state = ctx.facts["gpusim_state"]

    def edit(s: dict) -> None:
        g = next(x for x in s["gpus"] if x["index"] == gpu_index)
        g.setdefault("processes", []).append({"pid": proc.pid, "used_memory_mib": mem_mib, "name": "python3"})
        g["memory_used_mib"] = g.get("memory_used_mib", 0) + mem_mib
        g["utilization_gpu"] = 63

    gs.update_state(state, edit)

    def undo() -> None:
        def back(s: dict) -> None:
            g = next(x for x in s["gpus"] if x["index"] == gpu_index)
            g["processes"] = [p for p in g.get("processes", []) if p.get("pid") != proc.pid]
            g["memory_used_mib"] = max(0, g.get("memory_used_mib", 0) - mem_mib)
            g["utilization_gpu"] = 0
        gs.update_state(state, back)
    ctx.cleanups.append(undo)
    return proc, {"pid": proc.pid, "reserved_bytes": mem_mib * MIB, "stand_in": True}


def check_monitor(ctx: Ctx) -> Result:
    from hami_agent.nvml.client import NvmlClient

    dev = devices_json(ctx)
    g = dev["gpus"][0]
    if ctx.dry_run:
        proc, ready = _stand_in_workload(ctx, g["index"], 1024)
        workload = "gpusim stand-in (no CUDA in a dry run): a process NVML lists with 1024 MiB, GPU 63 % busy"
    else:
        ok, why = _torch_ok(ctx)
        if not ok:
            return Result(NOT_SUPPORTED, f"no PyTorch with CUDA here ({why}): no workload to watch")
        log = ctx.log_path("torch-load.log")
        log.parent.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, str(HERE / "torch_probe.py"), "load", "60"]
        proc = ctx.procs.start("torch matmul loop", argv, ctx.env, None, stdout=subprocess.PIPE)
        line = _read_json_line(proc, ctx.budget(60))
        if not line or not line.get("ready"):
            ctx.procs.stop(proc)
            raise CheckError(f"the PyTorch matmul loop did not start: {line}")
        ready = line
        workload = f"PyTorch {line.get('torch')} matmul loop (8192x8192 fp32) on {line.get('device')}"
    mon = start_monitor(ctx)
    uuid = g["uuid"]
    seen: dict[str, Any] = {}

    def util_seen() -> bool:
        text = scrape(mon["port"])
        util = metric_values(text, "hami_host_gpu_utilization_ratio", device_uuid=uuid)
        mem = metric_values(text, "hami_host_gpu_memory_used_bytes", device_uuid=uuid)
        legacy = metric_values(text, "HostCoreUtilization", deviceuuid=uuid)
        seen.update(util=util, mem=mem, legacy=legacy, text=text)
        return bool(util) and max(util) > 0 and bool(mem)

    got = wait_until(util_seen, ctx.budget(25), interval=0.5)
    ctx.save("monitor-metrics-under-load.txt", seen.get("text", ""))
    # the process, with its memory, through the agent's NVML usage request (what the monitor's client asks)
    with NvmlClient(ctx.nvml_lib, call_timeout_s=10.0) as client:
        usage = client.usage(timeout_s=ctx.budget(15))
    procs = [p for p in usage.processes if p.gpu_uuid == uuid]
    mine = [p for p in procs if p.pid == ready["pid"]]
    how = "by pid"
    if not mine and procs:
        # NVML reports host PIDs; inside a container with its own PID namespace the pid differs
        mine = [p for p in procs if (p.used_bytes or 0) >= ready["reserved_bytes"]]
        how = "by memory (NVML's pid is in another PID namespace)"
    ctx.procs.stop(proc, grace_s=3)
    details = {"workload": ready, "utilization": seen.get("util"), "memory_used_bytes": seen.get("mem"),
               "legacy_HostCoreUtilization": seen.get("legacy"),
               "nvml_processes": [p.__dict__ if hasattr(p, "__dict__") else str(p) for p in procs]}
    if not got:
        return Result(FAIL, f"{workload}: /metrics showed utilisation {seen.get('util')} and memory "
                            f"{seen.get('mem')} for {uuid} within 25 s", details)
    if not mine:
        return Result(FAIL, f"{workload}: NVML lists {[(p.pid, p.used_bytes) for p in procs]} on {uuid}, "
                            "not the "
                            f"workload (pid {ready['pid']})", details)
    p = mine[0]
    if p.used_bytes is not None and p.used_bytes < ready["reserved_bytes"]:
        return Result(FAIL, f"NVML shows pid {p.pid} with {p.used_bytes} bytes, less than the "
                            f"{ready['reserved_bytes']} the workload holds", details)
    used_gpu = max(seen["mem"])
    return Result(PASS, f"{workload}: HostCoreUtilization {max(seen['util']):.2f} > 0, GPU memory used "
                        f"{used_gpu / MIB:.0f} MiB; NVML lists pid {p.pid} ({how}) with "
                        f"{(p.used_bytes or 0) / MIB:.0f} MiB", details)


def _read_json_line(proc: subprocess.Popen, timeout: float) -> dict[str, Any] | None:
    """The first JSON line a child prints on its stdout pipe, within ``timeout``."""
    import select

    if proc.stdout is None:
        return None
    end = time.monotonic() + timeout
    buf = b""
    fd = proc.stdout.fileno()
    while time.monotonic() < end:
        r, _w, _x = select.select([fd], [], [], 0.2)
        if not r:
            if proc.poll() is not None:
                break
            continue
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            try:
                return json.loads(line)
            except ValueError:
                continue
    return None


# ------------------------------------------------------------------------------- 9. HAMi-core build
def check_hami_core_build(ctx: Ctx) -> Result:
    if ctx.dry_run:
        return Result(NOT_SUPPORTED, "dry run: HAMi-core needs a CUDA driver (libvgpu.so is not built on "
                                     "gpusim)")
    if not ctx.facts.get("hami_core_src"):
        return Result(SKIPPED, "no HAMi-core source tree given (--hami-core-src DIR; `make hami-core-src` "
                               "exports one into .hami-core/): the three HAMi-core checks are skipped")
    if ctx.facts.get("hami_core_error"):
        raise CheckError(ctx.facts["hami_core_error"])
    proc, out, log = ctx.facts["hami_core_build"]
    rc = _wait_proc(ctx, proc, 200)
    took = time.monotonic() - ctx.facts["hami_core_build_started"]
    if rc != 0:
        tail = log.read_text(errors="replace")[-800:] if log.exists() else ""
        why = "timed out" if rc is None else f"exit {rc}"
        raise CheckError(f"build-hami-core.sh {why} after {took:.0f}s: "
                         f"{tail}")
    lib = out / "libvgpu.so"
    syms = ""
    if shutil.which("nm"):
        syms = ctx.run(["nm", "-D", "--defined-only", str(lib)], timeout=20).out
    need = ("cuMemAlloc_v2", "cuGetProcAddress", "cuInit", "nvmlDeviceGetMemoryInfo")
    missing = [s for s in need if syms and not re.search(rf"\sT {s}$", syms, re.M)]
    if missing:
        raise CheckError(f"libvgpu.so does not export {missing}")
    # install it where our Allocate's mounts point: <hook>/vgpu/libvgpu.so and <hook>/vgpu/ld.so.preload
    vgpu = cluster(ctx)["hook"] / "vgpu"
    vgpu.mkdir(parents=True, exist_ok=True)
    shutil.copy2(lib, vgpu / "libvgpu.so")
    (vgpu / "ld.so.preload").write_text(f"{vgpu / 'libvgpu.so'}\n")
    info = (out / "BUILD_INFO").read_text() if (out / "BUILD_INFO").exists() else ""
    ctx.save("hami-core-BUILD_INFO.txt", info)
    ctx.facts["libvgpu"] = vgpu / "libvgpu.so"
    first = info.splitlines()[0] if info else ""
    return Result(PASS, f"libvgpu.so built in {took:.0f}s ({lib.stat().st_size} bytes; exports "
                        f"{', '.join(need) if syms else 'not listed (no nm)'}); {first}; "
                        f"{info.splitlines()[1] if len(info.splitlines()) > 1 else ''}",
                  {"build_info": info})


# ------------------------------------------------------------------------------ 10. HAMi-core limits
def _host_path(alloc: dict[str, Any], container_path: str) -> str:
    """Where ``container_path`` lives on the host, through Allocate's mounts (longest prefix wins)."""
    best = None
    for m in alloc["mounts"]:
        cp = m["containerPath"].rstrip("/")
        if container_path == cp or container_path.startswith(cp + "/"):
            if best is None or len(cp) > len(best["containerPath"].rstrip("/")):
                best = m
    if best is None:
        return container_path
    return best["hostPath"] + container_path[len(best["containerPath"].rstrip("/")):]


def _container_env(alloc: dict[str, Any], lib_in_container: str) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "LC_ALL", "PYTHONPATH",
                                                           "LD_LIBRARY_PATH", "CUDA_HOME", "TMPDIR")}
    env = {**keep, **alloc["envs"], "LD_PRELOAD": lib_in_container}
    env.setdefault("LIBCUDA_LOG_LEVEL", "3")  # HAMi-core's own log on stderr (kept as evidence)
    return env


def _namespace_script(alloc: dict[str, Any], argv: list[str], created: list[Path],
                      stage: Path, preload: str | None = None) -> tuple[list[str], str]:
    """A shell line that, in a new mount namespace, bind-mounts Allocate's mounts and execs ``argv``.

    A container runtime binds host paths into another root; here host and container paths share one tree
    (the cache dir is mounted over ``<hook>/vgpu``, which holds the host's libvgpu.so). So every host path is
    first bound to ``stage/<i>`` (captured before anything is mounted over it), then the container paths are
    mounted from there, shallowest first as runtimes order them."""
    import shlex

    lines = ["set -e", "mount --make-rprivate / 2>/dev/null || true"]
    mounts = sorted(alloc["mounts"], key=lambda m: m["containerPath"].rstrip("/").count("/"))
    skipped = []
    plan = []
    for i, m in enumerate(mounts):
        cp, hp = m["containerPath"], m["hostPath"]
        if cp == "/etc/ld.so.preload" and not os.path.exists(cp):
            skipped.append("/etc/ld.so.preload (no such file on the host to mount over; LD_PRELOAD does "
                           "its job)")
            continue
        staged = stage / str(i)
        if os.path.isdir(hp):
            staged.mkdir(parents=True, exist_ok=True)
            if not os.path.exists(cp):
                Path(cp).mkdir(parents=True, exist_ok=True)
                created.append(Path(cp))
        else:
            staged.parent.mkdir(parents=True, exist_ok=True)
            staged.touch()
        lines.append(f"mount --bind {shlex.quote(hp)} {shlex.quote(str(staged))}")
        plan.append((staged, cp, bool(m.get("readOnly")), os.path.isdir(hp)))
    for staged, cp, ro, is_dir in plan:
        if not is_dir:
            # a file mountpoint must exist once the shallower mounts are in place (a runtime creates it too)
            lines.append(f"[ -e {shlex.quote(cp)} ] || : > {shlex.quote(cp)}")
        lines.append(f"mount --bind {shlex.quote(str(staged))} {shlex.quote(cp)}")
        if ro:
            lines.append(f"mount -o remount,bind,ro {shlex.quote(cp)} 2>/dev/null || true")
    if preload:  # only for the program itself: the mount commands above must not load libvgpu.so
        lines.append(f"export LD_PRELOAD={shlex.quote(preload)}")
    lines.append("exec " + " ".join(shlex.quote(a) for a in argv))
    ns = ["unshare", "--mount", "--propagation", "private", "sh", "-c", "\n".join(lines)]
    return ns, "; ".join(skipped)


def _probe_argv(ctx: Ctx, mib: int, hold: int) -> tuple[list[str], str]:
    pb = ctx.facts.get("probe_build")
    if pb is not None:
        proc, out, _log = pb
        if _wait_proc(ctx, proc, 60) == 0 and out.exists():
            return [str(out), str(mib), str(hold)], "alloc_probe (nvcc, cudaMalloc)"
    ok, _why = _torch_ok(ctx)
    if ok:
        argv = [sys.executable, str(HERE / "torch_probe.py"), "alloc", str(mib), str(hold)]
        return argv, "PyTorch (torch.empty)"
    raise CheckError("no CUDA program to run: nvcc could not build alloc_probe.cu and PyTorch has no CUDA")


def run_probe(ctx: Ctx, mib: int, hold: int,
              preload: bool = True) -> tuple[subprocess.Popen, dict | None, str]:
    """Start the probe for ``mib`` MiB under libvgpu.so with Allocate's env and mounts (a mount namespace
    when this machine allows one, else the same paths translated to the host); returns its first line."""
    alloc = ctx.facts["share_allocation"]
    argv, what = _probe_argv(ctx, mib, hold)
    lib_c = next((m["containerPath"] for m in alloc["mounts"] if m["containerPath"].endswith("/libvgpu.so")),
                 str(ctx.facts["libvgpu"]))
    env = _container_env(alloc, lib_c) if preload else {k: v for k, v in os.environ.items()}
    log = ctx.log_path(f"probe-{mib}{'' if preload else '-no-preload'}.log")
    log.parent.mkdir(parents=True, exist_ok=True)
    how = "no HAMi-core (control)"
    if preload:
        created: list[Path] = []
        ns_argv, skipped = _namespace_script(alloc, argv, created, ctx.work / "nsstage" / str(mib),
                                             preload=env.pop("LD_PRELOAD", None))
        for p in created:
            ctx.cleanups.append(lambda p=p: p.rmdir() if p.is_dir() and not any(p.iterdir()) else None)
        if ctx.facts.get("mount_namespace", True) and shutil.which("unshare"):
            proc = subprocess.Popen(ns_argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=open(log, "ab"), start_new_session=True)  # noqa: SIM115
            ctx.procs.procs.append((f"probe {mib} MiB", proc))
            line = _read_json_line(proc, ctx.budget(60))
            if line is not None:
                how = "mount namespace with Allocate's mounts" + (f"; skipped {skipped}" if skipped else "")
                return proc, line, f"{what}; {how}"
            rc = ctx.procs.stop(proc, grace_s=2)
            err = log.read_text(errors="replace")[-300:]
            if "mount" not in err and "unshare" not in err:
                return proc, None, f"{what}; namespace run printed nothing (exit {rc}): {err}"
            ctx.facts["mount_namespace"] = False
            ctx.facts["mount_namespace_error"] = err
        # no mount namespace here: the container paths translated to their host paths
        env = dict(env)
        env["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = _host_path(alloc, env["CUDA_DEVICE_MEMORY_SHARED_CACHE"])
        env["LD_PRELOAD"] = _host_path(alloc, lib_c)
        how = f"container paths translated to host paths (no mount namespace: " \
              f"{ctx.facts.get('mount_namespace_error', 'unshare missing')[-120:].strip()})"
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=open(log, "ab"), start_new_session=True)  # noqa: SIM115
    ctx.procs.procs.append((f"probe {mib} MiB", proc))
    return proc, _read_json_line(proc, ctx.budget(60)), f"{what}; {how}"


def _finish(ctx: Ctx, proc: subprocess.Popen) -> int | None:
    try:
        if proc.stdin:
            proc.stdin.close()  # "done with you": the probe frees and exits
    except OSError:
        pass
    try:
        return proc.wait(ctx.budget(15))
    except subprocess.TimeoutExpired:
        ctx.facts["killed_probes"] = ctx.facts.get("killed_probes", 0) + 1
        return ctx.procs.stop(proc, grace_s=2)


def check_hami_core_limits(ctx: Ctx) -> Result:
    if ctx.dry_run:
        return Result(NOT_SUPPORTED, "dry run: no CUDA device for a CUDA program under libvgpu.so")
    if not ctx.facts.get("hami_core_src"):
        return Result(SKIPPED, "no HAMi-core source tree given (--hami-core-src)")
    if "libvgpu" not in ctx.facts:
        raise CheckError("libvgpu.so was not built (see hami-core-build)")
    if "share_allocation" not in ctx.facts:
        raise CheckError("no Allocate answer for the 4096 MiB / 30 % share (see device-plugin)")
    alloc = ctx.facts["share_allocation"]
    details: dict[str, Any] = {"envs": alloc["envs"], "mounts": alloc["mounts"]}
    # control: without HAMi-core, 6 GiB fits on this GPU
    proc, ctl, what = run_probe(ctx, 6144, 0, preload=False)
    _finish(ctx, proc)
    details["control_6144_without_hami_core"] = ctl
    # 6 GiB over the 4 GiB limit, alone in the region: the allocation itself is refused
    proc6, r6, _ = run_probe(ctx, 6144, 0)
    _finish(ctx, proc6)
    details["alloc_6144"] = r6
    # 3 GiB under the 4 GiB limit: fits; held for the region check
    proc3, r3, how = run_probe(ctx, 3072, HOLD_S)
    details["alloc_3072"], details["how"] = r3, how
    if not r3 or not r3.get("ok"):
        _finish(ctx, proc3)
        raise CheckError(f"3072 MiB under a {SHARE_MIB} MiB limit failed: {r3} ({how}); HAMi-core log: "
                         f"{ctx.log_path('probe-3072.log').read_text(errors='replace')[-500:]}")
    ctx.facts["probe_3072"] = (proc3, r3)
    ctx.cleanups.append(lambda: _finish(ctx, proc3))
    _wait_region(ctx, _region_path(ctx))
    if not r6 or r6.get("ok") or r6.get("stage") == "context" or "memory" not in str(r6.get("error")).lower():
        raise CheckError(f"6144 MiB under a {SHARE_MIB} MiB limit was not refused with out-of-memory: {r6} "
                         f"(control without HAMi-core: {ctl})")
    ctl_note = "control without HAMi-core: 6144 MiB " + ("fits" if ctl and ctl.get("ok") else f"{ctl}")
    return Result(PASS, f"CUDA_DEVICE_MEMORY_LIMIT_0={alloc['envs'].get('CUDA_DEVICE_MEMORY_LIMIT_0')}, "
                        f"CUDA_DEVICE_SM_LIMIT={alloc['envs'].get('CUDA_DEVICE_SM_LIMIT')}: 3072 MiB ok, "
                        "6144 MiB "
                        f"{r6.get('error')} ({ctl_note}); {how}", details)


def _region_path(ctx: Ctx) -> Path:
    alloc = ctx.facts["share_allocation"]
    return Path(_host_path(alloc, alloc["envs"]["CUDA_DEVICE_MEMORY_SHARED_CACHE"]))


def _wait_region(ctx: Ctx, path: Path) -> bool:
    return bool(wait_until(lambda: path.exists() and path.stat().st_size > 1 << 20, ctx.budget(10), 0.1))


# ------------------------------------------------------------------------------ 11. HAMi-core region
def _mkregion(ctx: Ctx) -> Path:
    ran = ctx.run(["make", "-s", "-C", str(REPO / "tests" / "shrreg")], timeout=120)
    exe = REPO / "tests" / "shrreg" / "build" / "mkregion"
    if ran.rc != 0 or not exe.exists():
        raise CheckError(f"cannot build tests/shrreg/mkregion (gcc): {ran.err[-300:]}")
    return exe


def check_hami_core_region(ctx: Ctx) -> Result:
    if not ctx.dry_run and not ctx.facts.get("hami_core_src"):
        return Result(SKIPPED, "no HAMi-core source tree given (--hami-core-src)")
    if "share_allocation" not in ctx.facts:
        raise CheckError("no Allocate answer for the share (see device-plugin)")
    alloc = ctx.facts["share_allocation"]
    limit_mib = int(alloc["envs"]["CUDA_DEVICE_MEMORY_LIMIT_0"].rstrip("mM"))
    sm_limit = int(alloc["envs"]["CUDA_DEVICE_SM_LIMIT"])
    region = _region_path(ctx)
    used_expect = 3072 * MIB
    if ctx.dry_run:
        # HAMi-core's writer stand-in: the same layout, limits from Allocate's env, one live slot of 3 GiB
        exe = _mkregion(ctx)
        region.parent.mkdir(parents=True, exist_ok=True)
        made = ctx.run([str(exe), "create", str(region), "v1.2", "1", str(limit_mib), str(sm_limit)],
                       timeout=20)
        if made.rc != 0:
            raise CheckError(f"mkregion create: {made.err}")
        proc = ctx.procs.start("mkregion live", [str(exe), "live", str(region), "v1.2", "60"],
                               dict(ctx.env, MKREGION_BYTES=str(used_expect)), None, stdout=subprocess.PIPE)
        first = proc.stdout.readline().decode() if proc.stdout else ""
        if not first.startswith("READY"):
            raise CheckError(f"mkregion live did not start: {first!r}")
        holder, writer = int(first.split()[1]), "tests/shrreg/mkregion (HAMi-core's v1.2 layout; dry run)"
    else:
        held = ctx.facts.get("probe_3072")
        if not held:
            raise CheckError("the 3072 MiB probe is not holding its memory (see hami-core-limits)")
        proc, line = held
        holder, writer = int(line["pid"]), "HAMi-core libvgpu.so in the 3072 MiB probe"
        if not _wait_region(ctx, region):
            raise CheckError(f"HAMi-core wrote no shared region at {region}")
    try:
        # shrreg_tool --inspect decodes it
        ran = ctx.run(ctx.agent_argv("shrreg", "--inspect", "--json", "--file", str(region)), timeout=30)
        ctx.save("shrreg-inspect.json", ran.out)
        try:
            doc = json.loads(ran.out)
        except ValueError as exc:
            raise CheckError(f"shrreg_tool --inspect --json printed no JSON (exit {ran.rc}): "
                             f"{ran.err[-300:]}") from exc
        reg = (doc.get("regions") or [{"error": "no region listed"}])[0]
        problems = _check_region(reg, limit_mib, sm_limit, holder, used_expect,
                                 None if ctx.dry_run else alloc["gpu"])
        # ... and the monitor shows it under the pod
        mon = start_monitor(ctx)
        seen: dict[str, Any] = {}

        def in_metrics() -> bool:
            text = scrape(mon["port"])
            used = metric_values(text, "hami_vgpu_memory_used_bytes", pod="hami-core-share",
                                 namespace="default")
            limit = metric_values(text, "hami_vgpu_memory_limit_bytes", pod="hami-core-share")
            seen.update(used=used, limit=limit, text=text)
            return bool(used) and max(used) >= used_expect

        got = wait_until(in_metrics, ctx.budget(15), interval=0.5)
        ctx.save("monitor-metrics-region.txt", seen.get("text", ""))
    finally:
        if ctx.dry_run:
            # the stand-in ends like a killed process (its slot stays): its region goes with it, as the
            # container's would; HAMi-core's own exit handler clears its slot in the real run
            ctx.procs.stop(proc, grace_s=1)
            region.unlink(missing_ok=True)
        else:
            _finish(ctx, proc)
    details = {"region": str(region), "writer": writer, "findings": reg.get("findings"),
               "layout": (reg.get("region") or {}).get("layout"), "metrics_used": seen.get("used"),
               "metrics_limit": seen.get("limit"), "shrreg_exit": ran.rc}
    if not got:
        problems.append(f"monitor /metrics: hami_vgpu_memory_used_bytes{{pod=hami-core-share}} = "
                        f"{seen.get('used')}, expected >= {used_expect}")
    if seen.get("limit") and max(seen["limit"]) != limit_mib * MIB:
        problems.append(f"monitor limit {seen['limit']} != {limit_mib * MIB}")
    if problems:
        return Result(FAIL, "; ".join(problems), details)
    return Result(PASS, f"{writer}: region {region.name} decodes (limit {limit_mib} MiB, SM {sm_limit} %, "
                        "pid "
                        f"{holder} alive with {used_expect // MIB}+ MiB); monitor: default/hami-core-share "
                        f"used {max(seen['used']) / MIB:.0f} MiB of {limit_mib} MiB", details)


def _check_region(entry: dict[str, Any], limit_mib: int, sm: int, holder: int, used: int,
                  gpu_uuid: str | None) -> list[str]:
    """What ``shrreg_tool --inspect --json`` decoded against what Allocate asked for and the writer holds."""
    if entry.get("error"):
        return [f"shrreg_tool could not decode the region: {entry['error']}"]
    reg = entry.get("region") or {}
    problems = []
    if not reg.get("devices"):
        return [f"shrreg_tool decoded no device: {json.dumps(reg)[:300]}"]
    if (reg.get("limit") or [None])[0] != limit_mib * MIB:
        problems.append(f"region limit {(reg.get('limit') or [None])[0]} != {limit_mib} MiB")
    if (reg.get("sm_limit") or [None])[0] != sm:
        problems.append(f"region SM limit {(reg.get('sm_limit') or [None])[0]} != {sm}")
    if gpu_uuid and (reg.get("uuids") or [""])[0] != gpu_uuid:
        problems.append(f"region device 0 is {(reg.get('uuids') or [''])[0]!r}, not {gpu_uuid}")
    slots = [p for p in reg.get("procs") or [] if int(p.get("pid", 0)) == holder]
    if not slots:
        pids = [p.get("pid") for p in reg.get("procs") or []]
        problems.append(f"no slot of pid {holder} in the region ({pids})")
    elif sum(int((u or {}).get("total", 0)) for u in slots[0].get("used") or []) < used:
        problems.append(f"slot of pid {holder} holds {slots[0].get('used', [{}])[0]}, less than {used} bytes")
    if (reg.get("liveness") or {}).get(str(holder)) not in (None, "alive"):
        problems.append(f"pid {holder} is {reg['liveness'][str(holder)]} to shrreg_tool")
    bad = [f"{f['code']} ({f['severity']})" for f in entry.get("findings") or []
           if f.get("severity") in ("error", "critical")]
    if bad:
        problems.append(f"shrreg_tool findings: {', '.join(bad)}")
    return problems
