"""``shrreg_tool`` / ``hami-agent shrreg``: inspect and safely repair HAMi-core shared regions.

Flags follow seed 002: ``--inspect [--device N]``, ``--version``, ``--force-unlock --device N``,
``--cleanup --device N``; plus ``--file``/``--dir``, ``--json``, ``--dry-run``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from hami_agent import log
from hami_agent.shrreg import analysis, repair
from hami_agent.shrreg.layout import AGENT_MAJOR, AGENT_MINOR, LAYOUTS, MIN_V1, V12, RegionFormatError
from hami_agent.shrreg.liveness import Attachment, State, scan_attachments
from hami_agent.shrreg.model import Region
from hami_agent.shrreg.reader import container_identity, find_region_files, read_region, resolve_root

logger = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
MB = 1 << 20


def add_arguments(parser: argparse.ArgumentParser) -> None:
    mode = parser.add_argument_group("mode (one of; default --inspect)")
    mode.add_argument("--inspect", action="store_true", help="print the regions (seed 002 output shape)")
    mode.add_argument(
        "--version",
        dest="show_version",
        action="store_true",
        help="print the supported layout and each region's version",
    )
    mode.add_argument(
        "--force-unlock", action="store_true", help="release a region lock whose holder is verifiably dead"
    )
    mode.add_argument("--cleanup", action="store_true", help="remove task slots of dead processes")
    parser.add_argument(
        "--device",
        metavar="N|UUID",
        help="device index in the region (as 'Device N:' prints) or GPU UUID (prefix)",
    )
    parser.add_argument(
        "--file",
        action="append",
        metavar="PATH",
        help="region file (repeatable); default: $CUDA_DEVICE_MEMORY_SHARED_CACHE if set, "
        "else every region under --dir",
    )
    parser.add_argument(
        "--dir",
        metavar="DIR",
        default=None,
        help="directory of <podUID>_<container>/ cache dirs (default: $HOOK_PATH/vgpu/containers, "
        "HOOK_PATH defaulting to /usr/local; a HOOK_PATH ending in /vgpu is used as is)",
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument(
        "--dry-run", action="store_true", help="print what a repair would change; write nothing"
    )
    parser.add_argument(
        "--lock-timeout",
        type=float,
        default=repair.DEFAULT_LOCK_TIMEOUT_S,
        metavar="SECONDS",
        help="how long a repair waits for the region locks (default %(default)s)",
    )
    parser.add_argument(
        "--in-container",
        action="store_true",
        help="running inside the workload container: trust this PID namespace's view of /proc",
    )
    parser.add_argument(
        "--nvml-usage",
        metavar="FILE",
        help="JSON list of NVML processes [{gpu_uuid, pid, used_bytes}] for the leak analysis",
    )
    parser.add_argument(
        "--nvml",
        action="store_true",
        help="query NVML per-process usage (child process, with a deadline) for the leak analysis",
    )
    parser.add_argument(
        "--nvml-lib",
        default=os.environ.get("HAMI_NVML_LIBRARY"),
        metavar="PATH",
        help="libnvidia-ml.so.1 to use with --nvml (env HAMI_NVML_LIBRARY; default: the system's)",
    )
    parser.add_argument(
        "--expect-version",
        default=f"{AGENT_MAJOR}.{AGENT_MINOR}",
        metavar="MAJOR.MINOR",
        help="HAMi-core library version deployed on the node (default %(default)s)",
    )


@dataclass
class Entry:
    path: str
    region: Region | None = None
    error: str | None = None
    attachment: Attachment | None = None
    findings: list[analysis.Finding] = field(default_factory=list)

    def identity(self) -> dict[str, str] | None:
        ident = container_identity(self.path)
        return {"pod_uid": ident[0], "container": ident[1]} if ident else None


def _select_paths(args: argparse.Namespace) -> tuple[list[str], str | None]:
    """(paths, root): the root is the directory the tool was pointed at (``--dir``, else the node's
    region root); no path component below it is followed through a symlink. A ``--file`` outside the
    root is trusted up to its own directory, never further (see ``safeopen``)."""
    if args.file:
        try:
            root = resolve_root(args.dir, getattr(args, "config", None), getattr(args, "node_name", None))
        except (OSError, ValueError):
            root = None
        return [os.path.abspath(f) for f in args.file], root
    if args.dir is None:
        env = os.environ.get("CUDA_DEVICE_MEMORY_SHARED_CACHE")
        if env:
            return [env], None
    root = resolve_root(args.dir, getattr(args, "config", None), getattr(args, "node_name", None))
    return [str(p) for p in find_region_files(root)], root


def _device_matches(region: Region, spec: str | None) -> list[int]:
    devs = region.device_indices()
    if spec is None:
        return devs
    if spec.isdigit():
        return [d for d in devs if d == int(spec)]
    s = spec.lower()
    return [d for d in devs if region.uuids[d].lower().startswith(s)]


def _load(paths: list[str], root: str | None, args: argparse.Namespace, *, scan: bool = True) -> list[Entry]:
    entries = []
    for p in paths:
        e = Entry(path=p)
        try:
            e.region = read_region(p, root=root)
        except (OSError, RegionFormatError) as exc:
            e.error = str(exc)
        entries.append(e)
    if scan:
        live = [e.path for e in entries if e.region is not None]
        atts = scan_attachments(live, assume_complete=args.in_container) if live else {}
        for e in entries:
            e.attachment = atts.get(e.path)
    return entries


def _mb(n: int) -> str:
    return f"{n // MB} MB"


def _render_inspect(entries: list[Entry], device: str | None, out: TextIO, diag: TextIO) -> None:
    """Seed 002's picture on ``out``; findings on ``diag`` (stderr), so the seed's recipes
    (``grep PID | awk '{print $2}'``, ``grep "Lock Holder" | awk '{print $NF}'``) see only task lines."""
    out.write("=== Shared Region Info ===\n")
    if not entries:
        out.write("No shared regions found.\n")
    for e in entries:
        ident = e.identity()
        who = f"  (pod {ident['pod_uid']}, container {ident['container']})" if ident else ""
        out.write(f"Region: {e.path}{who}\n")
        if e.region is None:
            out.write(f"  Error:           {e.error}\n")
            continue
        r = e.region
        layout = LAYOUTS[r.layout]
        out.write(f"  Layout:          {r.layout} ({layout.hamiv}), {r.file_size} bytes\n")
        devs = _device_matches(r, device)
        if not devs:
            out.write("  (no matching device)\n" if device is not None else "  (no device initialised yet)\n")
        for d in devs:
            out.write(f"Device {d}:\n")
            out.write(f"  UUID:            {r.uuids[d][:40]}\n")
            out.write(f"  Total Memory:    {_mb(r.limit[d]) if r.limit[d] else 'unlimited'}\n")
            out.write(f"  Used Memory:     {_mb(r.used_bytes(d))}\n")
            tasks = [s for s in r.procs if s.pid != 0]  # pid 0: exited slot awaiting compaction
            out.write(f"  Task Count:      {len(tasks)}\n")
            out.write("  Tasks:\n")
            for s in tasks:
                note = ""
                if e.attachment is not None and s.pid > 0:
                    v = e.attachment.verdict(s.pid)
                    if v.state is State.DEAD:
                        note = "  DEAD (zombie entry)"
                    elif v.state is State.UNKNOWN:
                        note = "  (liveness unknown)"
                if s.write_in_progress:
                    note += "  (update in progress)"
                out.write(
                    f"    PID: {s.pid}  Memory: {_mb(s.used[d].total)}  Util Limit: {r.sm_limit[d]}%  "
                    f"Status: {s.status_name}  HostPID: {s.hostpid}  SM Util: "
                    f"{s.device_util[d].sm_util}%{note}\n"
                )
            out.write(f"  Lock Status:     {'LOCKED' if r.locked else 'UNLOCKED'}\n")
            if r.locked:
                out.write(f"  Lock Holder:     {r.owner_pid}\n")
            if r.major is not None:
                out.write(f"  Version:         MAJOR={r.major}, MINOR={r.minor}\n")
            else:
                out.write("  Version:         none (v0b header)\n")
        shown = [f for f in e.findings if f.severity != analysis.OK]
        if shown:
            # stdout is block-buffered when not a terminal: without this flush, in a shared log or
            # ``2>&1 | less`` the diagnosis lands before (or inside a line of) the region it is about
            out.flush()
            diag.write(f"Diagnosis for {e.path}:\n")
        for f in shown:
            diag.write(f"  [{f.severity.upper()}] {f.code}: {f.message}\n      Remedy: {f.remedy}\n")


def _entry_json(e: Entry, device: str | None) -> dict[str, Any]:
    d: dict[str, Any] = {"path": e.path, "identity": e.identity(), "error": e.error, "region": None}
    if e.region is not None:
        rd = e.region.to_dict()
        rd["selected_devices"] = _device_matches(e.region, device)
        rd["used_bytes"] = {str(i): e.region.used_bytes(i) for i in e.region.device_indices()}
        if e.attachment is not None:
            rd["liveness"] = {str(s.pid): e.attachment.verdict(s.pid).state.value for s in e.region.procs}
        d["region"] = rd
    d["findings"] = [f.to_dict() for f in e.findings]
    return d


def _cmd_inspect(args: argparse.Namespace, out: TextIO) -> int:
    entries = _load(*_select_paths(args), args)
    nvml = analysis.load_nvml_processes(args.nvml_usage) if args.nvml_usage else None
    if args.nvml:
        from hami_agent.shrreg.nvmlprobe import NvmlProbeError, probe

        try:
            nvml = (nvml or []) + probe(args.nvml_lib).processes
        except NvmlProbeError as exc:
            logger.error("%s", exc)
            return EXIT_FAILURE
    expect = analysis.parse_version(args.expect_version)
    if args.device is not None:
        entries = [e for e in entries if e.region is None or _device_matches(e.region, args.device)]
    for e in entries:
        if e.region is not None:
            e.findings = analysis.analyse_region(e.region, e.attachment, nvml, expect_version=expect)
    if args.json:
        json.dump({"regions": [_entry_json(e, args.device) for e in entries]}, out, indent=2)
        out.write("\n")
    else:
        _render_inspect(entries, args.device, out, sys.stderr)
    bad = any(e.error for e in entries) or any(
        f.severity == analysis.ERROR for e in entries for f in e.findings
    )
    return EXIT_FAILURE if bad else EXIT_OK


def _cmd_version(args: argparse.Namespace, out: TextIO) -> int:
    expect = analysis.parse_version(args.expect_version)
    entries = _load(*_select_paths(args), args, scan=False)
    rows = []
    for e in entries:
        row: dict[str, Any] = {"path": e.path, "error": e.error}
        if e.region is not None:
            row.update(
                layout=e.region.layout,
                version=e.region.version,
                file_size=e.region.file_size,
                findings=[f.to_dict() for f in analysis.analyse_version(e.region, expect)],
            )
        rows.append(row)
    if args.json:
        json.dump(
            {
                "shrreg_size": MIN_V1,
                "version": f"{AGENT_MAJOR}.{AGENT_MINOR}",
                "layout": V12,
                "supported_layouts": list(LAYOUTS),
                "expect_version": args.expect_version,
                "regions": rows,
            },
            out,
            indent=2,
        )
        out.write("\n")
    else:
        # The first line is what HAMi-core's own tool prints for the layout it was built with.
        out.write(f"shrreg size: {MIN_V1}, version {AGENT_MAJOR}.{AGENT_MINOR}\n")
        out.write(f"supported layouts: {', '.join(LAYOUTS)}\n")
        for row in rows:
            if row["error"]:
                out.write(f"{row['path']}: error: {row['error']}\n")
                continue
            out.write(
                f"{row['path']}: layout {row['layout']}, version {row['version']}, {row['file_size']} bytes\n"
            )
            for f in row["findings"]:
                out.write(f"  [{f['severity'].upper()}] {f['message']}\n      Remedy: {f['remedy']}\n")
    mismatch = any(e.error for e in entries) or any(
        f["severity"] == analysis.ERROR for r in rows for f in r.get("findings", [])
    )
    return EXIT_FAILURE if mismatch else EXIT_OK


def _cmd_repair(args: argparse.Namespace, out: TextIO, op: str) -> int:
    if args.device is None and not args.file:
        sys.stderr.write(f"shrreg_tool: --{op} needs --device N (or --file PATH) to name what to repair\n")
        return EXIT_USAGE
    paths, root = _select_paths(args)
    targets: list[str] = []
    errors: list[dict[str, Any]] = []
    for p in paths:
        try:
            r = read_region(p, root=root)
        except (OSError, RegionFormatError) as exc:
            errors.append({"path": p, "operation": op, "error": str(exc), "ok": False})
            continue
        if args.device is None or _device_matches(r, args.device):
            targets.append(p)
    fn = repair.force_unlock if op == "force-unlock" else repair.cleanup
    results = [
        fn(p, dry_run=args.dry_run, lock_timeout_s=args.lock_timeout, assume_complete=args.in_container,
           root=root)
        for p in targets
    ]
    if args.json:
        json.dump({"results": [r.to_dict() for r in results] + errors}, out, indent=2)
        out.write("\n")
    else:
        if not results and not errors:
            out.write("No matching shared regions found.\n")
        for err in errors:
            out.write(f"{err['path']}: error: {err['error']}\n")
        for res in results:
            verb = "would" if res.dry_run else ("did" if res.applied else "will not")
            out.write(f"{res.path}: {res.operation}{' (dry run)' if res.dry_run else ''}\n")
            if res.error:
                out.write(f"  error: {res.error}\n")
            for a in res.actions:
                out.write(f"  {verb}: {a.kind}: {a.detail}\n")
            for why in res.refused:
                out.write(f"  refused: {why}\n")
            for k in res.kept:
                out.write(f"  kept: {k}\n")
            if not res.actions and not res.refused and not res.error:
                out.write("  nothing to do\n")
    ok = not errors and all(r.ok for r in results)
    return EXIT_OK if ok else EXIT_FAILURE


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    modes = [m for m in ("inspect", "show_version", "force_unlock", "cleanup") if getattr(args, m, False)]
    if len(modes) > 1:
        sys.stderr.write("shrreg_tool: choose one of --inspect, --version, --force-unlock, --cleanup\n")
        return EXIT_USAGE
    try:
        analysis.parse_version(args.expect_version)
        mode = modes[0] if modes else "inspect"
        if mode == "show_version":
            return _cmd_version(args, out)
        if mode == "force_unlock":
            return _cmd_repair(args, out, "force-unlock")
        if mode == "cleanup":
            return _cmd_repair(args, out, "cleanup")
        return _cmd_inspect(args, out)
    except ValueError as exc:
        sys.stderr.write(f"shrreg_tool: {exc}\n")
        return EXIT_USAGE
    except BrokenPipeError:
        raise  # the reader went away (| head): main() exits quietly
    except OSError as exc:
        logger.error("shrreg_tool: %s", exc)
        return EXIT_FAILURE


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="shrreg_tool",
        description="Inspect and safely repair HAMi-core shared regions (cudevshr.cache files).",
    )
    parser.add_argument(
        "-v", "--v", dest="verbosity", type=int, default=0, metavar="N", help="klog verbosity"
    )
    add_arguments(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    log.setup(args.verbosity)
    try:
        return run(args)
    except BrokenPipeError:
        return EXIT_OK


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
