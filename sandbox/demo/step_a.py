"""a) Build what is missing and start the sandbox: the simulated API server, the podman GPU nodes (gpu-h20 on
seed 003's known-bad driver), the simulated kubelets.
"""

from __future__ import annotations

from sandbox.demo.core import BAD_DRIVER, SEED_NODE, Demo


def run(demo: Demo) -> None:
    demo.header("a", "build what is missing and start the sandbox")
    demo.sb.up(agents=False)
    st = demo.sb.status()
    demo.check(
        "API server, node containers and SIMULATED kubelets are up",
        st["apiserver"] and all(st["containers"].values()),
        f"containers {st['containers']}",
    )
    bad = demo.sb.gpusim_state(SEED_NODE)
    demo.check(
        f"{SEED_NODE} starts on the seed's known-bad driver",
        bad.get("module_version") == BAD_DRIVER,
        f"loaded module {bad.get('module_version')}, MIG on GPUs "
        f"{[g['index'] for g in bad['gpus'] if g['mig']['current'] == 1]}",
    )
