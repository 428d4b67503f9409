"""``kubectl-hami``: the kubectl plugin, so ``kubectl hami doctor pod NS/NAME`` works.

kubectl runs ``kubectl-hami`` from $PATH with the words after ``hami``; we forward ``doctor ...`` to the
same parser as ``hami-agent doctor``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from hami_agent import log


def build_parser() -> argparse.ArgumentParser:
    from hami_agent.cli import add_common_arguments
    from hami_agent.doctor import cmd

    parser = argparse.ArgumentParser(prog="kubectl hami", description="HAMi tools as a kubectl plugin")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    doctor = sub.add_parser("doctor", help="diagnose HAMi problems and print the fix")
    add_common_arguments(doctor)
    cmd.add_arguments(doctor)
    doctor.set_defaults(run=cmd.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    run = getattr(args, "run", None)
    if run is None:
        parser.print_help(sys.stderr)
        return 2
    log.setup(getattr(args, "verbosity", 0))
    try:
        return int(run(args))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
