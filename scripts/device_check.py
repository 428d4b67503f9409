#!/usr/bin/env python3
"""One prepared check of hami-agent on a real NVIDIA GPU and driver, and with the real HAMi-core.

    python3 scripts/device_check.py --out DIR [--hami-core-src .hami-core] [--deadline 420]
    python3 scripts/device_check.py --out DIR --dry-run        # the same checks on gpusim (make test)

Runs the agent from this source tree (no install), the project's simulated kubelet and API server, and
writes DIR/device-check.json, DIR/device-check.md and DIR/evidence.tar.gz (raw nvidia-smi and NVML answers,
logs). Every check is pass / fail / not-supported-here / skipped, with its evidence and duration.
Exit 0 only if no check failed and every check was reached before the deadline.

Nothing on the GPU outlives it: no MIG mode, clock, persistence-mode or application-clock change and no
reset; every process it starts is stopped at the end, also on error or SIGTERM. docs/hardware.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
for p in (str(HERE), str(REPO / "agent"), str(REPO)):
    if p not in sys.path:
        sys.path.insert(0, p)

from devcheck import checks_node, checks_nvml, checks_workload  # noqa: E402
from devcheck.core import FAIL, Check, Ctx, run_checks, write_report  # noqa: E402

GPUSIM_LIB = REPO / "tests" / "gpusim" / "build" / "libnvidia-ml.so.1"
DEFAULT_DEADLINE_S = 420.0  # 7 minutes: under the 8-minute promise with room for the report

CHECKS = [
    Check("inventory", "hami-agent devices --json equals nvidia-smi -q -x, field by field", 40,
          checks_nvml.check_inventory),
    Check("nvml-events", "NVML worker: XID event registration and a bounded event wait", 30,
          checks_nvml.check_events),
    Check("nvml-xid-table", "XID classification against the event types this board supports", 10,
          checks_nvml.check_xid_table),
    Check("nvml-stuck", "stuck worker: NVML calls given a 1 ms deadline; the worker is killed, a new one "
          "answers", 30,
          checks_nvml.check_stuck),
    Check("device-plugin", "device plugin under the simulated kubelet and API server: registration, "
          "ListAndWatch, GetPreferredAllocation p99, Allocate", 60, checks_node.check_device_plugin),
    Check("dra", "DRA driver: the ResourceSlice of the GPU (capacities, attributes, MIG profiles)", 45,
          checks_node.check_dra),
    Check("monitor-workload", "monitor and /metrics while a CUDA workload runs: utilisation > 0, the process "
          "with its memory", 60, checks_workload.check_monitor),
    Check("hami-core-build", "scripts/build-hami-core.sh builds libvgpu.so from the HAMi-core source", 240,
          checks_workload.check_hami_core_build),
    Check("hami-core-limits", "CUDA under libvgpu.so with Allocate's env and mounts (4096 MiB / 30 %): 3 GiB "
          "fits, 6 GiB is out of memory", 60, checks_workload.check_hami_core_limits),
    Check("hami-core-region", "the shared region decodes with shrreg_tool and shows in the monitor with its "
          "pod and usage", 40, checks_workload.check_hami_core_region),
    Check("doctor", "hami-agent doctor node --local on this node: no false verdict", 45,
          checks_node.check_doctor),
]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="device_check.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="output folder: device-check.json, .md, evidence.tar.gz")
    ap.add_argument("--nvml-lib", default=None, help="libnvidia-ml.so.1 to use (default: the system's); "
                    "gpusim's library turns on the dry run")
    ap.add_argument("--dry-run", action="store_true", help="run on gpusim (tests/gpusim), no GPU needed")
    ap.add_argument("--gpusim-profile", default="h100-sxm", help="gpusim profile of the dry run")
    ap.add_argument("--hami-core-src", default=None, help="a HAMi-core source tree (make hami-core-src); "
                    "without it the HAMi-core checks are skipped")
    ap.add_argument("--deadline", type=float, default=DEFAULT_DEADLINE_S, help="global deadline in seconds")
    ap.add_argument("--only", default=None, help="comma list of check names to run (default: all)")
    ap.add_argument("--work", default=None, help="work folder (default: a new one under /tmp, removed)")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    deadline = started + max(10.0, args.deadline)
    nvml_lib = args.nvml_lib
    dry = args.dry_run or bool(nvml_lib and Path(nvml_lib).resolve() == GPUSIM_LIB.resolve())
    if dry and not nvml_lib:
        nvml_lib = str(GPUSIM_LIB)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="hdc-", dir="/tmp"))
    work.mkdir(parents=True, exist_ok=True)
    out = Path(args.out)

    def log(msg: str) -> None:
        print(f"{time.monotonic() - started:6.1f}s {msg}", flush=True)

    ctx = Ctx(args, work, dry, nvml_lib, deadline)
    ctx.facts["hami_core_src"] = args.hami_core_src

    def on_signal(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGHUP)}
    records = []
    interrupted = None
    cleanup: list[str] = []
    try:
        if dry:
            checks_workload.setup_gpusim(ctx, args.gpusim_profile)
        checks_workload.start_background_build(ctx)
        chosen = CHECKS
        if args.only:
            names = {n.strip() for n in args.only.split(",") if n.strip()}
            unknown = names - {c.name for c in CHECKS}
            if unknown:
                print(f"unknown check(s): {sorted(unknown)}; choose from {[c.name for c in CHECKS]}",
                      file=sys.stderr)
                return 2
            chosen = [c for c in CHECKS if c.name in names]
        mode = "dry-run (gpusim)" if dry else "real driver"
        log(f"mode {mode}; work {work}; deadline {args.deadline:.0f}s")
        records = run_checks(ctx, chosen, log)
    except KeyboardInterrupt as exc:
        interrupted = str(exc) or "interrupted"
        log(f"interrupted: {interrupted}")
    finally:
        cleanup = ctx.cleanup()
        for s, h in old.items():
            signal.signal(s, h)
    reached = {r.name for r in records}
    not_reached = [c.name for c in CHECKS if (not args.only or c.name in args.only.split(","))
                   and (c.name not in reached or any(r.name == c.name and r.details.get("not_reached")
                                                     for r in records))]
    failed = [r.name for r in records if r.status == FAIL]
    rc = 0 if not failed and not not_reached and not interrupted else 1
    dev = ctx.facts.get("devices") or {}
    cuda = dev.get("cuda_driver_version")
    meta = {
        "mode": "dry-run (gpusim)" if dry else "real",
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(), "python": platform.python_version(),
        "device": ", ".join(f"{g['name']} {g['memory_mib']} MiB" for g in dev.get("gpus", [])) or None,
        "driver": dev.get("driver_version"),
        "cuda": f"{cuda // 1000}.{cuda % 1000 // 10}" if isinstance(cuda, int) and cuda > 0 else None,
        "hami_core": ctx.facts.get("hami_core_commit") or (args.hami_core_src or "no source tree given"),
        "nvml_lib": nvml_lib or "system", "deadline_s": args.deadline,
        "total_s": round(time.monotonic() - started, 1), "exit_code": rc, "failed": failed,
        "not_reached": not_reached, "interrupted": interrupted, "cleanup": cleanup,
    }
    files = write_report(out, meta, records, ctx.evidence)
    log(f"wrote {', '.join(str(f) for f in files)}; exit {rc}")
    print(json.dumps({"summary": {r.name: r.status for r in records}, "exit_code": rc}), flush=True)
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return rc


if __name__ == "__main__":
    os.umask(0o022)
    sys.exit(main())
