# SPDX-License-Identifier: Apache-2.0
# Copyright: hami.node contributors
"""``hami.node.fleet_account``: every run of site.yml ends with one line per node saying what became of it.

Why a callback: it is the one part of Ansible that sees every host's every result, an unreachable host
included, and that runs at the end even when a play stopped the playbook (Ansible ends a playbook when
every host of a batch failed). Ansible's own recap counts tasks; an operator of a few hundred nodes needs
the verdict per node instead: converged, changed, rolled, parked at a gate, failed in which task and why,
unreachable, or left for the next run because the roll stopped. site.yml states those verdicts as the fact
``site_account`` on each host; this plugin reads them from the results, adds what only it sees
(unreachable hosts, failures nobody rescued) and prints and writes the account.

The account itself (verdicts, printed lines, files) is plugins/module_utils/_fleet_account.py, which
tools/site_slices.py uses without Ansible; this file is only the Ansible glue.
"""

from __future__ import annotations

DOCUMENTATION = r"""
    name: fleet_account
    type: aggregate
    short_description: A per-node account at the end of a site.yml run (printed, and written as JSON)
    description:
      - At the end of the run, one line per host - converged, changed, rolled, parked (with the gate),
        refused, deferred, failed (with the play, task and message), unreachable, or skipped because the
        roll stopped - and a summary. Written as C(_account.json) and C(_needs-attention.txt) (the hosts
        to rerun with C(--limit @FILE)) to the rollout report directory (C(site_rollout_report_dir)), else to
        C(~/.ansible/hami-node/runs/<UTC time>/).
      - Enable it in C(ansible.cfg) (C(callbacks_enabled = hami.node.fleet_account)) or with
        C(ANSIBLE_CALLBACKS_ENABLED=hami.node.fleet_account). The collection's own C(ansible.cfg) does.
    author: hami.node developers
    options:
      runs_dir:
        description: Where accounts go when the playbook names no report directory.
        default: ~/.ansible/hami-node/runs
        env:
          - name: HAMI_NODE_ACCOUNT_DIR
        ini:
          - section: hami_node
            key: account_dir
        type: path
      account_file:
        description:
          - Write the account (JSON) to exactly this file and nothing to the report directory. A run in slices
            (tools/site_slices.py) gives each of its ansible-playbook processes its own file and merges them.
        default: ''
        env:
          - name: HAMI_NODE_ACCOUNT_FILE
        type: str
"""

import datetime  # noqa: E402
import os  # noqa: E402

from ansible.plugins.callback import CallbackBase  # noqa: E402
from ansible_collections.hami.node.plugins.module_utils._fleet_account import (  # noqa: E402
    ACCOUNT_FILE,
    ATTENTION_FILE,
    Account,
    dumps,
    render,
    write,
)


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "hami.node.fleet_account"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.account = Account()
        self.playbook = ""

    def v2_playbook_on_start(self, playbook):
        self.playbook = os.path.basename(getattr(playbook, "_file_name", "") or "")

    def v2_playbook_on_play_start(self, play):
        self.account.play = play.get_name().strip()

    def v2_playbook_on_task_start(self, task, is_conditional):
        self.account.task = task.get_name().strip()

    def v2_playbook_on_handler_task_start(self, task):
        self.account.task = task.get_name().strip()

    def v2_runner_on_ok(self, result):
        # a check-mode task (a role's read-only plan) reports what it would change, not a change
        changed = bool(result._result.get("changed")) and not getattr(result._task, "check_mode", False)
        self.account.ok(result._host.get_name(), result._result, changed)

    def v2_runner_on_skipped(self, result):
        self.account.skipped(result._host.get_name())

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self.account.failed(result._host.get_name(), result._result, ignore_errors, _rescued(result._task))

    def v2_runner_on_unreachable(self, result):
        self.account.unreachable_(result._host.get_name(), result._result)

    def v2_playbook_on_stats(self, stats):
        doc = self.account.result()
        doc["playbook"] = doc["playbook"] or self.playbook
        if not doc["nodes"]:
            return
        where = self._write(doc)
        self._display.banner("HAMI.NODE ACCOUNT (%s, %d host(s), %.0fs)"
                             % (doc["playbook"] or "playbook", len(doc["nodes"]), doc["seconds"]))
        for line in render(doc):
            self._display.display(line)
        if where:
            hint = ""
            if doc["needs_attention"]:
                hint = "; rerun only those: --limit @%s" % os.path.join(where, ATTENTION_FILE)
            self._display.display("account: %s%s" % (os.path.join(where, ACCOUNT_FILE), hint))

    def _write(self, doc):
        # a str, expanded here: type "path" turns the empty default into the working directory
        exact = os.path.expanduser(self.get_option("account_file") or "")
        if exact:
            try:
                os.makedirs(os.path.dirname(os.path.abspath(exact)), exist_ok=True)
                with open(exact, "w") as fh:
                    fh.write(dumps(doc))
            except OSError as exc:
                self._display.warning("hami.node.fleet_account: cannot write the account to %s: %s"
                                      % (exact, exc))
            return ""
        where = self.account.run.get("report_dir") or ""
        if not where:
            stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
            where = os.path.join(os.path.expanduser(self.get_option("runs_dir")), stamp)
        try:
            write(doc, where)
        except OSError as exc:
            self._display.warning("hami.node.fleet_account: cannot write the account to %s: %s"
                                  % (where, exc))
            return ""
        return where


def _rescued(task):
    """Whether a block's ``rescue`` handles this task's failure: the task (or a block, include or import
    holding it) is in the ``block`` part of a block that has a ``rescue`` (the strategy's
    ``is_any_block_rescuing``, read from the task's parents: the callback does not see the iterator).
    Compared by ``_uuid``: the task a result carries is a copy."""
    node = task
    parent = getattr(task, "_parent", None)
    for _depth in range(64):  # bounded: parents form a short chain
        if parent is None:
            return False
        if getattr(parent, "rescue", None) and any(
            getattr(child, "_uuid", None) == getattr(node, "_uuid", object()) for child in parent.block or ()
        ):
            return True
        node, parent = parent, getattr(parent, "_parent", None)
    return False

