# SPDX-License-Identifier: Apache-2.0
# Copyright: hami.node contributors
"""site.yml's per-node account: the verdicts, the printed lines and the files. PRIVATE to hami.node.

One copy for its two users: the callback ``hami.node.fleet_account`` (plugins/callback/fleet_account.py, the
Ansible glue: it feeds a run's events to ``Account`` and prints and writes ``result()``) and
tools/site_slices.py (which merges the accounts of several ansible-playbook processes and must run without
Ansible). So: standard library only, no Ansible objects; every function is unit-tested without Ansible.
"""

from __future__ import annotations

import datetime
import json
import os
import time

ATTENTION = ("failed", "unreachable", "parked", "refused", "deferred", "skipped")
# "pending roll": only in a slice of a run in slices (site_roll_defer): its final run rolls the node
ORDER = (
    "unreachable",
    "failed",
    "parked",
    "refused",
    "deferred",
    "skipped",
    "pending roll",
    "rolled",
    "changed",
    "converged",
)
MSG_MAX = 400
LINE_MAX = 300
ACCOUNT_TASKS = "Account |"
ACCOUNT_FILE = "_account.json"
ATTENTION_FILE = "_needs-attention.txt"  # one host a line: ansible-playbook --limit @FILE reruns them


def clip(text, limit=MSG_MAX):
    """One line, at most ``limit`` characters: the head (what failed) and the tail (why; tools print the
    cause last, e.g. apt's "Unable to acquire the dpkg frontend lock" after the whole command line)."""
    text = " ".join(str(text or "").split())
    if len(text) <= limit:
        return text
    head = limit // 3
    return text[:head] + " ... " + text[-(limit - head - 5) :]


class HostRecord:
    """What one host went through, from the results the callback saw."""

    def __init__(self):
        self.facts = {}  # the site_account fact, merged in order
        self.failure = None  # first failure nobody ignored or rescued: {play, task, msg}
        self.rescued = None  # first failure a block's rescue handled (only its message is used)
        self.unreachable = None  # {play, task, msg}
        self.reached_after = False  # a result came back after the host was unreachable
        self.tasks = 0
        self.changed = []  # names of changed tasks
        self.first = None
        self.last = None

    def seen(self, now):
        self.first = self.first if self.first is not None else now
        self.last = now


class Account:
    """The verdict per host from the events of one run (plain dicts in, plain dicts out)."""

    def __init__(self, clock=time.time):
        self.clock = clock
        self.started = clock()
        self.hosts = {}
        self.run = {}  # the site_account_run fact (playbook settings, report dir)
        self.findings = {}  # site_account_finding: about the cluster, not a node (code -> message)
        self.roll = {}  # the site_account_roll fact: planned order, why it stopped
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

    def failed(self, host, result, ignored, rescued=False):
        """``rescued``: the task sits in a block whose ``rescue`` handles it (Ansible's recap counts it as
        rescued, not failed): the host is not failed for it; site.yml's rescues record their own verdict."""
        rec = self._host(host)
        rec.seen(self.clock())
        rec.tasks += 1
        # site.yml's last play fails the hosts (and the run) that need attention: the account's own verdict,
        # not an event of the run
        if ignored or self.task.startswith(ACCOUNT_TASKS):
            return
        msg = result.get("msg") or result.get("stderr") or result.get("reason") or "failed"
        failure = {"play": self.play, "task": self.task, "msg": clip(msg)}
        if rescued:
            rec.rescued = rec.rescued or failure
        elif rec.failure is None:
            rec.failure = failure

    def unreachable_(self, host, result):
        rec = self._host(host)
        rec.seen(self.clock())
        rec.tasks += 1
        # a looped task says "All items completed": the connection's own message is in its items
        items = [r for r in result.get("results") or [] if isinstance(r, dict) and r.get("unreachable")]
        msg = (items[0].get("msg") if items else None) or result.get("msg") or "unreachable"
        rec.unreachable = {"play": self.play, "task": self.task, "msg": clip(msg)}
        rec.reached_after = False

    # -- the verdicts
    def verdict(self, name):
        rec = self.hosts[name]
        facts = dict(rec.facts)
        state = facts.get("state")
        gone = rec.unreachable is not None and not rec.reached_after
        if gone and state in (None, "converged", "changed", "pending roll"):
            facts.update(
                state="unreachable",
                play=rec.unreachable["play"],
                task=rec.unreachable["task"],
                detail=rec.unreachable["msg"],
            )
        elif state == "pending roll" and self.roll.get("defer"):
            facts["detail"] = "%s: %s" % (self.roll["defer"], facts.get("detail") or "a disruptive change")
        elif state == "pending roll":
            waited = facts.get("waited") or (self.roll.get("deferred") or {}).get(name)
            if waited and not self.roll.get("stopped"):
                facts.update(
                    state="deferred", detail="not rolled, waiting: %s; run the playbook again" % waited
                )
            else:
                stop = self.roll.get("stopped") or "the roll ended before its batch"
                facts.update(state="skipped", detail="not rolled: %s; run the playbook again" % stop)
        elif state is None or state in ("converged", "changed"):
            if rec.failure is not None:
                facts.update(
                    state="failed",
                    play=rec.failure["play"],
                    task=rec.failure["task"],
                    detail=rec.failure["msg"],
                )
            else:
                facts["state"] = "changed" if rec.changed else "converged"
        cause = rec.failure or rec.rescued  # a recorded verdict without a message takes the failure's
        if facts["state"] in ("failed", "parked") and not facts.get("detail") and cause is not None:
            facts.setdefault("task", cause["task"])
            facts["detail"] = cause["msg"]
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


# ------------------------------------------------------------------------------------ the printed account
def describe(v):
    """One line of the printed account."""
    state = v["state"]
    if state == "rolled":
        text = "batch %s: %s" % (v.get("batch", "?"), v.get("detail") or "changed inside a window")
    elif state in ("failed", "unreachable"):
        where = " / ".join(x for x in (v.get("play"), v.get("task")) if x)
        text = "%s%s" % (("[%s] " % where) if where else "", v.get("detail", ""))
    elif state == "parked":
        text = "gate %s failed: %s (runbook %s)" % (
            v.get("gate", "?"),
            v.get("detail", ""),
            v.get("runbook", "-"),
        )
    elif state in ("refused", "deferred", "skipped", "pending roll"):
        text = v.get("detail", "")
    elif state == "changed":
        text = "%d task(s) changed: %s" % (v.get("changed_tasks", 0), "; ".join(v.get("changed", [])))
    else:
        text = v.get("detail") or "nothing to change"
    return clip(text, LINE_MAX)


def _no_prefix(v):
    return ""


def render(doc, loud=ATTENTION, prefix=_no_prefix):
    """The printed account: one line per node, worst first, then the findings and a summary.

    ``loud``: the states printed in capitals (those that need attention); ``prefix(v)``: text put before
    the node's description (tools/site_slices.py names the slice that ran the node)."""
    lines = []
    width = max([len(n) for n in doc["nodes"]] + [4])
    for name, v in sorted(
        doc["nodes"].items(),
        key=lambda kv: (ORDER.index(kv[1]["state"]) if kv[1]["state"] in ORDER else 99, kv[0]),
    ):
        label = v["state"].upper() if v["state"] in loud else v["state"]
        lines.append("%-*s  %-11s %s%s" % (width, name, label, prefix(v), describe(v)))
    for code, message in sorted((doc.get("findings") or {}).items()):
        lines.append("%-*s  %-11s %s" % (width, "(cluster)", code, clip(message, LINE_MAX)))
    summary = ", ".join("%s %d" % kv for kv in doc["summary"].items()) or "no hosts"
    findings = len(doc.get("findings") or {})
    about = ("; %d finding(s) about the cluster" % findings) if findings else ""
    lines.append("summary: %s; %d node(s) need attention%s" % (summary, len(doc["needs_attention"]), about))
    return lines


# ------------------------------------------------------------------------------------------- the files
def dumps(doc):
    """The account as written to ``_account.json``."""
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def write(doc, where):
    """``_account.json`` and ``_needs-attention.txt`` in the directory ``where`` (made if missing). Raises
    OSError; the caller says where it could not write."""
    os.makedirs(where, exist_ok=True)
    with open(os.path.join(where, ACCOUNT_FILE), "w") as fh:
        fh.write(dumps(doc))
    with open(os.path.join(where, ATTENTION_FILE), "w") as fh:
        fh.write("".join("%s\n" % n for n in doc["needs_attention"]))
