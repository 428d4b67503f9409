"""Static MIG resources, request parsing, flags, event texts."""

from __future__ import annotations

import argparse

import pytest

from hami_agent.protocol import MigPlacement, MigProfile
from hami_agent.protocol.requests import RequestConfig
from hami_agent.scheduler.core.fit import PodContext
from hami_agent.scheduler.core.model import PodRequest, PodUsage
from hami_agent.scheduler.core.requests import RequestError, pod_request
from hami_agent.scheduler.serve.cmd import add_arguments, build_config, parse_duration
from hami_agent.scheduler.state.cache import UsageCache
from hami_agent.scheduler.verbs import events as ev
from tests.unit.scheduler.helpers import dev, gpu_pod

pytestmark = pytest.mark.unit


def test_static_mig_resources_counted_from_register():
    c = UsageCache()
    d = dev(0, mode="mig")
    d.mig_profiles = (MigProfile("1g.12gb", 12288, placements=(MigPlacement(0, 1), MigPlacement(1, 1))),
                      MigProfile("3g.48gb", 49152, placements=(MigPlacement(4, 4),)))
    c.set_node("n", [d], mig_capacity={"1g.12gb": 2, "3g.48gb": 1})
    want = PodRequest(containers=(None,), n_init=0, mig=(("1g.12gb", 2),))
    dec = c.decide(["n"], want, PodContext())
    assert dec.node == "n"
    c.add_pod(PodUsage("u", "ns", "p", "n", {}, mig=(("1g.12gb", 2),)))
    dec = c.decide(["n"], PodRequest(containers=(None,), n_init=0, mig=(("1g.12gb", 1),)), PodContext())
    assert dec.node is None and dec.failed["n"] == "1/1 CardMigTopologyInfeasible"


def test_pod_request_parsing():
    p = gpu_pod("p", gpus=2, mem=1000, cores=30, init=[{"name": "i", "resources": {"limits": {"cpu": "1"}}}])
    r = pod_request(p, RequestConfig())
    assert r.n_init == 1 and r.containers[0] is None
    assert (r.containers[1].nums, r.containers[1].memreq, r.containers[1].coresreq) == (2, 1000, 30)
    pct = pod_request(gpu_pod("q"), RequestConfig()).containers[0]
    assert pct.mem_percentage == 100 and pct.memreq == 0  # no memory given: whole card
    dflt = pod_request(gpu_pod("q"), RequestConfig(default_memory=2000)).containers[0]
    assert dflt.memreq == 2000
    p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/mig-1g.10gb"] = "2"
    assert pod_request(p, RequestConfig()).mig == (("1g.10gb", 2),)
    p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem"] = "-5"
    with pytest.raises(RequestError, match="nvidia.com/gpumem"):
        pod_request(p, RequestConfig())


def test_durations_and_flags():
    assert parse_duration("5m") == 300 and parse_duration("1m30s") == 90
    assert parse_duration("300ms") == pytest.approx(0.3) and parse_duration("45") == 45
    with pytest.raises(argparse.ArgumentTypeError):
        parse_duration("5 minutes")
    p = argparse.ArgumentParser()
    p.add_argument("--config")
    add_arguments(p)
    args = p.parse_args(["--node-scheduler-policy", "spread", "--default-mem", "1024",
                         "--node-lock-timeout", "2m"])
    cfg = build_config(args)
    assert cfg.node_policy == "spread" and cfg.names.default_memory == 1024
    assert cfg.node_lock_timeout_s == 120 and cfg.scheduler_name == "hami-scheduler"
    assert cfg.avoid_busy_nodes  # the default: prefer a node without an admission under way
    assert not build_config(p.parse_args(["--strict-node-order"])).avoid_busy_nodes
    assert cfg.write_behind  # the default: /filter answers before its assignment write ends
    assert not build_config(p.parse_args(["--sync-filter-write"])).write_behind


def test_audit_interval_flag():
    from hami_agent.scheduler.serve.cmd import run

    p = argparse.ArgumentParser()
    p.add_argument("--config")
    p.add_argument("--kubeconfig")
    add_arguments(p)
    assert p.parse_args([]).audit_interval == 60
    assert p.parse_args(["--audit-interval", "5s"]).audit_interval == 5
    # below 1 s the leader's audit would spin: refused before anything starts
    assert run(p.parse_args(["--audit-interval", "500ms"])) == 2


def test_event_texts():
    msgs = ev.filtering_failed_messages({"a": "1/2 CardInsufficientMemory, 1/2 CardTypeMismatch",
                                         "b": "2/2 CardInsufficientMemory", "c": "NodeInsufficientDevice"})
    # one event per reason, ordered by reason name, nodes sorted
    assert msgs == ["2 nodes CardInsufficientMemory(a,b)", "1 nodes CardTypeMismatch(a)",
                    "1 nodes NodeInsufficientDevice(c)"]
    assert ev.filtering_failed_messages({"a": ""}) == ["no available node, 1 nodes do not meet"]
    assert ev.filtering_succeed_message("a", 1, 2, ["a", "b"], {"a": 15.0, "b": 3.333}) == \
        "find fit node(a), 1 nodes not fit, 2 nodes fit(a:15.00,b:3.33)"
    assert ev.binding_succeed_message("n", "ns", "p") == "Successfully binding node [n] to ns/p"


def test_a_filtering_failed_event_for_thousands_of_nodes_fits_the_apis_message_limit():
    failed = {f"gpu-node-{i:05d}": "1/8 CardInsufficientMemory" for i in range(5000)}
    (msg,) = ev.filtering_failed_messages(failed)
    assert len(msg) <= ev.MESSAGE_MAX
    assert msg.startswith("5000 nodes CardInsufficientMemory(gpu-node-00000,gpu-node-00001,")
    listed = msg[len("5000 nodes CardInsufficientMemory("):msg.index(",...(+")].split(",")
    assert listed == sorted(failed)[:len(listed)]
    assert msg.endswith(f",...(+{5000 - len(listed)} more))")
    # a list that fits is written whole, as HAMi writes it
    few = {f"n{i}": "1/1 CardInsufficientMemory" for i in range(3)}
    assert ev.filtering_failed_messages(few) == ["3 nodes CardInsufficientMemory(n0,n1,n2)"]
    # and one just over the limit keeps as many names as fit beside the marker
    names = [f"{i:03d}" + "x" * 96 for i in range(10)]  # 10 names of 99 characters: 999 + commas + head
    (cut,) = ev.filtering_failed_messages(dict.fromkeys(names, "1/1 CardInsufficientMemory"))
    assert len(cut) <= ev.MESSAGE_MAX and cut.endswith("more))") and names[0] in cut
