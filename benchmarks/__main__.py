"""Run every ``benchmarks/<name>/bench.py`` (or only the names given): ``python -m benchmarks [name ...]``.
A name may be written with dashes (``e2e-schedule`` = ``e2e_schedule``).

A bench module that leaves ``(figure, value, goal, met)`` rows in its module-level ``SUMMARY`` list gets
them repeated in one table at the end (``make bench``: every figure of the run beside its goal).

``python -m benchmarks NAME --flag ...`` runs one benchmark with its own flags (e.g. ``chaos --seconds 60``).
A bench module with ``RUN_BY_DEFAULT = False`` (the chaos soak) runs only when named.

Exit status: 1 when a benchmark missed a goal it printed (or failed), 2 for an unknown name.
``--no-goals`` (anywhere on the line, given to every benchmark run) only reports: misses are marked in the
table and the exit status is 0 unless a benchmark failed otherwise."""

from __future__ import annotations

import importlib
import sys
import time
from pathlib import Path

from benchmarks import goals

HERE = Path(__file__).resolve().parent


def discover() -> list[str]:
    return sorted(p.parent.name for p in HERE.glob("*/bench.py") if not p.parent.name.startswith(("_", ".")))


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    no_goals = goals.FLAG in args
    args = [a for a in args if a != goals.FLAG]
    names = discover()
    args = [a.replace("-", "_") if a.replace("-", "_") in names else a for a in args]
    if args in (["-h"], ["--help"]):
        print(f"usage: python -m benchmarks [{goals.FLAG}] [name ...]   (available: {', '.join(names)})")
        return 0
    flags: list[str] = []
    if len(args) > 1 and args[0] in names and args[1].startswith("-"):
        args, flags = args[:1], args[1:]  # one benchmark with its own flags
    unknown = [a for a in args if a not in names]
    if unknown:
        print(f"unknown benchmark(s): {', '.join(unknown)}; available: {', '.join(names)}", file=sys.stderr)
        return 2
    failed = []
    summary: list[tuple[str, str, str, str, bool]] = []
    chosen = args or [n for n in names
                      if getattr(importlib.import_module(f"benchmarks.{n}.bench"), "RUN_BY_DEFAULT", True)]
    banner = sys.stderr if args == chosen[:1] == chosen else sys.stdout  # one named: stdout is its own
    for name in chosen:
        print(f"=== benchmark {name} ===", file=banner, flush=True)
        start = time.monotonic()
        module = importlib.import_module(f"benchmarks.{name}.bench")
        rows = getattr(module, "SUMMARY", None)
        if isinstance(rows, list):
            rows.clear()  # a module run before in this process must not lend its figures
        rc = int(module.main(flags + ([goals.FLAG] if no_goals else [])) or 0)
        if not rc and not no_goals and goals.missed(rows or []):
            rc = 1  # a goal it printed was missed (every bench's main says so too; this is the backstop)
        print(f"=== {name}: exit {rc} in {time.monotonic() - start:.1f}s ===", file=banner, flush=True)
        summary += [(name, *row) for row in rows or []]
        if rc:
            failed.append(name)
    if summary and len(chosen) > 1:
        print_summary(summary)
    return 1 if failed else 0


def print_summary(rows: list[tuple[str, str, str, str, bool]]) -> None:
    """One Markdown table: benchmark, figure, value, goal, met (docs/performance.md keeps the latest)."""
    print(f"\n## Summary ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})\n")
    print("| benchmark | figure | value | goal | met |")
    print("|---|---|---|---|---|")
    for bench, figure, value, goal, ok in rows:
        print(f"| {bench} | {figure} | {value} | {goal} | {'yes' if ok else '**no**'} |")


if __name__ == "__main__":
    sys.exit(main())
