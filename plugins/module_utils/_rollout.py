# SPDX-License-Identifier: Apache-2.0
# Copyright: hami.node contributors
"""Which GPU nodes a roll takes out of service together. PRIVATE to hami.node (the k8s_rollout module and
benchmarks/fleet use it); pure Python, no Kubernetes client, so every decision is unit-tested.

A batch is bounded by four things at once (docs/rollouts.md, "Batches"):

* ``serial``: at most this many nodes (Ansible's ``serial``, a count or a percentage of the roll);
* ``max_unavailable``: at most this many of the fleet's GPUs out of service at once, counting the GPUs of
  every node that is already out (cordoned by anyone, or not Ready) - the GPU Operator's upgrade
  controller counts ``maxUnavailable`` the same way (its ``upgrade_state.go`` adds nodes already
  unavailable to those being upgraded);
* ``max_per_domain``: at most this many nodes of one failure domain (a zone, a rack, an NVLink domain)
  out at once, again counting the nodes of that domain that are already out;
* PodDisruptionBudgets: the pods of one budget on a batch's nodes are at most as many as that budget
  allows disruptions right now (``status.disruptionsAllowed``), so the batch's drains evict them at once
  instead of waiting (the Eviction API answers 429) for replacements to become Ready while the whole
  batch waits for its slowest drain. A node holding more of a budget's pods than it allows goes without
  other nodes holding that budget: its drain evicts them one after another as the budget recovers, which
  is what ``kubectl drain`` does.

Batches after a plan's first leave one disruption of each budget that allows more than one unplanned
(``RESERVE``): pods move between the plan and those batches' start.

A node already out of service (an operator's cordon, an earlier run's parked node) costs nothing when it
joins a batch: its GPUs are out either way. Nodes that an earlier run of ours left cordoned
(``resume``) go first and are held back only by ``serial``: finishing them gives capacity back.

``plan`` fills batches first-fit; a node that fits no batch, even alone, is ``deferred`` with the reason.
Its order (``ORDERS``): ``spread`` (the default) keeps the first node of the given order as the canary and
then, batch by batch, takes first the nodes of the constraint that needs the most batches still (its
nodes left over what one batch may hold of them: a failure domain's room, a budget's allowed
disruptions), and among equals those whose budgets the previous batch did not use up, so every domain
and every budget spreads its nodes over the whole roll and the roll ends when its tightest constraint
allows, not with a tail of one rack's nodes; ``inventory`` is first-fit in the given order. A pass may
leave its plan's last batches to the next pass (``leave_last``), where the nodes held back at their
batch's start fill their room. ``admit`` is the same rule at the start of a batch against the cluster as
it is then: the members that fit go, the others wait for the roll's second pass; ``admit_soon`` says which
of those would fit once the replacements already placed for evicted pods are Ready (worth a bounded wait).
"""

from __future__ import annotations

import math


class BoundError(ValueError):
    """A bound that cannot be met or read; the message names the variable and the fix."""


def resolve(value, total, name, minimum=0):
    """``value`` as a number: an int, a digit string, or a percentage of ``total`` (rounded down, as
    Ansible's ``serial`` and Kubernetes' ``maxUnavailable`` do). ``None``/``""``/``0`` mean no bound
    (``None`` is returned)."""
    if value is None or str(value).strip() in ("", "0"):
        return None
    text = str(value).strip()
    try:
        if text.endswith("%"):
            pct = float(text[:-1])
            if not 0 < pct <= 100:
                raise ValueError
            return max(minimum, int(math.floor(total * pct / 100.0)))
        number = int(text)
        if number < 0:
            raise ValueError
    except ValueError:
        raise BoundError("%s=%r is not a count or a percentage (e.g. 4 or 10%%)" % (name, value)) from None
    return number or None


class Node:
    """A node the roll may take out of service."""

    __slots__ = ("name", "gpus", "domain", "resume", "out", "keeps_out", "budgets")

    def __init__(self, name, gpus=0, domain=None, resume=False, out=False, keeps_out=False, budgets=None):
        self.name = name
        self.gpus = int(gpus or 0)
        self.domain = domain or None
        self.resume = bool(resume)      # an earlier run of ours left it cordoned
        self.out = bool(out)            # out of service now (cordoned by anyone, or not Ready)
        self.keeps_out = bool(keeps_out)  # stays out after its window (an operator's cordon stays)
        self.budgets = dict(budgets or {})  # budget key -> this node's pods that budget covers

    def __repr__(self):
        return "Node(%s)" % self.name


class Fleet:
    """The cluster as the roll sees it: every GPU node's GPUs, domain and whether it is out now, and each
    budget's allowed disruptions."""

    def __init__(self, nodes, allowed=None, recovering=None):
        self.nodes = {n.name: n for n in nodes}   # every GPU node of the cluster, in the roll or not
        self.allowed = dict(allowed or {})
        # budget key -> its pods placed on a node but not Ready yet (replacements on their way back)
        self.recovering = dict(recovering or {})

    @property
    def total_gpus(self):
        return sum(n.gpus for n in self.nodes.values())

    def out_gpus(self, batch_names):
        return sum(n.gpus for n in self.nodes.values() if n.out or n.name in batch_names)

    def out_in_domain(self, domain, batch_names):
        return sorted(n.name for n in self.nodes.values()
                      if n.domain == domain and (n.out or n.name in batch_names))


class Bounds:
    """The limits of one roll, resolved to numbers (``None``: no limit)."""

    def __init__(self, serial=1, max_unavailable=None, max_per_domain=None, canary=False):
        self.serial = max(1, int(serial or 1))
        self.max_unavailable = max_unavailable
        self.max_per_domain = max_per_domain
        self.canary = bool(canary)

    @classmethod
    def read(cls, serial, max_unavailable, max_per_domain, canary, roll_size, fleet):
        """From the playbook's variables: counts or percentages (of the roll's nodes for ``serial``, of the
        fleet's GPUs for ``max_unavailable``)."""
        if str(max_per_domain or "").strip().endswith("%"):
            raise BoundError("site_rollout_max_per_domain=%r must be a count of nodes (e.g. 1)"
                             % max_per_domain)
        return cls(
            serial=resolve(serial, roll_size, "site_serial", minimum=1) or max(1, roll_size),
            max_unavailable=resolve(max_unavailable, fleet.total_gpus, "site_rollout_max_unavailable"),
            max_per_domain=resolve(max_per_domain, 0, "site_rollout_max_per_domain"),
            canary=canary,
        )

    def as_dict(self):
        return {"serial": self.serial, "max_unavailable_gpus": self.max_unavailable,
                "max_per_domain": self.max_per_domain, "canary": self.canary}


def why_not(batch, node, bounds, fleet, used=None, reserve=0):
    """Why ``node`` cannot join ``batch`` (a list of Nodes), or None when it can. ``used``: budget key ->
    the batch's pods of that budget (``budget_use``; computed from ``batch`` when not given). ``reserve``:
    disruptions of a budget that allows more than that many left unplanned (``plan``'s later batches)."""
    names = {n.name for n in batch} | {node.name}
    if node.resume:
        return None  # already out; finishing it gives capacity back (only serial holds it)
    if bounds.max_unavailable is not None and not node.out:
        out = fleet.out_gpus(names)
        if out > bounds.max_unavailable:
            return ("GPUs: %d of the fleet's %d would be out of service (%d already out), more than "
                    "site_rollout_max_unavailable=%d"
                    % (out, fleet.total_gpus, fleet.out_gpus(set()), bounds.max_unavailable))
    if bounds.max_per_domain is not None and node.domain and not node.out:
        members = fleet.out_in_domain(node.domain, names)
        if len(members) > bounds.max_per_domain:
            return ("failure domain %s: %s would be out at once, more than site_rollout_max_per_domain=%d"
                    % (node.domain, ", ".join(members), bounds.max_per_domain))
    if used is None:
        used = budget_use(batch)
    for key in sorted(node.budgets):
        if node.budgets[key] <= 0 or key not in fleet.allowed:
            continue
        allowed = now = fleet.allowed[key]
        if allowed > reserve:
            allowed -= reserve
        held = used.get(key, 0)
        # a node with more of its pods than it allows goes without other holders (its drain evicts them
        # one after another as the budget recovers)
        if allowed <= 0 or (held > 0 and held + node.budgets[key] > allowed):
            return ("PodDisruptionBudget %s allows %d disruption(s) now%s%s" % (
                key, max(now, 0),
                (" (%d planned: the rest is kept for pods that move before this batch)" % allowed)
                if allowed < now else "",
                (" and this batch's nodes already hold %d of its pods (this node %d)"
                 % (held, node.budgets[key])) if held else ""))
    return None


def budget_use(batch):
    used = {}
    for n in batch:
        for key, count in n.budgets.items():
            if count > 0:
                used[key] = used.get(key, 0) + count
    return used


def _check_feasible(nodes, bounds):
    if bounds.max_unavailable is None:
        return
    biggest = max((n for n in nodes if not n.out and not n.resume), key=lambda n: n.gpus, default=None)
    if biggest is not None and biggest.gpus > bounds.max_unavailable:
        raise BoundError(
            "site_rollout_max_unavailable allows %d GPU(s) out of service, but node %s alone has %d: "
            "no batch can hold it. Raise site_rollout_max_unavailable to at least %d (or to a percentage "
            "of the fleet's GPUs that gives that many)"
            % (bounds.max_unavailable, biggest.name, biggest.gpus, biggest.gpus))


class Plan:
    def __init__(self):
        self.batches = []     # [[node name]]
        self.deferred = {}    # node name -> why it fits no batch now
        self.notes = []       # per batch: {batch, nodes, gpus_out, held_back: {node: why}}

    @property
    def sizes(self):
        return [len(b) for b in self.batches]

    @property
    def order(self):
        return [name for batch in self.batches for name in batch]

    def as_dict(self):
        return {"batches": self.batches, "sizes": self.sizes, "order": self.order,
                "deferred": self.deferred, "notes": self.notes}


ORDERS = ("spread", "inventory")
# Disruptions of each budget allowing more than this many that the plan's batches after the first leave
# unused: between the reading and a later batch's start, evicted pods' replacements land on nodes the plan
# saw without them (a bin-packing scheduler prefers the full nodes not rolled yet), so a later batch holds
# more of a budget's pods than planned and admit would hold its members back. The first batch is admitted
# against the same cluster it was planned on.
RESERVE = 1


def plan(nodes, bounds, fleet, order="spread", leave_last=0):
    """Batches for ``nodes`` (in the order given; resume nodes are put first), first-fit under ``bounds``
    against ``fleet`` as it is now, in ``order`` (module docstring). A batch's nodes are assumed back in
    service before the next batch starts (the roll waits for them); ``admit`` checks that again when the
    batch starts. ``leave_last``: this many of the last batches (never all) are not rolled in this pass but
    returned in ``deferred`` for the next one, which plans them again together with the nodes ``admit``
    held back, so those fill their room instead of adding batches of their own."""
    if order not in ORDERS:
        raise BoundError("site_rollout_order=%r is not one of %s" % (order, ", ".join(ORDERS)))
    _check_feasible(nodes, bounds)
    if isinstance(leave_last, bool) or not isinstance(leave_last, int) or leave_last < 0:
        raise BoundError("leave_last=%r must be a count of batches (0 or more)" % (leave_last,))
    result = _plan(nodes, bounds, fleet, order)
    # never the whole plan: a pass that rolls nothing would only hand everything on
    for _ in range(min(leave_last, len(result.batches) - 1)):
        last = result.batches.pop()
        result.notes.pop()
        result.deferred.update((name, LEFT_LATER) for name in last)
    return result


def _plan(nodes, bounds, fleet, order):
    pending = [n for n in nodes if n.resume] + [n for n in nodes if not n.resume]
    given = {n.name: i for i, n in enumerate(pending)}
    used_up = set()  # budgets the previous batch used up: they allow nothing until its replacements are Ready
    result = Plan()
    while pending:
        cap = 1 if bounds.canary and not result.batches else bounds.serial
        if order == "spread" and (result.batches or not bounds.canary):  # the canary: the first node given
            pending = spread(pending, bounds, fleet, given, used_up)
        batch, held = [], {}
        for node in pending:
            if len(batch) >= cap:
                break
            why = why_not(batch, node, bounds, fleet, reserve=RESERVE if result.batches else 0)
            if why is None:
                batch.append(node)
            else:
                held[node.name] = why
        if not batch:
            result.deferred.update(held)
            break
        result.batches.append([n.name for n in batch])
        names = {n.name for n in batch}
        used_up = {k for k, v in budget_use(batch).items() if v >= fleet.allowed.get(k, 0)}
        result.notes.append({
            "batch": len(result.batches),
            "nodes": [n.name for n in batch],
            "gpus_out": fleet.out_gpus(names),
            "held_back": {k: v for k, v in held.items()},
        })
        pending = [n for n in pending if n.name not in names]
        # the roll waits for the batch's windows: its nodes are back in service for the next batch, but for
        # those an operator had cordoned (their cordon stays)
        fleet = Fleet([_after_window(n) if n.name in names else n for n in fleet.nodes.values()],
                      fleet.allowed)
    return result


LEFT_LATER = ("one of the plan's last batches: planned again in the next pass together with the nodes "
              "held back at their batch's start")


def spread(pending, bounds, fleet, given, used_up=()):
    """``pending`` with the nodes of the most pressed constraint first: a node's pressure is the largest,
    over its failure domain and its budgets, of the constraint's nodes still pending divided by how many
    of them one batch may hold now (the domain's room under ``max_per_domain``, the budget's allowed
    disruptions): the batches that constraint still needs. Among nodes of equal pressure (a domain's
    nodes) those with fewer budgets in ``used_up`` (used up by the previous batch: they allow nothing
    until its replacements are Ready, which admit would wait for) go first. Resume nodes stay first; ties
    keep the given order, so the result is deterministic."""
    left = {}
    for n in pending:
        for key in _constraints(n, bounds):
            left[key] = left.get(key, 0) + 1
    room = {}
    for key in left:
        kind, name = key
        if kind == "domain":
            room[key] = bounds.max_per_domain - len(fleet.out_in_domain(name, set()))
        else:
            room[key] = fleet.allowed.get(name, 0)

    def pressure(n):
        return max([left[k] / float(max(1, room[k])) for k in _constraints(n, bounds)] or [0.0])

    def after_used_up(n):
        return sum(1 for key in n.budgets if key in used_up and n.budgets[key] > 0)

    return sorted(pending, key=lambda n: (not n.resume, -pressure(n), after_used_up(n), given[n.name]))


def _constraints(node, bounds):
    """The per-batch limits ``node`` counts against besides serial and the GPUs: its domain, its budgets."""
    out = []
    if bounds.max_per_domain is not None and node.domain and not node.out:
        out.append(("domain", node.domain))
    out.extend(("budget", key) for key in sorted(node.budgets) if node.budgets[key] > 0)
    return out


def _after_window(node):
    return Node(node.name, node.gpus, node.domain, resume=False, out=node.keeps_out, keeps_out=node.keeps_out,
                budgets=node.budgets)


def admit(members, bounds, fleet):
    """At the start of a batch, against the cluster as it is now: (go, wait) where ``go`` are the members
    that fit together (first-fit in batch order) and ``wait`` maps the others to the reason."""
    go, wait = [], {}
    for node in members:
        why = why_not(go, node, bounds, fleet)
        if why is None:
            go.append(node)
        else:
            wait[node.name] = why
    return [n.name for n in go], wait


def admit_soon(members, bounds, fleet):
    """The members ``admit`` holds back now that would go once every budget's replacements already placed
    on a node are Ready (``fleet.recovering``), when that lets more members go than now: worth a bounded
    wait at the batch's start, where the others (a budget with nothing on its way back, GPUs, domains) are
    not. Only a hint for how long to wait: what goes is always decided by ``admit`` against the budgets as
    they are."""
    go_now, _ = admit(members, bounds, fleet)
    if not fleet.recovering:
        return []
    soon = Fleet(fleet.nodes.values(),
                 {k: v + fleet.recovering.get(k, 0) for k, v in fleet.allowed.items()})
    go_later, _ = admit(members, bounds, soon)
    if len(go_later) <= len(go_now):
        return []  # waiting would only change who goes (another bound is full), not let more go
    return [n for n in go_later if n not in go_now]


# -- reading the cluster: plain dicts as the API returns them ------------------------------------------

def node_out(node):
    """Out of service: cordoned (by anyone) or not Ready."""
    if (node.get("spec") or {}).get("unschedulable"):
        return True
    for cond in (node.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return cond.get("status") != "True"
    return True


def node_gpus(node, resource):
    """The GPUs a node takes out of service: its capacity of ``resource`` (whole GPUs; the device plugin
    advertises them), 0 when it has none."""
    status = node.get("status") or {}
    cap = status.get("capacity") or status.get("allocatable") or {}
    try:
        return int(str(cap.get(resource, "0")))
    except ValueError:
        return 0


def _labels_match(selector, labels):
    """A LabelSelector (matchLabels + matchExpressions) against a pod's labels. An empty selector matches
    every pod of the namespace (policy/v1 semantics); a null one matches none."""
    if selector is None:
        return False
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels.get(key) in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def budgets_of(pod, pdbs):
    """Keys (``namespace/name``) of the PodDisruptionBudgets whose selector matches ``pod``."""
    md = pod.get("metadata") or {}
    ns, labels = md.get("namespace"), md.get("labels") or {}
    out = []
    for pdb in pdbs:
        pmd = pdb.get("metadata") or {}
        if pmd.get("namespace") == ns and _labels_match((pdb.get("spec") or {}).get("selector"), labels):
            out.append("%s/%s" % (ns, pmd.get("name")))
    return out


def pod_recovering(pod):
    """Placed on a node, not being deleted, running or starting, and not Ready yet: a replacement on its
    way back (its budget will allow one more disruption once it is Ready)."""
    md, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    if not spec.get("nodeName") or md.get("deletionTimestamp"):
        return False
    if status.get("phase") not in (None, "Pending", "Running"):
        return False
    for cond in status.get("conditions") or []:
        if cond.get("type") == "Ready":
            return cond.get("status") != "True"
    return True


def allowed_disruptions(pdbs):
    """``status.disruptionsAllowed`` of each budget; a budget whose status the disruption controller has
    not written yet allows none (the Eviction API refuses it the same way)."""
    out = {}
    for pdb in pdbs:
        md = pdb.get("metadata") or {}
        out["%s/%s" % (md.get("namespace"), md.get("name"))] = int(
            (pdb.get("status") or {}).get("disruptionsAllowed") or 0)
    return out
