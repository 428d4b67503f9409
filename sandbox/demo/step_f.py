"""f) The same GPUs through Dynamic Resource Allocation (``sandbox/dra_step.py``).
"""

from __future__ import annotations

from sandbox.demo.core import Demo


def run(demo: Demo) -> None:
    """The same GPUs through Dynamic Resource Allocation (sandbox/dra_step.py): a node of its own, the
    real ``hami-agent dra``, the simulated kubelet's DRA manager and kube-scheduler's allocator."""
    from sandbox import dra_step

    demo.header("f", "DRA: claims shared the HAMi way (hami-agent dra)")
    result = dra_step.run(dra_step.DraStepCluster.from_sandbox(demo.sb), say=demo.say)
    for name, ok, detail in result.checks:
        demo.check(f"DRA: {name}", ok, detail)
    if not result.checks:
        demo.check("DRA step ran", False, "no check ran")
