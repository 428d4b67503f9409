"""NVML worker: the ONLY process that calls into libnvidia-ml. Run as ``python -m hami_agent.nvml.worker``.

Why a separate process: a thread blocked inside an NVML call (the R570 init hang of seed 003) can never
be cancelled; a process can be abandoned. The parent (``supervisor``/``inventory``) reads this worker's
stdout, one JSON object per line:

  {"t": "begin", "k": 7, "fn": "nvmlInit", "limit": 5.0}     an NVML call starts (deadline: limit s)
  {"t": "end", "k": 7, "fn": "nvmlInit", "s": 0.0012}         it returned after s seconds
  {"t": "batch", "k": 8, "limit": 5.0}                         a batch of calls starts (an inventory, a
                                                               usage sample): each call is in the shared
                                                               call slot (``callslot``), not on stdout
  {"t": "batch-end", "k": 8, "calls": [["nvmlDeviceGetCount", 0.0001], ...]}   it ended; the calls' times
  {"t": "inventory", "data": {...}, "id": 3}                   a full inventory (see ``collect``)
  {"t": "usage", "data": {...}, "id": 4}                       per-GPU and per-process usage
  {"t": "event", "index": 3, "uuid": "GPU-...", "xid": 79, "gi": null, "ci": null}
  {"t": "error", "fn": "...", "code": 9, "msg": "nvml Init err: Driver Not Loaded", "fatal": true}
  {"t": "bye"}

Modes: ``watch`` (the supervisor's: an inventory every ``--refresh`` seconds plus XID events) and
``serve`` (a long-lived worker answering requests, one JSON line each on stdin: ``{"op": "usage",
"id": 4}``, ``{"op": "inventory", "id": 3}``, or a dynamic-MIG op with ``"args"``: ``mig_profiles``,
``mig_instances``, ``mig_create``, ``mig_destroy`` (``hami_agent.nvml.mig``); answers carry the request's
``id``; an NVML refusal of a MIG op is an answer with ``error`` and ``code``, not a worker failure).

Batches use the call slot only when the parent passed one (``--slot-fd``); without it every call is
announced with ``begin``/``end`` lines, as calls outside batches (``nvmlInit``, XID event waits, MIG
operations) always are.

The worker exits when its stdin reaches EOF (parent gone), so it never outlives the agent unless it is
stuck in the driver, where nothing can end it anyway.
"""

from __future__ import annotations

import argparse
import ctypes
import itertools
import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hami_agent.nvml.callslot import CallSlot
from hami_agent.nvml.errors import phrase_for
from hami_agent.nvml.mig import MIG_OPS, MigOps
from hami_agent.nvml.model import mig_profile_name

LIB_ENV = "HAMI_NVML_LIBRARY"
SYSFS_ROOT_ENV = "HAMI_SYSFS_ROOT"


class Channel:
    """Line-oriented JSON writer shared by the worker's threads.

    ``send(msg, hold=True)`` keeps the line until the next send or ``flush()`` writes it with its own: a
    call's ``end`` travels with the next call's ``begin``, one pipe write and one wakeup of the supervisor
    instead of two (issue 31: an idle node's inventory is ~160 messages every refresh). Whoever holds a line
    must send or flush before it waits for anything but NVML."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._held: list[str] = []

    def send(self, msg: dict[str, Any], hold: bool = False) -> None:
        line = json.dumps(msg, separators=(",", ":")) + "\n"
        with self._lock:
            self._held.append(line)
            if not hold:
                self._write()

    def flush(self) -> None:
        with self._lock:
            if self._held:
                self._write()

    def _write(self) -> None:
        lines, self._held = self._held, []
        try:
            self._stream.write("".join(lines))
            self._stream.flush()
        except (BrokenPipeError, ValueError):
            os._exit(0)  # parent went away

    def next_id(self) -> int:
        return next(self._ids)


class _Batch:
    def __init__(self, k: int) -> None:
        self.k = k
        self.owner = threading.get_ident()
        self.calls: list[tuple[str, float]] = []


class Nvml:
    """pynvml with every call known to the parent, so it can enforce deadlines: announced on stdout
    (begin/end), or, inside a ``batch()`` with a call slot, written to the slot."""

    def __init__(self, chan: Channel, call_limit_s: float, slot: CallSlot | None = None) -> None:
        import pynvml

        self.pynvml = pynvml
        self.chan = chan
        self.call_limit_s = call_limit_s
        self.slot = slot
        self._batch: _Batch | None = None

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Calls made by this thread until the block ends go to the call slot; the parent hears of the
        batch twice (start, end with every call's time) instead of twice per call. Without a slot, or
        nested, it changes nothing."""
        if self.slot is None or self._batch is not None:
            yield
            return
        b = _Batch(self.chan.next_id())
        self.chan.send({"t": "batch", "k": b.k, "limit": self.call_limit_s})  # before the first call
        self._batch = b
        try:
            yield
        finally:
            self._batch = None  # each call cleared the slot when it returned
            self.chan.send({"t": "batch-end", "k": b.k, "calls": b.calls}, hold=True)

    def call(self, fn: str, func: Any, *args: Any, limit: float | None = None) -> Any:
        k = self.chan.next_id()
        b = self._batch
        slot = self.slot if b is not None and b.owner == threading.get_ident() else None
        if slot is not None:
            slot.publish(k, fn, limit or self.call_limit_s)
        else:
            self.chan.send({"t": "begin", "k": k, "fn": fn, "limit": limit or self.call_limit_s})
        t0 = time.monotonic()
        try:
            return func(*args)
        finally:
            s = round(time.monotonic() - t0, 6)
            if slot is not None and b is not None:
                slot.clear()
                b.calls.append((fn, s))
            else:
                # held: written with the next message (the next call's begin, the answer, an event)
                self.chan.send({"t": "end", "k": k, "fn": fn, "s": s}, hold=True)


def load_library(pynvml: Any, lib_path: str | None) -> None:
    """Point pynvml at ``lib_path`` (pynvml skips its own dlopen when ``nvmlLib`` is already set)."""
    if not lib_path:
        return
    if not Path(lib_path).exists():
        raise FileNotFoundError(f"NVML library {lib_path} does not exist")
    pynvml.nvmlLib = ctypes.CDLL(lib_path)


def sysfs_numa_node(pci_bus_id: str, sysfs_root: str = "/sys") -> int | None:
    """Raw ``/sys/bus/pci/devices/<bdf>/numa_node`` of a GPU (HAMi's source), None when absent/unreadable.

    NVML's bus id has an 8-digit domain and upper-case hex; sysfs uses a 4-digit domain, lower case.
    """
    bdf = sysfs_bus_id(pci_bus_id)
    try:
        return int((Path(sysfs_root) / "bus/pci/devices" / bdf / "numa_node").read_text().strip())
    except (OSError, ValueError):
        return None


def numa_from_sysfs(pci_bus_id: str, sysfs_root: str = "/sys") -> int | None:
    """NUMA node for the model: None when unknown (file absent, or negative = no NUMA affinity)."""
    value = sysfs_numa_node(pci_bus_id, sysfs_root)
    return value if value is not None and value >= 0 else None


def sysfs_bus_id(pci_bus_id: str) -> str:
    domain, rest = pci_bus_id.split(":", 1)
    return f"{int(domain, 16):04x}:{rest.lower()}"


def _err_text(exc: Exception) -> str:
    try:
        return str(exc)
    except Exception:  # pynvml's __str__ calls into NVML itself
        return repr(exc)


class Collector:
    def __init__(self, nv: Nvml, sysfs_root: str) -> None:
        self.nv = nv
        self.sysfs_root = sysfs_root

    def system(self) -> dict[str, Any]:
        p = self.nv.pynvml
        out: dict[str, Any] = {"driver_version": None, "cuda_driver_version": None}
        try:
            out["driver_version"] = self.nv.call("nvmlSystemGetDriverVersion", p.nvmlSystemGetDriverVersion)
        except p.NVMLError:
            pass
        try:
            out["cuda_driver_version"] = self.nv.call(
                "nvmlSystemGetCudaDriverVersion_v2", p.nvmlSystemGetCudaDriverVersion_v2)
        except p.NVMLError:
            pass
        return out

    def inventory(self) -> dict[str, Any]:
        p = self.nv.pynvml
        with self.nv.batch():
            data = self.system()
            count = self.nv.call("nvmlDeviceGetCount", p.nvmlDeviceGetCount)
            data["gpus"] = [self.gpu(i) for i in range(count)]
        return data

    def gpu(self, index: int) -> dict[str, Any]:
        p, nv = self.nv.pynvml, self.nv
        g: dict[str, Any] = {"index": index}
        try:
            h = nv.call("nvmlDeviceGetHandleByIndex", p.nvmlDeviceGetHandleByIndex, index)
            g["uuid"] = nv.call("nvmlDeviceGetUUID", p.nvmlDeviceGetUUID, h)
            g["name"] = nv.call("nvmlDeviceGetName", p.nvmlDeviceGetName, h)
            g["pci_bus_id"] = nv.call("nvmlDeviceGetPciInfo_v3", p.nvmlDeviceGetPciInfo_v3, h).busId
            if isinstance(g["pci_bus_id"], bytes):
                g["pci_bus_id"] = g["pci_bus_id"].decode()
            g["memory_mib"] = None
            try:
                mem = nv.call("nvmlDeviceGetMemoryInfo", p.nvmlDeviceGetMemoryInfo, h)
                g["memory_mib"] = int(mem.total) // (1024 * 1024)
            except p.NVMLError_NotSupported:
                g["memory_not_supported"] = True
            raw_numa = sysfs_numa_node(g["pci_bus_id"], self.sysfs_root)
            g["numa"] = raw_numa if raw_numa is not None and raw_numa >= 0 else None
            if raw_numa is None:  # no sysfs entry (simulated node, odd container): ask NVML
                try:
                    node = nv.call("nvmlDeviceGetNumaNodeId", p.nvmlDeviceGetNumaNodeId, h)
                    g["numa"] = node if node >= 0 else None
                except (p.NVMLError_NotSupported, p.NVMLError_FunctionNotFound):
                    pass
            g.update(mig_capable=False, mig_enabled=False, mig_pending=False, mig_devices=[])
            try:
                current, pending = nv.call("nvmlDeviceGetMigMode", p.nvmlDeviceGetMigMode, h)
                g.update(mig_capable=True, mig_enabled=current == 1, mig_pending=pending == 1)
            except p.NVMLError_NotSupported:
                pass
            if g["mig_enabled"]:
                g["mig_devices"] = self.mig_devices(h, g["memory_mib"])
        except p.NVMLError_GpuIsLost:
            g["lost"] = True
        except p.NVMLError as exc:
            g["error"] = _err_text(exc)
        return g

    def mig_devices(self, h: Any, total_mib: int | None) -> list[dict[str, Any]]:
        p, nv = self.nv.pynvml, self.nv
        out = []
        count = nv.call("nvmlDeviceGetMaxMigDeviceCount", p.nvmlDeviceGetMaxMigDeviceCount, h)
        for i in range(count):
            try:
                m = nv.call("nvmlDeviceGetMigDeviceHandleByIndex",
                            p.nvmlDeviceGetMigDeviceHandleByIndex, h, i)
            except (p.NVMLError_NotFound, p.NVMLError_InvalidArgument):
                continue  # empty slot (go-nvlib skips both codes too)
            uuid = nv.call("nvmlDeviceGetUUID", p.nvmlDeviceGetUUID, m)
            name = nv.call("nvmlDeviceGetName", p.nvmlDeviceGetName, m)
            try:
                attrs = nv.call("nvmlDeviceGetAttributes_v2", p.nvmlDeviceGetAttributes_v2, m)
                mem, slices = int(attrs.memorySizeMB), int(attrs.gpuInstanceSliceCount)
            except (p.NVMLError_NotSupported, p.NVMLError_FunctionNotFound):
                # older drivers: memory from the MIG handle, slices from the name ("... MIG 3g.48gb")
                info = nv.call("nvmlDeviceGetMemoryInfo", p.nvmlDeviceGetMemoryInfo, m)
                mem, slices = int(info.total) // (1024 * 1024), _slices_from_name(name)
            out.append({
                "index": i,
                "uuid": uuid,
                "profile": mig_profile_name(slices, total_mib, mem, name),
                "memory_mib": mem,
                "gi_id": nv.call("nvmlDeviceGetGpuInstanceId", p.nvmlDeviceGetGpuInstanceId, m),
                "ci_id": nv.call("nvmlDeviceGetComputeInstanceId", p.nvmlDeviceGetComputeInstanceId, m),
            })
        return out


    def usage(self) -> dict[str, Any]:
        """Memory used, utilization and compute processes per full GPU (MIG devices are not walked:
        on a MIG GPU the full-GPU handle lists the processes of all its MIG devices)."""
        with self.nv.batch():
            return self._usage()

    def _usage(self) -> dict[str, Any]:
        p, nv = self.nv.pynvml, self.nv
        gpus: list[dict[str, Any]] = []
        procs: list[dict[str, Any]] = []
        count = nv.call("nvmlDeviceGetCount", p.nvmlDeviceGetCount)
        for index in range(count):
            g: dict[str, Any] = {"index": index}
            gpus.append(g)
            try:
                h = nv.call("nvmlDeviceGetHandleByIndex", p.nvmlDeviceGetHandleByIndex, index)
                g["uuid"] = _text(nv.call("nvmlDeviceGetUUID", p.nvmlDeviceGetUUID, h))
                g["name"] = _text(nv.call("nvmlDeviceGetName", p.nvmlDeviceGetName, h))
            except p.NVMLError as exc:
                g["error"] = _err_text(exc)  # lost GPU and the like: no identity, nothing else to ask
                continue
            g["memory_used_bytes"] = None
            try:
                g["memory_used_bytes"] = int(nv.call("nvmlDeviceGetMemoryInfo", p.nvmlDeviceGetMemoryInfo,
                                                     h).used)
            except p.NVMLError:
                pass  # NOT_SUPPORTED on unified-memory GPUs
            g["utilization"] = None
            try:
                g["utilization"] = int(nv.call("nvmlDeviceGetUtilizationRates",
                                               p.nvmlDeviceGetUtilizationRates, h).gpu)
            except p.NVMLError:
                pass  # NOT_SUPPORTED while MIG is enabled
            try:
                # pynvml's unversioned name calls the _v3 entry point; announce the real one
                running = nv.call("nvmlDeviceGetComputeRunningProcesses_v3",
                                  p.nvmlDeviceGetComputeRunningProcesses, h)
            except p.NVMLError:
                running = []
            for r in running:
                used = r.usedGpuMemory  # pynvml maps NVML_VALUE_NOT_AVAILABLE to None
                procs.append({"gpu_uuid": g["uuid"], "pid": int(r.pid),
                              "used_bytes": None if used is None else int(used)})
        return {"gpus": gpus, "processes": procs}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _slices_from_name(name: str) -> int:
    profile = name.rsplit(" MIG ", 1)[-1]
    digits = profile.split("g.", 1)[0]
    return int(digits) if digits.isdigit() else 1


def watch_events(nv: Nvml, chan: Channel, wait_ms: int, stop: threading.Event) -> None:
    """Forward XID critical errors to the parent (the parent applies the ignore list)."""
    p = nv.pynvml
    try:
        es = nv.call("nvmlEventSetCreate", p.nvmlEventSetCreate)
        count = nv.call("nvmlDeviceGetCount", p.nvmlDeviceGetCount)
        registered: dict[int, str] = {}
        for i in range(count):
            try:
                h = nv.call("nvmlDeviceGetHandleByIndex", p.nvmlDeviceGetHandleByIndex, i)
                uuid = nv.call("nvmlDeviceGetUUID", p.nvmlDeviceGetUUID, h)
                supported = nv.call("nvmlDeviceGetSupportedEventTypes", p.nvmlDeviceGetSupportedEventTypes, h)
                if not supported & p.nvmlEventTypeXidCriticalError:
                    raise p.NVMLError(p.NVML_ERROR_NOT_SUPPORTED)
                nv.call("nvmlDeviceRegisterEvents", p.nvmlDeviceRegisterEvents, h,
                        p.nvmlEventTypeXidCriticalError, es)
                registered[i] = uuid
            except p.NVMLError_NotSupported:
                chan.send({"t": "error", "fn": "nvmlDeviceRegisterEvents", "code": 3, "fatal": False,
                           "msg": f"GPU {i} is too old to support healthchecking"})
            except p.NVMLError_GpuIsLost:
                continue
        while not stop.is_set():
            try:
                data = nv.call("nvmlEventSetWait_v2", p.nvmlEventSetWait_v2, es, wait_ms,
                               limit=wait_ms / 1000.0 + nv.call_limit_s)
            except p.NVMLError_Timeout:
                continue
            except p.NVMLError as exc:
                chan.send({"t": "error", "fn": "nvmlEventSetWait", "code": getattr(exc, "value", None),
                           "fatal": False, "msg": f"nvml EventSetWait err: {_err_text(exc)}"})
                stop.wait(1.0)
                continue
            index = None
            try:
                index = nv.call("nvmlDeviceGetIndex", p.nvmlDeviceGetIndex, data.device)
            except p.NVMLError:
                pass
            na = p.NVML_VALUE_NOT_AVAILABLE_uint.value
            chan.send({
                "t": "event", "index": index, "uuid": registered.get(index) if index is not None else None,
                "xid": int(data.eventData),
                "gi": None if data.gpuInstanceId == na else int(data.gpuInstanceId),
                "ci": None if data.computeInstanceId == na else int(data.computeInstanceId),
            })
    except p.NVMLError as exc:
        chan.send({"t": "error", "fn": "nvmlEventSetCreate", "code": getattr(exc, "value", None),
                   "fatal": False, "msg": f"nvml health check disabled: {_err_text(exc)}"})


def _exit_on_stdin_eof() -> None:
    try:
        while sys.stdin.buffer.read(4096):
            pass
    except (OSError, ValueError):
        pass
    os._exit(0)


def serve(nv: Nvml, collector: Collector, chan: Channel) -> int:
    """Answer requests from stdin until EOF. An NVML error answers the request and ends the worker (its
    NVML state is unknown after that); the parent starts a fresh one for the next request."""
    p = nv.pynvml
    mig = MigOps(nv)
    chan.flush()  # nvmlInit's end: nothing else is sent before the first request
    for raw in sys.stdin.buffer:
        try:
            req = json.loads(raw)
            op, rid = req["op"], req["id"]
        except (ValueError, KeyError, TypeError):
            chan.send({"t": "error", "fatal": False, "msg": f"nvml worker: bad request {raw[:200]!r}"})
            continue
        try:
            if op == "usage":
                chan.send({"t": "usage", "id": rid, "data": collector.usage()})
            elif op == "inventory":
                chan.send({"t": "inventory", "id": rid, "data": collector.inventory()})
            elif op in MIG_OPS:
                args = req.get("args") if isinstance(req.get("args"), dict) else {}
                chan.send({"t": op, "id": rid, "data": mig.run(op, args)})
            else:
                chan.send({"t": "error", "id": rid, "fatal": False, "msg": f"nvml worker: unknown op {op!r}"})
        except p.NVMLError as exc:
            fn = "nvmlDeviceGetCount"
            chan.send({"t": "error", "id": rid, "fn": fn, "code": getattr(exc, "value", None), "fatal": True,
                       "msg": f"{phrase_for(fn)}: {_err_text(exc)}"})
            return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="hami_agent.nvml.worker")
    ap.add_argument("--mode", choices=["serve", "watch"], default="serve")
    ap.add_argument("--lib", default=None)
    ap.add_argument("--refresh", type=float, default=30.0)
    ap.add_argument("--call-limit", type=float, default=5.0)
    ap.add_argument("--events", type=int, default=1)
    ap.add_argument("--event-wait-ms", type=int, default=5000)  # process.EVENT_WAIT_MS
    ap.add_argument("--slot-fd", type=int, default=-1, help="the parent's call slot (callslot.py)")
    args = ap.parse_args(argv)

    # Our protocol owns fd 1; anything else printing to stdout (a library) goes to stderr instead.
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    chan = Channel(proto)
    if args.mode == "watch":  # serve mode reads stdin itself and ends at EOF
        threading.Thread(target=_exit_on_stdin_eof, daemon=True, name="stdin-eof").start()

    slot = None
    if args.slot_fd >= 0:
        try:
            slot = CallSlot.attach(args.slot_fd)
        except (OSError, ValueError) as exc:  # announce every call instead: slower, never blind
            sys.stderr.write(f"nvml worker: call slot fd {args.slot_fd} unusable ({exc}); announcing calls\n")
    try:
        nv = Nvml(chan, args.call_limit, slot)
    except ImportError as exc:
        chan.send({"t": "error", "fn": "nvmlInit", "code": None, "fatal": True,
                   "msg": f"nvml Init err: pynvml (nvidia-ml-py) is not installed: {exc}"})
        return 1
    p = nv.pynvml
    lib = args.lib or os.environ.get(LIB_ENV) or None
    try:
        load_library(p, lib)
    except OSError as exc:
        chan.send({"t": "error", "fn": "nvmlInit", "code": p.NVML_ERROR_LIBRARY_NOT_FOUND, "fatal": True,
                   "msg": f"nvml Init err: cannot load NVML library {lib}: {exc}"})
        return 1
    try:
        nv.call("nvmlInit", p.nvmlInit)
    except p.NVMLError as exc:
        where = f" ({lib})" if lib else ""
        chan.send({"t": "error", "fn": "nvmlInit", "code": getattr(exc, "value", None), "fatal": True,
                   "msg": f"nvml Init err: {_err_text(exc)}{where}"})
        return 1

    collector = Collector(nv, os.environ.get(SYSFS_ROOT_ENV) or "/sys")
    if args.mode == "serve":
        rc = serve(nv, collector, chan)
    else:
        rc = watch(nv, collector, chan, args)
    if rc == 0:
        try:
            nv.call("nvmlShutdown", p.nvmlShutdown)
        except p.NVMLError:
            pass
        chan.send({"t": "bye"})
    chan.flush()
    return rc


def watch(nv: Nvml, collector: Collector, chan: Channel, args: argparse.Namespace) -> int:
    """An inventory every ``--refresh`` seconds (and XID events) until stdin closes."""
    p = nv.pynvml
    stop = threading.Event()
    if args.events:
        threading.Thread(target=watch_events, args=(nv, chan, args.event_wait_ms, stop), daemon=True,
                         name="nvml-events").start()
    while True:
        try:
            chan.send({"t": "inventory", "data": collector.inventory()})
        except p.NVMLError as exc:
            fn = "nvmlDeviceGetCount"
            chan.send({"t": "error", "fn": fn, "code": getattr(exc, "value", None), "fatal": True,
                       "msg": f"{phrase_for(fn)}: {_err_text(exc)}"})
            stop.set()
            return 1
        time.sleep(args.refresh)


if __name__ == "__main__":
    sys.exit(main())
