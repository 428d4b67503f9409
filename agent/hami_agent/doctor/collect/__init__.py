"""Evidence collectors. Each is ``fn(ctx, facts)``, run by ``run_collector`` with a deadline."""

from hami_agent.doctor.collect.base import Context, run_collector

__all__ = ["Context", "run_collector"]
