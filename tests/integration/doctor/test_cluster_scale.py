"""``doctor cluster`` reads the cluster with a constant number of list calls: the per-node and per-pod
collectors use the cluster view instead of a GET per node, a list of each node's pods and of each pod's
events (issue 18 item 6)."""

from __future__ import annotations

import pytest

from benchmarks.doctor_cluster.fleet import populate
from tests.integration.doctor.helpers import run_doctor
from tests.sim.apiserver import ApiServer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _calls(capsys: pytest.CaptureFixture[str], nodes: int, pods: int) -> tuple[dict[str, int], dict]:
    with ApiServer(history_limit=100_000) as api:
        populate(api, nodes, pods, pending=5)
        api.accounting.reset()
        _rc, report = run_doctor(capsys, "cluster", "--kubeconfig", api.kubeconfig_path, "--no-local")
        tally = api.accounting.by(agent_contains=" doctor")
    return {verb: t.requests for verb, t in tally.items()}, report


def test_list_calls_do_not_grow_with_the_cluster(capsys: pytest.CaptureFixture[str]) -> None:
    small, report_small = _calls(capsys, nodes=3, pods=30)
    large, report_large = _calls(capsys, nodes=30, pods=300)
    # nodes, pods, pod events: one page each at this size; and the allocation guard (policy bindings, webhook
    # configurations: ALLOCATION_GUARD_MISSING)
    assert small == large == {"list-etcd": 5}
    assert len(report_large["children"]) == 30 + 5 and len(report_small["children"]) == 3 + 5
    pending = [c for c in report_large["children"] if c["command"] == "pod"]
    facts = pending[0]["facts"]
    assert facts["events.filtering_failed"] == 1 and facts["pod.found"] is True
    node = next(c for c in report_large["children"] if c["command"] == "node")
    assert node["facts"]["node.register.count"] == 8 and node["facts"]["node.pods_on_node"] > 0


def test_per_node_collectors_run_without_a_thread_each(capsys: pytest.CaptureFixture[str],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """With the cluster view the node and pod collectors only read memory: a thread (and its deadline)
    per node cost ~3 ms each, seconds at 1,000 nodes."""
    import threading

    from hami_agent.doctor.collect import base

    started: list[str] = []
    real = threading.Thread.start

    def start(self: threading.Thread) -> None:
        if self.name.startswith("doctor-"):
            started.append(self.name)
        real(self)

    monkeypatch.setattr(base.threading.Thread, "start", start)
    _calls(capsys, nodes=30, pods=300)
    # the API lists only (each has a deadline)
    assert started == ["doctor-cluster_list", "doctor-admission_guard"], started


def test_doctor_cluster_imports_only_what_it_runs(tmp_path) -> None:
    """Start-up is part of the figure (python -m benchmarks doctor-cluster): the CLI builds only the chosen
    subcommand's parser, and the node-local collectors (urllib, the NVML reaper) are not imported for
    nodes doctor does not run on."""
    import json
    import subprocess
    import sys

    others = ["hami_agent.scheduler.serve.cmd", "hami_agent.deviceplugin.cmd", "hami_agent.monitor.cmd",
              "hami_agent.dra.cmd", "hami_agent.nvml.client", "hami_agent.shrreg.analysis",
              "hami_agent.doctor.collect.endpoints", "hami_agent.doctor.collect.nvmlworkers",
              "hami_agent.doctor.collect.logs"]
    script = ("import json, sys\nfrom hami_agent import cli\n"
              "rc = cli.main(sys.argv[2:])\n"
              "print(json.dumps([m for m in json.loads(sys.argv[1]) if m in sys.modules]), file=sys.stderr)\n"
              "sys.exit(rc)\n")
    with ApiServer(history_limit=10_000) as api:
        populate(api, 3, 30, pending=2)
        proc = subprocess.run([sys.executable, "-c", script, json.dumps(others), "doctor", "cluster",
                               "--kubeconfig", api.kubeconfig_path, "--no-local", "--json"],
                              capture_output=True, text=True, timeout=60, check=False)
    report = json.loads(proc.stdout)
    assert len(report["children"]) == 3 + 2, proc.stderr[-2000:]
    assert json.loads(proc.stderr.strip().splitlines()[-1]) == []
