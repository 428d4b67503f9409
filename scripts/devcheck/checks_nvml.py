"""NVML checks: the inventory against nvidia-smi, the health-event worker, the XID table, the stuck path.

This process never calls NVML itself: the agent's worker processes do (``hami-agent devices``,
``NvmlSupervisor``, ``NvmlClient``), and the raw dump runs in a child (``nvml_dump.py``) with a deadline.
"""

from __future__ import annotations

import json
import re
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from devcheck.core import FAIL, NOT_SUPPORTED, PASS, CheckError, Ctx, Result, wait_until

HERE = Path(__file__).resolve().parent

# XIDs NVIDIA documents in its "XID Errors" catalog that a device plugin meets most, with what HAMi's and
# NVIDIA's plugins do with them (the six application-class ones are ignored, every other marks the GPU).
XID_TABLE = {
    13: "graphics engine exception (application)", 31: "GPU memory page fault (application)",
    43: "GPU stopped processing (application)", 45: "preemptive cleanup (application)",
    48: "double-bit ECC error", 63: "ECC page retirement / row remapping", 64: "row remapper failure",
    68: "video processor exception (application)", 74: "NVLink error", 79: "GPU has fallen off the bus",
    92: "high single-bit ECC rate", 94: "contained ECC error", 95: "uncontained ECC error",
    109: "context switch timeout (application)", 119: "GSP RPC timeout", 120: "GSP error",
}
IGNORED_BY_NVIDIA = frozenset({13, 31, 43, 45, 68, 109})


# ------------------------------------------------------------------------------------- raw answers
def nvml_dump(ctx: Ctx) -> dict[str, Any]:
    """The raw NVML answers (cached): ``nvml_dump.py`` in a child process, killed at its deadline."""
    if "nvml_dump" in ctx.facts:
        return ctx.facts["nvml_dump"]
    argv = [sys.executable, str(HERE / "nvml_dump.py")]
    if ctx.nvml_lib:
        argv += ["--lib", ctx.nvml_lib]
    ran = ctx.run(argv, timeout=20)
    doc: dict[str, Any]
    try:
        doc = json.loads(ran.out) if ran.out.strip() else {}
    except ValueError:
        doc = {}
    if ran.rc != 0 or not doc:
        doc = {"error": "the raw NVML dump failed: " + ("timed out after 20s" if ran.timed_out else
                                                        f"exit {ran.rc}: {(ran.err or ran.out)[-400:]}"),
               **doc}
    ctx.save("nvml-dump.json", doc)
    ctx.facts["nvml_dump"] = doc
    return doc


def devices_json(ctx: Ctx) -> dict[str, Any]:
    """``hami-agent devices --json`` (cached)."""
    if "devices" in ctx.facts:
        return ctx.facts["devices"]
    ran = ctx.run(ctx.agent_argv("devices", "--json", "--timeout", "20"), timeout=30)
    ctx.save("hami-agent-devices.json", ran.out or "")
    if ran.err:
        ctx.save("logs/hami-agent-devices.stderr", ran.err)
    try:
        doc = json.loads(ran.out)
    except ValueError as exc:
        raise CheckError(f"hami-agent devices --json printed no JSON (exit {ran.rc}): "
                         f"{(ran.err or ran.out)[-300:]}") from exc
    if doc.get("status") != "ok" or not doc.get("gpus"):
        raise CheckError(f"hami-agent devices: status {doc.get('status')}, "
                         f"{len(doc.get('gpus') or [])} GPUs, "
                         f"error {doc.get('error')}")
    ctx.facts["devices"] = doc
    return doc


def smi(ctx: Ctx, *args: str, timeout: float = 30) -> tuple[int | None, str, str]:
    ran = ctx.run(["nvidia-smi", *args], timeout=timeout)
    return ran.rc, ran.out, ran.err


# ------------------------------------------------------------------------------- 1. the inventory
def _xml_text(node: ET.Element | None, path: str) -> str | None:
    if node is None:
        return None
    found = node.find(path)
    return found.text.strip() if found is not None and found.text is not None else None


def _mib(text: str | None) -> int | None:
    m = re.match(r"^\s*(\d+)\s*MiB\s*$", text or "")
    return int(m.group(1)) if m else None


def _topo_numa(ctx: Ctx) -> dict[int, str]:
    """``nvidia-smi topo -m``: the NUMA Affinity column per GPU index (real nvidia-smi; the gpusim stub
    has no ``topo``)."""
    rc, out, _err = smi(ctx, "topo", "-m", timeout=20)
    if rc != 0 or "NUMA Affinity" not in out:
        return {}
    lines = [ln for ln in out.splitlines() if ln.strip()]
    header = next((ln for ln in lines if "NUMA Affinity" in ln), "")
    cols = re.split(r"\t+|\s{2,}", header.strip())
    try:
        idx = cols.index("NUMA Affinity")
    except ValueError:
        return {}
    result = {}
    for ln in lines:
        m = re.match(r"^GPU(\d+)\s", ln)
        if not m:
            continue
        cells = re.split(r"\t+|\s{2,}", ln.strip())
        # the row has the row label in front of the header's columns
        if len(cells) > idx + 1:
            result[int(m.group(1))] = cells[idx + 1]
    return result


def _sysfs_numa(bus: str) -> str | None:
    domain, _, rest = bus.partition(":")
    try:
        bdf = f"{int(domain, 16):04x}:{rest.lower()}"
        return Path(f"/sys/bus/pci/devices/{bdf}/numa_node").read_text().strip()
    except (OSError, ValueError):
        return None


def _norm_numa(value: Any) -> int | None:
    if value is None:
        return None
    text = str(value).strip()
    if text in ("N/A", "", "-1"):
        return None
    try:
        n = int(text)
    except ValueError:
        return None
    return n if n >= 0 else None


def check_inventory(ctx: Ctx) -> Result:
    dev = devices_json(ctx)
    nvml_dump(ctx)  # the raw answers, saved for the record
    rc, xml_text, err = smi(ctx, "-q", "-x")
    if rc != 0 or not xml_text.strip():
        if rc == 127 or "No such file" in err:
            return Result(NOT_SUPPORTED, "no nvidia-smi on this machine: nothing to compare with")
        raise CheckError(f"nvidia-smi -q -x failed (exit {rc}): {(err or xml_text)[-300:]}")
    ctx.save("nvidia-smi-q.xml", xml_text)
    root = ET.fromstring(xml_text)
    rc_cc, cc_out, _ = smi(ctx, "--query-gpu=index,pci.bus_id,compute_cap", "--format=csv,noheader")
    ctx.save("nvidia-smi-compute-cap.csv", cc_out)
    cc_by_bus = {}
    if rc_cc == 0:
        for line in cc_out.splitlines():
            parts = [p.strip() for p in line.split(",")]
            if len(parts) == 3:
                cc_by_bus[parts[1].upper()] = parts[2]
    topo = _topo_numa(ctx) if not ctx.dry_run else {}
    from hami_agent.dra.devices import architecture

    smi_gpus = {(g.get("id") or "").upper(): g for g in root.findall("gpu")}
    rows: list[dict[str, Any]] = []

    def row(gpu: int, fld: str, agent: Any, ref: Any, source: str, required: bool = True) -> None:
        if ref is None:
            verdict = "no-reference" if not required else "missing"
        else:
            verdict = "equal" if agent == ref else "differs"
        rows.append({"gpu": gpu, "field": fld, "agent": agent, "nvidia_smi": ref, "source": source,
                     "result": verdict})

    cuda = dev.get("cuda_driver_version")
    agent_cuda = f"{cuda // 1000}.{(cuda % 1000) // 10}" if isinstance(cuda, int) and cuda > 0 else None
    row(-1, "driver_version", dev.get("driver_version"), _xml_text(root, "driver_version"),
        "<driver_version>")
    row(-1, "cuda_version", agent_cuda, _xml_text(root, "cuda_version"), "<cuda_version>")
    row(-1, "gpu_count", len(dev["gpus"]), len(smi_gpus), "<gpu> elements")
    for g in dev["gpus"]:
        bus = str(g["pci_bus_id"]).upper()
        sg = smi_gpus.get(bus)
        i = g["index"]
        if sg is None:
            row(i, "pci_bus_id", g["pci_bus_id"], None, "<gpu id>")
            continue
        row(i, "pci_bus_id", bus, (_xml_text(sg, "pci/pci_bus_id") or "").upper() or None, "<pci_bus_id>")
        row(i, "uuid", g["uuid"], _xml_text(sg, "uuid"), "<uuid>")
        row(i, "name", g["name"], _xml_text(sg, "product_name"), "<product_name>")
        row(i, "memory_mib", g["memory_mib"], _mib(_xml_text(sg, "fb_memory_usage/total")),
            "<fb_memory_usage><total>")
        cur = _xml_text(sg, "mig_mode/current_mig")
        pend = _xml_text(sg, "mig_mode/pending_mig")
        agent_mig = ("N/A" if not g["mig_capable"] else ("Enabled" if g["mig_enabled"] else "Disabled"))
        agent_pend = ("N/A" if not g["mig_capable"] else ("Enabled" if g["mig_pending"] else "Disabled"))
        row(i, "mig_mode.current", agent_mig, cur, "<mig_mode><current_mig>")
        row(i, "mig_mode.pending", agent_pend, pend, "<mig_mode><pending_mig>")
        arch = architecture(g["name"])
        row(i, "compute_capability", arch[1] if arch else None, cc_by_bus.get(bus),
            "--query-gpu=compute_cap (the agent derives it from the product name: dra/devices.py)")
        # -q -x carries no CPU-affinity NUMA node (a "GPU NUMA ID" is the GPU memory's own node on
        # coherent systems, another thing): topo -m's NUMA Affinity column, else sysfs
        numa_ref, numa_src = None, ""
        if i in topo:
            numa_ref, numa_src = topo[i], "nvidia-smi topo -m, NUMA Affinity"
        if numa_ref is None and not ctx.dry_run:
            numa_ref, numa_src = _sysfs_numa(bus), "/sys/bus/pci/devices/<bdf>/numa_node"
        row(i, "numa", g["numa"], _norm_numa(numa_ref) if numa_ref is not None else None,
            numa_src or "none (this nvidia-smi shows no NUMA node)", required=False)
        if numa_ref is not None and rows[-1]["nvidia_smi"] is None:
            rows[-1]["result"] = "equal" if g["numa"] is None else "differs"  # N/A / -1 = no affinity
    ctx.save("inventory-comparison.json", rows)
    bad = [r for r in rows if r["result"] in ("differs", "missing")]
    compared = [r for r in rows if r["result"] == "equal"]
    unref = [f"{r['field']}" for r in rows if r["result"] == "no-reference"]
    details = {"rows": rows}
    if bad:
        return Result(FAIL, "; ".join(f"GPU {r['gpu']} {r['field']}: agent {r['agent']!r} vs nvidia-smi "
                                      f"{r['nvidia_smi']!r}" for r in bad[:6]), details)
    gpus = ", ".join(f"{g['index']}:{g['name']} {g['memory_mib']}MiB {g['pci_bus_id']}" for g in dev["gpus"])
    note = f"; no reference for {', '.join(sorted(set(unref)))}" if unref else ""
    return Result(PASS, f"{len(compared)} fields equal ({gpus}; driver {dev.get('driver_version')}, CUDA "
                        f"{agent_cuda}){note}", details)


# --------------------------------------------------------------------- 2. events: register + wait
def check_events(ctx: Ctx) -> Result:
    from hami_agent.nvml.supervisor import NvmlSupervisor

    devices_json(ctx)
    sup = NvmlSupervisor(lib_path=ctx.nvml_lib, call_timeout_s=5.0, refresh_interval_s=30.0,
                         watch_events=True, event_wait_ms=1000)
    t0 = time.monotonic()
    sup.start()
    try:
        snap = wait_until(lambda: sup.snapshot() if sup.snapshot().status == "ok" else None,
                          ctx.budget(20))
        if not snap:
            s = sup.snapshot()
            raise CheckError(f"NVML supervisor never got an inventory: status {s.status}, {s.error}")
        # two full event waits: each must come back (timeout) within its bound
        waited = wait_until(lambda: _waits_done(sup), ctx.budget(6), interval=0.1)
        durations = sup.call_durations()
        status = sup.snapshot()
    finally:
        sup.stop(timeout=5)
    took = time.monotonic() - t0
    details = {"call_durations_s": durations, "snapshot_status": status.status}
    reg = durations.get("nvmlDeviceRegisterEvents")
    wait_s = durations.get("nvmlEventSetWait_v2")
    if reg is None:
        dump = nvml_dump(ctx)
        types = [g.get("supported_event_types") for g in dump.get("gpus", [])]
        return Result(FAIL, f"no nvmlDeviceRegisterEvents call returned (supported event types: {types}); "
                            "health checks would be off", details)
    if not waited or wait_s is None:
        return Result(FAIL, f"nvmlEventSetWait_v2 did not return within the bound (1 s wait + 5 s call "
                            f"deadline) in {took:.1f}s", details)
    if status.status != "ok" or not all(g.healthy for g in status.gpus):
        return Result(FAIL, f"after the event waits the snapshot is {status.status}: "
                            f"{[(g.index, g.unhealthy_reason) for g in status.gpus if not g.healthy]}",
                      details)
    return Result(PASS, f"XidCriticalError registered on every GPU ({reg * 1000:.2f} ms); an idle "
                        f"nvmlEventSetWait_v2(1000 ms) returned after {wait_s:.3f}s (bound 6 s); GPUs "
                        "healthy",
                  details)


def _waits_done(sup: Any) -> bool:
    d = sup.call_durations()
    return "nvmlEventSetWait_v2" in d and "nvmlDeviceRegisterEvents" in d


# ------------------------------------------------------------------------------- 3. XID table
def check_xid_table(ctx: Ctx) -> Result:
    from hami_agent.nvml.health import DEFAULT_IGNORED_XIDS, XidPolicy

    dump = nvml_dump(ctx)
    if "gpus" not in dump:
        raise CheckError(dump.get("error") or "no NVML answers")
    policy = XidPolicy.from_env({})
    table = [{"xid": x, "meaning": m, "agent": "unhealthy" if policy.is_critical(x) else "ignored",
              "nvidia_device_plugin": "ignored" if x in IGNORED_BY_NVIDIA else "unhealthy"}
             for x, m in sorted(XID_TABLE.items())]
    boards = []
    for g in dump["gpus"]:
        types = g.get("supported_event_types")
        if types is None:
            boards.append((g["index"], None, g.get("nvmlDeviceGetSupportedEventTypes")))
        else:
            boards.append((g["index"], types, None))
    details = {"table": table, "supported_event_types": {str(i): t or err for i, t, err in boards}}
    ctx.save("xid-table.json", details)
    wrong = [r for r in table if r["agent"] != r["nvidia_device_plugin"]]
    if wrong or DEFAULT_IGNORED_XIDS != IGNORED_BY_NVIDIA:
        return Result(FAIL, f"the agent classifies XIDs {[r['xid'] for r in wrong]} unlike NVIDIA's plugin",
                      details)
    no_xid = [i for i, t, _err in boards if not t or "XidCriticalError" not in t]
    if no_xid:
        return Result(FAIL, f"GPU(s) {no_xid} do not offer XidCriticalError events: the agent's health "
                            f"check cannot see XIDs there ({details['supported_event_types']})", details)
    kinds = sorted({k for _i, t, _e in boards for k in (t or [])})
    return Result(PASS, f"{len(table)} XIDs classified as NVIDIA's plugin does (ignored: "
                        f"{sorted(IGNORED_BY_NVIDIA)}); every GPU offers XidCriticalError; event types: "
                        f"{', '.join(kinds)}", details)


# ------------------------------------------------------------------------------- 4. stuck worker
def check_stuck(ctx: Ctx) -> Result:
    """A fresh worker whose NVML calls get a 1 ms deadline: the first call that takes longer (on a real
    driver: nvmlInit, which opens the device files) must end as NvmlTimeout naming it, the worker SIGKILLed
    inside the driver must exit, and a worker with the normal deadline must answer next. gpusim answers
    every call within microseconds, so the dry run adds gpusim's hang fault on nvmlInit when 1 ms is met."""
    from hami_agent.nvml.client import NvmlClient
    from hami_agent.nvml.errors import NvmlError, NvmlTimeout
    from hami_agent.nvml.reaper import WorkerReaper

    reaper = WorkerReaper(limit=2)
    attempts: list[dict[str, Any]] = []
    caught: NvmlTimeout | None = None
    faulted = False
    t_kill = 0.0
    for attempt in range(4):
        if attempt == 2 and ctx.dry_run:
            _gpusim_fault(ctx, "nvmlInit", True)
            faulted = True
        client = NvmlClient(ctx.nvml_lib, call_timeout_s=0.001, reaper=reaper)
        t0 = time.monotonic()
        try:
            client.inventory(timeout_s=ctx.budget(20))
            attempts.append({"result": "every call answered within 1 ms",
                             "s": round(time.monotonic() - t0, 4)})
        except NvmlTimeout as exc:
            caught, t_kill = exc, time.monotonic()
            attempts.append({"result": str(exc), "call": exc.call, "pid": exc.pid,
                             "s": round(time.monotonic() - t0, 4)})
        except NvmlError as exc:
            attempts.append({"result": f"error: {exc}"})
        finally:
            client.close()
        if caught:
            break
    if faulted:
        _gpusim_fault(ctx, "nvmlInit", False)
    if caught is None:
        return Result(FAIL, "no NVML call outlasted a 1 ms deadline: the stuck path was not reached",
                      {"attempts": attempts})
    exited = wait_until(lambda: reaper.reap() == 0, ctx.budget(5), interval=0.01)
    gone_s = time.monotonic() - t_kill
    with NvmlClient(ctx.nvml_lib, call_timeout_s=10.0, reaper=reaper) as good:
        try:
            snap = good.inventory(timeout_s=ctx.budget(20))
        except NvmlError as exc:
            snap = None
            attempts.append({"recovery": str(exc)})
    details = {"attempts": attempts, "abandoned_alive": reaper.reap(), "reaper": reaper.details(),
               "gpusim_hang_fault": faulted}
    if not exited:
        return Result(FAIL, f"the worker killed in {caught.call} did not exit within 5 s (stuck in the "
                            "driver): "
                            f"{reaper.details()}", details)
    if snap is None or snap.status != "ok":
        return Result(FAIL, "no worker with the normal deadline answered after the stuck one", details)
    how = " (gpusim's hang fault on nvmlInit: gpusim answers within 1 ms)" if faulted else ""
    return Result(PASS, f"1 ms deadline: NvmlTimeout in {caught.call}{how} after "
                        f"{attempts[-1]['s'] * 1000:.1f} ms, worker pid {caught.pid} SIGKILLed and gone "
                        f"{gone_s * 1000:.0f} ms later; a worker with the normal deadline answered "
                        f"({len(snap.gpus)} GPUs)", details)


def _gpusim_fault(ctx: Ctx, fn: str, on: bool) -> None:
    from tests.gpusim import gpusim_state as gs

    def edit(s: dict) -> None:
        hang = s.setdefault("faults", {}).setdefault("hang_functions", [])
        if on and fn not in hang:
            hang.append(fn)
        if not on and fn in hang:
            hang.remove(fn)

    gs.update_state(ctx.facts["gpusim_state"], edit)
