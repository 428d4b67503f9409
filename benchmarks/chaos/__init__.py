"""The chaos soak (issue 17): the real agents on simulated GPU nodes under a seeded random schedule of
faults, then the invariant checker. ``python -m benchmarks chaos --help``; docs/testing.md, "Chaos soak"."""
