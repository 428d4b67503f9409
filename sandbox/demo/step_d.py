"""d) Replay seed 003: the known-bad driver with mixed MIG makes NVML hang; pods keep being admitted;
``hami-agent doctor`` names NVML_INIT_HANG_KNOWN_BAD_DRIVER with evidence; ``remediate_nvml_hang.yml``
fixes the node; doctor is clean.
"""

from __future__ import annotations

import json
import time

from sandbox import identities
from sandbox.cluster import wait_for
from sandbox.config import REPO
from sandbox.demo.core import ADMIT_DEADLINE_S, BAD_DRIVER, FIXED_DRIVER, REMEDIATE, SEED_NODE, Demo
from sandbox.workload import replay_workload


def run(demo: Demo) -> None:
    demo.header("d", "replay seed 003: known-bad driver + mixed MIG -> NVML hang")
    proc = demo.playbook(
        REPO / "sandbox" / "playbooks" / "seed_driver.yml",
        "seed003-state",
        "-e",
        f"sandbox_seed_driver={BAD_DRIVER}",
        limit=SEED_NODE,
    )
    st = demo.sb.gpusim_state(SEED_NODE)
    demo.check(
        f"{SEED_NODE} is back on {BAD_DRIVER} with mixed MIG (the seed's state)",
        proc.returncode == 0 and st.get("module_version") == BAD_DRIVER,
        f"module {st.get('module_version')}, MIG GPUs "
        f"{[g['index'] for g in st['gpus'] if g['mig']['current']]}",
    )
    smi = demo.node_exec(SEED_NODE, "timeout", "5", "nvidia-smi", "-L", timeout_s=30)
    demo.check(
        "nvidia-smi hangs on the node (the seed's symptom)",
        smi.returncode == 124,
        f"`timeout 5 nvidia-smi -L` exit {smi.returncode}",
    )
    port = demo.sb.cfg.node(SEED_NODE).metrics_port
    demo.sb.restart_plugin(SEED_NODE)  # the seed restarted the plugin too: NVML init hangs on start
    stuck = wait_for(lambda: (demo.metric(port, "hami_device_plugin_nvml_stuck") or 0) >= 1, 40)
    demo.check(
        "device plugin detected the hang and kept serving (/metrics: hami_device_plugin_nvml_stuck 1)",
        stuck,
        f"hami_device_plugin_nvml_stuck={demo.metric(port, 'hami_device_plugin_nvml_stuck')}",
    )
    client = demo.sb.kube()
    for p in replay_workload(SEED_NODE):
        client.create("pods", p)
    client.close()
    names = [p["metadata"]["name"] for p in replay_workload(SEED_NODE)]
    t = time.monotonic()

    def decided_all() -> bool:
        adm, live = demo.admissions(), demo.pods()
        return all(
            n in adm and (live[n].get("status") or {}).get("phase") in ("Running", "Failed")
            for n in names
        )

    decided = wait_for(decided_all, ADMIT_DEADLINE_S, 0.2)
    adm, live = demo.admissions(), demo.pods()
    for n in names:
        rec = adm.get(n) or {}
        demo.say(
            f"  {n}: admitted={rec.get('admitted')} in {rec.get('duration_s', 0):.3f}s, phase "
            f"{(live[n].get('status') or {}).get('phase')}; {rec.get('message') or ''}"
        )
    demo.check(
        f"the kubelet is not blocked: pods sent to {SEED_NODE} during the hang were decided within "
        f"{ADMIT_DEADLINE_S:.0f}s",
        decided,
        f"{time.monotonic() - t:.1f}s",
    )
    demo.check(
        "a plain pod on the hung node runs (in the seed even these hung)",
        (live["during-hang-plain"].get("status") or {}).get("phase") == "Running",
    )
    klog = (demo.sb.cfg.logs / f"kubelet-sim-{SEED_NODE}.log").read_text()
    issued = klog.count("Issuing a GetPreferredAllocation call for container")
    demo.say(
        f"  kubelet log: {issued} GetPreferredAllocation call(s), "
        f"{klog.count('Making allocation request for device plugin')} Allocate call(s), all answered"
    )
    rc, rep = demo.doctor(SEED_NODE, "before")
    codes = [v.get("code") for v in rep.get("verdicts", [])]
    seed = next(
        (v for v in rep.get("verdicts", []) if v.get("code") == "NVML_INIT_HANG_KNOWN_BAD_DRIVER"), None
    )
    demo.say(f"  $ hami-agent doctor cluster  -> exit {rc}, findings {codes}")
    if seed:
        demo.say(f"    {seed.get('summary')}")
        for ev in (seed.get("evidence") or [])[:6]:
            demo.say(f"      > {ev if isinstance(ev, str) else json.dumps(ev)}")
        demo.say(f"    fix: {seed.get('fix')}")
    demo.check(
        "doctor names NVML_INIT_HANG_KNOWN_BAD_DRIVER with evidence",
        rc == 1 and seed is not None and bool(seed.get("evidence")),
        f"exit {rc}, codes {codes}",
    )
    # the replay's pods are bare pods (no controller would recreate them): the maintenance window
    # refuses to evict such pods unless told to (node_maintenance_force), as kubectl drain does
    proc = demo.playbook(REMEDIATE, "remediate", "-e", "node_maintenance_force=true", limit=SEED_NODE)
    demo.check(
        "ansible-playbook playbooks/remediate_nvml_hang.yml fixed the node",
        proc.returncode == 0,
        f"exit {proc.returncode}",
    )
    st = demo.sb.gpusim_state(SEED_NODE)
    demo.check(
        f"{SEED_NODE} runs {FIXED_DRIVER}, MIG layout kept",
        st.get("module_version") == FIXED_DRIVER
        and [g["index"] for g in st["gpus"] if g["mig"]["current"]] == [0, 1, 2],
        f"module {st.get('module_version')}",
    )
    recovered = wait_for(
        lambda: (
            demo.metric(port, "hami_device_plugin_nvml_stuck") == 0 and demo.allocatable(SEED_NODE) > 0
        ),
        60,
    )
    demo.check(
        "the device plugin recovered by itself (NVML answers, GPUs allocatable again)",
        recovered,
        f"allocatable nvidia.com/gpu={demo.allocatable(SEED_NODE)}",
    )
    rc, rep = demo.doctor(SEED_NODE, "after")
    bad = [v.get("code") for v in rep.get("verdicts", []) if v.get("severity") in ("critical", "error")]
    demo.say(
        f"  $ hami-agent doctor cluster  -> exit {rc}, findings "
        f"{[(v.get('code'), v.get('severity')) for v in rep.get('verdicts', [])]}"
    )
    unguarded = identities.kubeconfig(demo.sb.cfg.run_dir, "operator") is None
    if unguarded and "ALLOCATION_GUARD_MISSING" in bad:
        # without per-component identities every component is the admin, whom the allocation guard would
        # refuse: the sandbox runs unguarded on purpose (inventories/sandbox), and doctor says so
        demo.say("    (ALLOCATION_GUARD_MISSING: expected without HAMI_SANDBOX_IDENTITIES=1, whose run "
                 "installs the guard)")
        bad.remove("ALLOCATION_GUARD_MISSING")
        rc = 0 if not bad else rc
    demo.check("doctor is clean (no critical or error finding)", rc == 0 and not bad, f"exit {rc}, {bad}")
