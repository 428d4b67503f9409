"""``kubectl-hami``: the kubectl plugin, so ``kubectl hami doctor pod NS/NAME`` works.

kubectl runs ``kubectl-hami`` from $PATH with the words after ``hami``; we forward ``doctor ...`` to the
same parser as ``hami-agent doctor``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


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
    from hami_agent.cli import dispatch

    return dispatch(build_parser(), argv)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
