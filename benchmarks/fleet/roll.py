"""A SIMULATED driver roll over a 1,000-node fleet, batched by the roll planner of site.yml
(``plugins/module_utils/_rollout.py``: ``plan`` and, at each batch's start, ``admit``), on a simulated clock.

Everything but the planner is simulated here:

- **The fleet**: N nodes of G GPUs in D failure domains (node i in domain ``i * D // N``: racks are
  contiguous); a few nodes are out of service before the roll (an operator's cordon, which stays).
- **Workloads** (``build``): training jobs (one pod of G GPUs per node, ``jobs_nodes`` nodes per job, a
  PodDisruptionBudget allowing one disruption), inference deployments (1-GPU pods, 2-4 per node, budgets of
  ``maxUnavailable: 20 %``), unprotected 1-GPU batch pods filling the fleet to ``utilization``.
- **The roll** (site.yml's disruptive play): the batches ``plan`` makes (pass 1 with the canary, leaving its
  last two batches to pass 2); at each batch's start ``admit`` decides against the cluster as it is then,
  waiting as ``k8s_rollout`` does (``admit_like_k8s_rollout``), and the nodes it holds back go to a later pass
  (pass 2, planned again without a canary; a third pass would be a second site.yml run). Each admitted node is
  cordoned (out of service), then drained through the Eviction API: a Ready pod is evicted only while its
  budget allows a disruption (``healthy - desiredHealthy > 0``; an unready one while the budget is met),
  otherwise retried every ``retry_s``. An evicted pod terminates in ``termination_s``; its ReplicaSet's
  replacement is Pending until a schedulable node has room (best fit: the fullest node that fits, as a
  binpacking GPU scheduler places it; nothing preempts) and Ready ``pod_ready_s`` after it is placed. Once the
  node is empty, the change and its gates take ``window_s`` (spread by ``window_jitter``), then the node is
  uncordoned. Ansible's ``serial``: a batch ends when its last node does.
- **Checks**, every simulated second: GPUs out of service <= the planner's ``max_unavailable``, nodes out
  per failure domain <= ``max_per_domain``, every budget's healthy pods >= its desiredHealthy. Each breach
  is a violation (the goal is none).

Pure Python and deterministic for a seed. Gaps: docs/testing.md, "Fleet benchmark".
"""

from __future__ import annotations

import heapq
import importlib.util
import math
import random
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parents[2]
PLANNER = REPO / "plugins" / "module_utils" / "_rollout.py"


class PlannerMissing(RuntimeError):
    """The roll planner is not in this checkout yet."""


def load_planner(path: Path = PLANNER) -> ModuleType:
    """``plugins/module_utils/_rollout.py`` by its path (pure Python: no Ansible import needed)."""
    if not path.exists():
        raise PlannerMissing(f"{path} is not in this checkout: the simulated roll needs site.yml's roll "
                             "planner (issue 26)")
    spec = importlib.util.spec_from_file_location("hami_node_rollout_planner", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@dataclass
class Config:
    nodes: int = 1000
    gpus: int = 8
    domains: int = 20
    window_s: float = 600.0
    window_jitter: float = 0.0           # each window: window_s * uniform(1 - j, 1 + j)
    serial: str = "10%"
    max_unavailable: str = "10%"         # of the fleet's GPUs
    max_per_domain: int | None = None    # None: max_unavailable's nodes spread over the domains; 0: no bound
    canary: bool = True
    out_nodes: int = 5                   # cordoned by an operator before the roll; they stay cordoned
    utilization: float = 0.85
    jobs_nodes: int = 8                  # nodes per training job
    training_share: float = 0.5          # of the nodes
    inference_share: float = 0.35
    termination_s: float = 30.0
    pod_ready_s: float = 120.0
    retry_s: float = 5.0
    seed: int = 26
    limit_s: float = 24 * 3600.0
    stall_s: float = 900.0               # give up when nothing could start for this long
    held_back: str = "later"             # admit's held-back nodes: a "later" pass (site.yml), "next" batch
    order: str = "planner"               # "planner" (its default, site.yml's), "inventory" (the planner's
                                         # first-fit in node-name order) or "budgets" (spread_by_budget)
    leave_last: int = 2                  # pass 1 leaves its plan's last batches to pass 2 (site.yml: 2)
    budget_wait_s: float = 120.0         # site_rollout_budget_wait: admit's bounded wait (k8s_rollout's rule)
    admit_wait_s: float = 0.0            # before a batch, wait up to this long for all its members to fit
    prefer_rolled: bool = False          # NOT site.yml: replacements go to rolled nodes first (as a
                                         # PreferNoSchedule taint on the nodes still to roll would make them)
    pause_s: float = 0.0                 # site_rollout_pause: seconds between batches


@dataclass
class Pod:
    name: str
    budget: str                          # "" = no budget
    gpus: int
    node: str | None                     # None: Pending
    ready: bool = True
    terminating: bool = False


@dataclass
class Budget:
    name: str
    desired: int                         # desiredHealthy
    pods: set[str] = field(default_factory=set)
    unhealthy: int = 0                   # pods of it not Ready, Pending or terminating

    @property
    def healthy(self) -> int:
        return len(self.pods) - self.unhealthy


class Cluster:
    """Nodes, pods and budgets with the counts the roll and the checks need kept up to date."""

    def __init__(self, cfg: Config, names: list[str], domain_of: dict[str, str]) -> None:
        self.cfg = cfg
        self.now = 0.0
        self.domain_of = domain_of
        self.gpus_of = dict.fromkeys(names, cfg.gpus)
        self.used = dict.fromkeys(names, 0)
        self.on_node: dict[str, set[str]] = {n: set() for n in names}
        self.pods: dict[str, Pod] = {}
        self.budgets: dict[str, Budget] = {}
        self.cordoned: set[str] = set()
        self.keeps_out: set[str] = set()
        self.pending: list[str] = []
        self.rolled: set[str] = set()    # with cfg.prefer_rolled: nodes whose window ended
        self.evictions = 0
        self.timers: list[tuple[float, int, str, str]] = []   # (when, seq, what, pod)
        self._seq = 0
        self.out_per_domain: dict[str, int] = defaultdict(int)
        self.gpus_out = 0
        # schedulable nodes by free GPUs (insertion-ordered: deterministic), for a best fit in O(G)
        self.by_free: dict[int, dict[str, None]] = defaultdict(dict)
        for n in names:
            self.by_free[cfg.gpus][n] = None

    # -- nodes
    def cordon(self, n: str) -> None:
        if n in self.cordoned:
            return
        self.cordoned.add(n)
        self.by_free[self.gpus_of[n] - self.used[n]].pop(n, None)
        self.out_per_domain[self.domain_of[n]] += 1
        self.gpus_out += self.gpus_of[n]

    def uncordon(self, n: str) -> None:
        if n not in self.cordoned:
            return
        self.cordoned.discard(n)
        self.by_free[self.gpus_of[n] - self.used[n]][n] = None
        self.out_per_domain[self.domain_of[n]] -= 1
        self.gpus_out -= self.gpus_of[n]

    def _use(self, n: str, delta: int) -> None:
        free = self.gpus_of[n] - self.used[n]
        self.used[n] += delta
        if n not in self.cordoned:
            self.by_free[free].pop(n, None)
            self.by_free[free - delta][n] = None

    # -- pods
    def add(self, pod: Pod) -> None:
        self.pods[pod.name] = pod
        if pod.budget:
            b = self.budgets[pod.budget]
            b.pods.add(pod.name)
            b.unhealthy += not pod.ready
        if pod.node is None:
            self.pending.append(pod.name)
        else:
            self.on_node[pod.node].add(pod.name)
            self._use(pod.node, pod.gpus)

    def healthy(self, p: Pod) -> bool:
        return p.node is not None and p.ready and not p.terminating

    def allowed(self, budget: str) -> int:
        b = self.budgets[budget]
        return b.healthy - b.desired

    def evict(self, p: Pod) -> bool:
        """The Eviction API: refused (False) while the budget allows no disruption."""
        if p.budget:
            allowed = self.allowed(p.budget)
            if (allowed <= 0) if self.healthy(p) else (allowed < 0):  # IfHealthyBudget for unready pods
                return False
            if self.healthy(p):
                self.budgets[p.budget].unhealthy += 1
        p.terminating = True
        self.evictions += 1
        self._timer(self.cfg.termination_s, "gone", p.name)
        self.add(Pod(p.name + "'", p.budget, p.gpus, None, ready=False))  # the ReplicaSet replaces it
        return True

    def _timer(self, after: float, what: str, pod: str) -> None:
        self._seq += 1
        heapq.heappush(self.timers, (self.now + after, self._seq, what, pod))

    def tick(self, dt: float) -> None:
        self.now += dt
        while self.timers and self.timers[0][0] <= self.now:
            _, _, what, name = heapq.heappop(self.timers)
            p = self.pods[name]
            if what == "gone":
                del self.pods[name]
                assert p.node is not None
                self.on_node[p.node].discard(name)
                self._use(p.node, -p.gpus)
                if p.budget:
                    b = self.budgets[p.budget]
                    b.pods.discard(name)
                    b.unhealthy -= 1
            elif what == "ready":
                p.ready = True
                if p.budget:
                    self.budgets[p.budget].unhealthy -= 1
        still = []
        for name in self.pending:
            p = self.pods[name]
            fits = (n for free in range(p.gpus, self.cfg.gpus + 1) for n in self.by_free[free])
            if self.cfg.prefer_rolled:
                fits = iter(sorted(fits, key=lambda n: n not in self.rolled))  # stable: best fit within
            node = next(fits, None)
            if node is None:
                still.append(name)
                continue
            p.node = node
            self.on_node[node].add(name)
            self._use(node, p.gpus)
            self._timer(self.cfg.pod_ready_s, "ready", name)
        self.pending = still


def build(cfg: Config) -> Cluster:
    """The fleet and its workloads (deterministic for ``cfg.seed``)."""
    rng = random.Random(cfg.seed)
    names = [f"gpu-{i:04d}" for i in range(cfg.nodes)]
    c = Cluster(cfg, names, {n: f"rack-{i * cfg.domains // cfg.nodes:02d}" for i, n in enumerate(names)})
    order = names[:]
    rng.shuffle(order)
    jobs = int(cfg.nodes * cfg.training_share) // cfg.jobs_nodes
    for j in range(jobs):  # training: one G-GPU pod per node; the budget allows one disruption
        c.budgets[f"train/job-{j:03d}"] = Budget(f"train/job-{j:03d}", desired=cfg.jobs_nodes - 1)
        for k in range(cfg.jobs_nodes):
            c.add(Pod(f"job-{j:03d}-{k}", f"train/job-{j:03d}", cfg.gpus, order[j * cfg.jobs_nodes + k]))
    inf_nodes = order[jobs * cfg.jobs_nodes: jobs * cfg.jobs_nodes + int(cfg.nodes * cfg.inference_share)]
    deploys = [f"serve/deploy-{d:03d}" for d in range(max(1, len(inf_nodes) * 3 // 20))]
    for d in deploys:
        c.budgets[d] = Budget(d, desired=0)
    k = 0
    for node in inf_nodes:  # inference: 2-4 one-GPU pods a node, from deployments of ~20 replicas
        for _ in range(rng.choice((2, 3, 4))):
            d = deploys[k % len(deploys)]
            c.add(Pod(f"{d}-{k}", d, 1, node))
            k += 1
    for d in deploys:
        b = c.budgets[d]
        b.desired = len(b.pods) - max(1, len(b.pods) // 5)  # maxUnavailable: 20 %
    # the operator's cordons: one per failure domain at most, so they do not breach a bound on their own
    racks: dict[str, str] = {}
    for n in reversed(order):
        if len(racks) >= min(cfg.out_nodes, cfg.domains):
            break
        racks.setdefault(c.domain_of[n], n)
    out = list(racks.values())
    want = int(cfg.utilization * cfg.nodes * cfg.gpus) - sum(c.used.values())
    spare = [n for n in order if n not in out]
    i = 0
    while want > 0 and i < len(spare) * cfg.gpus:  # unprotected 1-GPU batch pods up to the utilization
        n = spare[i % len(spare)]
        if c.used[n] < c.gpus_of[n]:
            c.add(Pod(f"batch-{i}", "", 1, n))
            want -= 1
        i += 1
    for n in out:
        c.cordon(n)
        c.keeps_out.add(n)
    return c


def spread_by_budget(c: Cluster, roll: list[str]) -> list[str]:
    """An order in which first-fit batches spread each budget's nodes over the batches: the k-th node of
    every budget before the (k+1)-th of any, the nodes no budget limits spread evenly between them."""
    seen: dict[str, int] = defaultdict(int)
    rank: dict[str, float] = {}
    free = []
    for n in roll:
        budgets = {c.pods[p].budget for p in c.on_node[n] if c.pods[p].budget}
        if not budgets:
            free.append(n)
            continue
        rank[n] = max(seen[b] for b in budgets)
        for b in budgets:
            seen[b] += 1
    top = max(rank.values(), default=0) + 1
    for i, n in enumerate(free):
        rank[n] = i * top / max(1, len(free))
    return sorted(roll, key=lambda n: (rank[n], roll.index(n)))


def planner_view(c: Cluster, rollout: ModuleType, members: list[str]) -> tuple[Any, list[Any]]:
    """The planner's ``Fleet`` (every node; each budget's allowed disruptions now) and ``members`` as its
    Nodes (with the budgets their pods belong to)."""
    per_node: dict[str, dict[str, int]] = {}
    for n, names in c.on_node.items():
        counts: dict[str, int] = {}
        for name in names:
            p = c.pods[name]
            if p.budget and not p.terminating:
                counts[p.budget] = counts.get(p.budget, 0) + 1
        per_node[n] = counts
    nodes = {n: rollout.Node(n, c.gpus_of[n], c.domain_of[n], resume=False, out=n in c.cordoned,
                             keeps_out=n in c.keeps_out, budgets=per_node[n]) for n in c.gpus_of}
    recovering: dict[str, int] = defaultdict(int)  # placed, not Ready: pods on their way back
    for p in c.pods.values():
        if p.budget and p.node is not None and not p.ready and not p.terminating:
            recovering[p.budget] += 1
    fleet = rollout.Fleet(list(nodes.values()), {b: c.allowed(b) for b in c.budgets}, dict(recovering))
    return fleet, [nodes[n] for n in members]


def simulate(cfg: Config, rollout: ModuleType | None = None) -> dict[str, Any]:
    rollout = rollout or load_planner()
    c = build(cfg)
    rng = random.Random(cfg.seed + 1)
    roll = [n for n in c.gpus_of if n not in c.keeps_out]
    if cfg.order == "budgets":
        roll = spread_by_budget(c, roll)
    order = {"planner": {}, "inventory": {"order": "inventory"}, "budgets": {"order": "inventory"}}[cfg.order]
    fleet, nodes = planner_view(c, rollout, roll)
    per_domain = cfg.max_per_domain or None
    if cfg.max_per_domain is None:
        total = rollout.resolve(cfg.max_unavailable, fleet.total_gpus, "max_unavailable") or fleet.total_gpus
        per_domain = max(1, math.ceil(total / cfg.gpus / cfg.domains))
    bounds = rollout.Bounds.read(cfg.serial, cfg.max_unavailable, per_domain, cfg.canary, len(roll), fleet)
    extra = {"leave_last": cfg.leave_last} if cfg.leave_last else {}
    planned = rollout.plan(nodes, bounds, fleet, **order, **extra)
    # site.yml's later passes have no canary (tasks/site_roll_plan.yml)
    later_bounds = rollout.Bounds(bounds.serial, bounds.max_unavailable, bounds.max_per_domain, canary=False)
    queue = [list(b) for b in planned.batches]
    todo, passes, batches = set(roll), 1, []
    violations: list[dict[str, Any]] = []
    peak = {"gpus_out": c.gpus_out, "per_domain": max(c.out_per_domain.values(), default=0),
            "budget_margin": min((c.allowed(b) for b in c.budgets), default=0)}

    def step(dt: float) -> None:
        c.tick(dt)
        _check(c, bounds, violations, peak)

    last_busy, deferred = 0.0, {}  # when a batch last started or ended: stall_s counts idle time from there
    while todo and c.now < cfg.limit_s and c.now - last_busy < cfg.stall_s:
        if not queue:  # a later pass over what admit held back or the plan deferred
            fleet, nodes = planner_view(c, rollout, sorted(todo))
            again = rollout.plan(nodes, later_bounds, fleet, **order)
            queue, deferred = [list(b) for b in again.batches], dict(again.deferred)
            if not queue:
                step(max(cfg.retry_s, 30.0))  # nothing fits now: let replacements become Ready
                continue
            passes += 1
        members = [n for n in queue.pop(0) if n in todo]
        if not members:
            continue
        if batches and cfg.pause_s > 0:
            for _ in range(int(cfg.pause_s)):
                step(1.0)
        go, wait = admit_like_k8s_rollout(c, rollout, members, bounds, cfg.budget_wait_s, step)
        waited = 0.0
        while wait and waited < cfg.admit_wait_s:  # wait (bounded) for budgets to recover before admitting
            step(cfg.retry_s)
            waited += cfg.retry_s
            fleet, view = planner_view(c, rollout, members)
            go, wait = rollout.admit(view, bounds, fleet)
        if not go and not cfg.budget_wait_s:  # the simulation's own retry (no site.yml wait): try again
            queue.insert(0, members)
            step(cfg.retry_s)
            continue
        if wait and cfg.held_back == "next":
            if queue:
                queue[0] = [n for n in members if n in wait] + queue[0]
            else:
                queue.append([n for n in members if n in wait])
        if go:  # an admission that let nobody go is no progress
            last_busy = c.now
        start = c.now
        window = {n: cfg.window_s * rng.uniform(1 - cfg.window_jitter, 1 + cfg.window_jitter) for n in go}
        for n in go:
            c.cordon(n)
        drained: dict[str, float] = {}
        done: dict[str, float] = {}
        next_try = dict.fromkeys(go, c.now)
        while len(done) < len(go) and c.now < cfg.limit_s:
            for n in go:
                if n in done:
                    continue
                if n not in drained:
                    if c.now >= next_try[n]:
                        for name in sorted(c.on_node[n]):
                            p = c.pods[name]
                            if not p.terminating:
                                c.evict(p)
                        next_try[n] = c.now + cfg.retry_s
                    if not c.on_node[n]:
                        drained[n] = c.now
                elif c.now >= drained[n] + window[n]:
                    done[n] = c.now
                    c.rolled.add(n)
                    if n not in c.keeps_out:
                        c.uncordon(n)
            step(1.0)
        todo -= set(done)
        if go:
            last_busy = c.now  # a batch longer than stall_s (20-min windows) is not a stall
        batches.append({"nodes": len(go), "held_back": len(wait), "start_s": start, "end_s": c.now,
                        "drain_max_s": max((drained[n] - start for n in drained), default=0.0),
                        "held_back_why": held_back_why(wait), "pass": passes})
    return {
        "config": asdict(cfg), "max_unavailable_gpus": bounds.max_unavailable, "max_per_domain": per_domain,
        "planned_batches": len(planned.batches), "deferred_at_plan": len(planned.deferred),
        "batches": len(batches), "passes": passes, "rolled": len(roll) - len(todo), "left": len(todo),
        # site.yml plans two passes per run (the second for the nodes admit held back); more take a rerun
        "site_runs": math.ceil(passes / 2),
        "hours": c.now / 3600.0, "deferred": dict(list(deferred.items())[:5]) if todo else {},
        "violations": len(violations), "first_violations": violations[:5],
        "peak": {k: v for k, v in peak.items() if not k.startswith("_")},
        "pods": len(c.pods), "budgets": len(c.budgets), "evictions": c.evictions,
        "batch_sizes": [b["nodes"] for b in batches],
        "per_batch": batches,
        "drain_max_s": max((b["drain_max_s"] for b in batches), default=0.0),
    }


def admit_like_k8s_rollout(c: Cluster, rollout: ModuleType, members: list[str], bounds: Any, wait_s: float,
                           step: Any) -> tuple[list[str], dict[str, str]]:
    """k8s_rollout state=admit with ``wait`` (plugins/modules/k8s_rollout.py ``admit``): read, decide;
    answer when nobody waits, when somebody goes and waiting would not let more go (``admit_soon``), or
    when the next poll would pass the deadline; else poll again with backoff (2 s doubling to 30 s)."""
    deadline = c.now + max(0.0, wait_s)
    delay = 2.0
    soon_of = getattr(rollout, "admit_soon", None)
    while True:
        fleet, view = planner_view(c, rollout, members)
        go, wait = rollout.admit(view, bounds, fleet)
        soon = soon_of(view, bounds, fleet) if soon_of and wait and go else []
        if not wait or (go and not soon) or c.now + delay > deadline:
            return go, wait
        for _ in range(int(delay)):
            step(1.0)
        delay = min(delay * 2, 30.0)


def held_back_why(wait: dict[str, str]) -> dict[str, int]:
    """admit's reasons, counted by kind: GPUs, failure domain, or the budget's namespace (train, serve)."""
    kinds: dict[str, int] = defaultdict(int)
    for why in wait.values():
        if why.startswith("PodDisruptionBudget "):
            kinds["budget " + why.split()[1].split("/")[0]] += 1
        else:
            kinds[why.split(":")[0].split(" ")[0]] += 1
    return dict(kinds)


def _check(c: Cluster, bounds: Any, violations: list, peak: dict) -> None:
    """Record each breach once per episode (its start), not once per simulated second."""
    worst = max(c.out_per_domain.values(), default=0)
    low = [b.name for b in c.budgets.values() if b.healthy < b.desired]
    margin = min((b.healthy - b.desired for b in c.budgets.values()), default=0)
    peak["gpus_out"] = max(peak["gpus_out"], c.gpus_out)
    peak["per_domain"] = max(peak["per_domain"], worst)
    peak["budget_margin"] = min(peak["budget_margin"], margin)
    now = {
        "gpus": bounds.max_unavailable is not None and c.gpus_out > bounds.max_unavailable,
        "domain": bounds.max_per_domain is not None and worst > bounds.max_per_domain,
        **{f"budget {b}": True for b in low},
    }
    active = peak.setdefault("_active", set())
    for what, on in now.items():
        if on and what not in active:
            violations.append({"t": c.now, "what": what, "gpus_out": c.gpus_out, "worst_domain": worst})
            active.add(what)
    for what in [w for w in active if not now.get(w)]:
        active.discard(what)
