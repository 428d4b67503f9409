"""The per-node account (plugins/module_utils/_fleet_account.py, printed and written by the callback
plugins/callback/fleet_account.py) from a run's events: the verdict of each host
(facts site.yml states, failures nobody rescued, unreachable hosts, nodes the roll never reached), the
summary, the hosts that need attention, and the printed lines."""

from __future__ import annotations

import json

import pytest
from ansible_collections.hami.node.plugins.callback import fleet_account as callback
from ansible_collections.hami.node.plugins.module_utils import _fleet_account as fa

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        self.t += 1.0
        return self.t


def account() -> fa.Account:
    return fa.Account(clock=Clock())


def facts(**kw) -> dict:
    return {"ansible_facts": {"site_account": kw}}


def test_verdicts_of_a_run_with_one_of_each() -> None:
    a = account()
    a.play, a.task = "Reach every GPU node", "Reach | ping"
    run = {"playbook": "site.yml", "report_dir": "/r"}
    a.ok("localhost", {"ansible_facts": {"site_account_run": run}}, False)
    for h in ("quiet", "busy", "sick", "rolled", "parked", "later"):
        a.ok(h, {}, False)
    a.ok("gone", facts(state="unreachable", play="reach", task="ping", detail="ssh: connection refused"),
         False)
    a.play, a.task = "Plan", "Plan | kubelet settings"
    a.failed("sick", {"msg": "cannot parse /etc/kubernetes/kubelet-config.yaml"}, False)
    a.ok("sick", facts(state="failed", play="plan", task="Plan | kubelet settings",
                       detail="cannot parse /etc/kubernetes/kubelet-config.yaml"), False)
    for h in ("rolled", "parked", "later"):
        a.ok(h, facts(state="pending roll", play="plan", detail="driver 570.172.08 -> 570.195.03"), False)
    a.play, a.task = "GPU nodes, all at once", "hami_agent : Install the agent"
    a.ok("busy", {"changed": True}, True)
    a.ok("quiet", {}, False)
    a.play, a.task = "Roll pass 1", "Window | the verdict"
    a.ok("rolled", facts(state="rolled", play="roll", batch=1, detail="driver; evicted 2 pod(s)"), False)
    a.ok("parked", facts(state="parked", play="roll", batch=2, gate="nvml", runbook="docs/x.md#nvml",
                         detail="GPU 3 lost"), False)
    stopped = "1 node(s) parked (parked), more than site_rollout_max_parked=0"
    a.ok("localhost", {"ansible_facts": {"site_account_roll": {"stopped": stopped}}}, False)
    doc = a.result()
    states = {h: v["state"] for h, v in doc["nodes"].items()}
    assert states == {"quiet": "converged", "busy": "changed", "sick": "failed", "rolled": "rolled",
                      "parked": "parked", "later": "skipped", "gone": "unreachable"}
    assert doc["needs_attention"] == ["gone", "later", "parked", "sick"]
    assert doc["nodes"]["busy"]["changed"] == ["hami_agent : Install the agent"]
    assert "site_rollout_max_parked=0" in doc["nodes"]["later"]["detail"]
    assert doc["summary"] == {"unreachable": 1, "failed": 1, "parked": 1, "skipped": 1, "rolled": 1,
                              "changed": 1, "converged": 1}
    assert "localhost" not in doc["nodes"] and doc["playbook"] == "site.yml"
    lines = fa.render(doc)
    assert lines[0].startswith("gone") and "UNREACHABLE" in lines[0] and "connection refused" in lines[0]
    assert any(ln.startswith("parked") and "gate nvml failed: GPU 3 lost (runbook docs/x.md#nvml)" in ln
               for ln in lines)
    assert lines[-1].startswith("summary: unreachable 1, failed 1")
    assert "4 node(s) need attention" in lines[-1]


def test_an_unreachable_host_that_nobody_recorded_is_unreachable_with_the_play_and_task() -> None:
    a = account()
    a.ok("n1", {}, False)
    a.play, a.task = "GPU nodes, all at once", "kubelet : Merge the settings"
    a.unreachable_("n1", {"msg": "container n1 is not running"})
    v = a.result()["nodes"]["n1"]
    assert (v["state"], v["play"], v["task"]) == ("unreachable", "GPU nodes, all at once",
                                                  "kubelet : Merge the settings")
    assert "not running" in v["detail"]


def test_an_unreachable_looped_task_gives_the_connection_message_of_its_item() -> None:
    a = account()
    a.play, a.task = "GPU nodes, all at once", "kubelet : Plan | find the kubespray and kubeadm layouts"
    a.unreachable_("n1", {"msg": "All items completed", "unreachable": True,
                          "results": [{"unreachable": True, "msg": "host went down during play"}]})
    assert a.result()["nodes"]["n1"]["detail"] == "host went down during play"


def test_a_failure_nobody_rescued_fails_the_host() -> None:
    a = account()
    a.play, a.task = "Scheduler extender", "hami_scheduler : Start"
    a.failed("ctl", {"msg": "unit failed"}, False)
    a.failed("ctl", {"msg": "second error"}, False)  # the first failure is the one reported
    a.failed("ok", {"msg": "ignored"}, True)
    a.ok("ok", {}, False)
    doc = a.result()
    assert doc["nodes"]["ctl"]["state"] == "failed" and doc["nodes"]["ctl"]["detail"] == "unit failed"
    assert doc["nodes"]["ok"]["state"] == "converged"


def test_a_node_waiting_for_headroom_is_deferred_unless_the_roll_stopped() -> None:
    a = account()
    waited = "PodDisruptionBudget ml/db allows 0 disruption(s) now"
    a.ok("w", facts(state="pending roll", waited=waited), False)
    assert a.result()["nodes"]["w"]["state"] == "deferred"
    a.ok("localhost", {"ansible_facts": {"site_account_roll": {"stopped": "the roll stopped"}}}, False)
    v = a.result()["nodes"]["w"]
    assert v["state"] == "skipped" and "the roll stopped" in v["detail"]


def test_in_a_slice_a_pending_roll_is_deferred_to_the_final_run_not_attention() -> None:
    a = account()
    a.ok("p", facts(state="pending roll", play="plan", detail="kubelet maxPods 110 -> 111"), False)
    a.ok("c", {}, False)
    defer = "roll deferred to the final phase (this run is a slice: site_roll_defer)"
    a.ok("localhost", {"ansible_facts": {"site_account_roll": {"defer": defer}}}, False)
    doc = a.result()
    v = doc["nodes"]["p"]
    assert v["state"] == "pending roll" and v["detail"] == defer + ": kubelet maxPods 110 -> 111"
    assert doc["needs_attention"] == [] and doc["summary"] == {"pending roll": 1, "converged": 1}
    assert fa.render(doc)[0].split()[:4] == ["p", "pending", "roll", "roll"]


def test_long_messages_keep_their_head_and_their_cause_on_one_line() -> None:
    a = account()
    a.failed("n", {"msg": "'/usr/bin/apt-get install\n" + "pkg " * 500 + "' failed: E: Unable to acquire the "
                          "dpkg frontend lock"}, False)
    detail = a.result()["nodes"]["n"]["detail"]
    assert "\n" not in detail and len(detail) <= fa.MSG_MAX
    assert detail.startswith("'/usr/bin/apt-get install") and detail.endswith("dpkg frontend lock")
    assert " ... " in detail


def test_a_finding_about_the_cluster_is_not_a_node_failure() -> None:
    a = account()
    a.ok("n1", {}, False)
    finding = {"ALLOCATION_GUARD_MISSING": "no kubeconfig"}
    a.ok("n1", {"ansible_facts": {"site_account_finding": finding}}, False)
    a.play = "Account | every node that needs attention fails here"
    a.task = "Account | needs attention (the cluster)"
    a.failed("n1", {"msg": '{"ALLOCATION_GUARD_MISSING": "no kubeconfig"}'}, False)
    doc = a.result()
    assert doc["nodes"]["n1"]["state"] == "converged" and doc["needs_attention"] == []
    assert doc["findings"] == {"ALLOCATION_GUARD_MISSING": "no kubeconfig"}
    lines = fa.render(doc)
    assert any("(cluster)" in ln and "ALLOCATION_GUARD_MISSING" in ln and "no kubeconfig" in ln
               for ln in lines)
    assert lines[-1].endswith("1 finding(s) about the cluster")


def test_account_file_default_is_no_file() -> None:
    # Ansible's option type "path" turns the empty default into the working directory: the account then went
    # nowhere (a directory) instead of beside the rollout report. The option must be a plain string.
    import yaml

    opts = yaml.safe_load(callback.DOCUMENTATION)["options"]
    assert opts["account_file"]["type"] == "str" and opts["account_file"]["default"] == ""


def test_the_files_hold_the_account_and_the_hosts_to_rerun(tmp_path) -> None:
    a = account()
    a.ok("fine", {}, False)
    a.failed("sick", {"msg": "boom"}, False)
    a.unreachable_("gone", {"msg": "ssh: no route"})
    doc = a.result()
    fa.write(doc, str(tmp_path / "new"))
    assert json.loads((tmp_path / "new" / "_account.json").read_text()) == doc
    assert (tmp_path / "new" / "_account.json").read_text() == fa.dumps(doc)
    assert (tmp_path / "new" / "_needs-attention.txt").read_text() == "gone\nsick\n"  # --limit @FILE


def test_a_rescued_failure_is_not_a_failure_but_gives_a_recorded_verdict_its_message() -> None:
    a = account()
    a.play, a.task = "Plan", "kubelet : Plan"
    a.failed("n1", {"msg": "rescued error"}, False, rescued=True)
    a.ok("n1", {}, False)
    a.failed("n2", {"msg": "parse error"}, False, rescued=True)
    a.ok("n2", {"ansible_facts": {"site_account": {"state": "failed", "play": "plan"}}}, False)
    doc = a.result()
    assert doc["nodes"]["n1"]["state"] == "converged"
    assert doc["nodes"]["n2"]["state"] == "failed" and doc["nodes"]["n2"]["detail"] == "parse error"
    assert doc["needs_attention"] == ["n2"]
