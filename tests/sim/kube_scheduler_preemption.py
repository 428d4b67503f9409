"""SIMULATED kube-scheduler preemption: DefaultPreemption's PostFilter as kube-scheduler v1.35.4 runs it,
with the simulator's framework filters (NodeUnschedulable, TaintToleration, NodeResourcesFit) and the
extender's ``preemptVerb`` over HTTP.

Upstream files (kubernetes v1.35.4; line numbers of that tag):

* ``pkg/scheduler/schedule_one.go`` ``schedulingCycle``: PostFilter runs only after a ``FitError``; an
  extender error skips it and clears ``nominatedNodeName`` (:161-191); the nominated node is tried first
  (:518-530, ``evaluateNominatedNode`` :575-599); an assumed pod leaves the nominator (:967-970);
  ``handleSchedulingFailure`` records the nomination and patches ``status.nominatedNodeName``
  (:1095-1159);
* ``pkg/scheduler/framework/plugins/defaultpreemption/default_preemption.go``: ``PostFilter`` prefixes
  ``preemption: `` (:121-132); ``calculateNumCandidates`` (:174-187); ``SelectVictimsOnNode`` (:207-307);
  ``PodEligibleToPreemptOthers`` (:317-341); ``filterPodsWithPDBViolation`` (:373-419);
* ``pkg/scheduler/framework/preemption/preemption.go``: ``Preempt`` (:268-339), ``findCandidates``
  (:343-366), ``callExtenders`` (:371-427), ``SelectCandidate`` (:431-458), ``prepareCandidate``
  (:464-502), ``PreemptPod`` (:177-219), ``pickOneNodeForPreemption`` (:651-737),
  ``getLowerPriorityNominatedPods`` (:746-761), ``DryRunPreemption`` (:768-821);
* ``pkg/scheduler/extender.go`` ``ProcessPreemption`` / ``convertToVictims`` / ``convertPodUIDToPod``
  (:137-221), ``send`` (:399-425: a non-200 answer is an error);
* ``pkg/scheduler/framework/runtime/framework.go`` ``RunPostFilterPlugins`` (:1080-1123: an ``Error``
  keeps the nomination), ``RunFilterPluginsWithNominatedPods`` / ``addGENominatedPods`` (:1145-1218:
  nominated pods of equal or higher priority count);
* ``pkg/scheduler/framework/plugins/noderesources/fit.go`` ``fitsRequest`` (:649-735): the reasons and
  the ``Unresolvable`` flag (a request larger than the node's allocatable);
* ``pkg/scheduler/framework/types.go`` ``FitError.Error`` (:807-858) and
  ``k8s.io/apimachinery/pkg/util/errors/errors.go`` ``aggregate.Error`` (:70-96): the message texts.

Simplifications (docs/testing.md lists them): the dry run is sequential from a fixed offset (``offset``,
0 by default; upstream picks a random one and runs nodes in parallel); preemption runs synchronously
(upstream's async preemption gates the preemptor with PreEnqueue until the API calls are done); no
Permit/waiting pods; only the filters above exist, so nothing but resources, taints and cordons can make a
node fail; NodeResourcesFit checks cpu, memory and the pod count only where the node's allocatable names
them, and the extended resource only in extender-off mode (``ignoredByScheduler`` otherwise); PDBs are
listed from the API at each preemption (upstream: an informer); no ``ignorable`` extender; one extender.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tests.sim.apiserver_policy import selector_matches
from tests.sim.kube_scheduler_queue import pod_priority

UNSCHEDULABLE = "Unschedulable"
UNRESOLVABLE = "UnschedulableAndUnresolvable"
ERROR = "Error"
SUCCESS = "Success"

NO_VICTIMS = "No preemption victims found for incoming pod"
NOT_HELPFUL = "Preemption is not helpful for scheduling"
NO_CANDIDATE = "no candidate node for preemption"
NEVER = "not eligible due to preemptionPolicy=Never."
TERMINATING_ON_NOMINATED = "not eligible due to a terminating pod on the nominated node."
MAX_INT32 = 2**31 - 1


@dataclass
class Status:
    """A framework ``Status``: a code and its reasons (a node's status joins them with ``, ``)."""

    code: str
    reasons: list[str] = field(default_factory=list)

    @property
    def message(self) -> str:
        return ", ".join(self.reasons)


@dataclass
class Outcome:
    """What PostFilter returned: its status and the nomination to apply (``None``: leave it as it is,
    ``""``: clear it, a node name: nominate it)."""

    status: Status
    nominate: str | None = None
    victims: list[dict] = field(default_factory=list)


def fit_error(total: int, statuses: dict[str, Status], absent: str = "", post_filter: str = "") -> str:
    """``FitError.Error()``: ``0/N nodes are available: <count> <reason>, ....`` then the PostFilter
    message. Each reason of each node counts; nodes without a status count under ``absent``."""
    counts: dict[str, int] = {}
    for st in statuses.values():
        for r in st.reasons:
            counts[r] = counts.get(r, 0) + 1
    if absent and len(statuses) < total:
        counts[absent] = counts.get(absent, 0) + total - len(statuses)
    msg = f"0/{total} nodes are available:"
    parts = sorted(f"{n} {r}" for r, n in counts.items())
    if parts:
        msg += f" {', '.join(parts)}."
    if post_filter:
        msg += f" {post_filter}"
    return msg


def aggregate(messages: list[str]) -> str:
    """``utilerrors.NewAggregate(errs).Error()``: one message as is; several, deduplicated, in brackets."""
    if len(messages) == 1:
        return messages[0]
    seen: list[str] = []
    for m in messages:
        if m not in seen:
            seen.append(m)
    return seen[0] if len(seen) == 1 else "[" + ", ".join(seen) + "]"


# ------------------------------------------------------------------------------------ resources
def _milli(value: Any) -> int:
    from hami_agent.protocol.quantity import parse_quantity

    try:
        return math.ceil(parse_quantity(value) * 1000)
    except Exception:  # noqa: BLE001 - a malformed quantity counts as nothing, as the sim's other parsers
        return 0


def _whole(value: Any) -> int:
    return math.ceil(_milli(value) / 1000)


def pod_request(pod: dict, resource: str) -> int:
    """The pod's request of ``resource`` (cpu in millicores, anything else in units): the larger of the
    app containers' sum and any init container (``resource.PodRequests``; no overhead, no sidecars)."""
    conv = _milli if resource == "cpu" else _whole
    spec = pod.get("spec") or {}

    def req(c: dict) -> int:
        res = c.get("resources") or {}
        value = (res.get("requests") or {}).get(resource, (res.get("limits") or {}).get(resource))
        return conv(value) if value is not None else 0

    init = max((req(c) for c in spec.get("initContainers") or []), default=0)
    return max(init, sum(req(c) for c in spec.get("containers") or []))


def resource_fit(pod: dict, node: dict, node_pods: list[dict], checked: tuple[str, ...]) -> Status | None:
    """NodeResourcesFit's ``fitsRequest`` over ``node_pods`` (the pods the node holds in this view):
    ``Too many pods`` / ``Insufficient <r>``; ``UnschedulableAndUnresolvable`` when a request is larger
    than the node's whole allocatable. ``checked``: the resources looked at (cpu, memory, pods where the
    node's allocatable names them; an extended resource always)."""
    alloc = (node.get("status") or {}).get("allocatable") or {}
    reasons, code = [], UNSCHEDULABLE
    if "pods" in checked and "pods" in alloc and len(node_pods) + 1 > _whole(alloc["pods"]):
        reasons.append("Too many pods")
    for r in checked:
        if r == "pods" or (r in ("cpu", "memory") and r not in alloc):
            continue
        want = pod_request(pod, r)
        if want <= 0:
            continue
        cap = (_milli if r == "cpu" else _whole)(alloc.get(r, 0))
        used = sum(pod_request(p, r) for p in node_pods)
        if want > cap - used:
            reasons.append(f"Insufficient {r}")
            if want > cap:
                code = UNRESOLVABLE
    return Status(code, reasons) if reasons else None


# ------------------------------------------------------------------------------------ victims
def start_time(pod: dict) -> str:
    """``util.GetPodStartTime``: ``status.startTime`` (RFC 3339 sorts as text); none: now, i.e. last."""
    return (pod.get("status") or {}).get("startTime") or "9999-12-31T23:59:59Z"


def importance(pod: dict) -> tuple[int, str]:
    """Sort key for ``util.MoreImportantPod``: higher priority first, then the earlier start."""
    return (-pod_priority(pod), start_time(pod))


def terminating_by_preemption(pod: dict) -> bool:
    """``podTerminatingByPreemption``: deleting, with ``DisruptionTarget=True`` ``PreemptionByScheduler``."""
    if not (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "DisruptionTarget":
            return c.get("status") == "True" and c.get("reason") == "PreemptionByScheduler"
    return False


def split_by_pdb(pods: list[dict], pdbs: list[dict]) -> tuple[list[dict], list[dict]]:
    """``filterPodsWithPDBViolation``: (violating, non-violating), order kept; each matching budget's
    ``disruptionsAllowed`` is spent pod by pod; a pod in ``disruptedPods`` spends nothing."""
    allowed = [int((b.get("status") or {}).get("disruptionsAllowed") or 0) for b in pdbs]
    violating, fine = [], []
    for p in pods:
        md = p.get("metadata") or {}
        labels, hit = md.get("labels") or {}, False
        if labels:
            for i, b in enumerate(pdbs):
                if (b.get("metadata") or {}).get("namespace") != md.get("namespace"):
                    continue
                if not selector_matches((b.get("spec") or {}).get("selector"), labels):
                    continue
                if md.get("name") in ((b.get("status") or {}).get("disruptedPods") or {}):
                    continue
                allowed[i] -= 1
                if allowed[i] < 0:
                    hit = True
        (violating if hit else fine).append(p)
    return violating, fine


def select_victims_on_node(pod: dict, node_pods: list[dict], fits: Callable[[list[dict]], Status | None],
                           pdbs: list[dict]) -> tuple[list[dict], int, Status]:
    """``SelectVictimsOnNode``: remove every lower-priority pod, run the framework filters (``fits`` over
    the pods left: None = it fits), then reprieve PDB violators first and the rest after, most important
    first in each group. Returns (victims by importance, PDB violations among them, status)."""
    prio = pod_priority(pod)
    potential = [p for p in node_pods if pod_priority(p) < prio]
    if not potential:
        return [], 0, Status(UNRESOLVABLE, [NO_VICTIMS])
    kept = [p for p in node_pods if pod_priority(p) >= prio]
    st = fits(kept)
    if st is not None:
        return [], 0, st
    potential.sort(key=importance)
    violating, fine = split_by_pdb(potential, pdbs)
    victims: list[dict] = []
    violations = 0
    for group, is_violating in ((violating, True), (fine, False)):
        for p in group:
            if fits([*kept, p]) is None:
                kept.append(p)
            else:
                victims.append(p)
                violations += is_violating
    if violating and fine:
        victims.sort(key=importance)
    return victims, violations, Status(SUCCESS)


def num_candidates(n: int, percentage: int = 10, absolute: int = 100) -> int:
    """``calculateNumCandidates`` with DefaultPreemptionArgs' defaults (10 %, 100)."""
    return min(max(n * percentage // 100, absolute), n)


def pick_one_node(candidates: dict[str, tuple[list[dict], int]]) -> str:
    """``pickOneNodeForPreemption``: fewest PDB violations, lowest highest victim priority, lowest sum of
    priorities (each shifted by 2^31), fewest victims, latest earliest start; then the first node
    (insertion order here)."""
    def earliest(victims: list[dict]) -> str:
        top = pod_priority(victims[0])
        return min(start_time(v) for v in victims if pod_priority(v) == top)

    scores = [
        lambda v: -v[1],
        lambda v: -pod_priority(v[0][0]),
        lambda v: -sum(pod_priority(p) + MAX_INT32 + 1 for p in v[0]),
        lambda v: -len(v[0]),
        lambda v: earliest(v[0]),
    ]
    names = list(candidates)
    for f in scores:
        best = max(f(candidates[n]) for n in names)
        names = [n for n in names if f(candidates[n]) == best]
        if len(names) == 1:
            break
    return names[0]



# ------------------------------------------------------------------------------------ the evaluator
class Evaluator:
    """DefaultPreemption's ``Evaluator`` over a :class:`tests.sim.kube_scheduler.KubeSchedulerSim`.

    ``offset``: the first potential node of the dry run (upstream: random). ``log``: (preemptor key,
    what happened) tuples, for tests."""

    def __init__(self, sim: Any, offset: int = 0) -> None:
        self.sim = sim
        self.offset = offset
        self.log: list[tuple[str, str]] = []
        self.preempt_calls: list[dict] = []  # the ExtenderPreemptionArgs bodies sent

    def _note(self, key: str, what: str) -> None:
        self.log.append((key, what))
        del self.log[:-10000]

    # PodEligibleToPreemptOthers
    def eligible(self, pod: dict, statuses: dict[str, Status]) -> tuple[bool, str]:
        if (pod.get("spec") or {}).get("preemptionPolicy") == "Never":
            return False, NEVER
        nominated = (pod.get("status") or {}).get("nominatedNodeName")
        if nominated:
            st = statuses.get(nominated)
            if st is None or st.code == UNRESOLVABLE:  # absent nodes read UnschedulableAndUnresolvable
                return True, ""
            prio = pod_priority(pod)
            for p in self.sim.node_pods(nominated):
                if pod_priority(p) < prio and terminating_by_preemption(p):
                    return False, TERMINATING_ON_NOMINATED
        return True, ""

    def post_filter(self, pod: dict, statuses: dict[str, Status], total: int) -> Outcome:
        """``DefaultPreemption.PostFilter`` -> ``Evaluator.Preempt``; messages carry ``preemption: ``."""
        out = self.preempt(pod, statuses, total)
        if out.status.reasons:
            out.status.reasons = ["preemption: " + out.status.message]
        return out

    def preempt(self, pod: dict, statuses: dict[str, Status], total: int) -> Outcome:
        key = pod_key_of(pod)
        md = pod["metadata"]
        latest = self.sim.pod_informer.get(md.get("namespace", "default"), md["name"])
        if latest is None:
            return Outcome(Status(ERROR, [f'pod "{md["name"]}" not found']))
        pod = latest
        ok, why = self.eligible(pod, statuses)
        if not ok:
            self._note(key, why)
            return Outcome(Status(UNSCHEDULABLE, [why]))
        nodes = {n["metadata"]["name"]: n for n in self.sim.node_informer.list()}
        potential = sorted(n for n, st in statuses.items() if st.code == UNSCHEDULABLE and n in nodes)
        candidates: dict[str, tuple[list[dict], int]] = {}
        dry: dict[str, Status] = {}
        errors: list[str] = []
        if potential:
            pdbs = self.sim.list_pdbs()
            want = num_candidates(len(potential))
            non_violating = 0
            for i in range(len(potential)):
                name = potential[(self.offset + i) % len(potential)]
                node = nodes[name]
                victims, violations, st = select_victims_on_node(
                    pod, self.sim.node_pods(name),
                    lambda held, node=node: self.sim.framework_fit(pod, node, held), pdbs)
                if st.code == SUCCESS and victims:
                    candidates[name] = (victims, violations)
                    non_violating += violations == 0
                    if non_violating and len(candidates) >= want:
                        break  # DryRunPreemption cancels the rest
                    continue
                if st.code == SUCCESS:
                    st = Status(ERROR, [f'expected at least one victim pod on node "{name}"'])
                if st.code == ERROR:
                    errors.append(st.message)
                dry[name] = st
            # non-violating candidates come first (DryRunPreemption's return order)
            candidates = dict(sorted(candidates.items(), key=lambda kv: kv[1][1] > 0))
        if errors and not candidates:
            msg = aggregate(errors)
            self._note(key, msg)
            return Outcome(Status(ERROR, [msg]))
        if not candidates:
            msg = fit_error(total, dry, absent=NOT_HELPFUL)
            self._note(key, msg)
            return Outcome(Status(UNSCHEDULABLE, [msg]), nominate="")
        candidates, err = self.call_extender(pod, candidates)
        if err:
            self._note(key, err)
            return Outcome(Status(ERROR, [err]))
        if not candidates:
            self._note(key, NO_CANDIDATE)
            return Outcome(Status(UNSCHEDULABLE, [NO_CANDIDATE]))
        name = next(iter(candidates)) if len(candidates) == 1 else pick_one_node(candidates)
        victims = candidates[name][0]
        err = self.prepare_candidate(pod, name, victims)
        if err:
            self._note(key, err)
            return Outcome(Status(ERROR, [err]))
        self._note(key, f"preempted {len(victims)} pod(s) on {name}: "
                        + ", ".join(pod_key_of(v) for v in victims))
        return Outcome(Status(SUCCESS), nominate=name, victims=victims)

    # callExtenders -> HTTPExtender.ProcessPreemption
    def call_extender(self, pod: dict, candidates: dict[str, tuple[list[dict], int]]
                      ) -> tuple[dict[str, tuple[list[dict], int]], str]:
        sim = self.sim
        if not sim.preempt_verb or sim.extender_url is None or not sim.interested(pod):
            return candidates, ""
        meta = {n: {"Pods": [{"UID": (v.get("metadata") or {}).get("uid", "")} for v in victims],
                    "NumPDBViolations": violations}
                for n, (victims, violations) in candidates.items()}
        args = {"Pod": pod, "NodeNameToVictims": None, "NodeNameToMetaVictims": meta}
        self.preempt_calls.append(args)
        try:
            result = sim.post_extender(sim.preempt_verb, args)
        except Exception as exc:  # noqa: BLE001 - a transport error or a non-200 answer
            return {}, str(exc)
        out: dict[str, tuple[list[dict], int]] = {}
        for name, mv in ((result or {}).get("NodeNameToMetaVictims") or {}).items():
            held = {(p.get("metadata") or {}).get("uid"): p for p in sim.node_pods(name)}
            if name not in {n["metadata"]["name"] for n in sim.node_informer.list()}:
                return {}, f'nodeinfo not found for node name "{name}"'
            victims = []
            for mp in (mv or {}).get("Pods") or []:
                uid = (mp or {}).get("UID")
                if uid not in held:
                    return {}, (f"extender: {sim.extender_url} claims to preempt pod (UID: &{{{uid}}}) "
                                f"on node: {name}, but the pod is not found on that node")
                victims.append(held[uid])
            if not victims:
                return {}, f'expected at least one victim pod on node "{name}"'
            out[name] = (victims, int((mv or {}).get("NumPDBViolations") or 0))
        return out, ""

    # prepareCandidate / PreemptPod
    def prepare_candidate(self, pod: dict, node: str, victims: list[dict]) -> str:
        sim, uid = self.sim, (pod.get("metadata") or {}).get("uid", "")
        for v in victims:
            vmd = v["metadata"]
            ns, name = vmd.get("namespace", "default"), vmd["name"]
            if vmd.get("deletionTimestamp"):
                continue  # graceful deletion already started: no API call
            try:
                conds = [c for c in (v.get("status") or {}).get("conditions") or []
                         if c.get("type") != "DisruptionTarget"]
                conds.append({"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler",
                              "message": f"{(pod.get('spec') or {}).get('schedulerName')}: preempting to "
                                         "accommodate a higher priority pod"})
                sim.client.patch_pod_status(ns, name, {"conditions": conds})
                sim.client.delete("pods", name, ns)  # empty DeleteOptions: the pod's own grace period
            except Exception as exc:  # noqa: BLE001
                if getattr(exc, "status", None) == 404 or "NotFound" in type(exc).__name__:
                    continue
                return str(exc)
            if sim.post_events:
                sim._event(v, "Normal", "Preempted", f"Preempted by pod {uid} on node {node}")
        prio = pod_priority(pod)
        for other in sim.nominated_pods(node):
            if pod_priority(other) < prio:
                sim.set_nomination(other, "")
        return ""


def pod_key_of(pod: dict) -> str:
    md = pod.get("metadata") or {}
    return f"{md.get('namespace', 'default')}/{md.get('name')}"

__all__ = ["ERROR", "NEVER", "NOT_HELPFUL", "NO_CANDIDATE", "NO_VICTIMS", "SUCCESS",
           "TERMINATING_ON_NOMINATED", "UNRESOLVABLE", "UNSCHEDULABLE", "Evaluator", "Outcome", "Status",
           "aggregate", "fit_error", "importance", "num_candidates", "pick_one_node", "pod_key_of",
           "pod_request", "resource_fit", "select_victims_on_node", "split_by_pdb", "start_time",
           "terminating_by_preemption"]
