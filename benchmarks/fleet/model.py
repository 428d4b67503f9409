"""Pure arithmetic of the fleet benchmark: what one run's account says, growth, and the 1,000-node projection.

The projection (``project``) separates what the controller pays from what runs on the hosts:

- ``H``: host-tasks per host (every result Ansible processes for a host: ok, changed, skipped, includes);
- ``m(N)``: the controller's **main process** CPU per host-task at a fleet of N hosts. One process, one
  core: the strategy loop, variable management (``get_vars`` per host and task), result processing,
  callbacks. It grows with N as its heap grows (what it keeps per host: facts, registered results; every
  forked worker inherits it, ``growth.py``) and where a task looks at every other host (``hostvars``);
  fitted as ``m(N) = m0 + m1 * N`` over the measured sizes;
- ``w(N)``: the controller's **worker** CPU per host-task: one forked worker per host-task (fork, task
  executor, templating, the module's packaging, the connection's client), parallel over the forks and
  the controller's cores; fitted the same way;
- ``h``: the **host** CPU per host-task (the module running on the node, from the containers' cgroup
  minus what the hosts' daemons -- the agents, systemd, journald -- used during the run), which on a
  real fleet runs on each node's own CPU, in parallel;
- ``r``: the connection's round trip per host-task on a real network (assumed; ssh with ControlPersist).

For N nodes, F forks and a controller with K cores::

    main    = m(N) * H * N                       (one core; nothing overlaps it)
    workers = w(N) * H * N / min(F, K - 1)       (the main process keeps one core)
    slots   = (w(N) + h + r) * H * N / F         (each host-task holds a fork slot for that long)
    T(N)    = fixed + max(main, workers, slots) + H * (w(N) + h + r)

``fixed`` is the run's cost that does not grow with N (start-up, the controller-side ``run_once`` tasks:
building and packing the agent's wheels), the intercept of the measured wall times; the last term is the
linear strategy's barrier (each task waits for its slowest host; one host-task's latency per task).

In slices (``project_slices``; tools/site_slices.py): S concurrent ansible-playbook processes over n = N/S
nodes each, F forks each, then one final run over the few hosts that the slices leave to it (the scheduler
hosts and, in a converged run, one node that carries the cluster-wide writes)::

    main_1  = m(n) * H * n                       (each slice's main process, on its own core)
    cpu     = S * main_1 + w(n) * H * N          (every slice's main process and workers)
    slots   = (w(n) + h + r) * H * n / F
    T1      = fixed + max(main_1 * max(1, S / K), cpu / K, slots) + H * (w(n) + h + r)
    T(N, S) = T1 + T(final hosts)                (``project`` of the final run)

Each slice's main process pays the cost per host-task of its own host count, m(n), not m(N): what grows
with the hosts in one process (its heap: the facts and registered results it keeps per host, which every
forked worker inherits; ``growth.py``) shrinks with the slice.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

CONTROLLER_ACTIONS = frozenset(
    {
        "ansible.builtin.set_fact",
        "set_fact",
        "ansible.builtin.assert",
        "assert",
        "ansible.builtin.debug",
        "debug",
        "ansible.builtin.fail",
        "fail",
        "ansible.builtin.meta",
        "meta",
        "ansible.builtin.add_host",
        "add_host",
        "ansible.builtin.group_by",
        "group_by",
        "ansible.builtin.pause",
        "pause",
        "ansible.builtin.include_role",
        "include_role",
        "ansible.builtin.include_tasks",
        "include_tasks",
        "ansible.builtin.import_role",
        "import_role",
        "ansible.builtin.import_tasks",
        "import_tasks",
        "ansible.builtin.include_vars",
        "include_vars",
    }
)
AGENT_UA = "hami-agent/"


def fit_linear(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least squares ``y = a + b x`` (one point: ``a = y``, ``b = 0``)."""
    if len(xs) != len(ys) or not xs:
        raise ValueError("fit_linear needs as many x as y, at least one")
    if len(xs) == 1 or len(set(xs)) == 1:
        return sum(ys) / len(ys), 0.0
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=False))
    b = sxy / sxx
    return my - b * mx, b


def fit_growth(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """``fit_linear`` for a cost per host-task that may grow with the fleet, never extrapolated downwards: a
    negative slope (noise between runs) gives the mean and no growth."""
    a, b = fit_linear(xs, ys)
    return (a, b) if b >= 0 else (sum(ys) / len(ys), 0.0)


def growth(points: Sequence[tuple[int, float]]) -> list[tuple[int, int, float, float]]:
    """(n1, n2, value ratio, host ratio) between consecutive sizes (linear: value ratio = host ratio)."""
    pts = sorted(points)
    return [
        (a, b, (vb / va) if va else float("inf"), b / a)
        for (a, va), (b, vb) in zip(pts, pts[1:], strict=False)
    ]


def linear_or_better(points: Sequence[tuple[int, float]], tolerance: float = 0.10) -> bool:
    """Every step's growth at most the hosts' growth (``tolerance``: noise allowed, relative)."""
    return all(r <= h * (1 + tolerance) for _, _, r, h in growth(points))


FOREIGN_MAX_SHARE = 0.05  # other processes' share of the machine's CPU beyond which a size is not comparable


def foreign_cpu_s(system_s: float, cpu: dict[str, float], background_s: float, helpers_s: float) -> float:
    """CPU seconds the machine spent during a run on anything but the run: the machine's busy time less
    the controller (main process and workers), the hosts' modules, the hosts' daemons
    (``background_s``) and the benchmark's own processes (``helpers_s``: this process, the simulated API
    server and kubelets). Another job beside the benchmark slows one size and not the others, which bends
    the growth either way (2026-11-28: a 25-host step slowed by a test run made 4.67× read as 4.31×)."""
    ours = cpu.get("controller_s", 0.0) + cpu.get("host_s", 0.0) + background_s + helpers_s
    return max(0.0, system_s - ours)


def quiet(rows: Iterable[dict[str, Any]], max_share: float = FOREIGN_MAX_SHARE) -> bool:
    """Whether no size ran beside other work (rows without the figure, from before it existed, pass)."""
    return all(r.get("foreign_share", 0.0) <= max_share for r in rows)


@dataclass(frozen=True)
class Params:
    tasks_per_host: float
    main_s: tuple[float, float]  # m(N) = m0 + m1 N, CPU s per host-task
    worker_s: tuple[float, float]  # w(N) = w0 + w1 N
    host_s: float  # h
    fixed_s: float  # intercept of the wall time


def at(coef: tuple[float, float], n: float) -> float:
    return max(0.0, coef[0] + coef[1] * n)


def project(p: Params, n: int, forks: int, cores: int, rtt_s: float = 0.01) -> dict[str, float]:
    """The projected wall time of a converged run over ``n`` nodes (module docstring)."""
    if forks < 1 or cores < 2:
        raise ValueError("project needs forks >= 1 and a controller of at least 2 cores")
    ht = p.tasks_per_host * n
    m, w = at(p.main_s, n), at(p.worker_s, n)
    main = m * ht
    workers = w * ht / min(forks, cores - 1)
    slots = (w + p.host_s + rtt_s) * ht / forks
    barrier = p.tasks_per_host * (w + p.host_s + rtt_s)
    bound = max(("main", main), ("workers", workers), ("slots", slots), key=lambda kv: kv[1])
    return {
        "nodes": n,
        "forks": forks,
        "cores": cores,
        "main_s": main,
        "workers_s": workers,
        "slots_s": slots,
        "barrier_s": barrier,
        "fixed_s": p.fixed_s,
        "total_s": p.fixed_s + bound[1] + barrier,
        "bound": bound[0],
    }  # type: ignore[dict-item]


def project_slices(
    p: Params, n: int, slices: int, forks: int, cores: int, rtt_s: float = 0.01, final_hosts: int = 2
) -> dict[str, float]:
    """The projected wall of a converged run over ``n`` nodes in ``slices`` processes (module docstring)."""
    if slices < 1:
        raise ValueError("project_slices needs slices >= 1")
    if forks < 1 or cores < 2:
        raise ValueError("project_slices needs forks >= 1 and a controller of at least 2 cores")
    per = n / slices
    m, w = at(p.main_s, per), at(p.worker_s, per)
    main_1 = m * p.tasks_per_host * per
    cpu = slices * main_1 + w * p.tasks_per_host * n
    slots = (w + p.host_s + rtt_s) * p.tasks_per_host * per / forks
    barrier = p.tasks_per_host * (w + p.host_s + rtt_s)
    bound = max(("main", main_1 * max(1.0, slices / cores)), ("cpu", cpu / cores), ("slots", slots),
                key=lambda kv: kv[1])
    phase1 = p.fixed_s + bound[1] + barrier
    final = project(p, max(1, final_hosts), forks, cores, rtt_s)
    return {
        "nodes": n,
        "slices": slices,
        "forks": forks,
        "cores": cores,
        "hosts_per_slice": per,
        "main_per_host_task_s": m,
        "main_s": main_1,
        "cpu_s": cpu,
        "slots_s": slots,
        "barrier_s": barrier,
        "phase1_s": phase1,
        "final_s": final["total_s"],
        "total_s": phase1 + final["total_s"],
        "bound": bound[0],
    }  # type: ignore[dict-item]


# ------------------------------------------------------------------------------------------ one run
def host_tasks(doc: dict[str, Any], hosts: Iterable[str]) -> dict[str, int]:
    """Results per host (the fleet's hosts only: ``localhost`` rows of delegated facts are not hosts)."""
    want = set(hosts)
    c = Counter(t["host"] for t in doc.get("tasks", []) if t["host"] in want)
    return {h: c.get(h, 0) for h in sorted(want)}


def module_runs(doc: dict[str, Any], hosts: Iterable[str]) -> dict[str, int]:
    """Module executions per host: results that were not skipped and whose action runs a module (not a
    controller-side action such as set_fact or assert), each loop item counting once. Delegated tasks
    run on the controller but count too (they are that host's work)."""
    want = set(hosts)
    c: Counter[str] = Counter()
    for t in doc.get("tasks", []):
        if t["host"] in want and t["status"] != "skipped" and t["action"] not in CONTROLLER_ACTIONS:
            c[t["host"]] += max(1, int(t.get("items") or 0))
    return {h: c.get(h, 0) for h in sorted(want)}


def status_counts(doc: dict[str, Any]) -> dict[str, int]:
    return dict(Counter(t["status"] for t in doc.get("tasks", [])))


def per_play_tasks(doc: dict[str, Any], hosts: Iterable[str]) -> dict[str, float]:
    """Mean results per host in each play."""
    want = set(hosts)
    c: Counter[str] = Counter(t["play"] for t in doc.get("tasks", []) if t["host"] in want)
    return {play: n / max(1, len(want)) for play, n in c.items()}


def api_by_verb(snapshot_a: dict | None, snapshot_b: dict | None, *, agents: bool = False) -> dict[str, int]:
    """Requests between two accounting snapshots (benchmarks/apiserver_proc), by verb; ``agents``: only
    the hami-agent clients (device plugins, monitors, the fleet's kubelets), else everything else (Ansible's
    modules on the controller)."""

    def rows(s: dict | None) -> dict[tuple[str, str, str], int]:
        if not s or "rows" not in s:
            return {}
        return {(r["agent"], r["user"], r["verb"]): int(r["requests"]) for r in s["rows"]}

    a, b = rows(snapshot_a), rows(snapshot_b)
    out: Counter[str] = Counter()
    for key, n in b.items():
        ua, _, verb = key
        if ua.startswith(AGENT_UA) != agents:
            continue
        d = n - a.get(key, 0)
        if d > 0:
            out[verb] += d
    return dict(sorted(out.items()))


def play_window(doc: dict[str, Any], index: int) -> tuple[dict | None, dict | None]:
    """The API snapshots at the start of play ``index`` and at the start of the next (or the end)."""
    plays = doc.get("plays", [])
    if index >= len(plays):
        return None, None
    nxt = plays[index + 1]["api"] if index + 1 < len(plays) else doc.get("end", {}).get("api")
    return plays[index].get("api"), nxt


def cost_by(doc: dict[str, Any], hosts: Iterable[str], key: str = "task") -> list[dict[str, Any]]:
    """Host-seconds and results per ``key`` (``task``: role + task name; ``role``; ``action``), largest first.
    Host-seconds: the sum over hosts of the worker's time from start to result."""
    want = set(hosts)
    agg: dict[str, dict[str, Any]] = defaultdict(lambda: {"host_s": 0.0, "results": 0, "skipped": 0})
    for t in doc.get("tasks", []):
        if t["host"] not in want or t.get("s") is None:
            continue
        if key == "task":
            k = f"{t['role'] or '-'} : {t['task']}"
        elif key == "role":
            k = t["role"] or "(play)"
        else:
            k = t["action"]
        a = agg[k]
        a["host_s"] += t["s"]
        a["results"] += 1
        a["skipped"] += t["status"] == "skipped"
        a["action"] = t["action"]
    rows = [{"name": k, **v} for k, v in agg.items()]
    return sorted(rows, key=lambda r: -r["host_s"])


def task_walls(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Wall time of each task across the fleet (its start to the next task's start), largest first."""
    starts = doc.get("task_starts", [])
    end = doc.get("end", {}).get("t", 0.0)
    out = []
    for i, s in enumerate(starts):
        nxt = starts[i + 1]["t"] if i + 1 < len(starts) else end
        out.append({"play": s["play"], "name": s["name"], "wall_s": max(0.0, nxt - s["t"])})
    return sorted(out, key=lambda r: -r["wall_s"])


def cpu_split(
    doc: dict[str, Any], host_cpu_s: float | None, background_s: float, nested: bool = True
) -> dict[str, float]:
    """Controller main / workers and host CPU over the run (module docstring of this file).

    The callback reads the main process's own CPU and its reaped children's. With ``nested`` (the
    fleet_nsenter connection) the children include the modules run on the hosts (nsenter waits for them),
    which the containers' cgroup charges to the hosts: ``workers = children - (host cgroup - background)``,
    the background being what the hosts' daemons used during the run (``hosts.daemons_cpu_s``: measured, not
    an idle window's rate times the wall, which on this machine varied several-fold within an hour).
    Without (``podman exec``: conmon and runc start the module, not the controller) the children are
    the workers alone, and the hosts' cgroup also holds conmon's and runc's share of each exec."""
    end = doc.get("end", {})
    main, children = float(end.get("self_s", 0.0)), float(end.get("children_s", 0.0))
    host = max(0.0, (host_cpu_s or 0.0) - background_s)
    br = end.get("main") or {}
    workers = max(0.0, children - host) if nested else children
    return {
        "main_s": main,
        "children_s": children,
        "host_s": host,
        "main_work_s": float(br.get("work_s", main)),
        "main_spin_s": float(br.get("spin_s", 0.0)),
        "main_poll_s": float(br.get("poll_s", 0.0)),
        "main_fork_s": float(br.get("fork_s", 0.0)),
        "main_get_vars_s": float(br.get("get_vars_s", 0.0)),
        "workers_s": workers,
        "controller_s": main + workers,
    }


def plan_play(doc: dict[str, Any]) -> int:
    """Index of the plan play (its name starts with "Plan"; else the first play)."""
    for i, p in enumerate(doc.get("plays", [])):
        if p.get("name", "").lower().startswith("plan"):
            return i
    return 0
