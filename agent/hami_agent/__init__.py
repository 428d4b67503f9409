"""hami-agent: HAMi-compatible GPU device plugin, scheduler extender and node tooling."""

__version__ = "0.1.0"
