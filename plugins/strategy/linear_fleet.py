# SPDX-License-Identifier: Apache-2.0
# Copyright: hami.node contributors
"""``hami.node.linear_fleet``: Ansible's ``linear`` strategy without its two busy waits.

Why: with more hosts in a play than ``forks``, Ansible's main process waits for a free worker by scanning
every worker and sleeping 0.1 ms, over and over (``StrategyBase._queue_task`` in
ansible/plugins/strategy/__init__.py), and waits for a task's last results by sleeping
``internal_poll_interval`` (1 ms) between looks (``_wait_on_pending_results``). On a controller whose cores
are busy running the workers, the first loop takes a core from them: at 100 hosts and 50 forks it was 68
CPU-s of a 1,391 s converged run (docs/performance.md, "Fleet"). Here the main process sleeps until a worker
exits (each worker's process sentinel, ``multiprocessing.connection.wait``) and looks for results with a
backoff from 1 ms to 20 ms. Everything else - task order, batching, failures, handlers - is ``linear``'s:
this class only decides how the main process waits.

Not covered: a task with ``throttle`` (Ansible's own loop waits for a slot below the throttle; rare in
this collection, none in site.yml).
"""

from __future__ import annotations

DOCUMENTATION = r"""
    name: linear_fleet
    short_description: Ansible's linear strategy, waiting for workers and results without busy loops
    description:
      - Runs tasks exactly as the builtin C(linear) strategy does (each task on every host of the batch
        before the next task).
      - When every fork is busy, the main process sleeps until a worker exits instead of scanning the
        workers every 0.1 ms; it looks for a task's last results with a backoff (1 ms to 20 ms) instead of
        every C(internal_poll_interval). On a controller with more hosts than forks this leaves the cores
        to the workers.
      - site.yml's plays use it; set C(strategy = hami.node.linear_fleet) in C(ansible.cfg) for your own
        playbooks.
    author: hami.node developers
"""

import time  # noqa: E402
from multiprocessing.connection import wait as wait_for_any  # noqa: E402

from ansible.errors import AnsibleError  # noqa: E402
from ansible.plugins.strategy.linear import StrategyModule as LinearStrategyModule  # noqa: E402

# A bound on every sleep, so a terminated run (Ctrl-C, a fatal error) is noticed within it.
WORKER_WAIT_S = 1.0
RESULTS_POLL_FIRST_S = 0.001
RESULTS_POLL_MAX_S = 0.02


class StrategyModule(LinearStrategyModule):
    def _queue_task(self, host, task, task_vars, play_context):
        if not getattr(task, "throttle", 0):
            self._wait_for_a_free_worker()
        super()._queue_task(host, task, task_vars, play_context)

    def _wait_for_a_free_worker(self) -> None:
        """Return once some worker slot is empty or its process has ended (the slot the base class takes)."""
        while not self._tqm._terminated:
            by_sentinel = {}
            for worker in self._workers:
                if worker is None or not worker.is_alive():
                    return
                by_sentinel[worker.sentinel] = worker
            for sentinel in wait_for_any(list(by_sentinel), timeout=WORKER_WAIT_S):
                # An exiting process closes its end of the sentinel's pipe a moment before the kernel lets
                # its parent reap it; on a loaded controller that moment lasts milliseconds, and asking
                # is_alive() again in it would spin. join() reaps it the way multiprocessing itself does
                # once a sentinel is ready (Popen.wait: a blocking waitpid).
                by_sentinel[sentinel].join(WORKER_WAIT_S)

    def _wait_on_pending_results(self, iterator):
        """The base class's loop, with a backoff between looks while no result arrives."""
        results = []
        delay = RESULTS_POLL_FIRST_S
        while self._pending_results > 0 and not self._tqm._terminated:
            if self._tqm.has_dead_workers():
                raise AnsibleError("A worker was found in a dead state")
            got = self._process_pending_results(iterator)
            results.extend(got)
            if self._pending_results > 0:
                delay = RESULTS_POLL_FIRST_S if got else min(delay * 2, RESULTS_POLL_MAX_S)
                time.sleep(delay)
        return results
