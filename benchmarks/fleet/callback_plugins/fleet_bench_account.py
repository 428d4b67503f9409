# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""``fleet_bench_account``: the fleet benchmark's account of one ansible-playbook run (benchmark only).

Writes ``$HAMI_FLEETBENCH_ACCOUNT`` (JSON) at the end of the run:

- ``tasks``: one row per host-task result -- play, role, task name, action, host, status (ok / changed /
  skipped / failed / unreachable), seconds from the worker's start to the result (``v2_runner_on_start``
  to ``v2_runner_on_*``, both seen by the controller's main process), and whether it was delegated;
- ``plays``: per play its start, the main process's CPU (``RUSAGE_SELF``: the strategy loop, variable
  management, result processing, callbacks) and its reaped children's CPU (``RUSAGE_CHILDREN``: the
  per-task worker processes and what they ran locally -- the connection's client, delegated modules),
  and, with ``$HAMI_FLEETBENCH_API_DIR``, the simulated API server's request accounting at that moment (the
  benchmark's API server process dumps it on SIGUSR1), so requests can be charged to plays;
- ``end``: the same readings at the end of the run.
"""

from __future__ import annotations

DOCUMENTATION = r"""
    name: fleet_bench_account
    type: aggregate
    short_description: Per host-task timings, controller CPU and API requests per play (benchmark only)
    description:
      - Writes the JSON account of a run to $HAMI_FLEETBENCH_ACCOUNT for benchmarks/fleet.
    requirements:
      - enable in callbacks_enabled
"""

import json  # noqa: E402
import os  # noqa: E402
import pickle  # noqa: E402
import resource  # noqa: E402
import time  # noqa: E402

from ansible.plugins.callback import CallbackBase  # noqa: E402


def _rusage():
    s = resource.getrusage(resource.RUSAGE_SELF)
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {
        "self_s": s.ru_utime + s.ru_stime,
        "children_s": c.ru_utime + c.ru_stime,
        "maxrss_kib": s.ru_maxrss,
    }


def _host_state_bytes(variable_manager) -> dict:
    """What the controller keeps per host by the end of the run, as pickled bytes per variable name.

    Facts (``_fact_cache``) and registered results / set_facts (``_nonpersistent_fact_cache``) live in the
    main process for the whole run; every worker is a fork of it, and a fork's cost (page tables, and the
    copy-on-write faults of the child's garbage collector touching the heap) grows with that heap. So the
    bytes kept per host are what makes each host-task dearer as hosts are added (docs/performance.md).
    """
    if variable_manager is None:
        return {}
    per_key: dict[str, int] = {}
    hosts = 0
    caches = []
    try:
        facts = variable_manager._fact_cache
        caches.append(("facts", {h: facts.get(h) for h in list(facts.keys())}))
    except Exception:  # noqa: BLE001 - a cache plugin that cannot list its keys: facts not counted
        pass
    caches.append(("vars", dict(variable_manager._nonpersistent_fact_cache)))
    seen = set()
    for kind, cache in caches:
        for host, values in cache.items():
            seen.add(host)
            for key, value in (values or {}).items():
                try:
                    size = len(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))
                except Exception:  # noqa: BLE001 - an unpicklable value: its size unknown, not fatal
                    continue
                name = f"{kind}:{key}"
                per_key[name] = per_key.get(name, 0) + size
    hosts = len(seen)
    top = sorted(per_key.items(), key=lambda kv: -kv[1])[:15]
    return {
        "hosts": hosts,
        "bytes_per_host": round(sum(per_key.values()) / hosts) if hosts else 0,
        "top_per_host": {k: round(v / hosts) for k, v in top} if hosts else {},
    }


# --------------------------------------------------------------------------------- the main process
# Where the main process's CPU goes. Ansible's main process spins while every fork is busy
# (StrategyBase._queue_task loops over the workers with time.sleep(0.0001)) and polls while it waits for a
# task's last results (_wait_on_pending_results, internal_poll_interval). Neither is work: on a controller
# with spare cores they cost nothing, and when the main process is the bottleneck it does not wait. The
# wrappers below charge the main thread's CPU (time.thread_time) of those loops to "spin" and "poll";
# "work" is the rest of the process's CPU (the strategy, get_vars, forking workers, results, callbacks,
# and the results thread that unpacks the workers' answers).
_ACC = {
    "queue": 0.0,
    "fork": 0.0,
    "wait": 0.0,
    "results_in_wait": 0.0,
    "get_vars": 0.0,
    "fork_calls": 0,
    "get_vars_calls": 0,
}
_STATE = {"in_wait": 0, "patched": False}


def _patch_main_process():
    if _STATE["patched"]:
        return
    _STATE["patched"] = True
    try:
        from ansible.executor.process.worker import WorkerProcess
        from ansible.plugins.strategy import StrategyBase
        from ansible.vars.manager import VariableManager
    except ImportError:  # another Ansible layout: no breakdown, the run goes on
        return
    clock = time.thread_time

    def timed(cls, name, key, count=None):
        orig = getattr(cls, name)

        def wrapper(*args, **kwargs):
            t0 = clock()
            try:
                return orig(*args, **kwargs)
            finally:
                _ACC[key] += clock() - t0
                if count:
                    _ACC[count] += 1

        setattr(cls, name, wrapper)

    timed(StrategyBase, "_queue_task", "queue")
    timed(WorkerProcess, "start", "fork", "fork_calls")
    timed(VariableManager, "get_vars", "get_vars", "get_vars_calls")
    orig_wait = StrategyBase._wait_on_pending_results
    orig_results = StrategyBase._process_pending_results

    def wait(self, *args, **kwargs):
        t0 = clock()
        _STATE["in_wait"] += 1
        try:
            return orig_wait(self, *args, **kwargs)
        finally:
            _STATE["in_wait"] -= 1
            _ACC["wait"] += clock() - t0

    def results(self, *args, **kwargs):
        t0 = clock()
        out = orig_results(self, *args, **kwargs)
        if _STATE["in_wait"] and out:
            _ACC["results_in_wait"] += clock() - t0
        return out

    StrategyBase._wait_on_pending_results = wait
    StrategyBase._process_pending_results = results


def _main_breakdown(process_cpu):
    spin = max(0.0, _ACC["queue"] - _ACC["fork"])
    poll = max(0.0, _ACC["wait"] - _ACC["results_in_wait"])
    return {
        "spin_s": spin,
        "poll_s": poll,
        "fork_s": _ACC["fork"],
        "forks": _ACC["fork_calls"],
        "get_vars_s": _ACC["get_vars"],
        "get_vars_calls": _ACC["get_vars_calls"],
        "main_thread_s": time.thread_time(),
        "work_s": max(0.0, process_cpu - spin - poll),
    }


def _api_snapshot(directory, timeout_s=10.0):
    """The API server process's accounting now (benchmarks/apiserver_proc.py), or None."""
    if not directory:
        return None
    try:
        from benchmarks.apiserver_proc import read_accounting

        return read_accounting(directory, timeout_s=timeout_s)
    except Exception as exc:  # noqa: BLE001 - the account must not fail the run
        return {"error": str(exc)}


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "fleet_bench_account"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # "{run}": one file per ansible-playbook process of a run in slices (tools/site_slices.py names each
        # process's own account file: account-1, account-2, ..., account-final)
        run = os.path.splitext(os.path.basename(os.environ.get("HAMI_NODE_ACCOUNT_FILE", "")))[0] or "run"
        self._out = os.environ.get("HAMI_FLEETBENCH_ACCOUNT", "").replace("{run}", run)
        self._api_dir = os.environ.get("HAMI_FLEETBENCH_API_DIR", "")
        self._t0 = time.time()
        _patch_main_process()
        self._play = ""
        self._starts = {}
        self._items = {}
        self._tasks = []
        self._plays = []
        self._task_starts = []
        self._vm = None

    # ------------------------------------------------------------------------------ plays and tasks
    def v2_playbook_on_play_start(self, play):
        self._play = play.get_name()
        self._vm = getattr(play, "_variable_manager", None)
        self._plays.append(
            {
                "name": self._play,
                "t": time.time() - self._t0,
                **_rusage(),
                "api": _api_snapshot(self._api_dir),
            }
        )

    def v2_playbook_on_task_start(self, task, is_conditional):
        self._task_starts.append({"play": self._play, "name": task.get_name(), "t": time.time() - self._t0})

    def v2_playbook_on_handler_task_start(self, task):
        self._task_starts.append(
            {"play": self._play, "name": task.get_name(), "t": time.time() - self._t0, "handler": True}
        )

    def v2_runner_on_start(self, host, task):
        self._starts[(host.get_name(), task._uuid)] = time.time()
        self._items[(host.get_name(), task._uuid)] = 0

    def _item(self, result):
        key = (result._host.get_name(), result._task._uuid)
        self._items[key] = self._items.get(key, 0) + 1

    def v2_runner_item_on_ok(self, result):
        self._item(result)

    def v2_runner_item_on_failed(self, result):
        self._item(result)

    def v2_runner_item_on_skipped(self, result):
        pass  # the module did not run for this item

    def _record(self, result, status):
        task = result._task
        host = result._host.get_name()
        start = self._starts.pop((host, task._uuid), None)
        items = self._items.pop((host, task._uuid), 0)
        now = time.time()
        role = getattr(task, "_role", None)
        if status == "ok" and result._result.get("changed", False):
            status = "changed"
        self._tasks.append(
            {
                "play": self._play,
                "role": role.get_name() if role is not None else "",
                "task": task.get_name(include_role_fqcn=False).split(" : ", 1)[-1]
                if role is not None
                else task.get_name(),
                "action": task.action,
                "host": host,
                "status": status,
                "s": round(now - start, 4) if start is not None else None,
                "t": round((start or now) - self._t0, 3),
                "delegated": bool(getattr(task, "delegate_to", None)),
                "items": items,  # loop items that ran (each one ran the module); 0 without a loop
            }
        )

    def v2_runner_on_ok(self, result):
        self._record(result, "ok")

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._record(result, "ignored" if ignore_errors else "failed")

    def v2_runner_on_skipped(self, result):
        self._record(result, "skipped")

    def v2_runner_on_unreachable(self, result):
        self._record(result, "unreachable")

    # ------------------------------------------------------------------------------ the end
    def v2_playbook_on_stats(self, stats):
        if not self._out:
            return
        end = {"t": time.time() - self._t0, **_rusage(), "api": _api_snapshot(self._api_dir)}
        end["main"] = _main_breakdown(end["self_s"])
        end["host_state"] = _host_state_bytes(self._vm)
        hosts = sorted(stats.processed.keys())
        summary = {h: stats.summarize(h) for h in hosts}
        doc = {
            "plays": self._plays,
            "task_starts": self._task_starts,
            "tasks": self._tasks,
            "end": end,
            "stats": summary,
        }
        tmp = self._out + ".tmp"
        with open(tmp, "w") as fh:
            json.dump(doc, fh)
        os.replace(tmp, self._out)
