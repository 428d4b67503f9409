"""e) Roll a driver pin change over the GPU nodes under a PodDisruptionBudget (``sandbox/rollout.py``): an
operator's cordon stays, a node that fails its gate is parked and stops the roll, the fixed node resumes
first, MIG and MPS drift on nodes with GPU pods evicts them first, a third run changes nothing.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

from hami_agent.k8s.errors import KubeError
from sandbox import rollout as ro
from sandbox.cluster import wait_for
from sandbox.demo.core import SITE, Demo
from sandbox.workload import NAMESPACE


def roll(demo: Demo, log: str, report_dir: Path) -> tuple[subprocess.CompletedProcess, float, float]:
    report_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    # the parts a driver pin can touch (and MIG / MPS, whose drift run 2 repairs): the rest of
    # site.yml has nothing to do here and would only lengthen every batch
    proc = demo.playbook(SITE, log, "-e", f"nvidia_driver_version={ro.NEW_DRIVER}", "-e",
                         f"site_serial={ro.SERIAL}", "-e", f"site_rollout_report_dir={report_dir}",
                         "--tags", ro.ROLL_TAGS, timeout_s=2400)
    return proc, t0, time.time()


def run(demo: Demo) -> None:
    demo.header("e", f"roll a driver pin change ({ro.OLD_DRIVER} -> {ro.NEW_DRIVER}) under a "
                     "PodDisruptionBudget")
    cfg = demo.sb.cfg
    names = [n.name for n in cfg.nodes]
    client = demo.sb.kube()
    # 1. the earlier steps' pods are bare pods: a drain refuses to evict what nothing recreates
    for p in client.list_pods(namespace=NAMESPACE):
        client.delete("pods", p["metadata"]["name"], NAMESPACE)
    gone = wait_for(lambda: not demo.pods(), 60)
    demo.check("the earlier steps' bare pods are deleted (a drain refuses pods no controller recreates)",
               gone)
    # 2. the workload under its budget
    rs, pdb = ro.workload()
    try:
        client.create("namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                     "metadata": {"name": ro.NAMESPACE}})
    except KubeError as exc:
        if exc.status != 409:
            raise
    client.call("POST", f"/apis/apps/v1/namespaces/{ro.NAMESPACE}/replicasets", verb="create",
                kind="replicaset", body=rs, idempotent=False)
    client.call("POST", f"/apis/policy/v1/namespaces/{ro.NAMESPACE}/poddisruptionbudgets", verb="create",
                kind="poddisruptionbudget", body=pdb, idempotent=False)
    watch = ro.BudgetWatch(client).start()
    ok = wait_for(lambda: sum(watch.healthy.values()) == ro.REPLICAS, 120)
    placement = {}
    for p in client.list_pods(namespace=ro.NAMESPACE):
        placement.setdefault(p["spec"].get("nodeName") or "-", []).append(p["metadata"]["name"])
    pdb_path = f"/apis/policy/v1/namespaces/{ro.NAMESPACE}/poddisruptionbudgets/{ro.APP}"
    budget: dict = {}

    def budget_settled() -> bool:
        # the disruption controller updates the budget's status after it sees the pods Ready (a real one
        # lags too): wait for its answer instead of reading it once
        status = client.call("GET", pdb_path, verb="get", kind="poddisruptionbudget").get("status") or {}
        budget.clear()
        budget.update(status)
        return budget.get("disruptionsAllowed") == 1

    if ok:
        wait_for(budget_settled, 30)
    else:
        budget_settled()
    demo.check(f"workload: ReplicaSet {ro.APP} {ro.REPLICAS}/{ro.REPLICAS} Ready, PodDisruptionBudget "
               f"minAvailable {ro.MIN_AVAILABLE}", ok and budget.get("disruptionsAllowed") == 1,
               f"pods per node { {n: len(v) for n, v in sorted(placement.items())} }, disruptionsAllowed "
               f"{budget.get('disruptionsAllowed')}")
    demo.sb.gpusim(ro.GATE_FAULT_NODE, "gpu-lost", "--gpu", "3", "on")
    demo.say(f"  fault: GPU 3 of {ro.GATE_FAULT_NODE} falls off the bus (gpusim gpu-lost): its NVML gate "
             "must stop the roll")
    demo.cordon(ro.OPERATOR_NODE, True)
    demo.say(f"  an operator cordons {ro.OPERATOR_NODE} (kubectl cordon): it must stay cordoned")
    watch.arm()
    try:
        _roll_with_a_failing_gate(demo, watch, names)
        _resume_with_drift(demo, watch, names)
        _second_run(demo)
    finally:
        watch.stop()
        demo.cordon(ro.OPERATOR_NODE, False)
        client.close()
    demo.rollout.update({
        "serial": ro.SERIAL,
        "max_cordoned": watch.max_by_rollout,
        "max_cordoned_including_operator": watch.max_by_anyone,
        "max_unavailable": ro.REPLICAS - (watch.lowest if watch.lowest is not None else ro.REPLICAS),
        "pdb_min_available": ro.MIN_AVAILABLE,
        "pdb_violations": watch.violations,
        "lowest_healthy": watch.lowest,
        "budget_events": len(watch.timeline),
    })
    (demo.out / "rollout-timeline.json").write_text(json.dumps(watch.timeline))
    demo.check(f"the budget held at every change: lowest healthy {watch.lowest} >= minAvailable "
               f"{ro.MIN_AVAILABLE} ({len(watch.timeline)} watch events)",
               watch.violations == 0 and (watch.lowest or 0) >= ro.MIN_AVAILABLE,
               f"violations {watch.violations}")
    demo.check(f"never more than serial={ro.SERIAL} node(s) cordoned by the rollout at once",
               0 < watch.max_by_rollout <= ro.SERIAL,
               f"max {watch.max_by_rollout} (with the operator's cordon: {watch.max_by_anyone})")


def _show_batches(demo: Demo, recs: dict) -> None:
    for b in ro.batches("", recs):
        gates = ", ".join(f"{g}={'pass' if ok else 'FAIL'}" for g, ok in b["gates"].items())
        demo.say(f"    batch {b['batch']}: {', '.join(b['nodes'])}: evicted {len(b['evicted'])} pod(s) "
                 f"({b['budget_refusals']} PodDisruptionBudget refusal(s)); gates {gates or '-'}")


def _roll_with_a_failing_gate(demo: Demo, watch: ro.BudgetWatch, names: list[str]) -> None:
    demo.say(f"  run 1: site.yml with nvidia_driver_version={ro.NEW_DRIVER}, serial {ro.SERIAL}")
    rdir = demo.out / "rollout-run1"
    proc, t0, t1 = roll(demo, "rollout-run1", rdir)
    recs = ro.records(rdir)
    _show_batches(demo, recs)
    demo.rollout.setdefault("batches", []).extend(ro.batches("run1", recs))
    demo.check("run 1 stopped at the first failed node (exit != 0)", proc.returncode != 0,
               f"exit {proc.returncode}")
    for node in (ro.MIG_NODE, ro.MPS_NODE):
        n = demo.node_obj(node)
        demo.check(f"{node}: rolled to {ro.NEW_DRIVER}, gates passed, uncordoned",
                   demo.driver_of(node) == ro.NEW_DRIVER and not n["spec"].get("unschedulable")
                   and node in recs and not recs[node].get("failed_gate"),
                   f"driver {demo.driver_of(node)}, gates {recs.get(node, {}).get('gates')}")
    n = demo.node_obj(ro.GATE_FAULT_NODE)
    ann = n["metadata"].get("annotations") or {}
    client = demo.sb.kube()
    events = [e for e in client.list("events", "default")[0]
              if e.get("reason") == "HamiMaintenanceGateFailed"
              and (e.get("involvedObject") or {}).get("name") == ro.GATE_FAULT_NODE]
    client.close()
    demo.check(f"{ro.GATE_FAULT_NODE} failed its nvml gate and stays cordoned, annotated and with an "
               "event naming the gate and its runbook",
               n["spec"].get("unschedulable") is True and ann.get(ro.FAILED_GATE) == "nvml"
               and "rollout_gates.md#nvml" in ann.get(ro.RUNBOOK, "") and bool(events),
               f"{ro.FAILED_GATE}={ann.get(ro.FAILED_GATE)}, {ro.RUNBOOK}={ann.get(ro.RUNBOOK)}, "
               f"event: {events[0]['message'][:160] if events else 'none'}")
    reqs = ro.requests_between(demo.sb.request_log, t0, t1)
    touched = [p for p in ro.evictions(reqs) if any(x in p for x in _pods_on(demo, ro.OPERATOR_NODE))]
    n = demo.node_obj(ro.OPERATOR_NODE)
    demo.check(f"{ro.OPERATOR_NODE} (the later batch) untouched: driver {ro.OLD_DRIVER}, no eviction, no "
               "cordon of ours",
               demo.driver_of(ro.OPERATOR_NODE) == ro.OLD_DRIVER and not touched
               and ro.OPERATOR_NODE not in ro.cordons(reqs) and ro.OPERATOR_NODE not in recs
               and (n["metadata"].get("annotations") or {}).get(ro.CORDONED_BY) is None,
               f"driver {demo.driver_of(ro.OPERATOR_NODE)}, cordons written {ro.cordons(reqs)}")


def _pods_on(demo: Demo, node: str) -> list[str]:
    client = demo.sb.kube()
    try:
        return [p["metadata"]["name"] for p in client.list_pods(field_selector=f"spec.nodeName={node}")]
    finally:
        client.close()


def _resume_with_drift(demo: Demo, watch: ro.BudgetWatch, names: list[str]) -> None:
    demo.sb.gpusim(ro.GATE_FAULT_NODE, "gpu-lost", "--gpu", "3", "off")
    demo.say(f"  the operator fixes {ro.GATE_FAULT_NODE} (GPU 3 back); meanwhile the MIG layout of "
             f"{ro.MIG_NODE} and the compute mode of {ro.MPS_NODE} drift")
    before = {n: _pods_on(demo, n) for n in (ro.MIG_NODE, ro.MPS_NODE)}
    demo.node_exec(ro.MIG_NODE, "nvidia-smi", "mig", "-i", "0", "-dci")
    demo.node_exec(ro.MIG_NODE, "nvidia-smi", "mig", "-i", "0", "-dgi")
    demo.node_exec(ro.MPS_NODE, "nvidia-smi", "-i", "0", "-c", "DEFAULT")
    demo.say(f"  run 2: site.yml again (GPU pods before: { {k: len(v) for k, v in before.items()} })")
    rdir = demo.out / "rollout-run2"
    proc, _t0, _t1 = roll(demo, "rollout-run2", rdir)
    recs = ro.records(rdir)
    _show_batches(demo, recs)
    demo.rollout.setdefault("batches", []).extend(ro.batches("run2", recs))
    demo.check("run 2 finished the roll (exit 0)", proc.returncode == 0, f"exit {proc.returncode}")
    for node, role in ((ro.MIG_NODE, "nvidia_mig"), (ro.MPS_NODE, "nvidia_mps")):
        rec = recs.get(node) or {}
        roles = [d.get("role") for d in rec.get("disruptions") or []]
        demo.check(f"{node}: the {role} change on a node with running GPU pods evicted them first",
                   role in roles and len(rec.get("evicted") or []) > 0 and not rec.get("failed_gate"),
                   f"disruptions {[d.get('change') for d in rec.get('disruptions') or []]}, evicted "
                   f"{rec.get('evicted')}")
    rec = recs.get(ro.GATE_FAULT_NODE) or {}
    n = demo.node_obj(ro.GATE_FAULT_NODE)
    demo.check(f"{ro.GATE_FAULT_NODE} resumed first (batch 1): gates passed, uncordoned, annotations "
               "cleared",
               bool(rec) and int(rec.get("batch") or 0) == 1 and not rec.get("failed_gate")
               and not n["spec"].get("unschedulable")
               and not any(k.startswith("hami.io/maintenance")
                           for k in n["metadata"].get("annotations") or {}),
               f"gates {rec.get('gates')}")
    rec = recs.get(ro.OPERATOR_NODE) or {}
    n = demo.node_obj(ro.OPERATOR_NODE)
    demo.check(f"{ro.OPERATOR_NODE} rolled and stays cordoned (its operator's cordon)",
               rec.get("cordoned_by") == "operator" and n["spec"].get("unschedulable") is True
               and not rec.get("failed_gate"),
               f"cordoned_by {rec.get('cordoned_by')}, evicted {len(rec.get('evicted') or [])}")
    drivers = {n: demo.driver_of(n) for n in names}
    demo.check(f"every GPU node runs {ro.NEW_DRIVER}", set(drivers.values()) == {ro.NEW_DRIVER},
               str(drivers))


def _second_run(demo: Demo) -> None:
    demo.say("  run 3: site.yml again: nothing is pending")
    proc, t0, t1 = roll(demo, "rollout-run3", demo.out / "rollout-run3")
    rc = ro.recap(proc.stdout)
    reqs = ro.requests_between(demo.sb.request_log, t0, t1)
    changed = {h: r.get("changed") for h, r in rc.items()}
    demo.check("second run: changed=0 on every host, no cordon and no eviction in the API request log",
               proc.returncode == 0 and rc and all(v == 0 for v in changed.values())
               and not ro.cordons(reqs) and not ro.evictions(reqs),
               f"changed {changed}; cordons {ro.cordons(reqs)}; evictions {len(ro.evictions(reqs))}")
