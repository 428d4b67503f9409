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
import json  # noqa: E402
import os  # noqa: E402
import time  # noqa: E402

from ansible.plugins.callback import CallbackBase  # noqa: E402

ATTENTION = ("failed", "unreachable", "parked", "refused", "deferred", "skipped")
# "pending roll": only in a slice of a run in slices (site_roll_defer): its final run rolls the node
ORDER = ("unreachable", "failed", "parked", "refused", "deferred", "skipped",
         "pending roll", "rolled", "changed", "converged")
MSG_MAX = 400
ACCOUNT_TASKS = "Account |"


def _clip(text, limit=MSG_MAX):
    """One line, at most ``limit`` characters: the head (what failed) and the tail (why; tools print the
    cause last, e.g. apt's "Unable to acquire the dpkg frontend lock" after the whole command line)."""
    text = " ".join(str(text or "").split())
    if len(text) <= limit:
        return text
    head = limit // 3
    return text[:head] + " ... " + text[-(limit - head - 5):]


class HostRecord:
    """What one host went through, from the results the callback saw."""

    def __init__(self):
        self.facts = {}          # the site_account fact, merged in order
        self.failure = None      # first failure nobody ignored: {play, task, msg}
        self.unreachable = None  # {play, task, msg}
        self.reached_after = False  # a result came back after the host was unreachable
        self.tasks = 0
        self.changed = []        # names of changed tasks
        self.first = None
        self.last = None

    def seen(self, now):
        self.first = self.first if self.first is not None else now
        self.last = now


class Account:
    """The verdict per host from the events of one run; free of Ansible objects so it is unit-tested."""

    def __init__(self, clock=time.time):
        self.clock = clock
        self.started = clock()
        self.hosts = {}
        self.run = {}            # the site_account_run fact (playbook settings, report dir)
        self.findings = {}       # site_account_finding: about the cluster, not a node (code -> message)
        self.roll = {}           # the site_account_roll fact: planned order, why it stopped
        self.play = ""
        self.task = ""

    def _host(self, name):
        rec = self.hosts.get(name)
        if rec is None:
            rec = self.hosts[name] = HostRecord()
        return rec

    # -- events
    def ok(self, host, result, changed):
        rec = self._host(host)
        rec.seen(self.clock())
        rec.tasks += 1
        if rec.unreachable is not None:
            rec.reached_after = True
        if changed:
            rec.changed.append(self.task)
        facts = result.get("ansible_facts") or {}
        if isinstance(facts.get("site_account"), dict):
            rec.facts.update(facts["site_account"])
        if isinstance(facts.get("site_account_run"), dict):
            self.run.update(facts["site_account_run"])
        if isinstance(facts.get("site_account_roll"), dict):
            self.roll.update(facts["site_account_roll"])
        if isinstance(facts.get("site_account_finding"), dict):
            self.findings.update(facts["site_account_finding"])

    def skipped(self, host):
        rec = self._host(host)
        rec.seen(self.clock())
        rec.tasks += 1

    def failed(self, host, result, ignored):
        rec = self._host(host)
        rec.seen(self.clock())
        rec.tasks += 1
        # site.yml's last play fails the hosts (and the run) that need attention: the account's own verdict,
        # not an event of the run
        if ignored or rec.failure is not None or self.task.startswith(ACCOUNT_TASKS):
            return
        msg = result.get("msg") or result.get("stderr") or result.get("reason") or "failed"
        rec.failure = {"play": self.play, "task": self.task, "msg": _clip(msg)}

    def unreachable_(self, host, result):
        rec = self._host(host)
        rec.seen(self.clock())
        rec.tasks += 1
        # a looped task says "All items completed": the connection's own message is in its items
        items = [r for r in result.get("results") or [] if isinstance(r, dict) and r.get("unreachable")]
        msg = (items[0].get("msg") if items else None) or result.get("msg") or "unreachable"
        rec.unreachable = {"play": self.play, "task": self.task, "msg": _clip(msg)}
        rec.reached_after = False

    # -- the verdicts
    def verdict(self, name):
        rec = self.hosts[name]
        facts = dict(rec.facts)
        state = facts.get("state")
        gone = rec.unreachable is not None and not rec.reached_after
        if gone and state in (None, "converged", "changed", "pending roll"):
            facts.update(state="unreachable", play=rec.unreachable["play"], task=rec.unreachable["task"],
                         detail=rec.unreachable["msg"])
        elif state == "pending roll" and self.roll.get("defer"):
            facts["detail"] = "%s: %s" % (self.roll["defer"], facts.get("detail") or "a disruptive change")
        elif state == "pending roll":
            waited = facts.get("waited") or (self.roll.get("deferred") or {}).get(name)
            if waited and not self.roll.get("stopped"):
                facts.update(state="deferred",
                             detail="not rolled, waiting: %s; run the playbook again" % waited)
            else:
                stop = self.roll.get("stopped") or "the roll ended before its batch"
                facts.update(state="skipped", detail="not rolled: %s; run the playbook again" % stop)
        elif state is None or state in ("converged", "changed"):
            if rec.failure is not None:
                facts.update(state="failed", play=rec.failure["play"], task=rec.failure["task"],
                             detail=rec.failure["msg"])
            else:
                facts["state"] = "changed" if rec.changed else "converged"
        if facts["state"] in ("failed", "parked") and not facts.get("detail") and rec.failure is not None:
            facts.setdefault("task", rec.failure["task"])
            facts["detail"] = rec.failure["msg"]
        facts["changed_tasks"] = len(rec.changed)
        if rec.changed and facts["state"] in ("changed", "rolled"):
            facts["changed"] = list(dict.fromkeys(rec.changed))[:8]
        facts["tasks"] = rec.tasks
        if rec.first is not None:
            facts["seconds"] = round(rec.last - rec.first, 1)
        return facts

    def result(self, ignore=("localhost",)):
        nodes = {name: self.verdict(name) for name in sorted(self.hosts) if name not in ignore}
        counts = {}
        for v in nodes.values():
            counts[v["state"]] = counts.get(v["state"], 0) + 1
        attention = sorted(n for n, v in nodes.items() if v["state"] in ATTENTION)
        return {
            "findings": dict(self.findings),
            "playbook": self.run.get("playbook", ""),
            "report_dir": self.run.get("report_dir", ""),
            "started": datetime.datetime.fromtimestamp(self.started, datetime.timezone.utc).isoformat(),
            "seconds": round(self.clock() - self.started, 1),
            "settings": self.run.get("settings", {}),
            "roll": self.roll,
            "summary": {k: counts[k] for k in ORDER if k in counts},
            "needs_attention": attention,
            "nodes": nodes,
        }


def describe(v):
    """One line of the printed account."""
    state = v["state"]
    if state == "rolled":
        text = "batch %s: %s" % (v.get("batch", "?"), v.get("detail") or "changed inside a window")
    elif state in ("failed", "unreachable"):
        where = " / ".join(x for x in (v.get("play"), v.get("task")) if x)
        text = "%s%s" % (("[%s] " % where) if where else "", v.get("detail", ""))
    elif state == "parked":
        text = "gate %s failed: %s (runbook %s)" % (v.get("gate", "?"), v.get("detail", ""),
                                                     v.get("runbook", "-"))
    elif state in ("refused", "deferred", "skipped", "pending roll"):
        text = v.get("detail", "")
    elif state == "changed":
        text = "%d task(s) changed: %s" % (v.get("changed_tasks", 0), "; ".join(v.get("changed", [])))
    else:
        text = v.get("detail") or "nothing to change"
    return _clip(text, 300)


def render(doc):
    lines = []
    width = max([len(n) for n in doc["nodes"]] + [4])
    for name, v in sorted(doc["nodes"].items(), key=lambda kv: (ORDER.index(kv[1]["state"])
                                                                 if kv[1]["state"] in ORDER else 99, kv[0])):
        label = v["state"].upper() if v["state"] in ATTENTION else v["state"]
        lines.append("%-*s  %-11s %s" % (width, name, label, describe(v)))
    for code, message in sorted((doc.get("findings") or {}).items()):
        lines.append("%-*s  %-11s %s" % (width, "(cluster)", code, _clip(message, 300)))
    summary = ", ".join("%s %d" % kv for kv in doc["summary"].items()) or "no hosts"
    findings = len(doc.get("findings") or {})
    about = ("; %d finding(s) about the cluster" % findings) if findings else ""
    lines.append("summary: %s; %d node(s) need attention%s" % (summary, len(doc["needs_attention"]), about))
    return lines


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
        self.account.failed(result._host.get_name(), result._result, ignore_errors)

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
                hint = "; rerun only those: --limit @%s" % os.path.join(where, "_needs-attention.txt")
            self._display.display("account: %s%s" % (os.path.join(where, "_account.json"), hint))

    def _write(self, doc):
        # a str, expanded here: type "path" turns the empty default into the working directory
        exact = os.path.expanduser(self.get_option("account_file") or "")
        if exact:
            try:
                os.makedirs(os.path.dirname(os.path.abspath(exact)), exist_ok=True)
                with open(exact, "w") as fh:
                    json.dump(doc, fh, indent=2, sort_keys=True)
                    fh.write("\n")
            except OSError as exc:
                self._display.warning("hami.node.fleet_account: cannot write the account to %s: %s"
                                      % (exact, exc))
            return ""
        where = self.account.run.get("report_dir") or ""
        if not where:
            stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
            where = os.path.join(os.path.expanduser(self.get_option("runs_dir")), stamp)
        try:
            os.makedirs(where, exist_ok=True)
            with open(os.path.join(where, "_account.json"), "w") as fh:
                json.dump(doc, fh, indent=2, sort_keys=True)
                fh.write("\n")
            with open(os.path.join(where, "_needs-attention.txt"), "w") as fh:
                fh.write("".join("%s\n" % n for n in doc["needs_attention"]))
        except OSError as exc:
            self._display.warning("hami.node.fleet_account: cannot write the account to %s: %s"
                                  % (where, exc))
            return ""
        return where
