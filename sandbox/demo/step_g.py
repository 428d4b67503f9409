"""g) GPU preemption (issue 29, ``sandbox/preempt_step.py``): a low-priority batch fills the A100 node's
GPUs, a high-priority inference pod arrives and runs; the report shows the victims, the GPU and the time.
"""

from __future__ import annotations

from sandbox.demo.core import Demo

NODE = "gpu-a100"


def run(demo: Demo) -> None:
    """The extender runs with ``--preemption extender`` in the sandbox (``hami_scheduler_preemption`` in
    inventories/sandbox/group_vars/all.yml)."""
    from sandbox import preempt_step

    demo.header("g", "GPU preemption: a high-priority inference pod on a GPU a low-priority batch fills")
    client = demo.sb.kube()
    try:
        result = preempt_step.run(client, NODE, say=demo.say)
    finally:
        client.close()
    for name, ok, detail in result.checks:
        demo.check(f"preemption: {name}", ok, detail)
    if not result.checks:
        demo.check("preemption step ran", False, "no check ran")
