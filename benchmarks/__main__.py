"""Run every ``benchmarks/<name>/bench.py`` (or only the names given): ``python -m benchmarks [name ...]``."""

from __future__ import annotations

import importlib
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def discover() -> list[str]:
    return sorted(p.parent.name for p in HERE.glob("*/bench.py") if not p.parent.name.startswith(("_", ".")))


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    names = discover()
    if args in (["-h"], ["--help"]):
        print(f"usage: python -m benchmarks [name ...]   (available: {', '.join(names)})")
        return 0
    unknown = [a for a in args if a not in names]
    if unknown:
        print(f"unknown benchmark(s): {', '.join(unknown)}; available: {', '.join(names)}", file=sys.stderr)
        return 2
    failed = []
    for name in args or names:
        print(f"=== benchmark {name} ===", flush=True)
        start = time.monotonic()
        module = importlib.import_module(f"benchmarks.{name}.bench")
        rc = int(module.main([]) or 0)
        print(f"=== {name}: exit {rc} in {time.monotonic() - start:.1f}s ===", flush=True)
        if rc:
            failed.append(name)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
