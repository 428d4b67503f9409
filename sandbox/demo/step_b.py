"""b) Provision with the real playbooks: ``playbooks/site.yml`` while one node is sick (its dpkg lock held:
``sandbox/sick_node.py``), a rerun of only the nodes that need attention, then every node's driver, compute
utils, MIG layout, kubelet verbosity, MPS, device plugin and scheduler extender checked.
"""

from __future__ import annotations

from sandbox import podman, sick_node
from sandbox.cluster import PLUGIN_UNIT, SCHEDULER_UNIT, wait_for
from sandbox.demo.core import FIXED_DRIVER, SEED_NODE, SITE, Demo


def run(demo: Demo) -> None:
    demo.header("b", "provision the nodes with the real playbooks")
    if SITE.exists():
        _provision_with_a_sick_node(demo)
    else:
        demo.check("ansible-playbook playbooks/site.yml", False, f"{SITE} is missing")
    for node in demo.sb.cfg.nodes:
        st = demo.sb.gpusim_state(node.name)
        demo.check(
            f"{node.name}: driver {FIXED_DRIVER} installed and loaded (known-bad refused/fixed)",
            st.get("driver_version") == FIXED_DRIVER and st.get("module_version") == FIXED_DRIVER,
            f"library {st.get('driver_version')}, module {st.get('module_version')}",
        )
        mps = demo.node_exec(node.name, "test", "-x", "/usr/bin/nvidia-cuda-mps-control")
        demo.check(f"{node.name}: compute utils (nvidia-cuda-mps-control) installed", mps.returncode == 0)
        smi = demo.node_exec(node.name, "timeout", "15", "nvidia-smi", "-L")
        demo.say(
            "    "
            + "\n    ".join(smi.stdout.strip().splitlines()[:6])
            + (" ..." if smi.stdout.count("\n") > 6 else "")
        )
    h20 = demo.sb.gpusim_state(SEED_NODE)
    layout = [len(g["mig"]["devices"]) if g["mig"]["current"] == 1 else 0 for g in h20["gpus"]]
    demo.check(
        f"{SEED_NODE}: the seed's MIG layout (GPUs 0-2: 3g.48gb + 1g.24gb + 2x 1g.12gb)",
        layout == [4, 4, 4, 0, 0, 0, 0, 0],
        f"MIG devices per GPU {layout}",
    )
    kcfg = demo.node_exec(
        SEED_NODE,
        "sh",
        "-c",
        "grep -h 'verbosity' /etc/kubernetes/kubelet-config.yaml "
        "/var/lib/kubelet/config.yaml 2>/dev/null",
    )
    demo.check(
        "kubelet verbosity set (seed 003 §3.1.6)",
        "verbosity" in kcfg.stdout,
        kcfg.stdout.strip() or "no verbosity in the kubelet config",
    )
    demo.check(
        "MPS configured (nvidia_mps role)",
        any(podman.unit_active(n.name, "nvidia-mps.service") for n in demo.sb.cfg.nodes),
        "nvidia-mps.service active" if SITE.exists() else "NOT YET: site.yml missing",
    )
    placement = demo.sb.ensure_agents()
    for node in demo.sb.cfg.nodes:
        where = placement.plugins[node.name]
        demo.check(
            f"{node.name}: device plugin deployed as systemd service {PLUGIN_UNIT}",
            where == "container",
            "active in the node"
            if where == "container"
            else "NOT YET: not deployed by the playbooks; the sandbox runs the same agent on the host",
        )
    demo.check(
        f"scheduler extender deployed as systemd service {SCHEDULER_UNIT}",
        placement.scheduler == "container",
        "active on the control node"
        if placement.scheduler == "container"
        else "NOT YET: not deployed by the playbooks; the sandbox runs it on the host",
    )
    ok = wait_for(
        lambda: all(demo.registered(n.name) and demo.allocatable(n.name) > 0 for n in demo.sb.cfg.nodes),
        60,
    )
    demo.check(
        "every GPU node registered its GPUs (hami.io/node-nvidia-register, allocatable nvidia.com/gpu)",
        ok,
        ", ".join(f"{n.name}: {demo.allocatable(n.name)}" for n in demo.sb.cfg.nodes),
    )


def _provision_with_a_sick_node(demo: Demo) -> None:
    """site.yml while one node's dpkg lock is held (sandbox/sick_node.py): the others converge, the
    account names the sick node; a rerun of only the nodes that need attention finishes it."""
    sick = sick_node.SICK_NODE
    held = sick_node.hold_dpkg_lock(sick)
    demo.say(f"  {sick} is sick: its dpkg lock is held (an unattended upgrade that never ends): {held}")
    first = demo.out / "site-run1"
    try:
        proc = demo.playbook(SITE, "site", "-e", f"site_rollout_report_dir={first}", timeout_s=2400)
    finally:
        sick_node.release_dpkg_lock(sick)
    doc = sick_node.account(first)
    demo.fleet["run1"] = doc
    nodes = doc.get("nodes") or {}
    for line in [ln for ln in proc.stdout.splitlines() if ln.startswith(tuple(nodes))][-len(nodes):]:
        demo.say("    " + line[:160])
    want = {n.name for n in demo.sb.cfg.nodes} | {"hami-control"}
    others = {n: v["state"] for n, v in nodes.items() if n != sick}
    failed = nodes.get(sick) or {}
    demo.check(
        f"one sick node never stops the others: {sick} failed in the converge play (dpkg lock held), "
        "every other node converged or rolled, the account says so and the exit code is non-zero",
        held and proc.returncode != 0 and failed.get("state") == "failed"
        and failed.get("play") == "converge" and "lock" in failed.get("detail", "").lower()
        and set(nodes) == want
        and all(state in ("changed", "converged", "rolled") for state in others.values())
        and doc.get("needs_attention") == [sick],
        f"exit {proc.returncode}; {sick}: {failed.get('task', '?')}: {failed.get('detail', '')[:160]}; "
        f"others {others}",
    )
    second = demo.out / "site-run2"
    rerun = demo.playbook(SITE, "site-rerun", "-e", f"site_rollout_report_dir={second}", "--limit",
                          f"@{first / '_needs-attention.txt'}", timeout_s=1200)
    doc = sick_node.account(second)
    demo.fleet["run2"] = doc
    states = {n: v["state"] for n, v in (doc.get("nodes") or {}).items()}
    demo.check(
        "ansible-playbook playbooks/site.yml succeeded for every node once the lock was gone: a rerun of "
        f"only the nodes that needed attention (--limit @_needs-attention.txt) converged {sick}",
        rerun.returncode == 0 and states == {sick: "changed"},
        f"exit {rerun.returncode}; account {states}",
    )
    refused = "known-bad" in proc.stdout or "known bad" in proc.stdout
    demo.say(f"  site.yml output mentions the known-bad driver policy: {refused}")
