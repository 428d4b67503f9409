"""``hami-agent shrreg``: the same implementation as ``shrreg_tool`` (import-light)."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from hami_agent.shrreg import tool

    tool.add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from hami_agent.shrreg import tool

    return tool.run(args)
