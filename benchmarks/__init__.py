"""Reproducible performance harnesses (``make bench`` = ``python -m benchmarks``).

Each ``benchmarks/<name>/bench.py`` exposes ``main(argv: list[str] | None = None) -> int`` and prints its
figures. Benchmarks report numbers; tests never assert them.
"""
