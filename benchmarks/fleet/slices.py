"""The fleet benchmark's run in slices (``--slices N``): tools/site_slices.py instead of one ansible-playbook.

Each ansible-playbook process of the runner writes its own benchmark account (``fleet_bench_account`` with
``{run}`` in its path: account-1, account-2, ..., account-final). ``merge`` adds them into one account of the
shape one process writes (every host-task; CPU summed over the processes), so the run's figures compare with
a one-process run's; ``per_process`` keeps what each main process paid per host-task of its own hosts - the
figure that slicing is meant to lower (docs/performance.md, "Fleet").
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks.fleet import model

REPO = Path(__file__).resolve().parents[2]
RUNNER = REPO / "tools" / "site_slices.py"
SUMMED = ("self_s", "children_s")
SUMMED_MAIN = ("work_s", "spin_s", "poll_s", "fork_s", "get_vars_s")


def argv(
    python: str,
    slices: int,
    inventory: Path,
    playbook: Path,
    run_dir: Path,
    timeout_s: float,
    extra: list[str],
) -> list[str]:
    return [
        python,
        str(RUNNER),
        "--slices",
        str(slices),
        "-i",
        str(inventory),
        "--playbook",
        str(playbook),
        "--run-dir",
        str(run_dir),
        "--slice-timeout",
        str(int(timeout_s)),
        "--final-timeout",
        str(int(timeout_s)),
        *extra,
    ]


def accounts(pattern: str) -> dict[str, dict[str, Any]]:
    """Each process's account by its name (1, 2, ..., final) from the ``{run}`` pattern."""
    path = Path(pattern)
    prefix, suffix = path.name.split("{run}")
    out = {}
    for p in sorted(path.parent.glob(f"{prefix}account-*{suffix}")):
        name = p.name[len(prefix) + len("account-") : len(p.name) - len(suffix)]
        out[name] = json.loads(p.read_text())
    return out


def merge(docs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One account: every process's host-tasks, plays and stats; the main processes' and their children's
    CPU summed (they ran side by side); the API snapshots of the first slice's start and the last end."""
    if not docs:
        return {}
    order = sorted(docs, key=lambda k: (k == "final", k))
    first, last = docs[order[0]], docs[order[-1]]
    end = dict(last.get("end", {}))
    for k in SUMMED:
        end[k] = sum(float(d.get("end", {}).get(k, 0.0)) for d in docs.values())
    end["main"] = {
        k: sum(float((d.get("end", {}).get("main") or {}).get(k, 0.0)) for d in docs.values())
        for k in SUMMED_MAIN
    }
    stats: dict[str, Any] = {}
    for name in order:
        stats.update(docs[name].get("stats", {}))
    return {
        "plays": first.get("plays", []),
        "task_starts": first.get("task_starts", []),
        "tasks": [t for name in order for t in docs[name].get("tasks", [])],
        "end": end,
        "stats": stats,
    }


def per_process(docs: dict[str, dict[str, Any]], names: list[str]) -> list[dict[str, Any]]:
    """Per process: its hosts, host-tasks, main-process work and CPU per host-task, wall."""
    rows = []
    for name in sorted(docs, key=lambda k: (k == "final", k)):
        d = docs[name]
        per_host = model.host_tasks(d, [h for h in names if h in d.get("stats", {})])
        tasks = sum(per_host.values())
        end = d.get("end", {})
        work = float((end.get("main") or {}).get("work_s", end.get("self_s", 0.0)))
        rows.append(
            {
                "process": name,
                "hosts": len(per_host),
                "host_tasks": tasks,
                "main_s": float(end.get("self_s", 0.0)),
                "main_work_s": work,
                "main_work_per_host_task_s": work / tasks if tasks else 0.0,
                "wall_s": float(end.get("t", 0.0)),
            }
        )
    return rows
