"""``hami-agent devices``: the GPU inventory as NVML reports it, read in a throw-away worker process.

Bounded by ``--timeout``: when NVML hangs (seed 003: ``nvmlInit`` on R570 drivers with mixed MIG) the
command still returns, exit 1, naming the call that hung.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import asdict
from typing import Any

from hami_agent import known_bad_drivers

logger = logging.getLogger(__name__)


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0 seconds, got {text}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--nvml-lib", metavar="PATH", default=None,
                        help="path of libnvidia-ml.so.1 (default: $HAMI_NVML_LIBRARY, else the system's)")
    parser.add_argument("--timeout", metavar="S", type=_positive_float, default=10.0,
                        help="give up when NVML has not answered within S seconds (default 10)")


def hang_hint(call: str | None) -> str:
    if call != "nvmlInit":
        return ""
    fixed = sorted({e["fixed_in"] for e in known_bad_drivers.KNOWN_BAD_DRIVERS.values()})
    return (f"; NVIDIA drivers {known_bad_drivers.describe_versions()} hang in nvmlInit on nodes that mix "
            f"MIG and full GPUs: upgrade the driver to {' or '.join(fixed)} or later, or disable MIG on this "
            "node")


def _health(gpu: Any) -> str:
    return "healthy" if gpu.healthy else f"unhealthy ({gpu.unhealthy_reason})"


def _mig_mode(gpu: Any) -> str:
    if not gpu.mig_capable:
        return "n/a"
    mode = "enabled" if gpu.mig_enabled else "disabled"
    if gpu.mig_pending != gpu.mig_enabled:
        mode += f" (pending {'enabled' if gpu.mig_pending else 'disabled'})"
    return mode


def format_table(snap: Any) -> str:
    rows = [("IDX", "UUID", "TYPE", "MEMORY", "NUMA", "MIG", "HEALTH")]
    for g in snap.gpus:
        mem = f"{g.memory_mib}MiB" if g.memory_mib is not None else "N/A"
        rows.append((str(g.index), g.uuid, g.type, mem, "-" if g.numa is None else str(g.numa),
                     _mig_mode(g), _health(g)))
        for m in g.mig_devices:
            rows.append((f"  {g.index}/{m.index}", m.uuid, m.profile, f"{m.memory_mib}MiB", "",
                         f"gi={m.gi_id} ci={m.ci_id}", ""))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [f"driver {snap.driver_version or '?'}  CUDA {_cuda(snap.cuda_driver_version)}  "
             f"{len(snap.gpus)} GPUs, {sum(len(g.mig_devices) for g in snap.gpus)} MIG devices"]
    lines += ["  ".join(c.ljust(widths[i]) for i, c in enumerate(r)).rstrip() for r in rows]
    return "\n".join(lines)


def _cuda(v: int | None) -> str:
    return "?" if not v else f"{v // 1000}.{(v % 1000) // 10}"


def run(args: argparse.Namespace) -> int:
    from hami_agent.nvml.client import collect_inventory
    from hami_agent.nvml.errors import NvmlError, NvmlTimeout

    try:
        snap = collect_inventory(lib_path=args.nvml_lib, timeout_s=args.timeout)
    except NvmlTimeout as exc:
        logger.error("%s%s", exc, hang_hint(exc.call))
        if args.json:
            print(json.dumps({"status": "stuck", "stuck_call": exc.call, "error": str(exc), "gpus": []}))
        return 1
    except NvmlError as exc:
        logger.error("%s", exc)
        if args.json:
            print(json.dumps({"status": "error", "error": str(exc), "gpus": []}))
        return 1
    if args.json:
        doc = asdict(snap)
        doc.pop("generation", None)
        print(json.dumps(doc, indent=2))
    else:
        print(format_table(snap))
        for problem in snap.problems:
            print(f"problem: {problem}")
    sys.stdout.flush()
    return 0 if all(g.healthy for g in snap.gpus) and not snap.problems else 1
