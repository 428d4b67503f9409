"""Evidence from the node itself (or from files): NVML, the driver version and MIG layout read without
NVML, ``nvidia-cuda-mps-control``, HAMi-core's ``libvgpu.so`` / ``ld.so.preload``, shared regions.

Everything is read under ``--host-root`` so tests (and a doctor running in a container with the host
mounted at /host) point it elsewhere.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from hami_agent.doctor import knownbad
from hami_agent.doctor.collect.base import Context
from hami_agent.doctor.model import Facts

MPS_CONTROL = "nvidia-cuda-mps-control"
SYSFS_ROOT_ENV = "HAMI_SYSFS_ROOT"
MAX_REGIONS = 200
_PROC_VERSION = re.compile(r"Kernel Module\s+(\d+\.\d+(?:\.\d+)?)")
_MINOR = re.compile(r"Device Minor:\s*(\d+)")


def _read(path: str, limit: int = 65536) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read(limit)
    except OSError:
        return None


# ------------------------------------------------------------------------------------ driver / MIG
def collect_driver_files(ctx: Context, facts: Facts) -> None:
    """The loaded kernel module's version and the MIG layout from /sys and /proc: these need no NVML,
    so they still answer when NVML hangs (seed 003)."""
    # HAMI_SYSFS_ROOT: the same override the NVML layer and the Ansible modules honour (simulated nodes
    # keep the loaded module version outside /sys, which a container cannot fake).
    sysfs_root = os.environ.get(SYSFS_ROOT_ENV)
    sys_path = (os.path.join(sysfs_root, "module/nvidia/version") if sysfs_root
                else ctx.host_path("/sys/module/nvidia/version"))
    proc_path = ctx.host_path("/proc/driver/nvidia/version")
    text = _read(sys_path)
    if text and text.strip():
        facts.set("host.driver.version", text.strip(), f"{sys_path}: {text.strip()}")
    else:
        text = _read(proc_path)
        m = _PROC_VERSION.search(text or "")
        if m:
            first = (text or "").splitlines()[0].strip()
            facts.set("host.driver.version", m.group(1), f"{proc_path}: {first}")
        else:
            facts.set("host.driver.version", None, f"no NVIDIA kernel module version in {sys_path} or "
                                                   f"{proc_path}")
    gpus_dir = Path(ctx.host_path("/proc/driver/nvidia/gpus"))
    minors: list[int] = []
    if gpus_dir.is_dir():
        for info in sorted(gpus_dir.glob("*/information")):
            m = _MINOR.search(_read(str(info)) or "")
            if m:
                minors.append(int(m.group(1)))
    if not minors:
        return
    caps = Path(ctx.host_path("/proc/driver/nvidia/capabilities"))
    mig_on = [n for n in minors if any((caps / f"gpu{n}" / "mig").glob("gi*"))]
    facts.set("host.gpus.minors", minors, f"{gpus_dir}: {len(minors)} GPUs (minors {minors})")
    facts.set("host.mig.enabled_minors", mig_on,
              f"{caps}: GPU instances exist on GPU minors {mig_on or 'none'}")


def collect_nvml(ctx: Context, facts: Facts) -> None:
    """One NVML inventory in a throw-away worker with a deadline: a timeout names the hung call. Not run
    when NVML workers are already stuck in the driver: a probe would only leave one more behind."""
    from hami_agent.doctor.collect.nvmlworkers import find_nvml_workers, unkillable
    from hami_agent.nvml import NvmlError, NvmlTimeout, collect_inventory

    stuck = unkillable(find_nvml_workers(ctx.proc()))
    if stuck:
        facts.set("nvml.status", "hung",
                  f"NVML: not probed: {len(stuck)} NVML worker process(es) already stuck in the driver "
                  f"({', '.join(str(w['pid']) for w in stuck)}); a probe would only add one more")
        facts.set("nvml.stuck_call", "an earlier call of the agent's NVML worker")
        return
    try:
        snap = collect_inventory(ctx.nvml_lib, timeout_s=ctx.nvml_timeout_s)
    except NvmlTimeout as exc:
        facts.set("nvml.status", "hung", f"NVML: {exc}")
        facts.set("nvml.stuck_call", exc.call)
        return
    except NvmlError as exc:
        facts.set("nvml.status", "error", f"NVML: {exc}")
        facts.set("nvml.error", str(exc))
        return
    facts.set("nvml.status", "ok", f"NVML answered: {len(snap.gpus)} GPUs, driver {snap.driver_version}")
    facts.set("nvml.driver_version", snap.driver_version)
    facts.set("nvml.gpus", [{"index": g.index, "uuid": g.uuid, "name": g.name, "mig_enabled": g.mig_enabled,
                             "mig_devices": len(g.mig_devices), "healthy": g.healthy} for g in snap.gpus],
              *(f"GPU {g.index} {g.uuid} {g.name} MIG {'enabled' if g.mig_enabled else 'disabled'}"
                f"{f' ({len(g.mig_devices)} MIG devices)' if g.mig_devices else ''}" for g in snap.gpus))
    facts.set("nvml.mig_modes", [g.mig_enabled for g in snap.gpus])


# ---------------------------------------------------------------------------------------- binaries
def which(ctx: Context, name: str) -> str | None:
    path_env = ctx.path_env if ctx.path_env is not None else os.environ.get("PATH", "")
    if ctx.host_root in ("", "/"):
        return shutil.which(name, path=path_env)
    for d in path_env.split(os.pathsep):
        candidate = ctx.host_path(os.path.join(d, name))
        if d and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def collect_mps(ctx: Context, facts: Facts) -> None:
    found = which(ctx, MPS_CONTROL)
    path_env = ctx.path_env if ctx.path_env is not None else os.environ.get("PATH", "")
    facts.set("host.mps_control.path", found,
              f"{MPS_CONTROL}: {found}" if found else f"{MPS_CONTROL}: executable file not found in $PATH "
                                                      f"({path_env})")
    if ctx.expect_mps:
        facts.set("host.mps.expected", True, "--expect-mps given: this node shares GPUs with MPS")


# ------------------------------------------------------------------------------------- HAMi-core
def collect_hami_core_files(ctx: Context, facts: Facts) -> None:
    vgpu = ctx.host_path(os.path.join(ctx.hook_path, "vgpu"))
    lib = os.path.join(vgpu, "libvgpu.so")
    versions = sorted(p.name for p in Path(vgpu).glob("libvgpu.so*")) if os.path.isdir(vgpu) else []
    facts.set("host.libvgpu.present", bool(versions),
              f"{lib}: " + (f"present ({', '.join(versions)})" if versions else "missing"))
    preload = os.path.join(vgpu, "ld.so.preload")
    text = _read(preload)
    facts.set("host.preload.present", text is not None,
              f"{preload}: " + ("missing" if text is None else f"{text.strip()!r}"))
    if text is not None:
        facts.set("host.preload.lists_libvgpu", "libvgpu.so" in text)
    etc = ctx.host_path("/etc/ld.so.preload")
    etc_text = _read(etc)
    if etc_text is not None:
        facts.set("host.etc_preload", etc_text.strip(), f"{etc}: {etc_text.strip()!r}")


def collect_shrreg(ctx: Context, facts: Facts) -> None:
    from hami_agent.shrreg import analyse_region, find_region_files, read_region, scan_attachment

    root = ctx.shrreg_root or ctx.host_path(os.path.join(ctx.hook_path, "vgpu", "containers"))
    facts.set("shrreg.root", root)
    if not os.path.exists(root):
        facts.set("shrreg.regions", 0, f"{root}: no shared-region directory")
        return
    findings: list[dict] = []
    count = 0
    for path in find_region_files(root):
        count += 1
        if count > MAX_REGIONS:
            facts.add_lines("shrreg.regions", f"more than {MAX_REGIONS} regions; the rest were not read")
            break
        try:
            region = read_region(path)
            attachment = scan_attachment(path, proc_root=ctx.proc())
            got = analyse_region(region, attachment)
        except Exception as exc:  # noqa: BLE001 - one bad file must not hide the others
            findings.append({"code": "REGION_UNREADABLE", "severity": "warning", "path": str(path),
                             "message": f"{type(exc).__name__}: {exc}", "remedy": "", "pid": None})
            continue
        findings.extend(f.to_dict() for f in got if f.severity != "ok")
    facts.set("shrreg.regions", count, f"{root}: {count} shared region file(s) read")
    facts.set("shrreg.findings", findings)
    facts.set("shrreg.codes", sorted({f["code"] for f in findings}))
    for f in findings:
        facts.add_lines(f"shrreg.{f['code']}", f"{f['path']}: {f['code']}: {f['message']}")


# ------------------------------------------------------------------------------------ derived facts
def derive_driver_facts(facts: Facts) -> None:
    """Combine NVML, /sys and the API into ``driver.version``, ``driver.known_bad`` and ``mig.mixed``;
    each keeps the lines of the source it came from."""
    version = facts.get("nvml.driver_version", None) or facts.get("host.driver.version", None)
    if version:
        src = "nvml.status" if facts.get("nvml.driver_version", None) else "host.driver.version"
        facts.set("driver.version", version, *facts.lines(src))
        bad = knownbad.lookup(version)
        facts.set("driver.known_bad", bad is not None,
                  f"driver {version} is a known-bad build: {bad.reason} ({bad.reference})" if bad
                  else f"driver {version} is not on the known-bad list")
        if bad:
            facts.set("driver.fixed_in", bad.fixed_in)
    modes = facts.get("nvml.mig_modes", None)
    if modes:
        facts.set("mig.mixed", set(bool(m) for m in modes) == {True, False}, *facts.lines("nvml.gpus"))
        return
    minors, on = facts.get("host.gpus.minors", None), facts.get("host.mig.enabled_minors", None)
    if minors:
        facts.set("mig.mixed", bool(on) and len(on) < len(minors),
                  *facts.lines("host.gpus.minors"), *facts.lines("host.mig.enabled_minors"))
        return
    mig_alloc = facts.get("node.mig_allocatable", None)
    gpu_alloc = facts.get("node.allocatable_gpu", None)
    if isinstance(mig_alloc, dict) and gpu_alloc is not None and facts.get("node.found", False):
        mixed = any(v > 0 for v in mig_alloc.values()) and (gpu_alloc or 0) > 0
        facts.set("mig.mixed", mixed, *facts.lines("node.allocatable_gpu"),
                  *facts.lines("node.mig_allocatable"))
